//! Per-request cost in host-test: the empty filter (baseline) and the dedup
//! filter's cases, with ratios to the baseline printed at the end.
//!
//! Add a case by naming its module and configuration in `src/lib.rs`.

use criterion::Criterion;
use dedup_benches::{Case, BASELINE, BASELINE_64K, DEDUP};
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

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();

    let mut results = Vec::new();
    let Some(base) = bench(&mut c, &BASELINE) else {
        println!("the baseline cannot run: build the modules with `make wasm`");
        return;
    };
    let base = median(&base);
    results.push((BASELINE.name, base));
    if let Some(s) = bench(&mut c, &BASELINE_64K) {
        results.push((BASELINE_64K.name, median(&s)));
    }
    if DEDUP[0].path().exists() {
        for case in DEDUP {
            if let Some(s) = bench(&mut c, case) {
                results.push((case.name, median(&s)));
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
    for (name, t) in results {
        println!("  {name:<28} {:>10.1} µs   x{:.2}", t * 1e6, t / base);
    }
}
