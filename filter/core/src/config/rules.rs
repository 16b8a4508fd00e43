//! `rules`: named routes with their own policy, and the `match` that selects one.

use super::fields::{MAX_RULES, MAX_RULE_NAME_BYTES};
use super::policy::parse_policy;
use super::raw::{RawMatch, RawRule};
use super::values::parse_methods;
use super::*;

/// The records group of the top-level policy, as `records_of` names it.
pub const DEFAULT_RECORDS: &str = "default";

/// A rule name: 1-64 of `A-Z a-z 0-9 _ - .`; `default` is reserved for `records_of`.
pub(super) fn rule_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_RULE_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

pub(super) fn parse_rules(top: &Policy, raw: Vec<RawRule>) -> Result<Vec<Rule>, ConfigError> {
    if raw.len() > MAX_RULES {
        return Err(err("rules", format!("at most {MAX_RULES} rules")));
    }
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.len());
    let mut shares: Vec<Option<String>> = Vec::with_capacity(raw.len());
    for (i, mut r) in raw.into_iter().enumerate() {
        let raw_policy = r.take_policy();
        let prefix = format!("rules[{i}].");
        let f = |name: &str| format!("{prefix}{name}");
        let name =
            match r.name {
                None => {
                    return Err(err(
                        &f("name"),
                        "required: a stable name, part of the identity of the rule's records",
                    ))
                }
                Some(n) if n == DEFAULT_RECORDS => return Err(err(
                    &f("name"),
                    "`default` is reserved (records_of: \"default\" names the top-level records)",
                )),
                Some(n) if !rule_name_ok(&n) => {
                    return Err(err(
                        &f("name"),
                        format!("`{n}`: 1-64 characters of A-Z, a-z, 0-9, `_`, `-`, `.`"),
                    ))
                }
                Some(n) => n,
            };
        if let Some(j) = rules.iter().position(|o| o.name == name) {
            return Err(err(
                &f("name"),
                format!("`{name}` is already the name of rules[{j}]"),
            ));
        }
        let matcher = parse_match(&prefix, r.matcher)?;
        let bypass = r.bypass.unwrap_or(false);
        if bypass {
            let records_of = r.records_of.is_some().then_some("records_of");
            if let Some(field) = raw_policy.set_fields().chain(records_of).next() {
                return Err(err(
                    &f("bypass"),
                    format!("a bypassed rule takes no policy fields, but `{field}` is set"),
                ));
            }
        }
        let mut policy = parse_policy(&prefix, top, raw_policy)?;
        policy.rule = Some(name.clone());
        policy.records = Some(name.clone());
        policy.bypass = bypass;
        shares.push(r.records_of);
        rules.push(Rule {
            name,
            matcher,
            policy,
        });
    }
    // Sharing is resolved once every name is known: a rule may name a later one.
    for i in 0..rules.len() {
        let Some(target) = shares[i].clone() else {
            continue;
        };
        let field = format!("rules[{i}].records_of");
        let other = if target == DEFAULT_RECORDS {
            top
        } else {
            match rules.iter().position(|r| r.name == target) {
                None => {
                    return Err(err(
                        &field,
                        format!("`{target}` is not the name of a rule (nor \"default\")"),
                    ))
                }
                Some(j) if j == i => return Err(err(&field, "a rule cannot name itself")),
                Some(j) if shares[j].is_some() => {
                    return Err(err(
                        &field,
                        format!(
                        "`{target}` shares another rule's records itself: name that rule instead"
                    ),
                    ))
                }
                Some(j) if rules[j].policy.bypass => {
                    return Err(err(
                        &field,
                        format!("`{target}` is bypassed: it has no records"),
                    ))
                }
                Some(j) => &rules[j].policy,
            }
        };
        if let Some(what) = rules[i].policy.identity_differs(other) {
            return Err(err(
                &field,
                format!("rules sharing records must have the same key, scope and payload settings; `{what}` differs from `{target}`'s"),
            ));
        }
        rules[i].policy.records = (target != DEFAULT_RECORDS).then_some(target);
    }
    Ok(rules)
}

pub(super) fn parse_match(prefix: &str, raw: Option<RawMatch>) -> Result<RuleMatch, ConfigError> {
    let f = |name: &str| format!("{prefix}{name}");
    let Some(m) = raw else {
        return Err(err(
            &f("match"),
            "required: when the rule applies (path_prefix, path_exact, methods, authority, header)",
        ));
    };
    let path = |field: &str, p: Option<String>| -> Result<Option<String>, ConfigError> {
        match p {
            Some(p)
                if !p.starts_with('/') || p.contains('?') || p.chars().any(char::is_control) =>
            {
                Err(err(
                    &f(field),
                    format!("`{p}` must start with '/' and have no query or control characters"),
                ))
            }
            other => Ok(other),
        }
    };
    let path_prefix = path("match.path_prefix", m.path_prefix)?;
    let path_exact = path("match.path_exact", m.path_exact)?;
    if path_prefix.is_some() && path_exact.is_some() {
        return Err(err(
            &f("match.path_exact"),
            "set either match.path_prefix or match.path_exact, not both",
        ));
    }
    let methods = match m.methods {
        Some(list) => Some(parse_methods(&f("match.methods"), list)?),
        None => None,
    };
    let authority = match m.authority {
        Some(a) if a.is_empty() || a.chars().any(|c| c.is_control() || c == ' ' || c == '/') => {
            return Err(err(&f("match.authority"), format!("`{a}` is not a host")))
        }
        other => other.map(|a| a.to_ascii_lowercase()),
    };
    let header = match m.header {
        Some(h) => {
            if !header_name_ok(&h.name, false) {
                return Err(err(
                    &f("match.header.name"),
                    format!("`{}` is not a valid header name", h.name),
                ));
            }
            if h.equals
                .as_ref()
                .is_some_and(|v| v.chars().any(char::is_control))
            {
                return Err(err(
                    &f("match.header.equals"),
                    "control characters cannot be in a header value",
                ));
            }
            Some(HeaderMatch {
                name: h.name.to_ascii_lowercase(),
                equals: h.equals,
            })
        }
        None => None,
    };
    let matcher = RuleMatch {
        path_prefix,
        path_exact,
        methods,
        authority,
        header,
    };
    if matcher == RuleMatch::default() {
        return Err(err(
            &f("match"),
            "empty: name at least one of path_prefix, path_exact, methods, authority, header \
             (the top-level fields are the policy of every request no rule matches)",
        ));
    }
    Ok(matcher)
}

#[cfg(test)]
mod tests;
