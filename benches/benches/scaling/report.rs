//! The scaling bench's text for BENCHMARKS.md: its tables with what they show.

use super::{Text, BATCHES, SMALL_STORE_BATCHES};
use dedup_core::stores::etcd::local::{MAX_BYTES, MAX_ENTRIES};
use dedup_envoy::bench::machine;

/// The "## Scaling (host-test)" section of BENCHMARKS.md.
pub(super) fn section(t: &Text, load_before: &str, load_after: &str, secs: u64) -> String {
    let mut s = format!(
        "## Scaling (host-test)\n\n\
`make bench` (`benches/benches/scaling.rs`): how the filter's cost per request \
grows with the body, the store's fill and the workers, and the memory a stored \
record takes. The compiled `dist/dedup_filter.wasm` in host-test (wasmtime, one \
process, in-process upstream answering `201` with a 33-byte JSON body). Each \
time is the median over {BATCHES} batches of the time per request in a batch, \
the batches of the cases compared running in turn; ratios are to the empty \
Wasm filter measured in the same run with the same request. Machine: {}; load \
average {load_before} before the run and {load_after} after ({secs} s): other \
work shared the cores, so absolute times vary by tens of percent between runs; \
the ratios are steadier.\n\n",
        machine()
    );
    s += &format!(
        "### Body size\n\n\
Every request a first execution: keyed (`Idempotency-Key`, the body hashed \
for the payload check) or keyless (`key.fingerprint: [method, path, body]`, the \
body hashed once for both key and payload check), against the empty filter with \
the same body. Bodies from 0 to 1 MiB (`max_body_bytes`' default).\n\n{}\n\
Up to 1 KiB the added cost is flat (the claim and the stored response \
dominate). From 64 KiB it is bounded by the body: the filter buffers the whole \
body in the VM (one copy from the host) and hashes it with BLAKE3 on Wasm SIMD, \
so the added time grows about linearly with the body (keyed: {:.1}× from 64 KiB \
to 1 MiB, for 16× the bytes). The empty filter's own time at 1 MiB is \
host-test's handling of a 1 MiB body (Envoy's would differ), which is why the \
ratio falls there; the added µs are the filter's.\n\n",
        t.sizes, t.growth
    );
    s += &format!(
        "### Store fill\n\n\
First executions (a new key each) and replays (one key again and again, small \
JSON body) in an empty store and in one filled to 90% of `capacity` through \
the filter beforehand (default config otherwise). The small store's batches are \
{} requests each (5% of it, {SMALL_STORE_BATCHES} batches), the large one's 2000 \
({BATCHES} batches).\n\n{}\n{}\n\
What bounds it: the filter's work per request is bounded by one bucket of 16 \
records whatever the capacity: a claim reads, decodes and writes back one \
bucket value (one shared-data key) and writes one response slot; a replay reads \
the bucket and one slot. A fuller bucket is a little more work (a longer value \
to copy and decode), and a full one makes the claim scan its 16 records for \
the completed one closest to expiry and evict it (counted in \
`proxy_dedup_evictions_unexpired`; last column). Buckets fill unevenly, so \
\"90%\" is 90% of `capacity` sent as new keys, and some of them were evicted \
early (the records live after the fill are in the memory table below): at that \
fill most buckets are full and a large share of new claims evict, which is why \
the README says to size `capacity` at about twice the live keys. At the same \
fill the small store shows little growth; the large one (capacity {}) grows \
more, with the same per-request work in the filter and a similar eviction rate: \
what differs is the host: host-test's shared data then holds about a million \
keys, and it copies a value on every get and allocates on every set. A perf \
profile of a whole run (most of it the 900,000-request fill) has glibc's \
allocator on top (`_int_malloc` 17%, with `free`, `_int_free`, \
`unlink_chunk` and `malloc_consolidate` about a quarter of the samples in \
all): with two million live allocations its free lists are long. So the \
growth at 1,000,000 points to host-test's allocator, not the filter; Envoy (tcmalloc, \
values copied under its shared-data lock) has its own costs here, which only \
`make bench-envoy`-style runs with a filled store would show (not measured).\n\n",
        1_000 / 20,
        t.fill,
        t.fill_notes,
        t.large
    );
    s += &format!(
        "### Workers\n\n\
The same with 1 and 2 worker VMs sharing one store (`capacity` 1000000), \
requests alternating between the workers. host-test runs one request at a time, \
so this is the work per request with a second VM, not throughput: throughput \
with 2 workers is measured in real Envoy (`make bench-envoy`). The filter keeps \
no per-worker state for the shared-data store (every replay reads the record \
from shared data, whichever worker wrote it), so a second worker should add no \
work per request; differences of this size between the rows have come and gone \
between runs on this loaded machine.\n\n{}\n",
        t.workers
    );
    s += &format!(
        "### Memory per stored record\n\n\
Shared data after the 90% fill above, key and value bytes as the filter writes \
them: bucket records (one key per 16 records) and response slots (one key per \
record with a stored response; here the 33-byte body with its `content-type`, \
the record's digest and token). Envoy's own per-key overhead (its hash-map \
entry and string headers) is not in these figures. The sizing formula \
(docs/src/operations/sizing.md) is `store.max_store_bytes` (the slot values, which the \
budget counts) + `capacity × 200 bytes` (records, keys and Envoy's map entries) \
+ the responses being stored. Measured, the known part of the second term is \
the bucket share plus the slot key per record (columns 4 and 6), which leaves \
the rest of the 200 bytes for Envoy's map entries (about 1.06 per record: one \
slot, 1/16 of a bucket); whether Envoy's entry fits that is an estimate, not \
measured here (`envoy/tests/budget.rs` measures Envoy's memory as a whole). \
The worker VM's memory (Wasm linear memory, which only grows) does not grow \
with the records: they live in the host's shared data, not in the VM.\n\n{}\n",
        t.memory
    );
    s += &format!(
        "The etcd store keeps no records in shared data; each worker keeps a tier of \
completed records it has seen (`filter/core/src/stores/etcd/local.rs`), bounded at \
{MAX_ENTRIES} entries and {} MiB of counted bytes (entries older than 5 s are \
not answered). Measured natively with a counting allocator (8192 entries \
inserted, the bounds evicting; the module runs on wasm32, with 4-byte pointers, \
so its figures are a little lower):\n\n{}\n\
So per worker the tier stays under about {} MiB of heap whatever the traffic \
(the bytes bound holds large responses, the entries bound small ones): with \
`--concurrency N`, N times that per Envoy. The tier's own count (96 bytes plus \
body and headers) is about 200 bytes under the heap per entry for small \
responses (the hash map's slot and the allocations' headers), so the entries \
bound, not the bytes bound, is what limits small responses.\n",
        MAX_BYTES >> 20,
        t.local,
        (MAX_BYTES >> 20) + 2,
    );
    s
}
