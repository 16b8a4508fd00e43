//! The per-worker tier in front of a remote store: completed records this worker has seen,
//! answered without a round trip. Correct because a completed record never changes before
//! its expiry (etcd does not evict) unless an operator removes it (admin API), so a copy
//! is kept at most `MAX_AGE_MS`: a removal reaches every proxy within that time.

use crate::key::Digest;
use crate::response::StoredResponse;
use hashbrown::HashMap;

/// Most entries and bytes held per worker.
pub const MAX_ENTRIES: usize = 4096;
pub const MAX_BYTES: usize = 8 << 20;
/// Longest a copy is answered from the tier.
pub const MAX_AGE_MS: u64 = 5_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalEntry {
    pub payload: Digest,
    /// The record's own expiry (what a duplicate is told); the tier answers it for at
    /// most `MAX_AGE_MS` of it.
    pub expires_ms: u64,
    /// `None`: completed, response not kept.
    pub response: Option<StoredResponse>,
}

impl LocalEntry {
    fn size(&self) -> usize {
        96 + self.response.as_ref().map_or(0, |r| {
            r.body.len()
                + r.headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len() + 16)
                    .sum::<usize>()
        })
    }
}

#[derive(Debug, Default)]
pub struct LocalTier {
    /// Each entry with until when (ms) the tier answers it.
    map: HashMap<Digest, (u64, LocalEntry)>,
    bytes: usize,
}

impl LocalTier {
    pub fn get(&mut self, digest: &Digest, now_ms: u64) -> Option<&LocalEntry> {
        if self
            .map
            .get(digest)
            .is_some_and(|(until, _)| *until <= now_ms)
        {
            self.remove(digest);
        }
        self.map.get(digest).map(|(_, e)| e)
    }

    pub fn insert(&mut self, digest: Digest, entry: LocalEntry, now_ms: u64) {
        let until = entry.expires_ms.min(now_ms.saturating_add(MAX_AGE_MS));
        let size = entry.size();
        if size > MAX_BYTES / 16 {
            return;
        }
        self.remove(&digest);
        if self.map.len() >= MAX_ENTRIES || self.bytes + size > MAX_BYTES {
            let expired: Vec<Digest> = self
                .map
                .iter()
                .filter(|(_, (until, _))| *until <= now_ms)
                .map(|(d, _)| *d)
                .collect();
            for d in expired {
                self.remove(&d);
            }
        }
        while self.map.len() >= MAX_ENTRIES || self.bytes + size > MAX_BYTES {
            // Any victim will do: the remote store still has the record.
            let Some(victim) = self.map.keys().next().copied() else {
                break;
            };
            self.remove(&victim);
        }
        self.bytes += size;
        self.map.insert(digest, (until, entry));
    }

    fn remove(&mut self, digest: &Digest) {
        if let Some((_, e)) = self.map.remove(digest) {
            self.bytes -= e.size();
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests;
