//! What operators may do to shared-data records: look one up, remove one, count them.
//! Every live layout (capacity) is searched, as claims do.

use super::{Registry, SharedData, SharedStore, StoreError, WAYS};
use crate::key::Digest;
use crate::record::RecordView;
use crate::response::StoredResponse;

/// What a removal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge {
    Removed(RecordView),
    /// The record is a claim (in flight or held) and `force` was not given.
    Refused(RecordView),
    NotFound,
}

/// Fill level of the current layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub buckets: u64,
    pub ways: u64,
    pub in_flight: u64,
    pub held: u64,
    pub completed: u64,
    pub completed_not_stored: u64,
    /// Records past their expiry, waiting to be reused.
    pub expired: u64,
    /// Other layouts whose records may still live (a capacity change).
    pub other_layouts: Vec<u64>,
    /// Bytes held in response slots, as the buckets count them (kept within
    /// `store.max_store_bytes`).
    pub stored_bytes: u64,
}

impl<S: SharedData + ?Sized> SharedStore<'_, S> {
    /// Every layout to search: the current one, then the others the registry lists.
    fn layouts(&self, now_ms: u64) -> Result<Vec<u64>, StoreError> {
        let mut all = vec![self.layout.buckets];
        if let Some((bytes, _)) = self
            .shared
            .get(&self.layout.registry_key())
            .map_err(StoreError::Host)?
        {
            all.extend(Registry::decode(&bytes).others(self.layout.buckets, now_ms));
        }
        Ok(all)
    }

    /// Finds the unexpired record of `digest`: its layout, bucket, way and cas.
    fn find(
        &self,
        digest: &Digest,
        now_ms: u64,
    ) -> Result<Option<(RecordView, u64, u64, usize)>, StoreError> {
        for buckets in self.layouts(now_ms)? {
            let bucket = self.layout.bucket_in(buckets, digest);
            let (b, _) = self.read(buckets, bucket)?;
            for (way, r) in b.iter().enumerate() {
                let Some(r) = r else { continue };
                if &r.digest != digest || r.expires_ms <= now_ms {
                    continue;
                }
                let response = if r.state == super::RecordState::Completed {
                    let key = self.layout.response_key(buckets, bucket, way);
                    self.shared
                        .get(&key)
                        .map_err(StoreError::Host)?
                        .and_then(|(bytes, _)| StoredResponse::decode(&bytes, digest, r.token))
                        .map(|resp| (resp.status, resp.body.len()))
                } else {
                    None
                };
                let view = RecordView {
                    claim_lives_to_ttl: true,
                    shard: None,
                    state: r.state.name(),
                    expires_ms: r.expires_ms,
                    payload: r.payload,
                    response,
                    buckets,
                };
                return Ok(Some((view, buckets, bucket, way)));
            }
        }
        Ok(None)
    }

    /// The record of `digest`, if one is live.
    pub fn inspect(&self, digest: &Digest, now_ms: u64) -> Result<Option<RecordView>, StoreError> {
        Ok(self.find(digest, now_ms)?.map(|f| f.0))
    }

    /// Removes the record of `digest`; a claim (in flight or held) only with `force`.
    /// The key may run again afterwards.
    pub fn purge(&self, digest: &Digest, force: bool, now_ms: u64) -> Result<Purge, StoreError> {
        for _ in 0..super::MAX_ATTEMPTS {
            let Some((view, buckets, bucket, way)) = self.find(digest, now_ms)? else {
                return Ok(Purge::NotFound);
            };
            if !force && matches!(view.state, "in_flight" | "held") {
                return Ok(Purge::Refused(view));
            }
            let (mut b, cas) = self.read(buckets, bucket)?;
            if b[way].as_ref().is_none_or(|r| &r.digest != digest) {
                continue;
            }
            b[way] = None;
            if self.write(buckets, bucket, &b, cas)? {
                return Ok(Purge::Removed(view));
            }
        }
        Err(StoreError::Contention)
    }

    /// Counts the records of the current layout (one read per bucket).
    pub fn stats(&self, now_ms: u64) -> Result<StoreStats, StoreError> {
        let mut st = StoreStats {
            buckets: self.layout.buckets,
            ways: self.layout.buckets * WAYS as u64,
            ..StoreStats::default()
        };
        for bucket in 0..self.layout.buckets {
            let (b, _) = self.read(self.layout.buckets, bucket)?;
            st.stored_bytes += b.slot_bytes();
            for r in b.iter().flatten() {
                let counter = if r.expires_ms <= now_ms {
                    &mut st.expired
                } else {
                    match r.state {
                        super::RecordState::InFlight => &mut st.in_flight,
                        super::RecordState::Held => &mut st.held,
                        super::RecordState::Completed => &mut st.completed,
                        super::RecordState::CompletedNotStored => &mut st.completed_not_stored,
                    }
                };
                *counter += 1;
            }
        }
        st.other_layouts = self.layouts(now_ms)?.split_off(1);
        Ok(st)
    }
}
