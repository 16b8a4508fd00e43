//! Timing batches of requests: seconds per request, medians, cases run in turn.

use super::Res;
use std::time::Instant;

/// Seconds per request of `n` requests.
pub(super) fn timed(n: u64, mut one: impl FnMut(u64) -> Res<()>) -> Res<f64> {
    let start = Instant::now();
    for j in 0..n {
        one(j)?;
    }
    Ok(start.elapsed().as_secs_f64() / n.max(1) as f64)
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A case measured batch by batch: `batch(b)` runs batch `b` and returns its
/// seconds per request.
pub(super) type Batch<'a> = Box<dyn FnMut(usize) -> Res<f64> + 'a>;

/// Runs the batches of every case in turn, `batches` rounds; the median per case.
pub(super) fn interleaved(batches: usize, cases: &mut [Batch]) -> Res<Vec<f64>> {
    let mut times = vec![Vec::new(); cases.len()];
    for b in 0..batches {
        for (case, t) in cases.iter_mut().zip(times.iter_mut()) {
            t.push(case(b)?);
        }
    }
    Ok(times.into_iter().map(median).collect())
}
