//! Regions (`store.region`, `store.home`, `shards[].region`): every record has one home
//! region, and lives on that region's shards only. The home is a function of the
//! record's identity (a header of its scope, optionally through a map, else a default),
//! never of where the request landed: otherwise one key could be claimed in two homes.
//! A re-homing (a changed map or default) is a map change like a resharding: the
//! previous or next home rule (`store.previous_home`, `store.next_home`) is the other
//! map's rule, checked as the other map is.

use super::raw::RawHome;
use super::values::header_name_ok;
use super::{err, fields, ConfigError, EtcdConfig, ShardConfig};
use crate::head::RequestHead;
use std::collections::BTreeMap;

/// This proxy's region and the rule that homes records (`store.region`, `store.home`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regions {
    /// `store.region`: where this proxy runs; a claim or completion on a shard of
    /// another region counts as remote.
    pub local: String,
    pub home: HomeRule,
}

/// A home rule, resolved against its shard map's regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeRule {
    /// The scope header whose value names the home (lower case).
    pub header: String,
    /// Header value → index in `regions` (empty: the value is a region's name).
    pub map: BTreeMap<String, u16>,
    /// Index in `regions` of the home when the header is absent or unknown.
    pub default: u16,
    /// The map's regions: its shards' region names, sorted, each once.
    pub regions: Vec<String>,
}

/// A record's home: its region's index among the regions of `store.shards` (`now`) and
/// among those of the other map of a resharding or re-homing (`check`). Both 0 without
/// regions (one group of every shard).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Home {
    pub now: u16,
    pub check: u16,
}

impl HomeRule {
    /// The index of `head`'s home region among `self.regions`.
    pub fn index_of(&self, head: &RequestHead) -> u16 {
        let Some(value) = head
            .header(&self.header)
            .and_then(|v| std::str::from_utf8(v).ok())
        else {
            return self.default;
        };
        if !self.map.is_empty() {
            return self.map.get(value).copied().unwrap_or(self.default);
        }
        match self.regions.binary_search_by(|r| r.as_str().cmp(value)) {
            Ok(i) => u16::try_from(i).unwrap_or(self.default),
            Err(_) => self.default,
        }
    }

    /// The name of the region at `index`.
    pub fn region(&self, index: u16) -> &str {
        self.regions
            .get(usize::from(index))
            .map_or("", String::as_str)
    }
}

impl EtcdConfig {
    /// Where `head`'s record lives: its home region under each map (`Home::default()`
    /// without regions).
    pub fn home_of(&self, head: &RequestHead) -> Home {
        Home {
            now: self.regions.as_ref().map_or(0, |r| r.home.index_of(head)),
            check: self
                .check
                .as_ref()
                .and_then(|c| c.home.as_ref())
                .map_or(0, |h| h.index_of(head)),
        }
    }
}

/// A region's name (`store.region`, `shards[].region`): like a shard's name.
pub(super) fn region_name(field: &str, name: String) -> Result<String, ConfigError> {
    if name.is_empty()
        || name.len() > fields::MAX_SHARD_NAME_BYTES
        || !name.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(err(
            field,
            format!(
                "1-{} visible ASCII characters",
                fields::MAX_SHARD_NAME_BYTES
            ),
        ));
    }
    Ok(name)
}

/// The regions of a shard map: its shards' region names, sorted, each once.
fn regions_of(shards: &[ShardConfig]) -> Vec<String> {
    let mut out: Vec<String> = shards.iter().filter_map(|s| s.region.clone()).collect();
    out.sort();
    out.dedup();
    out
}

/// `map_field` (`store.shards`, ...) has a region on every shard (`store.home` is set).
pub(super) fn every_shard_has_a_region(
    map_field: &str,
    shards: &[ShardConfig],
    one: bool,
) -> Result<(), ConfigError> {
    if one {
        return Err(err(
            "store.home",
            "needs store.shards, each with its `region` (store.cluster is one shard in no region)",
        ));
    }
    match shards.iter().position(|s| s.region.is_none()) {
        Some(i) => Err(err(
            &format!("{map_field}[{i}].region"),
            "required with store.home: the region this shard's etcd members are in",
        )),
        None => Ok(()),
    }
}

/// A home rule (`field`: `store.home`, `store.next_home` or `store.previous_home`) read
/// against its map's shards (`map_field`): every region it names has a shard there.
pub(super) fn parse_home(
    field: &str,
    raw: RawHome,
    map_field: &str,
    shards: &[ShardConfig],
) -> Result<HomeRule, ConfigError> {
    let regions = regions_of(shards);
    let index = |at: &str, name: &str| -> Result<u16, ConfigError> {
        match regions.binary_search_by(|r| r.as_str().cmp(name)) {
            Ok(i) => u16::try_from(i).map_err(|_| err(at, "too many regions")),
            Err(_) => Err(err(
                at,
                format!(
                    "region `{name}` has no shard in {map_field} (its regions: {})",
                    regions.join(", ")
                ),
            )),
        }
    };
    let header = match raw.header {
        Some(h) if header_name_ok(&h, true) => h.to_ascii_lowercase(),
        Some(h) => {
            return Err(err(
                &format!("{field}.header"),
                format!("`{h}` is not a valid header name"),
            ))
        }
        None => {
            return Err(err(
                &format!("{field}.header"),
                "required: the scope header whose value names a record's home region",
            ))
        }
    };
    let default =
        match raw.default {
            Some(d) => index(&format!("{field}.default"), &d)?,
            None => return Err(err(
                &format!("{field}.default"),
                "required: the home of a record whose header is absent or names no known region",
            )),
        };
    let mut map = BTreeMap::new();
    if let Some(m) = raw.map {
        let at = format!("{field}.map");
        if m.is_empty() || m.len() > fields::MAX_HOME_MAP {
            return Err(err(
                &at,
                format!(
                    "1 to {} entries (found {}); leave it out to read the header as a region's name",
                    fields::MAX_HOME_MAP,
                    m.len()
                ),
            ));
        }
        for (value, region) in m {
            if value.is_empty() || value.len() > fields::MAX_HOME_VALUE_BYTES {
                return Err(err(
                    &at,
                    format!(
                        "a header value of 1-{} bytes maps to each region (found `{value}`)",
                        fields::MAX_HOME_VALUE_BYTES
                    ),
                ));
            }
            let i = index(&format!("{at}.{value}"), &region)?;
            map.insert(value, i);
        }
    }
    Ok(HomeRule {
        header,
        map,
        default,
        regions,
    })
}

/// The home header is part of every policy's scope, so a key's home follows from its
/// record's identity (`scopes`: each policy's field prefix and scope headers).
pub(super) fn check_home_in_scope<'a>(
    ec: &EtcdConfig,
    scopes: impl Iterator<Item = (String, &'a [String])> + Clone,
) -> Result<(), ConfigError> {
    let rules = ec
        .regions
        .as_ref()
        .map(|r| ("store.home", &r.home))
        .into_iter()
        .chain(
            ec.check
                .as_ref()
                .and_then(|c| c.home.as_ref().map(|h| (c.role.home_field(), h))),
        );
    for (field, rule) in rules {
        for (prefix, headers) in scopes.clone() {
            if !headers.contains(&rule.header) {
                return Err(err(
                    &format!("{field}.header"),
                    format!(
                        "`{}` is not in {prefix}scope.headers: a record's home must follow from its identity (its scope), or one key could be claimed in two regions",
                        rule.header
                    ),
                ));
            }
        }
    }
    Ok(())
}
