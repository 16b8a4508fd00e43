//! Tests of per-route policy configuration (`rules`): errors with the rule's index,
//! inheritance of top-level fields, and the book's example (docs/src/recipes/rules.md).

use crate::config::{Config, OnInFlight};
use crate::testing::*;

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
