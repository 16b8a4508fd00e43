//! bench-envoy prices the dedup filter's host calls with its per-call table
//! (`dedup_envoy::bench::FILTER_CALLS`); those lists must be the calls the filter
//! makes, as host-test counts them, or the "host calls, priced" column is fiction.

use dedup_benches::{host_calls_of, Case, DEDUP};
use dedup_envoy::bench::FILTER_CALLS;

/// bench-envoy's case name for each host-test benchmark case.
const SAME_CASE: &[(&str, &str)] = &[
    (
        "dedup_bypassed_get",
        "dedup, GET entering the filter (bypassed)",
    ),
    (
        "dedup_first_execution",
        "dedup, first execution, empty store",
    ),
    ("dedup_replay", "dedup, replay"),
];

/// What host-test counts per request for `case`, by call name (`get_shared_data`…).
fn calls_per_request(case: &Case, requests: u64) -> Vec<(String, f64)> {
    let counted = host_calls_of(case, requests).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let mut got: Vec<(String, f64)> = counted
        .calls
        .iter()
        .map(|(name, n)| {
            let name = name
                .trim_start_matches("env::")
                .trim_start_matches("proxy_");
            (name.to_string(), *n as f64 / requests as f64)
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    got
}

/// bench-envoy's mimics (hostcall-probe's `mimic_*`) make exactly the calls the dedup
/// filter makes in the case they stand beside, or "the filter's own logic" is fiction.
#[test]
fn the_mimics_make_the_filters_calls() {
    const REQUESTS: u64 = 20;
    for (bench, mimic) in [
        ("dedup_first_execution", "mimic_first_execution"),
        ("dedup_replay", "mimic_replay"),
    ] {
        let case = DEDUP.iter().find(|c| c.name == bench).unwrap();
        let probe = Case {
            name: mimic,
            about: mimic,
            wasm: "hostcall_probe.wasm",
            plugin_config: mimic,
            ..*case
        };
        assert_eq!(
            calls_per_request(&probe, REQUESTS),
            calls_per_request(case, REQUESTS),
            "{mimic} makes other calls than {bench}"
        );
    }
}

#[test]
fn filter_calls_match_host_test() {
    const REQUESTS: u64 = 20;
    for (bench, envoy_case) in SAME_CASE {
        let case = DEDUP
            .iter()
            .find(|c| c.name == *bench)
            .unwrap_or_else(|| panic!("no host-test case {bench}"));
        let got = calls_per_request(case, REQUESTS);
        let (_, listed) = FILTER_CALLS
            .iter()
            .find(|(n, _)| n == envoy_case)
            .unwrap_or_else(|| panic!("FILTER_CALLS has no {envoy_case}"));
        let mut want: Vec<(String, f64)> =
            listed.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got, want,
            "{envoy_case}: FILTER_CALLS differs from host-test's count"
        );
    }
}
