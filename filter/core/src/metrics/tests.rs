//! Tests of the counters' names.

use crate::metrics::Counter;

#[test]
fn counters_have_distinct_documented_names_and_their_own_index() {
    let names: std::collections::HashSet<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
    assert_eq!(names.len(), Counter::ALL.len());
    for (i, c) in Counter::ALL.iter().enumerate() {
        assert!(c.name().starts_with("proxy_dedup_"), "{c:?}");
        assert_eq!(c.index(), i, "{c:?}");
    }
    assert_eq!(Counter::Executed.name(), "proxy_dedup_executed");
}
