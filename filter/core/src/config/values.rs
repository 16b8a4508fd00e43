//! Checks of single values: header names, methods, JSON pointers, request parts, status classes.

use super::fields::MAX_HEADERS;
use super::{err, ConfigError, FingerprintPart, StatusRange};

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
    if names.len() > MAX_HEADERS {
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

/// Request headers Envoy's connection manager sets, appends to or overwrites on its own,
/// before any HTTP filter sees the request (so not a client's key), with what it does.
/// `x-request-id` is special: with `preserve_external_request_id: true` and
/// `generate_request_id: false` Envoy keeps a client's and adds none, so it may be a key
/// once `request_id_preserved` says those are set.
pub const ENVOY_SET_HEADERS: [(&str, &str); 9] = [
    (
        "x-request-id",
        "Envoy generates one for every request without it and replaces an outside client's",
    ),
    (
        "x-forwarded-for",
        "Envoy appends the peer's address (use_remote_address)",
    ),
    (
        "x-forwarded-proto",
        "Envoy sets it to the downstream scheme on edge requests",
    ),
    (
        "x-envoy-external-address",
        "Envoy sets it to the client's address on edge requests",
    ),
    (
        "x-envoy-internal",
        "Envoy sets or removes it by where the request came from",
    ),
    (
        "x-forwarded-client-cert",
        "Envoy sanitizes, sets or appends it from the client certificate (forward_client_cert_details)",
    ),
    (
        "x-forwarded-host",
        "Envoy appends the original host when it rewrites one (append_x_forwarded_host)",
    ),
    (
        "x-forwarded-port",
        "Envoy sets it to the listener's port (append_x_forwarded_port)",
    ),
    (
        "x-envoy-original-path",
        "Envoy sets it when a route rewrites the path",
    ),
];

/// A policy's key may not come from a header Envoy sets on its own (`ENVOY_SET_HEADERS`):
/// the filter would take Envoy's value for the client's key, silently (every retry a
/// new key, or a missing key never missing). `x-request-id` is allowed, as a key and in
/// a scope or fingerprint, once `request_id_preserved` says Envoy keeps the client's.
pub(super) fn check_envoy_set_headers(
    prefix: &str,
    p: &super::Policy,
    request_id_preserved: bool,
) -> Result<(), ConfigError> {
    let request_id = |field: &str| {
        err(
            &format!("{prefix}{field}"),
            "`x-request-id` is set by Envoy's connection manager: it generates one for every \
             request that has none (so `key.required` never fires and every retry is a new key) \
             and replaces an outside client's. Set `preserve_external_request_id: true` and \
             `generate_request_id: false` on the http_connection_manager (and, with tracing, the \
             UUID request_id_extension's `pack_trace_reason: false`), then `request_id_preserved: \
             true` here to say so (`dedupctl envoy-filter` prints those settings)",
        )
    };
    for name in &p.key_headers {
        if name == "x-request-id" {
            if !request_id_preserved {
                return Err(request_id("key.headers"));
            }
            continue;
        }
        if let Some((_, why)) = ENVOY_SET_HEADERS.iter().find(|(h, _)| h == name) {
            return Err(err(
                &format!("{prefix}key.headers"),
                format!("`{name}` is not a client's key: {why}"),
            ));
        }
    }
    if request_id_preserved {
        return Ok(());
    }
    if p.scope_headers.iter().any(|h| h == "x-request-id") {
        return Err(request_id("scope.headers"));
    }
    if p.fingerprint
        .iter()
        .any(|f| matches!(f, super::FingerprintPart::Header(h) if h == "x-request-id"))
    {
        return Err(request_id("key.fingerprint"));
    }
    if matches!(&p.principal, super::PrincipalSource::Header(h) if h == "x-request-id") {
        return Err(request_id("principal.header"));
    }
    Ok(())
}

pub(super) fn parse_methods(field: &str, m: Vec<String>) -> Result<Vec<String>, ConfigError> {
    if m.is_empty() {
        return Err(err(field, "must list at least one method"));
    }
    for x in &m {
        if x.is_empty() || !x.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(err(
                field,
                format!("`{x}` is not an upper-case HTTP method"),
            ));
        }
    }
    Ok(m)
}

/// An RFC 6901 pointer into a JSON body, checked.
pub(super) fn json_pointer(field: &str, p: String) -> Result<String, ConfigError> {
    if p.is_empty() || !p.starts_with('/') {
        return Err(err(
            field,
            format!("`{p}` is not an RFC 6901 pointer (must start with '/')"),
        ));
    }
    if let Some(bad) = invalid_escape(&p) {
        return Err(err(
            field,
            format!("`{p}` has an invalid escape `~{bad}` (only ~0 and ~1)"),
        ));
    }
    Ok(p)
}

/// Parts of a request (keyless fingerprint, payload check), at least one, none twice.
pub(super) fn parse_parts(
    field: &str,
    parts: Vec<String>,
) -> Result<Vec<FingerprintPart>, ConfigError> {
    if parts.is_empty() {
        return Err(err(field, "must list at least one part"));
    }
    let mut out = Vec::new();
    for p in parts {
        let part = match p.as_str() {
            "method" => FingerprintPart::Method,
            "path" => FingerprintPart::Path,
            "query" => FingerprintPart::Query,
            "body" => FingerprintPart::Body,
            other => match other.strip_prefix("header:") {
                Some(h) if header_name_ok(h, true) => FingerprintPart::Header(h.to_ascii_lowercase()),
                _ => {
                    return Err(err(
                        field,
                        format!("`{other}`: expected \"method\", \"path\", \"query\", \"body\" or \"header:<name>\" (a header or :authority, :path, :method)"),
                    ))
                }
            },
        };
        if out.contains(&part) {
            return Err(err(field, format!("`{p}` is listed twice")));
        }
        out.push(part);
    }
    Ok(out)
}

/// Returns the character after a `~` that is not `0` or `1`, if any.
pub(super) fn invalid_escape(p: &str) -> Option<String> {
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') | Some('1') => {}
                Some(o) => return Some(o.to_string()),
                None => return Some(String::new()),
            }
        }
    }
    None
}
