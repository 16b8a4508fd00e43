//! A configuration's shared-data geometry: how many buckets, which bucket a digest
//! falls in (keyed by the namespace's secret), the keys of buckets, response slots and
//! the layout registry, and the timing records are written with.

use super::{SECRET_LEN, WAYS};
use crate::key::Digest;
use sha2::{Digest as _, Sha256};

/// Bucket geometry and timing for one plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub(crate) namespace: String,
    pub buckets: u64,
    /// Keys the bucket choice, so no client can aim keys at one bucket.
    pub(crate) secret: [u8; SECRET_LEN],
    pub in_flight_ms: u64,
    pub ttl_ms: u64,
    /// `on_unknown_outcome: "keep"`: a claim lives until its TTL unless it is settled, so
    /// a claim whose stream never settled it (a worker gone, a failed store write) never
    /// lets its key run again within the TTL either; past `in_flight_ms` it answers as
    /// an unknown outcome.
    pub keep_unknown: bool,
    /// `store.eviction: "oldest"`: a full bucket evicts another scope's records too.
    pub evict_any_scope: bool,
    /// `store.scope_claims_per_bucket`.
    pub scope_claims: usize,
    /// Bytes of response slots one bucket may hold (`max_store_bytes / buckets`).
    pub bucket_budget: u64,
    /// Buckets of the ordering guard's entities (`store.max_entities / WAYS`); 0 when no
    /// policy orders.
    pub entity_buckets: u64,
    /// Until when (ms) this VM knows the layouts registry holds this layout: a claim
    /// registers only past it, so a claim costs one registry read, made after its
    /// record is written.
    pub(crate) registered_until: RegisteredUntil,
}

/// A cache of what the registry said (an atomic so a layout may be shared by threads in
/// tests); not part of a layout's identity.
#[derive(Debug, Default)]
pub(crate) struct RegisteredUntil(std::sync::atomic::AtomicU64);

impl RegisteredUntil {
    pub(crate) fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn set(&self, until_ms: u64) {
        self.0.store(until_ms, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clone for RegisteredUntil {
    fn clone(&self) -> Self {
        RegisteredUntil(std::sync::atomic::AtomicU64::new(self.get()))
    }
}

impl PartialEq for RegisteredUntil {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RegisteredUntil {}

impl Layout {
    /// Keys carry the bucket count, so a reconfigured capacity lays out a new set of
    /// buckets; the registry (`<namespace>/layouts`) lets every configuration see the
    /// others' records until they have drained. The secret starts zeroed: the glue sets
    /// the process's (`with_secret`) before serving.
    pub fn new(namespace: &str, capacity: u64, in_flight_ms: u64, ttl_ms: u64) -> Self {
        Layout {
            namespace: namespace.to_string(),
            buckets: (capacity / WAYS as u64).max(1),
            secret: [0; SECRET_LEN],
            in_flight_ms,
            ttl_ms,
            keep_unknown: false,
            evict_any_scope: false,
            scope_claims: WAYS,
            bucket_budget: u64::MAX,
            entity_buckets: 0,
            registered_until: RegisteredUntil::default(),
        }
    }

    /// The scope tag of a request (`key::scope_tag`, keyed by this process's secret).
    pub fn scope_tag(&self, policy: &crate::config::Policy, head: &crate::key::RequestHead) -> u32 {
        crate::key::scope_tag(policy, head, &self.secret)
    }

    /// The same layout with the isolation of scopes `store` asks for.
    pub fn isolating_scopes(mut self, evict_any_scope: bool, scope_claims: usize) -> Self {
        self.evict_any_scope = evict_any_scope;
        self.scope_claims = scope_claims.clamp(1, WAYS);
        self
    }

    /// The same layout with a policy's claim semantics (see `keep_unknown`).
    pub fn keeping_unknown(mut self, keep: bool) -> Self {
        self.keep_unknown = keep;
        self
    }

    /// How long a fresh claim lives if nobody settles it.
    pub fn claim_ms(&self) -> u64 {
        if self.keep_unknown {
            self.ttl_ms.max(self.in_flight_ms)
        } else {
            self.in_flight_ms
        }
    }

    /// When an unsettled claim that expires at `expires_ms` stops counting as in flight
    /// (a kept claim lives on as an unknown outcome until `expires_ms`).
    pub fn in_flight_end(&self, expires_ms: u64) -> u64 {
        expires_ms
            .saturating_sub(self.claim_ms())
            .saturating_add(self.in_flight_ms)
    }

    /// Whether an unsettled claim that expires at `expires_ms` is past its in-flight
    /// time at `now_ms`: its stream is gone or its outcome unknown (kept claims only).
    pub fn claim_overdue(&self, expires_ms: u64, now_ms: u64) -> bool {
        self.keep_unknown && now_ms >= self.in_flight_end(expires_ms)
    }

    /// The same buckets with another policy's timing: records carry their own expiry,
    /// so rules with different TTLs and in-flight timeouts share one layout.
    pub fn timed(&self, in_flight_ms: u64, ttl_ms: u64, keep_unknown: bool) -> Self {
        Layout {
            in_flight_ms,
            ttl_ms,
            keep_unknown,
            ..self.clone()
        }
    }

    /// Bounds the bytes of stored responses: each bucket gets an equal share of
    /// `max_store_bytes`, kept in the bucket record itself, so no shared counter is hot.
    pub fn with_max_store_bytes(mut self, max_store_bytes: u64) -> Self {
        self.bucket_budget = max_store_bytes / self.buckets.max(1);
        self
    }

    /// Room for `max_entities` entities of the ordering guard.
    pub fn with_entities(mut self, max_entities: u64) -> Self {
        self.entity_buckets = (max_entities / WAYS as u64).max(1);
        self
    }

    /// `<namespace>/<entity_buckets>/o/<bucket>`: an entity bucket of the ordering guard.
    pub fn entity_key(&self, bucket: u64) -> String {
        self.key_of(self.entity_buckets, "/o/", bucket)
    }

    pub fn with_secret(mut self, secret: [u8; SECRET_LEN]) -> Self {
        self.secret = secret;
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The bucket of a digest among `buckets`: a keyed hash (SHA-256 over the secret and
    /// the digest), not bits of the digest, which anyone can compute for a key.
    pub fn bucket_in(&self, buckets: u64, digest: &Digest) -> u64 {
        let mut h = Sha256::new();
        h.update(b"proxy-dedup bucket v1\0");
        h.update(self.secret);
        h.update(digest);
        let out = h.finalize();
        let mut b = [0u8; 8];
        b.copy_from_slice(&out[..8]);
        u64::from_be_bytes(b) % buckets.max(1)
    }

    pub fn bucket_of(&self, digest: &Digest) -> u64 {
        self.bucket_in(self.buckets, digest)
    }

    /// `<namespace>/<buckets>/b/<bucket>`. These keys are built on every claim and
    /// completion, so without `format!` (its machinery costs more than the key in Wasm).
    pub fn bucket_key_in(&self, buckets: u64, bucket: u64) -> String {
        self.key_of(buckets, "/b/", bucket)
    }

    pub fn bucket_key(&self, bucket: u64) -> String {
        self.bucket_key_in(self.buckets, bucket)
    }

    /// `<namespace>/<buckets>/r/<bucket>/<way>`.
    pub fn response_key(&self, buckets: u64, bucket: u64, way: usize) -> String {
        let mut key = self.key_of(buckets, "/r/", bucket);
        key.push('/');
        push_decimal(&mut key, way as u64);
        key
    }

    fn key_of(&self, buckets: u64, kind: &str, bucket: u64) -> String {
        let mut key = String::with_capacity(self.namespace.len() + 48);
        key.push_str(&self.namespace);
        key.push('/');
        push_decimal(&mut key, buckets);
        key.push_str(kind);
        push_decimal(&mut key, bucket);
        key
    }

    pub(crate) fn registry_key(&self) -> String {
        format!("{}/layouts", self.namespace)
    }

    /// Upper bound of shared-data keys this layout ever writes: its buckets and
    /// response slots, plus the namespace's secret and layout registry.
    pub fn max_keys(&self) -> u64 {
        self.buckets * (1 + WAYS as u64) + 2 + self.entity_buckets
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        out.push(char::from(d));
    }
}
