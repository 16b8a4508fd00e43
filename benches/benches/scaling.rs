//! How the filter's per-request cost grows, in host-test: with the body size,
//! with the store's fill (empty vs 90% of `capacity`, for two capacities),
//! with workers (1 vs 2), and the memory a stored record takes (shared data,
//! and the etcd store's per-worker tier of completed records). Prints the
//! tables and writes the "## Scaling (host-test)" section of BENCHMARKS.md
//! (`BENCH_NO_WRITE=1`: prints only).
//!
//! Plain timing, not criterion: each figure is the median over a few batches
//! of many requests of the time per request, the batches of the cases being
//! compared run in turn (so a burst of other work hits each alike), and every
//! figure is given as a ratio to the empty filter measured in the same run.
//! `SCALING_LARGE_CAPACITY=100000` replaces the large capacity (default
//! 1,000,000) for a quicker run.

use dedup_benches::{Case, BASELINE, DEDUP};
use dedup_core::response::StoredResponse;
use dedup_core::stores::etcd::local::{LocalEntry, LocalTier, MAX_BYTES, MAX_ENTRIES};
use dedup_envoy::bench::{load_average, micros, no_write, write_section};
use host_test::{EnvoyBuilder, Request, SimEnvoy};
use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Live heap bytes of this process, for the local tier's memory per entry.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

type Res<T> = Result<T, String>;

#[path = "scaling/report.rs"]
mod report;
#[path = "scaling/timing.rs"]
mod timing;

use report::section;
use timing::{interleaved, median, timed, Batch};

/// Batches per figure (the median of their per-request times is reported).
const BATCHES: usize = 7;
/// Batches for the small store (50 requests each, refilled before each).
const SMALL_STORE_BATCHES: usize = 31;
/// One TTL and a second: every record written before is expired after it.
const PAST_TTL: Duration = Duration::from_secs(86_401);
const LARGE_BODY_LIMIT: usize = 4 << 20;

fn large_capacity() -> u64 {
    std::env::var("SCALING_LARGE_CAPACITY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// An Envoy of `case`'s module with this plugin configuration.
fn envoy(case: &Case, vm_id: &str, config: &str, workers: usize) -> Res<SimEnvoy> {
    let b: EnvoyBuilder = case
        .builder()
        .vm_id(vm_id)
        .plugin_config(config)
        .workers(workers)
        .buffer_limit(LARGE_BODY_LIMIT);
    b.build().map_err(|e| format!("{vm_id}: {e}"))
}

/// A body of `size` bytes, distinct per `i` when it has room for it.
fn body(i: u64, size: usize) -> Vec<u8> {
    let mut b = format!("{i:016}").into_bytes();
    b.resize(size, b'x');
    b
}

fn keyed(i: u64, size: usize) -> Request {
    Request::post("/orders")
        .header("idempotency-key", &format!("k{i}"))
        .body(body(i, size))
}

/// Keyless: the fingerprint is method, path and body; the path makes a
/// 0-byte body distinct too.
fn keyless(i: u64, size: usize) -> Request {
    Request::post(&format!("/events/{i}")).body(body(i, size))
}

fn small(i: u64) -> Request {
    Request::post("/orders")
        .header("idempotency-key", &format!("k{i}"))
        .body(format!(r#"{{"order":{i},"sku":"A-1","qty":1}}"#))
}

fn send(envoy: &mut SimEnvoy, worker: usize, req: Request) -> Res<()> {
    match envoy.request(worker, req) {
        Ok(r) if r.status == 201 => Ok(()),
        Ok(r) => Err(format!("answered {} {}", r.status, r.body_str())),
        Err(e) => Err(e.to_string()),
    }
}

fn size_name(size: usize) -> String {
    match size {
        0 => "0".into(),
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

fn counter(envoy: &SimEnvoy, name: &str) -> u64 {
    envoy.counter(name).unwrap_or(0)
}

/// Requests per batch for a body size: about the same time per batch.
fn per_batch(size: usize) -> u64 {
    match size {
        s if s >= 1 << 20 => 6,
        s if s >= 64 << 10 => 60,
        _ => 300,
    }
}

/// Body size: the empty filter, a keyed first execution and a keyless
/// fingerprint, each with the same body.
fn body_sizes(out: &mut String) -> Res<f64> {
    let dedup = &DEDUP[0];
    let mut empty = envoy(&BASELINE, "scaling_empty", "", 1)?;
    let mut keyed_env = envoy(dedup, "scaling_keyed", r#"{"capacity": 1000000}"#, 1)?;
    let mut keyless_env = envoy(
        dedup,
        "scaling_keyless",
        r#"{"capacity": 1000000, "key": {"fingerprint": ["method", "path", "body"]}}"#,
        1,
    )?;
    out.push_str(
        "| body | empty filter | keyed, first execution | × empty | keyless fingerprint | × empty | keyed − empty | keyless − empty |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut n = 0u64;
    let mut added = Vec::new();
    for size in [0usize, 1 << 10, 64 << 10, 1 << 20] {
        let per = per_batch(size);
        let n0 = n;
        let fresh = |k: u64| n0 + k;
        let mut cases: Vec<Batch> = vec![
            Box::new(|b| {
                let base = fresh(b as u64 * per);
                timed(per, |j| send(&mut empty, 0, keyed(base + j, size)))
            }),
            Box::new(|b| {
                let base = fresh(b as u64 * per);
                timed(per, |j| send(&mut keyed_env, 0, keyed(base + j, size)))
            }),
            Box::new(|b| {
                let base = fresh(b as u64 * per);
                timed(per, |j| send(&mut keyless_env, 0, keyless(base + j, size)))
            }),
        ];
        // One untimed request per case first (lazily built state).
        for case in cases.iter_mut() {
            case(BATCHES + 1)?;
        }
        let t = interleaved(BATCHES, &mut cases)?;
        drop(cases);
        n += (BATCHES as u64 + 2) * per;
        let line = format!(
            "| {} | {} | {} | {:.2} | {} | {:.2} | {} | {} |\n",
            size_name(size),
            micros(t[0]),
            micros(t[1]),
            t[1] / t[0],
            micros(t[2]),
            t[2] / t[0],
            micros(t[1] - t[0]),
            micros(t[2] - t[0]),
        );
        print!("{line}");
        out.push_str(&line);
        added.push(t[1] - t[0]);
    }
    for (env, name) in [(&keyed_env, "keyed"), (&keyless_env, "keyless")] {
        let executed = counter(env, "proxy_dedup_executed");
        let requests = counter(env, "proxy_dedup_requests");
        if executed != requests {
            return Err(format!(
                "{name}: {executed} executed of {requests} requests: not all first executions"
            ));
        }
    }
    Ok(added[3] / added[2])
}

/// Shared-data bytes of one Envoy's store, by kind of key.
#[derive(Default)]
struct SharedBytes {
    buckets: usize,
    bucket_bytes: usize,
    slots: usize,
    slot_bytes: usize,
    slot_key_bytes: usize,
    other_bytes: usize,
}

fn shared_bytes(envoy: &SimEnvoy) -> SharedBytes {
    let mut s = SharedBytes::default();
    for key in envoy.shared_data_keys() {
        let len = key.len() + envoy.shared_data(&key).map_or(0, |(v, _)| v.len());
        if key.contains("/b/") {
            s.buckets += 1;
            s.bucket_bytes += len;
        } else if key.contains("/r/") {
            s.slots += 1;
            s.slot_bytes += len;
            s.slot_key_bytes += key.len();
        } else {
            s.other_bytes += len;
        }
    }
    s
}

struct Fill {
    capacity: u64,
    /// Seconds per request: first executions and replays, empty and filled.
    first_empty: f64,
    first_full: f64,
    replay_empty: f64,
    replay_full: f64,
    fill_note: String,
    evictions_measured: u64,
    measured: u64,
    memory: SharedBytes,
    records: u64,
    vm_bytes_empty: usize,
    vm_bytes_full: usize,
}

/// Store fill: first executions and replays in an empty store and in one 90%
/// full. A small store is refilled (TTL passed, then 90% of `capacity` new
/// keys, untimed) before each batch, so every batch sees 90%; a large one is
/// filled once (its batches add under 1.5% to the fill).
fn store_fill(capacity: u64, baseline: &mut SimEnvoy, base_time: &mut Vec<f64>) -> Res<Fill> {
    const EVICTIONS: &str = "proxy_dedup_evictions_unexpired";
    let dedup = &DEDUP[0];
    let config = format!(r#"{{"capacity": {capacity}}}"#);
    let mut empty = envoy(dedup, &format!("fill_empty_{capacity}"), &config, 1)?;
    let mut full = envoy(dedup, &format!("fill_full_{capacity}"), &config, 1)?;
    let target = capacity * 9 / 10;
    let small_store = capacity <= 10_000;
    let per: u64 = if small_store { capacity / 20 } else { 2_000 };
    let mut next = 0u64;
    let fill = |env: &mut SimEnvoy, next: &mut u64| -> Res<f64> {
        let start = Instant::now();
        for _ in 0..target {
            *next += 1;
            send(env, 0, small(*next))?;
        }
        Ok(start.elapsed().as_secs_f64())
    };
    let fill_note = if small_store {
        format!("refilled before each batch: TTL passed, then {target} new keys through the filter")
    } else {
        let secs = fill(&mut full, &mut next)?;
        println!("  filled {target} records in {secs:.1} s");
        format!(
            "{target} keys through the filter once, in {secs:.0} s ({:.1} µs each)",
            secs * 1e6 / target as f64
        )
    };
    let vm_bytes_empty = empty.memory_bytes(0);
    let mut memory = SharedBytes::default();
    let mut records = 0;
    let mut evictions_measured = 0;
    let mut first = vec![Vec::new(); 3];
    let mut replay = vec![Vec::new(); 2];
    // A small store's batches are short: more of them.
    let batches = if small_store {
        SMALL_STORE_BATCHES
    } else {
        BATCHES
    };
    // Batch 0 warms up and is not counted.
    for b in 0..=batches {
        // Empty store: earlier batches' records expired.
        empty.advance(PAST_TTL);
        let base = next;
        next += per;
        let t = timed(per, |j| send(&mut empty, 0, small(base + j)))?;
        let r = timed(per, |_| send(&mut empty, 0, small(base)))?;
        if b > 0 {
            first[0].push(t);
            replay[0].push(r);
        }
        if small_store {
            full.advance(PAST_TTL);
            fill(&mut full, &mut next)?;
        }
        if b == 0 {
            memory = shared_bytes(&full);
            records = counter(&full, "proxy_dedup_executed") - counter(&full, EVICTIONS);
        }
        let replayed_key = next - 1;
        let base = next;
        next += per;
        let e = counter(&full, EVICTIONS);
        let t = timed(per, |j| send(&mut full, 0, small(base + j)))?;
        let r = timed(per, |_| send(&mut full, 0, small(replayed_key)))?;
        // The baseline in the same stretch of time.
        let base = next;
        next += per;
        let bt = timed(per, |j| send(baseline, 0, small(base + j)))?;
        if b > 0 {
            evictions_measured += counter(&full, EVICTIONS) - e;
            first[1].push(t);
            replay[1].push(r);
            first[2].push(bt);
        }
    }
    let replayed = counter(&full, "proxy_dedup_replayed") + counter(&empty, "proxy_dedup_replayed");
    if replayed < 2 * (batches as u64 + 1) * (per - 1) {
        return Err(format!("capacity {capacity}: only {replayed} replays"));
    }
    base_time.append(&mut first[2]);
    let vm_bytes_full = full.memory_bytes(0);
    let [first_empty, first_full, _] = [0, 1, 2].map(|i| median(first[i].clone()));
    let [replay_empty, replay_full] = [0, 1].map(|i| median(replay[i].clone()));
    Ok(Fill {
        capacity,
        first_empty,
        first_full,
        replay_empty,
        replay_full,
        fill_note,
        evictions_measured,
        measured: batches as u64 * per,
        memory,
        records,
        vm_bytes_empty,
        vm_bytes_full,
    })
}

/// Workers: the empty filter and the dedup filter with 1 and 2 workers,
/// requests alternating between the workers (host-test runs one request at a
/// time: this is the work per request, not throughput).
fn workers(out: &mut String) -> Res<()> {
    let dedup = &DEDUP[0];
    let cfg = r#"{"capacity": 1000000}"#;
    let mut envs = Vec::new();
    for w in [1usize, 2] {
        envs.push(envoy(&BASELINE, &format!("workers_empty_{w}"), "", w)?);
        envs.push(envoy(dedup, &format!("workers_dedup_{w}"), cfg, w)?);
    }
    // (Envoy, replay): empty 1, dedup 1 first, dedup 1 replay, then the same with 2.
    let kinds = [
        (0, false),
        (1, false),
        (1, true),
        (2, false),
        (3, false),
        (3, true),
    ];
    let per = 300u64;
    let mut times = vec![Vec::new(); kinds.len()];
    // Batch 0 warms up and is not counted.
    for b in 0..=BATCHES as u64 {
        for (k, (e, is_replay)) in kinds.iter().enumerate() {
            let env = &mut envs[*e];
            let w = env.workers();
            let key0 = (k as u64 + 1) * 100_000_000;
            let base = key0 + 1 + b * per;
            let t = if *is_replay {
                timed(per, |j| send(env, j as usize % w, small(key0)))?
            } else {
                timed(per, |j| send(env, j as usize % w, small(base + j)))?
            };
            if b > 0 {
                times[k].push(t);
            }
        }
    }
    let t: Vec<f64> = times.into_iter().map(median).collect();
    out.push_str("| workers | empty filter | first execution | × empty | replay | × empty |\n|---:|---:|---:|---:|---:|---:|\n");
    for (w, row) in [(1, &t[0..3]), (2, &t[3..6])] {
        let line = format!(
            "| {w} | {} | {} | {:.2} | {} | {:.2} |\n",
            micros(row[0]),
            micros(row[1]),
            row[1] / row[0],
            micros(row[2]),
            row[2] / row[0]
        );
        print!("{line}");
        out.push_str(&line);
    }
    Ok(())
}

/// The etcd store's per-worker tier: heap bytes per entry (this process's
/// allocator, 64-bit) against the tier's own accounting, for three response sizes.
fn local_tier(out: &mut String) {
    out.push_str("| response body | entries kept (of 8192 inserted) | heap per entry (64-bit) | tier's own count per entry | heap, all entries | bound |\n|---:|---:|---:|---:|---:|---|\n");
    for body in [33usize, 1 << 10, 64 << 10] {
        let before = LIVE.load(Ordering::Relaxed);
        let mut tier = LocalTier::default();
        for i in 0..8192u64 {
            let mut digest = [0u8; 32];
            digest[..8].copy_from_slice(&i.to_le_bytes());
            let entry = LocalEntry {
                payload: [7; 32],
                expires_ms: 1_000_000,
                response: Some(StoredResponse {
                    status: 201,
                    headers: vec![("content-type".into(), b"application/json".to_vec())],
                    body: vec![b'x'; body],
                }),
            };
            tier.insert(digest, entry, 0);
        }
        let heap = LIVE.load(Ordering::Relaxed).saturating_sub(before);
        let n = tier.len().max(1);
        let bound = if tier.len() >= MAX_ENTRIES {
            format!("{MAX_ENTRIES} entries")
        } else {
            format!("{} MiB of counted bytes", MAX_BYTES >> 20)
        };
        let line = format!(
            "| {} | {} | {} B | {} B | {:.1} MiB | {bound} |\n",
            if body == 33 {
                "33 B".to_string()
            } else {
                size_name(body)
            },
            tier.len(),
            heap / n,
            tier.bytes() / n,
            heap as f64 / (1 << 20) as f64,
        );
        print!("{line}");
        out.push_str(&line);
        drop(tier);
    }
}

fn main() {
    // `cargo bench -p dedup-benches -- <filter>` passes the filter to every
    // bench: run only when it names this one (or there is none).
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if filter.iter().any(|f| !"scaling".contains(f.as_str())) {
        return;
    }
    if !DEDUP[0].path().exists() || !BASELINE.path().exists() {
        println!("skipping scaling: build the modules with `make wasm`");
        return;
    }
    let load_before = load_average();
    let started = Instant::now();
    match run() {
        Ok(text) => {
            let load_after = load_average();
            let secs = started.elapsed().as_secs();
            println!("scaling: {secs} s, load average {load_before} before, {load_after} after");
            if !no_write() {
                let section = section(&text, &load_before, &load_after, secs);
                if let Err(e) = write_section("## Scaling (host-test)", &section) {
                    println!("could not write BENCHMARKS.md: {e}");
                }
            }
        }
        Err(e) => println!("scaling: {e}"),
    }
}

/// The tables, as markdown pieces.
struct Text {
    sizes: String,
    fill: String,
    fill_notes: String,
    memory: String,
    workers: String,
    local: String,
    large: u64,
    /// Keyed first execution, time added over the empty filter: 1 MiB / 64 KiB.
    growth: f64,
}

fn run() -> Res<Text> {
    println!("\nscaling with body size:");
    let mut sizes = String::new();
    let growth = body_sizes(&mut sizes)?;

    println!("\nscaling with store fill:");
    let mut baseline = envoy(&BASELINE, "fill_baseline", "", 1)?;
    send(&mut baseline, 0, small(u64::MAX))?;
    let large = large_capacity();
    let mut fills = Vec::new();
    for capacity in [1_000, large] {
        let mut base = Vec::new();
        let f = store_fill(capacity, &mut baseline, &mut base)?;
        fills.push((f, median(base)));
    }
    let mut fill = String::from(
        "| capacity | empty filter | first execution, empty | × empty filter | first execution, 90% full | × empty filter | replay, empty | × | replay, 90% full | × | first executions (90% full) that evicted a record |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut fill_notes = String::new();
    let mut memory = String::from(
        "| capacity | records live | bucket keys | bucket key + value per record | response slots | slot key per record | slot value per record (counts against `max_store_bytes`) | shared data per record | worker VM memory, empty → 90% full |\n|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (f, base) in &fills {
        let line = format!(
            "| {} | {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {:.0}% |\n",
            f.capacity,
            micros(*base),
            micros(f.first_empty),
            f.first_empty / base,
            micros(f.first_full),
            f.first_full / base,
            micros(f.replay_empty),
            f.replay_empty / base,
            micros(f.replay_full),
            f.replay_full / base,
            100.0 * f.evictions_measured as f64 / f.measured.max(1) as f64
        );
        print!("{line}");
        fill.push_str(&line);
        let _ = writeln!(fill_notes, "- capacity {}: {}.", f.capacity, f.fill_note);
        let m = &f.memory;
        let records = f.records.max(1) as usize;
        let per_record = (m.bucket_bytes + m.slot_bytes) / records;
        let line = format!(
            "| {} | {} | {} | {} B | {} | {} B | {} B | {} B | {:.1} → {:.1} MiB |\n",
            f.capacity,
            f.records,
            m.buckets,
            m.bucket_bytes / records,
            m.slots,
            m.slot_key_bytes / records,
            (m.slot_bytes - m.slot_key_bytes) / records,
            per_record,
            f.vm_bytes_empty as f64 / (1 << 20) as f64,
            f.vm_bytes_full as f64 / (1 << 20) as f64,
        );
        print!("{line}");
        memory.push_str(&line);
    }

    println!("\nscaling with workers:");
    let mut workers_t = String::new();
    workers(&mut workers_t)?;

    println!("\netcd store, per-worker tier of completed records:");
    let mut local = String::new();
    local_tier(&mut local);
    Ok(Text {
        sizes,
        fill,
        fill_notes,
        memory,
        workers: workers_t,
        local,
        large,
        growth,
    })
}
