//! Where a record lives when the etcd store has several shards: rendezvous
//! (highest-random-weight) hashing of the record's digest over the shards' names. Each
//! shard's score for a digest is a hash of its name's seed and the digest; the highest
//! wins. Adding a shard moves only the records the new one outscores the others on (a
//! share of 1/(n+1)); removing one moves only its own. The order of the list does not
//! matter, and a shard keeps its records while its name stays.
//!
//! This is a format: an upgrade that placed a record elsewhere would let its key run
//! again, so the seed and the score are pinned by tests (`shards/tests.rs`).

use crate::key::Digest;
use sha2::{Digest as _, Sha256};

/// The seed a shard's name gives its scores: the first 8 bytes (big-endian) of
/// SHA-256 of `"proxy-dedup shard v1\0"` and the name.
pub fn name_seed(name: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(b"proxy-dedup shard v1\0");
    h.update(name.as_bytes());
    first_u64(&h.finalize())
}

/// What the leases a worker caches are kept apart by: one etcd cluster reached one
/// way (a lease is its cluster's own).
pub fn shard_id(name: &str, cluster: &str, authority: &str) -> u64 {
    let mut h = Sha256::new();
    for part in [name, cluster, authority] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    first_u64(&h.finalize())
}

fn first_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(b)
}

/// MurmurHash3's 64-bit finaliser: every input bit flips about half the output bits.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The score of the shard seeded `seed` for `digest` (its first 16 bytes, uniform: the
/// digest is SHA-256).
pub fn score(seed: u64, digest: &Digest) -> u64 {
    let a = first_u64(&digest[..8]);
    let b = first_u64(&digest[8..16]);
    fmix64(fmix64(seed ^ a) ^ b)
}

/// The index in `seeds` of the shard `digest` lives on: the highest score, a tie (two
/// names' seeds scoring alike) going to the larger seed, so the list's order never
/// matters. `None` for no shards.
pub fn pick(seeds: &[u64], digest: &Digest) -> Option<usize> {
    seeds
        .iter()
        .enumerate()
        .max_by_key(|(_, s)| (score(**s, digest), **s))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests;
