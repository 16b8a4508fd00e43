//! Per-request cost in host-test: the empty filter (baseline) and the dedup
//! filter's cases, with ratios to the baseline printed at the end. A run of
//! every case also writes the "## Filter per request (host-test)" section of
//! BENCHMARKS.md and its chart, benches/charts/per-request.svg
//! (`BENCH_NO_WRITE=1`: neither).
//!
//! Add a case by naming its module and configuration in `src/lib.rs`.

use criterion::Criterion;
use dedup_benches::{Case, BASELINE, BASELINE_64K, DEDUP};
use dedup_envoy::bench::{load_average, machine, micros, no_write, write_chart, write_section};
use dedup_envoy::chart::{self, Chart, Panel, Series};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Per-iteration times of each criterion sample, for the ratio table.
type Samples = Rc<RefCell<Vec<f64>>>;

fn bench(c: &mut Criterion, case: &Case) -> Option<Samples> {
    let mut envoy = match case.envoy() {
        Ok(e) => e,
        Err(e) => {
            println!("skipping {}: {e}", case.name);
            return None;
        }
    };
    // One request up front: a case whose filter fails is reported, not timed.
    match envoy.request(0, (case.request)(u64::MAX)) {
        Ok(r) if r.status < 500 => {}
        Ok(r) => {
            println!(
                "skipping {}: first request answered {} {}",
                case.name,
                r.status,
                r.body_str()
            );
            return None;
        }
        Err(e) => {
            println!("skipping {}: {e}", case.name);
            return None;
        }
    }
    let samples: Samples = Rc::default();
    let record = samples.clone();
    let mut n: u64 = 0;
    c.bench_function(case.name, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                n += 1;
                let resp = envoy.request(0, (case.request)(n));
                std::hint::black_box(resp.is_ok());
            }
            let elapsed = start.elapsed();
            record
                .borrow_mut()
                .push(elapsed.as_secs_f64() / iters.max(1) as f64);
            elapsed
        })
    });
    Some(samples)
}

fn median(samples: &Samples) -> f64 {
    let mut v = samples.borrow().clone();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

const SAMPLES: usize = 20;
const MEASUREMENT_SECONDS: u64 = 3;

fn main() {
    let load_before = load_average();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(MEASUREMENT_SECONDS))
        .sample_size(SAMPLES)
        .configure_from_args();

    let mut results = Vec::new();
    let Some(base) = bench(&mut c, &BASELINE) else {
        println!("the baseline cannot run: build the modules with `make wasm`");
        return;
    };
    let base = median(&base);
    results.push((&BASELINE, base));
    if let Some(s) = bench(&mut c, &BASELINE_64K) {
        results.push((&BASELINE_64K, median(&s)));
    }
    if DEDUP[0].path().exists() {
        for case in DEDUP {
            if let Some(s) = bench(&mut c, case) {
                results.push((case, median(&s)));
            }
        }
    } else {
        println!(
            "skipping the dedup cases: {} is absent (build it with `make wasm`)",
            DEDUP[0].path().display()
        );
    }
    c.final_summary();

    println!(
        "\nper-request cost in host-test (median of samples), ratio to {}:",
        BASELINE.name
    );
    for (case, t) in &results {
        println!(
            "  {:<28} {:>10.1} µs   x{:.2}",
            case.name,
            t * 1e6,
            t / base
        );
    }
    // Only a run of every case (no criterion filter, every module built)
    // replaces the published results.
    if results.len() == 2 + DEDUP.len() && !no_write() {
        if let Err(e) = publish(&results, base, &load_before) {
            println!("could not write BENCHMARKS.md: {e}");
        }
    }
}

fn publish(results: &[(&Case, f64)], base: f64, load_before: &str) -> dedup_envoy::Result<()> {
    let chart = Chart {
        title: "Filter per request in host-test: time and ratio to the empty filter".into(),
        subtitle: format!(
            "median of {SAMPLES} criterion samples of ~{MEASUREMENT_SECONDS} s per case, one worker; {}; load average before: {load_before}",
            machine()
        ),
        rows: results.iter().map(|(c, _)| c.about.to_string()).collect(),
        panels: vec![Panel {
            title: "µs per request, × the empty filter (lower is better)".into(),
            series: vec![Series::new(
                "µs per request",
                chart::BLUE,
                results.iter().map(|(_, t)| Some(t * 1e6)).collect(),
            )
            .labels(
                results
                    .iter()
                    .map(|(_, t)| format!("{} ×{:.2}", micros(*t), t / base))
                    .collect(),
            )],
        }],
    };
    let chart = write_chart("per-request.svg", &chart)?;
    let mut table = String::from("| case | per request | vs empty filter |\n|---|---:|---:|\n");
    for (case, t) in results {
        table.push_str(&format!(
            "| {} | {} | {:.2} |\n",
            case.about,
            micros(*t),
            t / base
        ));
    }
    let section = format!(
        "## Filter per request (host-test)\n\n\
`make bench` (`benches/benches/per_request.rs`, criterion): the compiled \
`dist/dedup_filter.wasm` driven through whole requests in host-test (wasmtime, \
one worker, in-process upstream), {SAMPLES} samples of ~{MEASUREMENT_SECONDS} s \
per case, ratios to the empty Wasm filter (`dist/empty_filter.wasm`, built from \
`host-test/probes/`) measured in the same run. The figure per case is the median \
of the samples' per-request times. Machine: {}; load average {load_before} when \
the run started (above ~1 means other work competed for the cores), so absolute \
times vary by tens of percent between runs; the ratios are steadier.\n\n\
{table}\n\
![Filter per request: µs and ratio to the empty filter per case]({chart})\n\n\
The 64 KiB keyless case is the body's copy into the VM and one BLAKE3 pass over \
it (Wasm SIMD; see \"BLAKE3 body hashing\" below): the body is hashed once, and \
the digest serves both the fingerprint key and the payload check.\n",
        machine()
    );
    write_section("## Filter per request (host-test)", &section)
}
