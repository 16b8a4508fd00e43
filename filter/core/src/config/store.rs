//! The `store` object: shared data or etcd, and the budgets each store needs checked.

use super::raw::{RawHome, RawShard, RawStore};
use super::*;

/// `store.max_store_bytes`. By default 128 MiB, raised when needed so that every bucket's
/// share holds one response of the largest `max_replay_body_bytes` with its headers
/// (the defaults need 6250 buckets × 20 KiB, within 128 MiB), so the default never
/// refuses a response the size limits allow; and never below 4 KiB per bucket. A set value must leave every
/// bucket at least 4 KiB; below the default, responses larger than a bucket's share
/// (`max_store_bytes / (capacity / 16)`) are not kept.
pub(super) fn store_budget(
    set: Option<u64>,
    capacity: u64,
    largest_replay: u64,
) -> Result<u64, ConfigError> {
    let buckets = (capacity / crate::geometry::WAYS as u64).max(1);
    let least = buckets * MIN_BUCKET_STORE_BYTES;
    let Some(v) = set else {
        let one_response = buckets.saturating_mul(largest_replay + STORED_HEADERS_ALLOWANCE);
        return Ok(DEFAULT_MAX_STORE_BYTES.max(least).max(one_response));
    };
    let v = fields::MAX_STORE_BYTES.check("store.max_store_bytes", Some(v), 0)?;
    if v < least {
        return Err(err(
            "store.max_store_bytes",
            format!(
                "{v} leaves each of the {buckets} buckets (capacity {capacity} / 16) {} bytes; \
                 at least {MIN_BUCKET_STORE_BYTES} per bucket ({least} in all) are needed: \
                 raise it or lower capacity",
                v / buckets
            ),
        ));
    }
    Ok(v)
}

impl StoreConfig {
    /// The prefix of this proxy's shared-data keys: the shared-data store's records, and
    /// the wake-up board of wait mode, which lives in shared data whatever the store
    /// (with etcd, under the default namespace).
    pub fn namespace(&self) -> &str {
        match self {
            StoreConfig::SharedData { namespace, .. } => namespace,
            StoreConfig::Etcd(_) => DEFAULT_NAMESPACE,
        }
    }

    /// Where `head`'s record lives (regions; `Home::default()` for every other store).
    pub fn home_of(&self, head: &RequestHead) -> Home {
        match self {
            StoreConfig::Etcd(ec) => ec.home_of(head),
            StoreConfig::SharedData { .. } => Home::default(),
        }
    }

    /// The shared-data store's byte budget (`None` with etcd).
    pub fn max_store_bytes(&self) -> Option<u64> {
        match self {
            StoreConfig::SharedData {
                max_store_bytes, ..
            } => Some(*max_store_bytes),
            StoreConfig::Etcd(_) => None,
        }
    }

    /// etcd: every policy's replay cap must fit a record (shared data has no such cap).
    pub(super) fn check_record_room(
        &self,
        policy: &Policy,
        rules: &[Rule],
    ) -> Result<(), ConfigError> {
        if let StoreConfig::Etcd(ec) = self {
            check_record_room("", policy, ec)?;
            for (i, r) in rules.iter().enumerate() {
                check_record_room(&format!("rules[{i}]."), &r.policy, ec)?;
            }
        }
        Ok(())
    }
}

/// The defaults: shared data, sized for the default capacity and replay cap.
impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::SharedData {
            eviction: Eviction::OwnScope,
            scope_claims_per_bucket: DEFAULT_SCOPE_CLAIMS_PER_BUCKET,
            namespace: DEFAULT_NAMESPACE.to_string(),
            max_entities: DEFAULT_MAX_ENTITIES,
            max_store_bytes: store_budget(None, DEFAULT_CAPACITY, DEFAULT_MAX_REPLAY_BODY_BYTES)
                .unwrap_or(DEFAULT_MAX_STORE_BYTES),
        }
    }
}

/// The record carries the response plus its own header: leave room for both.
fn check_record_room(prefix: &str, policy: &Policy, ec: &EtcdConfig) -> Result<(), ConfigError> {
    let room = ec.max_record_bytes.saturating_sub(RECORD_OVERHEAD_BYTES);
    let max_replay_body_bytes = policy.max_replay_body_bytes;
    if max_replay_body_bytes > room {
        return Err(err(
            &format!("{prefix}max_replay_body_bytes"),
            format!(
                "{max_replay_body_bytes} does not fit an etcd record of store.max_record_bytes {} \
                 (at most {room} with the record's own {RECORD_OVERHEAD_BYTES} bytes); \
                 lower it or raise store.max_record_bytes",
                ec.max_record_bytes
            ),
        ));
    }
    Ok(())
}

/// The `store` object (absent: all defaults). Shared data's byte budget depends on the
/// capacity and the largest replay cap of any policy (`store_budget`).
pub(super) fn parse_store(
    st: RawStore,
    capacity: u64,
    largest_replay: u64,
) -> Result<StoreConfig, ConfigError> {
    let kind = st.kind.as_deref().unwrap_or("shared_data");
    let etcd_only = [
        ("store.cluster", st.cluster.is_some()),
        ("store.authority", st.authority.is_some()),
        ("store.prefix", st.prefix.is_some()),
        ("store.timeout_ms", st.timeout_ms.is_some()),
        ("store.max_record_bytes", st.max_record_bytes.is_some()),
        ("store.protocol", st.protocol.is_some()),
        ("store.shards", st.shards.is_some()),
        ("store.previous_shards", st.previous_shards.is_some()),
        ("store.next_shards", st.next_shards.is_some()),
        ("store.region", st.region.is_some()),
        ("store.home", st.home.is_some()),
        ("store.previous_home", st.previous_home.is_some()),
        ("store.next_home", st.next_home.is_some()),
    ];
    match kind {
        "shared_data" => {
            if let Some((field, _)) = etcd_only.iter().find(|(_, set)| *set) {
                return Err(err(field, "only applies to store.kind \"etcd\""));
            }
            let namespace = match st.namespace {
                Some(ns) => {
                    if ns.is_empty()
                        || ns.len() > fields::MAX_NAMESPACE_BYTES
                        || !ns.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
                    {
                        return Err(err(
                            "store.namespace",
                            "1-64 visible ASCII characters without '/'",
                        ));
                    }
                    ns
                }
                None => DEFAULT_NAMESPACE.to_string(),
            };
            let max_store_bytes = store_budget(st.max_store_bytes, capacity, largest_replay)?;
            let eviction = match st.eviction.as_deref() {
                None | Some("own_scope") => Eviction::OwnScope,
                Some("oldest") => Eviction::Oldest,
                Some(other) => {
                    return Err(err(
                        "store.eviction",
                        format!("`{other}` is not known (expected \"own_scope\" or \"oldest\")"),
                    ))
                }
            };
            let scope_claims_per_bucket = fields::SCOPE_CLAIMS_PER_BUCKET.check(
                "store.scope_claims_per_bucket",
                st.scope_claims_per_bucket,
                DEFAULT_SCOPE_CLAIMS_PER_BUCKET,
            )?;
            let max_entities = fields::MAX_ENTITIES.check(
                "store.max_entities",
                st.max_entities,
                DEFAULT_MAX_ENTITIES,
            )?;
            Ok(StoreConfig::SharedData {
                namespace,
                max_store_bytes,
                eviction,
                scope_claims_per_bucket,
                max_entities,
            })
        }
        "etcd" => {
            for (field, set) in [
                ("store.eviction", st.eviction.is_some()),
                (
                    "store.scope_claims_per_bucket",
                    st.scope_claims_per_bucket.is_some(),
                ),
                ("store.max_entities", st.max_entities.is_some()),
            ] {
                if set {
                    return Err(err(field, "only applies to store.kind \"shared_data\""));
                }
            }
            if st.max_store_bytes.is_some() {
                return Err(err(
                    "store.max_store_bytes",
                    "only applies to store.kind \"shared_data\" (the etcd store's local tier has its own bound)",
                ));
            }
            if st.namespace.is_some() {
                return Err(err(
                    "store.namespace",
                    "only applies to store.kind \"shared_data\" (etcd uses store.prefix)",
                ));
            }
            let one = st.cluster.is_some();
            let shards = match (st.cluster, st.shards) {
                (Some(_), Some(_)) => {
                    return Err(err(
                        "store.shards",
                        "set store.cluster (one etcd cluster) or store.shards, not both",
                    ))
                }
                (None, Some(list)) => {
                    if st.authority.is_some() {
                        return Err(err(
                            "store.authority",
                            "with store.shards, each shard has its own `authority`",
                        ));
                    }
                    parse_shards("store.shards", list)?
                }
                (Some(cluster), None) => {
                    let one = RawShard {
                        name: None,
                        cluster: Some(cluster),
                        authority: st.authority,
                        region: None,
                    };
                    parse_shards("store", vec![one])?
                }
                (None, None) => return Err(err(
                    "store.cluster",
                    "required for store.kind \"etcd\": the Envoy cluster of the etcd members (or store.shards)",
                )),
            };
            let (check, regions) = parse_moves_and_regions(
                &shards,
                one,
                Moves {
                    previous_shards: st.previous_shards,
                    next_shards: st.next_shards,
                    region: st.region,
                    home: st.home,
                    previous_home: st.previous_home,
                    next_home: st.next_home,
                },
            )?;
            let prefix = st.prefix.unwrap_or_else(|| DEFAULT_ETCD_PREFIX.to_string());
            if prefix.is_empty()
                || prefix.len() > fields::MAX_ETCD_PREFIX_BYTES
                || prefix.chars().any(char::is_control)
            {
                return Err(err(
                    "store.prefix",
                    "1-128 characters, no control characters",
                ));
            }
            let timeout_ms = fields::ETCD_TIMEOUT_MS.check(
                "store.timeout_ms",
                st.timeout_ms,
                DEFAULT_ETCD_TIMEOUT_MS,
            )?;
            let max_record_bytes = fields::MAX_RECORD_BYTES.check(
                "store.max_record_bytes",
                st.max_record_bytes,
                DEFAULT_MAX_RECORD_BYTES,
            )? as usize;
            let protocol = match st.protocol.as_deref() {
                None | Some("grpc") => Protocol::Grpc,
                Some("json") => Protocol::Json,
                Some(other) => {
                    return Err(err(
                        "store.protocol",
                        format!(
                            "`{other}` is not a known protocol (expected \"grpc\" or \"json\")"
                        ),
                    ))
                }
            };
            Ok(StoreConfig::Etcd(EtcdConfig {
                shards,
                check,
                prefix,
                timeout_ms,
                max_record_bytes,
                protocol,
                regions,
            }))
        }
        other => Err(err(
            "store.kind",
            format!("`{other}` is not a known store (expected \"shared_data\" or \"etcd\")"),
        )),
    }
}

/// A shard map (`field`: `store.shards`, `store.previous_shards`, `store.next_shards`, or
/// `store` for the one `store.cluster`): 1 to `MAX_SHARDS` shards, names and clusters
/// unique.
fn parse_shards(field: &str, list: Vec<RawShard>) -> Result<Vec<ShardConfig>, ConfigError> {
    let one = field == "store";
    if list.is_empty() || list.len() > fields::MAX_SHARDS {
        return Err(err(
            field,
            format!("1 to {} shards (found {})", fields::MAX_SHARDS, list.len()),
        ));
    }
    let mut out: Vec<ShardConfig> = Vec::with_capacity(list.len());
    for (i, raw) in list.into_iter().enumerate() {
        let at = |name: &str| {
            if one {
                format!("store.{name}")
            } else {
                format!("{field}[{i}].{name}")
            }
        };
        let cluster = match raw.cluster {
            Some(c) if !c.is_empty() => c,
            Some(_) => return Err(err(&at("cluster"), "must not be empty")),
            None => {
                return Err(err(
                    &at("cluster"),
                    "required: the Envoy cluster of this shard's etcd members",
                ))
            }
        };
        let name = raw.name.unwrap_or_else(|| cluster.clone());
        if name.is_empty()
            || name.len() > fields::MAX_SHARD_NAME_BYTES
            || !name.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(err(
                &at("name"),
                format!(
                    "1-{} visible ASCII characters",
                    fields::MAX_SHARD_NAME_BYTES
                ),
            ));
        }
        let authority = raw.authority.unwrap_or_else(|| cluster.clone());
        if authority.is_empty() || authority.chars().any(|c| c.is_control() || c == ' ') {
            return Err(err(&at("authority"), "must be a host name"));
        }
        if out.iter().any(|s| s.name == name) {
            return Err(err(
                &at("name"),
                format!("`{name}` names two shards of one map"),
            ));
        }
        if out.iter().any(|s| s.cluster == cluster) {
            return Err(err(
                &at("cluster"),
                format!("`{cluster}` is the cluster of two shards of one map"),
            ));
        }
        let region = match raw.region {
            Some(r) => Some(super::regions::region_name(&at("region"), r)?),
            None => None,
        };
        out.push(ShardConfig {
            name,
            cluster,
            authority,
            region,
        });
    }
    Ok(out)
}

/// A shard named in both maps is the same etcd cluster in both (its records stay put),
/// and one cluster keeps one name (else its records would be placed by two names).
fn same_names_same_clusters(
    field: &str,
    checked: &[ShardConfig],
    current: &[ShardConfig],
) -> Result<(), ConfigError> {
    for (i, s) in checked.iter().enumerate() {
        for c in current {
            if c.name == s.name && (c.cluster != s.cluster || c.authority != s.authority) {
                return Err(err(
                    &format!("{field}[{i}].cluster"),
                    format!(
                        "shard `{}` is cluster `{}` in store.shards: a shard in both maps must be the same cluster",
                        s.name, c.cluster
                    ),
                ));
            }
            if c.cluster == s.cluster && c.name != s.name {
                return Err(err(
                    &format!("{field}[{i}].name"),
                    format!(
                        "cluster `{}` is shard `{}` in store.shards: one cluster keeps one name in both maps",
                        s.cluster, c.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The fields of a move between maps (resharding, re-homing) and of regions, as written.
struct Moves {
    previous_shards: Option<Vec<RawShard>>,
    next_shards: Option<Vec<RawShard>>,
    region: Option<String>,
    home: Option<RawHome>,
    previous_home: Option<RawHome>,
    next_home: Option<RawHome>,
}

/// The regions (`store.region`, `store.home`) and the other map of a resharding or
/// re-homing: its shards (or the current ones) and its home rule. Each map places by
/// regions (every shard with a region, and a home rule) or not at all (no region on any
/// shard: over all its shards, as before regions), so a deployment can adopt regions,
/// or drop them, by the same two steps. `one`: the map is the one `store.cluster`.
fn parse_moves_and_regions(
    shards: &[ShardConfig],
    one: bool,
    m: Moves,
) -> Result<(Option<ShardCheck>, Option<Box<Regions>>), ConfigError> {
    use super::regions::{every_shard_has_a_region, parse_home, region_name};
    let previous = m.previous_shards.is_some() || m.previous_home.is_some();
    let next = m.next_shards.is_some() || m.next_home.is_some();
    if previous && next {
        let field = if m.next_shards.is_some() {
            "store.next_shards"
        } else {
            "store.next_home"
        };
        return Err(err(
            field,
            "set the previous map (store.previous_shards, store.previous_home) or the next one (store.next_shards, store.next_home), not both: one move at a time",
        ));
    }
    let (role, other_shards, other_home) = if previous {
        (CheckRole::Previous, m.previous_shards, m.previous_home)
    } else {
        (CheckRole::Next, m.next_shards, m.next_home)
    };
    let other_shards = match other_shards {
        Some(list) => {
            let checked = parse_shards(role.field(), list)?;
            same_names_same_clusters(role.field(), &checked, shards)?;
            Some(checked)
        }
        None => None,
    };
    // The current map (its rule kept as written, to be read again against the other
    // map's regions when that map has none of its own).
    let current_home = m.home.clone();
    let regions = match m.home {
        None => {
            if m.region.is_some() {
                return Err(err(
                    "store.region",
                    "needs store.home: regions are set by store.region, store.home and each shard's `region`",
                ));
            }
            if let Some(i) = shards.iter().position(|s| s.region.is_some()) {
                return Err(err(
                    &format!("store.shards[{i}].region"),
                    "needs store.home: without a home rule a shard's region places nothing",
                ));
            }
            None
        }
        Some(home) => {
            every_shard_has_a_region("store.shards", shards, one)?;
            let rule = parse_home("store.home", home, "store.shards", shards)?;
            let local = match m.region {
                Some(r) => region_name("store.region", r)?,
                None => {
                    return Err(err(
                        "store.region",
                        "required with store.home: the region this proxy runs in",
                    ))
                }
            };
            if !rule.regions.contains(&local) {
                return Err(err(
                    "store.region",
                    format!(
                        "region `{local}` has no shard in store.shards (its regions: {})",
                        rule.regions.join(", ")
                    ),
                ));
            }
            Some(Box::new(Regions { local, home: rule }))
        }
    };
    if other_shards.is_none() && other_home.is_none() {
        return Ok((None, regions));
    }
    // The other map: its own shards or the current ones, its own rule or the current one.
    let map_field = if other_shards.is_some() {
        role.field()
    } else {
        "store.shards"
    };
    if other_shards.is_none() && other_home.is_some() && regions.is_none() {
        return Err(err(
            role.home_field(),
            format!(
                "needs {} with each shard's `region`: store.shards has no regions",
                role.field()
            ),
        ));
    }
    let list = other_shards.unwrap_or_else(|| shards.to_vec());
    let regional = list.iter().any(|s| s.region.is_some());
    let home = match (other_home, &regions) {
        (Some(h), _) => {
            every_shard_has_a_region(map_field, &list, false)?;
            Some(parse_home(role.home_field(), h, map_field, &list)?)
        }
        (None, Some(_)) if regional => {
            every_shard_has_a_region(map_field, &list, false)?;
            let raw = current_home.unwrap_or_default();
            Some(parse_home("store.home", raw, map_field, &list)?)
        }
        (None, None) if regional => {
            let i = list.iter().position(|s| s.region.is_some()).unwrap_or(0);
            return Err(err(
                &format!("{map_field}[{i}].region"),
                format!(
                    "needs {}: a map with regions needs its home rule",
                    role.home_field()
                ),
            ));
        }
        // A map without regions: placed over all its shards.
        (None, _) => None,
    };
    Ok((
        Some(ShardCheck {
            role,
            shards: list,
            home,
        }),
        regions,
    ))
}
