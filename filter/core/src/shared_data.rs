//! Envoy's shared data as the filter uses it (one host call each, statuses mapped),
//! and the errors of what is built on it: the shared-data store's buckets, the ordering
//! guard's entity buckets, wait mode's board.

/// A failure of the shared-data host calls other than NotFound / CasMismatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFault(pub String);

/// Result of a conditional set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetError {
    CasMismatch,
    Fault(HostFault),
}

/// Envoy's shared data as the store needs it (one call each, statuses mapped).
pub trait SharedData {
    /// `Ok(None)` when the key is absent; an empty value (tombstone) is `Some((vec![], cas))`.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault>;
    /// Envoy semantics: absent key ignores `cas`; `cas == 0` overwrites; stale cas mismatches.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError>;
}

/// Why the store could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    Host(HostFault),
    /// Every attempt lost its CAS race.
    Contention,
    /// Every record in the bucket is an unexpired in-flight claim (or, under
    /// `store.eviction: "own_scope"`, another scope's unexpired record).
    BucketFull,
    /// The claim's scope already holds `store.scope_claims_per_bucket` live claims in
    /// its bucket.
    ScopeFull,
}

/// CAS attempts before a writer on shared data gives up and reports contention.
pub const CAS_ATTEMPTS: usize = 64;

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Host(h) => write!(f, "shared data failed: {}", h.0),
            StoreError::Contention => write!(
                f,
                "shared data CAS contention after {CAS_ATTEMPTS} attempts"
            ),
            StoreError::BucketFull => write!(
                f,
                "bucket full of in-flight claims and other scopes' unexpired records"
            ),
            StoreError::ScopeFull => write!(
                f,
                "the scope holds its most live claims (store.scope_claims_per_bucket) in this bucket"
            ),
        }
    }
}
