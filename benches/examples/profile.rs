//! Runs one benchmark case in a loop, for a profiler:
//! `perf record -g cargo run --release -p dedup-benches --example profile -- <case> [requests]`
//! (`<case>` is a name from `benches/src/lib.rs`, e.g. `first_execution`).
//! Prints the mean time per request so a profile can be read against it.

use dedup_benches::{BASELINE, BASELINE_64K, DEDUP};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "first_execution".into());
    let requests: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let all = [&BASELINE, &BASELINE_64K].into_iter().chain(DEDUP.iter());
    let Some(case) = all.clone().find(|c| c.name == name) else {
        let names: Vec<_> = all.map(|c| c.name).collect();
        eprintln!("no case {name}; cases: {}", names.join(", "));
        std::process::exit(2);
    };
    let mut envoy = match case.envoy() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(1);
        }
    };
    let start = Instant::now();
    let mut failed = 0;
    for i in 0..requests {
        match envoy.request(0, (case.request)(i)) {
            Ok(r) if r.status < 500 => {}
            _ => failed += 1,
        }
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / requests as f64;
    println!("{name}: {requests} requests, {per:.1} µs each, {failed} failed");
}
