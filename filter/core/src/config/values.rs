//! Checks of single values: header names, numbers in range, status classes.

use super::{err, ConfigError, StatusRange};

/// Pseudo-headers that may be named where request headers are named (scope, fingerprint).
pub const PSEUDO_HEADERS: [&str; 3] = [":authority", ":path", ":method"];

/// A request header name, or one of `PSEUDO_HEADERS` when `pseudo` allows it.
pub(super) fn header_name_ok(name: &str, pseudo: bool) -> bool {
    let lower = name.to_ascii_lowercase();
    (!name.is_empty() && name.bytes().all(is_token_byte))
        || (pseudo && PSEUDO_HEADERS.contains(&lower.as_str()))
}

pub(super) fn header_names(
    field: &str,
    names: Vec<String>,
    allow_empty: bool,
) -> Result<Vec<String>, ConfigError> {
    header_names_with(field, names, allow_empty, false)
}

pub(super) fn header_names_with(
    field: &str,
    names: Vec<String>,
    allow_empty: bool,
    pseudo: bool,
) -> Result<Vec<String>, ConfigError> {
    if !allow_empty && names.is_empty() {
        return Err(err(field, "must list at least one header"));
    }
    if names.len() > super::fields::MAX_HEADERS {
        return Err(err(field, "at most 16 headers"));
    }
    names
        .into_iter()
        .map(|n| {
            if !header_name_ok(&n, pseudo) {
                let also = if pseudo {
                    " (pseudo-headers allowed: :authority, :path, :method)"
                } else {
                    ""
                };
                Err(err(
                    field,
                    format!("`{n}` is not a valid header name{also}"),
                ))
            } else {
                Ok(n.to_ascii_lowercase())
            }
        })
        .collect()
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub(super) fn in_range(
    field: &str,
    v: Option<u64>,
    default: u64,
    low: u64,
    high: u64,
) -> Result<u64, ConfigError> {
    let v = v.unwrap_or(default);
    if v < low || v > high {
        return Err(err(field, format!("{v} is out of range {low}..={high}")));
    }
    Ok(v)
}

pub(super) fn parse_status(field: &str, entry: &str) -> Result<StatusRange, ConfigError> {
    let (exclude, s) = match entry.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, entry),
    };
    let bad = || {
        err(
            field,
            format!("`{entry}` is neither a status class like \"2xx\" nor a code 100..=599 (a leading `!` excludes)"),
        )
    };
    if s.len() == 3 && s.ends_with("xx") {
        let class = s[..1].parse::<u16>().map_err(|_| bad())?;
        if !(1..=5).contains(&class) {
            return Err(bad());
        }
        return Ok(StatusRange::new(class * 100, class * 100 + 99, exclude));
    }
    let code = s.parse::<u16>().map_err(|_| bad())?;
    if !(100..=599).contains(&code) {
        return Err(bad());
    }
    Ok(StatusRange::new(code, code, exclude))
}
