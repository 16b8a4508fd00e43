//! Tests of per-route policy configuration (`rules`): errors with the rule's index,
//! inheritance of top-level fields, and the book's example (docs/src/recipes/rules.md).

use crate::config::{Config, OnInFlight};
use crate::testing::*;

fn rule_err(rules: &str) -> (String, String) {
    cfg_err(&format!(r#"{{"rules": [{rules}]}}"#))
}

const OK_RULE: &str = r#"{"name": "a", "match": {"path_prefix": "/a"}}"#;

#[test]
fn rule_config_errors_name_the_rule_index_and_the_field() {
    let cases: &[(&str, &str)] = &[
        (r#"{"match": {"path_prefix": "/b"}}"#, "rules[1].name"),
        (
            r#"{"name": "", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (
            r#"{"name": "a b", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (
            r#"{"name": "default", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (
            r#"{"name": "a", "match": {"path_prefix": "/b"}}"#,
            "rules[1].name",
        ),
        (r#"{"name": "b"}"#, "rules[1].match"),
        (r#"{"name": "b", "match": {}}"#, "rules[1].match"),
        (
            r#"{"name": "b", "match": {"path_prefx": "/b"}}"#,
            "rules[1].match",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "b"}}"#,
            "rules[1].match.path_prefix",
        ),
        (
            r#"{"name": "b", "match": {"path_exact": "/b?x=1"}}"#,
            "rules[1].match.path_exact",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b", "path_exact": "/b"}}"#,
            "rules[1].match.path_exact",
        ),
        (
            r#"{"name": "b", "match": {"methods": []}}"#,
            "rules[1].match.methods",
        ),
        (
            r#"{"name": "b", "match": {"methods": ["post"]}}"#,
            "rules[1].match.methods",
        ),
        (
            r#"{"name": "b", "match": {"authority": "a b"}}"#,
            "rules[1].match.authority",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": "x y"}}}"#,
            "rules[1].match.header.name",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": ":path"}}}"#,
            "rules[1].match.header.name",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": "x", "equals": "a\u0001"}}}"#,
            "rules[1].match.header.equals",
        ),
        (
            r#"{"name": "b", "match": {"header": {"name": "x", "value": "y"}}}"#,
            "rules[1].match.header",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "bypass": true, "ttl_seconds": 5}"#,
            "rules[1].bypass",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "bypass": true, "records_of": "a"}"#,
            "rules[1].bypass",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "ttl_seconds": 0}"#,
            "rules[1].ttl_seconds",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "in_flight_timeout_seconds": 86401}"#,
            "rules[1].in_flight_timeout_seconds",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "key": {"json_pointer": "x"}}"#,
            "rules[1].key.json_pointer",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "key": {"headerz": ["x"]}}"#,
            "rules[1].key",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "scope": {"headers": ["a", "a"]}}"#,
            "rules[1].scope.headers",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "store_statuses": ["!5xx"]}"#,
            "rules[1].store_statuses",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "payload": {"json_pointers": ["/a"], "parts": ["method"]}}"#,
            "rules[1].payload.parts",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "max_body_bytes": 67108865}"#,
            "rules[1].max_body_bytes",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "records_of": "zz"}"#,
            "rules[1].records_of",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "records_of": "b"}"#,
            "rules[1].records_of",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "records_of": "a", "scope": {"authority": false}}"#,
            "rules[1].records_of",
        ),
        (
            r#"{"name": "b", "match": {"path_prefix": "/b"}, "retry_after_seconds": 3}"#,
            "rules[1]",
        ),
    ];
    for (rule, field) in cases {
        let (got, reason) = rule_err(&format!("{OK_RULE}, {rule}"));
        assert!(
            got == *field || got.starts_with(&format!("{field}.")),
            "{rule}: field `{got}` ({reason}), expected `{field}`"
        );
    }
    // A chain of sharing names the rule that owns the records instead.
    let (field, reason) = rule_err(&format!(
        r#"{OK_RULE}, {{"name": "b", "match": {{"path_prefix": "/b"}}, "records_of": "a"}},
           {{"name": "c", "match": {{"path_prefix": "/c"}}, "records_of": "b"}}"#
    ));
    assert_eq!(field, "rules[2].records_of", "{reason}");
    // A bypassed rule has no records to share.
    let (field, _) = rule_err(
        r#"{"name": "s", "match": {"path_prefix": "/s"}, "bypass": true},
           {"name": "b", "match": {"path_prefix": "/b"}, "records_of": "s"}"#,
    );
    assert_eq!(field, "rules[1].records_of");
    // With etcd, a rule's replay cap must fit a record too.
    let (field, _) = cfg_err(&format!(
        r#"{{{ETCD}, "rules": [{{"name": "b", "match": {{"path_prefix": "/b"}}, "max_replay_body_bytes": 16777216}}]}}"#
    ));
    assert_eq!(field, "rules[0].max_replay_body_bytes");
    let (field, _) = cfg_err(r#"{"rules": {"name": "a"}}"#);
    assert_eq!(field, "rules");
    // The message names the field, so the one log line says which rule is wrong.
    let e = Config::parse(
        format!(r#"{{"rules": [{OK_RULE}, {{"name": "a", "match": {{"methods": ["PUT"]}}}}]}}"#)
            .as_bytes(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("rules[1].name"), "{e}");
    assert!(e.reason.contains("rules[0]"), "{}", e.reason);
}

#[test]
fn rules_inherit_the_top_level_fields_they_leave_out() {
    let c = Config::parse(
        br#"{"ttl_seconds": 600, "methods": ["POST"], "scope": {"headers": ["x-tenant"]},
             "key": {"headers": ["x-id"], "required": true},
             "rules": [
               {"name": "a", "match": {"path_prefix": "/a"}, "in_flight_timeout_seconds": 5},
               {"name": "b", "match": {"path_prefix": "/b"}, "key": {"json_pointer": "/id"}, "ttl_seconds": 7}
             ]}"#,
    )
    .unwrap();
    let (a, b) = (&c.rules[0].policy, &c.rules[1].policy);
    assert_eq!(
        (a.ttl_ms, a.in_flight_timeout_ms, a.key_required),
        (600_000, 5_000, true)
    );
    assert_eq!(a.key_headers, vec!["x-id"]);
    assert_eq!(a.scope_headers, vec!["x-tenant"]);
    assert_eq!(
        (a.rule.as_deref(), a.records.as_deref()),
        (Some("a"), Some("a"))
    );
    // An object given replaces the top-level one as a whole: built-in defaults inside.
    assert_eq!(b.key_headers, vec!["idempotency-key"]);
    assert_eq!(b.json_pointer.as_deref(), Some("/id"));
    assert!(!b.key_required);
    assert_eq!((b.ttl_ms, b.in_flight_timeout_ms), (7_000, 30_000));
    assert_eq!(b.methods, vec!["POST"]);
    assert_eq!(c.policy.rule, None);
    assert_eq!(c.policy.records, None);
}

#[test]
fn rules_override_wait_mode_and_their_errors_name_the_rule() {
    let c = Config::parse(
        br#"{"wait_timeout_ms": 8000, "rules": [
            {"name": "pay", "match": {"path_prefix": "/pay"}, "on_in_flight": "wait"},
            {"name": "short", "match": {"path_prefix": "/s"}, "on_in_flight": "wait",
             "in_flight_timeout_seconds": 3},
            {"name": "own", "match": {"path_prefix": "/o"}, "wait_timeout_ms": 2000}]}"#,
    )
    .unwrap();
    assert_eq!(c.policy.on_in_flight, OnInFlight::Reject);
    let pay = &c.rules[0].policy;
    assert_eq!(
        (pay.on_in_flight, pay.wait_timeout_ms),
        (OnInFlight::Wait, 8_000)
    );
    assert_eq!(
        c.rules[1].policy.wait_timeout_ms, 3_000,
        "an inherited wait timeout follows the rule's shorter in-flight timeout"
    );
    assert_eq!(c.rules[2].policy.wait_timeout_ms, 2_000);
    assert!(c.waits());
    assert_eq!(c.longest_wait_ms(), 8_000);
    assert!(!Config::parse(b"{}").unwrap().waits());
    let (field, _) = cfg_err(
        r#"{"rules": [{"name": "a", "match": {"path_prefix": "/a"},
            "in_flight_timeout_seconds": 2, "wait_timeout_ms": 2500}]}"#,
    );
    assert_eq!(field, "rules[0].wait_timeout_ms");
    let (field, _) = cfg_err(
        r#"{"rules": [{"name": "a", "match": {"path_prefix": "/a"}, "bypass": true,
            "on_in_flight": "wait"}]}"#,
    );
    assert_eq!(field, "rules[0].bypass");
}

#[test]
fn the_readme_example_parses_and_means_what_it_says() {
    let page = include_str!("../../../../../docs/src/recipes/rules.md");
    let section = &page[page.find("# Per-route policies").unwrap()..];
    let start = section.find("```json\n").unwrap() + "```json\n".len();
    let json = &section[start..start + section[start..].find("```").unwrap()];
    let c = Config::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{e}\n{json}"));
    let names: Vec<&str> = c.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["payments", "webhooks", "search"]);
    let hook = &c.rules[1].policy;
    assert_eq!(
        hook.scope_headers,
        vec!["x-tenant"],
        "the top-level scope is kept"
    );
    assert_eq!(hook.ttl_ms, 604_800_000);
    assert!(hook.stores_status(200) && !hook.stores_status(404));
    assert!(c.rules[2].policy.bypass);
}
