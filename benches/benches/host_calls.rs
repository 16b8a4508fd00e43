//! Host calls and bytes copied per request, by case: the compiled modules in
//! host-test with every import counted ([`host_test::EnvoyBuilder::count_host_calls`]).
//! Prints a table and writes the "## Host calls per request (host-test)"
//! section of BENCHMARKS.md (`BENCH_NO_WRITE=1`: prints only). Counts, not
//! times: the same on any machine, so a change in the hot path shows here as
//! an exact difference.

use dedup_benches::{host_calls_of, BASELINE, BASELINE_64K, DEDUP};
use dedup_envoy::bench::{no_write, write_section};

/// Requests counted per case (after one that is not: it loads the module's
/// lazily built state and, for the replay case, stores the response).
const REQUESTS: u64 = 50;

fn per_request(n: u64) -> f64 {
    n as f64 / REQUESTS as f64
}

fn main() {
    let mut rows = Vec::new();
    for case in [&BASELINE, &BASELINE_64K].into_iter().chain(DEDUP) {
        match host_calls_of(case, REQUESTS) {
            Ok(h) => rows.push((case, h)),
            Err(e) => println!("skipping {}: {e}", case.name),
        }
    }
    let mut table = String::from(
        "| case | host calls | bytes to the guest | bytes from the guest | calls by import |\n|---|---:|---:|---:|---|\n",
    );
    for (case, h) in &rows {
        let mut by_import: Vec<(&String, &u64)> = h.calls.iter().collect();
        by_import.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let imports = by_import
            .iter()
            .map(|(name, n)| {
                format!(
                    "{} {:.1}",
                    name.trim_start_matches("proxy_"),
                    per_request(**n)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        table.push_str(&format!(
            "| {} | {:.1} | {:.0} | {:.0} | {} |\n",
            case.about,
            per_request(h.total()),
            per_request(h.bytes_out),
            per_request(h.bytes_in),
            imports
        ));
    }
    println!("\nhost calls and bytes per request (mean of {REQUESTS}):\n\n{table}");
    if rows.len() < 2 + DEDUP.len() || no_write() {
        return;
    }
    let section = format!(
        "## Host calls per request (host-test)\n\n\
`make bench` (`benches/benches/host_calls.rs`): the same cases as above, each \
import of the module wrapped to count its calls, and the bytes copied through \
guest memory counted (to the guest: what the filter reads, such as headers, a \
body or a shared-data value; from the guest: what it hands to the host, such \
as header names, a shared-data value it sets or a local reply). Mean per request \
over {REQUESTS} requests after a first one. Counts, not times: they do not \
depend on the machine, and a change to the hot path shows here exactly.\n\n{table}"
    );
    if let Err(e) = write_section("## Host calls per request (host-test)", &section) {
        println!("could not write BENCHMARKS.md: {e}");
    }
}
