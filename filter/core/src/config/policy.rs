//! The policy fields (top level or a rule's): key, scope, methods, timing, sizes,
//! statuses and the payload a key is bound to.

use super::raw::{RawPayload, RawPolicy, RawPrincipal, RawUpstream};
use super::values::{json_pointer, parse_methods, parse_parts};
use super::*;

/// The policy fields under `prefix` (`""` at the top level, `rules[2].` in a rule). A
/// field left out keeps `base`'s value; an object given (`key`, `scope`, `payload`)
/// replaces `base`'s as a whole, its own missing sub-fields at their built-in defaults.
pub(super) fn parse_policy(
    prefix: &str,
    base: &Policy,
    raw: RawPolicy,
) -> Result<Policy, ConfigError> {
    let f = |name: &str| format!("{prefix}{name}");
    let d = Policy::default();
    let mut out = base.clone();
    if let Some(key) = raw.key {
        out.key_headers = match key.headers {
            Some(h) => header_names(&f("key.headers"), h, false)?,
            None => d.key_headers.clone(),
        };
        out.json_pointer = match key.json_pointer {
            Some(p) => Some(json_pointer(&f("key.json_pointer"), p)?),
            None => None,
        };
        out.fingerprint = match key.fingerprint {
            Some(parts) => parse_parts(&f("key.fingerprint"), parts)?,
            None => Vec::new(),
        };
        out.key_required = key.required.unwrap_or(DEFAULT_KEY_REQUIRED);
        out.key_max_length = fields::KEY_MAX_LENGTH.check(
            &f("key.max_length"),
            key.max_length,
            DEFAULT_KEY_MAX_LENGTH,
        )? as usize;
    }
    if let Some(payload) = raw.payload {
        out.payload = parse_payload(prefix, payload)?;
    }
    if let Some(scope) = raw.scope {
        let scope_headers = match scope.headers {
            Some(h) => header_names_with(&f("scope.headers"), h, true, true)?,
            None => Vec::new(),
        };
        if let Some(dup) = scope_headers
            .iter()
            .enumerate()
            .find(|(i, h)| scope_headers[..*i].contains(h))
        {
            return Err(err(
                &f("scope.headers"),
                format!("`{}` is listed twice", dup.1),
            ));
        }
        out.scope_headers = scope_headers;
        out.scope_authority = scope.authority.unwrap_or(DEFAULT_SCOPE_AUTHORITY);
    }
    if let Some(pr) = raw.principal {
        out.principal = parse_principal(prefix, pr)?;
    }
    if let Some(m) = raw.methods {
        out.methods = parse_methods(&f("methods"), m)?;
    }
    if let Some(o) = raw.on_duplicate {
        out.on_duplicate = o;
    }
    if let Some(o) = raw.on_in_flight {
        out.on_in_flight = o;
    }
    if let Some(o) = raw.on_unknown_outcome {
        out.on_unknown_outcome = o;
    }
    if let Some(g) = raw.grpc {
        out.grpc = g;
    }
    if let Some(a) = raw.advertise_expiry {
        out.advertise_expiry = a;
    }
    if let Some(e) = raw.errors {
        out.errors = super::errors::parse_errors(prefix, e)?;
    }
    out.ttl_ms =
        fields::TTL_SECONDS.check(&f("ttl_seconds"), raw.ttl_seconds, base.ttl_ms / 1000)? * 1000;
    out.in_flight_timeout_ms = fields::IN_FLIGHT_TIMEOUT_SECONDS.check(
        &f("in_flight_timeout_seconds"),
        raw.in_flight_timeout_seconds,
        base.in_flight_timeout_ms / 1000,
    )? * 1000;
    // A waiter never outlasts the claim it waits for: a wait timeout given here must
    // fit this policy's in-flight timeout; one inherited follows a shorter one down.
    let in_flight_ms = out.in_flight_timeout_ms;
    let (least, most) = (
        fields::WAIT_TIMEOUT_MS.min,
        fields::WAIT_TIMEOUT_MS.max(in_flight_ms / 1000),
    );
    out.wait_timeout_ms = match raw.wait_timeout_ms {
        Some(ms) if ms < least || ms > most => {
            return Err(err(
                &f("wait_timeout_ms"),
                format!(
                    "{ms} is out of range {least}..={most} (at most in_flight_timeout_seconds)"
                ),
            ))
        }
        Some(ms) => ms,
        None => base.wait_timeout_ms.min(in_flight_ms),
    };
    out.max_body_bytes = fields::MAX_BODY_BYTES.check(
        &f("max_body_bytes"),
        raw.max_body_bytes,
        base.max_body_bytes as u64,
    )? as usize;
    out.max_replay_body_bytes = fields::MAX_REPLAY_BODY_BYTES.check(
        &f("max_replay_body_bytes"),
        raw.max_replay_body_bytes,
        base.max_replay_body_bytes as u64,
    )? as usize;
    if let Some(list) = raw.store_statuses {
        let field = f("store_statuses");
        let ranges = list
            .iter()
            .map(|s| parse_status(&field, s))
            .collect::<Result<Vec<_>, _>>()?;
        if !ranges.iter().any(|r| !r.exclude) {
            return Err(err(
                &field,
                "must include at least one status or class (`!` entries only exclude)",
            ));
        }
        out.store_statuses = ranges;
    }
    if let Some(o) = raw.ordering {
        out.ordering = super::ordering::parse_ordering(prefix, o)?;
    }
    if let Some(up) = raw.upstream {
        out.detached = parse_upstream(prefix, up, out.in_flight_timeout_ms)?;
    } else if let Some(d) = &mut out.detached {
        // Inherited: its timeout still has to end before this policy's in-flight time.
        if d.timeout_ms >= out.in_flight_timeout_ms {
            return Err(err(
                &f("upstream.timeout_ms"),
                format!(
                    "{} (inherited) must be below in_flight_timeout_seconds ({} ms)",
                    d.timeout_ms, out.in_flight_timeout_ms
                ),
            ));
        }
    }
    Ok(out)
}

/// `upstream`: detached execution, when `detached` is true.
fn parse_upstream(
    prefix: &str,
    up: RawUpstream,
    in_flight_ms: u64,
) -> Result<Option<Detached>, ConfigError> {
    let f = |name: &str| format!("{prefix}upstream.{name}");
    if !up.detached.unwrap_or(false) {
        if up.cluster.is_some() || up.timeout_ms.is_some() || up.client_timeout_ms.is_some() {
            return Err(err(
                &f("detached"),
                "`cluster`, `timeout_ms` and `client_timeout_ms` apply only with `detached: true`",
            ));
        }
        return Ok(None);
    }
    let cluster = match up.cluster {
        Some(c)
            if !c.is_empty()
                && c.len() <= fields::MAX_CLUSTER_BYTES
                && !c.bytes().any(|b| b.is_ascii_control()) =>
        {
            c
        }
        Some(_) => {
            return Err(err(
                &f("cluster"),
                "must be an Envoy cluster name (1-256 visible characters)",
            ))
        }
        None => {
            return Err(err(
                &f("cluster"),
                "is required with `detached: true`: the Envoy cluster the route sends to",
            ))
        }
    };
    let timeout_ms = up.timeout_ms.unwrap_or(DEFAULT_DETACHED_TIMEOUT_MS);
    let least = fields::UPSTREAM_TIMEOUT_MS.min;
    if timeout_ms < least || timeout_ms > fields::UPSTREAM_TIMEOUT_MS.max(in_flight_ms / 1000) {
        return Err(err(
            &f("timeout_ms"),
            format!(
                "{timeout_ms} is out of range {least}..{in_flight_ms} (below in_flight_timeout_seconds, so no claim ends while its call runs)"
            ),
        ));
    }
    let least = fields::UPSTREAM_CLIENT_TIMEOUT_MS.min;
    let client_timeout_ms = match up.client_timeout_ms {
        Some(ms) if ms < least || ms > fields::UPSTREAM_CLIENT_TIMEOUT_MS.max(timeout_ms) => {
            return Err(err(
                &f("client_timeout_ms"),
                format!("{ms} is out of range {least}..{timeout_ms} (below upstream.timeout_ms)"),
            ))
        }
        other => other,
    };
    Ok(Some(Detached {
        cluster,
        timeout_ms,
        client_timeout_ms,
    }))
}

pub(super) fn parse_payload(prefix: &str, raw: RawPayload) -> Result<PayloadConfig, ConfigError> {
    let f = |name: &str| format!("{prefix}{name}");
    let pointers = |field: &str, list: Vec<String>| -> Result<Vec<String>, ConfigError> {
        if list.is_empty() || list.len() > fields::MAX_PAYLOAD_POINTERS {
            return Err(err(field, "must list 1 to 32 pointers"));
        }
        list.into_iter().map(|p| json_pointer(field, p)).collect()
    };
    let json = match (raw.json_pointers, raw.ignore_json_pointers) {
        (Some(_), Some(_)) => {
            return Err(err(
                &f("payload.ignore_json_pointers"),
                "set either payload.json_pointers or payload.ignore_json_pointers, not both",
            ))
        }
        (Some(only), None) => JsonSelection::Only(pointers(&f("payload.json_pointers"), only)?),
        (None, Some(ignore)) => {
            JsonSelection::Ignore(pointers(&f("payload.ignore_json_pointers"), ignore)?)
        }
        (None, None) => JsonSelection::Raw,
    };
    let parts = match raw.parts {
        Some(parts) => Some(parse_parts(&f("payload.parts"), parts)?),
        None => None,
    };
    if json != JsonSelection::Raw
        && parts
            .as_ref()
            .is_some_and(|p| !p.contains(&FingerprintPart::Body))
    {
        return Err(err(
            &f("payload.parts"),
            "JSON pointers select fields of the body: list \"body\" among the parts",
        ));
    }
    Ok(PayloadConfig { parts, json })
}

/// `principal`: exactly one of `header`, `cookie`, `metadata` or `none: true`.
fn parse_principal(prefix: &str, raw: RawPrincipal) -> Result<PrincipalSource, ConfigError> {
    let f = |name: &str| format!("{prefix}{name}");
    // `none: false` is no choice of its own: the default source, unless another is given.
    if raw.none == Some(false)
        && (raw.header.is_some() || raw.cookie.is_some() || raw.metadata.is_some())
    {
        return Err(err(
            &f("principal.none"),
            "`false` with another source: give only that source",
        ));
    }
    let none = raw.none == Some(true);
    if raw.none == Some(false) {
        return Ok(PrincipalSource::Header(
            DEFAULT_PRINCIPAL_HEADER.to_string(),
        ));
    }
    let given = [
        raw.header.is_some(),
        raw.cookie.is_some(),
        raw.metadata.is_some(),
        none,
    ]
    .iter()
    .filter(|&&b| b)
    .count();
    if given != 1 {
        return Err(err(
            &f("principal"),
            "give exactly one of `header`, `cookie`, `metadata` or `none: true`",
        ));
    }
    if let Some(h) = raw.header {
        let name = header_names(&f("principal.header"), vec![h], false)?.remove(0);
        return Ok(PrincipalSource::Header(name));
    }
    if let Some(c) = raw.cookie {
        let ok = !c.is_empty()
            && c.len() <= fields::MAX_PRINCIPAL_NAME_BYTES
            && c.bytes()
                .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
        if !ok {
            return Err(err(
                &f("principal.cookie"),
                format!(
                    "`{c}` is not a cookie name (1 to {} characters of an RFC 6265 token)",
                    fields::MAX_PRINCIPAL_NAME_BYTES
                ),
            ));
        }
        return Ok(PrincipalSource::Cookie(c));
    }
    if let Some(path) = raw.metadata {
        let field = f("principal.metadata");
        if path.len() < 2 || path.len() > fields::MAX_METADATA_PATH {
            return Err(err(
                &field,
                format!(
                    "list the filter's metadata namespace, then 1 to {} keys inside it \
                     (e.g. [\"envoy.filters.http.jwt_authn\", \"jwt_payload\", \"sub\"])",
                    fields::MAX_METADATA_PATH - 1
                ),
            ));
        }
        if let Some(bad) = path
            .iter()
            .find(|s| s.is_empty() || s.len() > 256 || s.contains('\0'))
        {
            return Err(err(
                &field,
                format!("`{bad}` is not a metadata key (1 to 256 bytes, no NUL)"),
            ));
        }
        let property = metadata_property(&path);
        return Ok(PrincipalSource::Metadata { path, property });
    }
    Ok(PrincipalSource::None)
}

/// The Envoy property that holds dynamic metadata at `path` (the filter's namespace,
/// then keys inside its struct), encoded as the glue asks for it: segments joined by NUL.
pub fn metadata_property(path: &[String]) -> String {
    let mut out = String::from("metadata\0filter_metadata");
    for seg in path {
        out.push('\0');
        out.push_str(seg);
    }
    out
}
