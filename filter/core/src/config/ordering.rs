//! `ordering`: the per-entity version guard (top level and per rule). Its types are
//! config's own (the stream and the stores read them); parsed here.

use super::raw::{RawEntity, RawOnStale, RawOrdering, RawVersion};
use super::values::{json_pointer, parse_parts};
use super::*;

/// The ordering guard of a policy: per entity, the highest version that completed is
/// kept for `ttl_ms`, and a request at or below it is stale (never forwarded); one
/// version of an entity is in flight at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordering {
    pub entity: EntitySource,
    pub version: VersionSource,
    pub version_type: VersionType,
    pub ttl_ms: u64,
    pub on_stale: OnStale,
}

/// Where a request's entity id is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntitySource {
    /// A request header (lower-case name).
    Header(String),
    /// An RFC 6901 pointer into the JSON body (a string or an integer there).
    JsonPointer(String),
    /// Request parts, hashed like a keyless fingerprint (`method`, `path`, …).
    Parts(Vec<FingerprintPart>),
}

/// Where a request's version is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionSource {
    Header(String),
    JsonPointer(String),
}

/// How versions compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionType {
    /// A signed 64-bit decimal integer (a JSON integer, or a string of one).
    Integer,
    /// An RFC 3339 date-time with an offset, compared as the instant it names.
    Timestamp,
    /// Any string, compared byte by byte (UTF-8: code point order).
    String,
}

/// What a stale request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStale {
    /// `409` problem+json `stale-version`.
    Reject,
    /// This 2xx status (for senders that retry until they get one), with
    /// `idempotent-stale: true`.
    Acknowledge { status: u16 },
}

/// Longest entity id and longest string version, in bytes.
pub const MAX_ENTITY_BYTES: usize = 255;
pub const MAX_VERSION_BYTES: usize = 128;

/// `ordering` under `prefix`: `None` when absent or `enabled: false` (a rule turns an
/// inherited guard off that way).
pub(super) fn parse_ordering(
    prefix: &str,
    raw: RawOrdering,
) -> Result<Option<Ordering>, ConfigError> {
    let f = |name: &str| format!("{prefix}ordering.{name}");
    // Every field given is checked, also under `enabled: false` (which needs neither
    // the entity nor the version), so the schema and the parser agree on it.
    let entity = match raw.entity {
        Some(e) => Some(parse_entity(&f("entity"), e)?),
        None => None,
    };
    let version = match raw.version {
        Some(v) => Some(parse_version(&f("version"), v)?),
        None => None,
    };
    let ttl_ms = fields::ORDERING_TTL_SECONDS.check(
        &f("ttl_seconds"),
        raw.ttl_seconds,
        DEFAULT_ORDERING_TTL_SECONDS,
    )? * 1000;
    let status = fields::ACKNOWLEDGE_STATUS.check(
        &f("acknowledge_status"),
        raw.acknowledge_status,
        DEFAULT_ACKNOWLEDGE_STATUS,
    )?;
    let on_stale = match raw.on_stale.unwrap_or(RawOnStale::Reject) {
        RawOnStale::Reject if raw.acknowledge_status.is_some() => {
            return Err(err(
                &f("acknowledge_status"),
                "applies only with `on_stale: \"acknowledge\"`",
            ))
        }
        RawOnStale::Reject => OnStale::Reject,
        RawOnStale::Acknowledge => OnStale::Acknowledge {
            status: status as u16,
        },
    };
    if raw.enabled == Some(false) {
        return Ok(None);
    }
    let Some(entity) = entity else {
        return Err(err(
            &f("entity"),
            "is required: where the entity id is (`header`, `json_pointer` or `parts`)",
        ));
    };
    let Some((version, version_type)) = version else {
        return Err(err(
            &f("version"),
            "is required: where the version is (`header` or `json_pointer`)",
        ));
    };
    Ok(Some(Ordering {
        entity,
        version,
        version_type,
        ttl_ms,
        on_stale,
    }))
}

fn one_header(field: &str, name: String) -> Result<String, ConfigError> {
    if !header_name_ok(&name, false) {
        return Err(err(field, format!("`{name}` is not a header name")));
    }
    Ok(name.to_ascii_lowercase())
}

fn parse_entity(field: &str, raw: RawEntity) -> Result<EntitySource, ConfigError> {
    let f = |name: &str| format!("{field}.{name}");
    match (raw.header, raw.json_pointer, raw.parts) {
        (Some(h), None, None) => Ok(EntitySource::Header(one_header(&f("header"), h)?)),
        (None, Some(p), None) => Ok(EntitySource::JsonPointer(json_pointer(
            &f("json_pointer"),
            p,
        )?)),
        (None, None, Some(parts)) => Ok(EntitySource::Parts(parse_parts(&f("parts"), parts)?)),
        (None, None, None) => Err(err(field, "set one of `header`, `json_pointer` or `parts`")),
        _ => Err(err(
            field,
            "set only one of `header`, `json_pointer` or `parts`",
        )),
    }
}

fn parse_version(
    field: &str,
    raw: RawVersion,
) -> Result<(VersionSource, VersionType), ConfigError> {
    let f = |name: &str| format!("{field}.{name}");
    let source = match (raw.header, raw.json_pointer) {
        (Some(h), None) => VersionSource::Header(one_header(&f("header"), h)?),
        (None, Some(p)) => VersionSource::JsonPointer(json_pointer(&f("json_pointer"), p)?),
        (None, None) => return Err(err(field, "set one of `header` or `json_pointer`")),
        _ => return Err(err(field, "set only one of `header` or `json_pointer`")),
    };
    Ok((source, raw.r#type.unwrap_or(VersionType::Integer)))
}
