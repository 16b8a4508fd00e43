//! The ordering guard's entities on shared data: entity buckets beside the record
//! buckets of the same layout, claimed and settled with CAS by the rules every store
//! applies (`ordering::entities::Entity`).

use super::Layout;
use crate::key::Digest;
use crate::ordering::entities::{decode, encode, free_slot, Entity, EntityClaim, Settle};
use crate::ordering::Version;
use crate::shared_data::{
    HostFault, SetError, SharedData, StoreError, CAS_ATTEMPTS as MAX_ATTEMPTS,
};

/// The shared-data entities of one layout (its `entity_buckets`, keyed by its secret).
pub struct SharedEntities<'a, S: SharedData + ?Sized> {
    shared: &'a S,
    layout: &'a Layout,
    /// The scope tag of the request at hand (0: unknown).
    scope: u32,
}

impl<'a, S: SharedData + ?Sized> SharedEntities<'a, S> {
    pub fn new(shared: &'a S, layout: &'a Layout) -> Self {
        SharedEntities {
            shared,
            layout,
            scope: 0,
        }
    }

    /// For a request of the scope tagged `scope`: a new entity carries it, and a full
    /// bucket evicts only that scope's entities (or untagged ones), unless the layout
    /// evicts any scope's (`store.eviction: "oldest"`).
    pub fn scoped(mut self, scope: u32) -> Self {
        self.scope = scope;
        self
    }

    fn fresh(&self, digest: &Digest) -> Entity {
        Entity {
            scope: self.scope,
            ..Entity::fresh(*digest)
        }
    }

    fn key_of(&self, digest: &Digest) -> String {
        let bucket = self.layout.bucket_in(self.layout.entity_buckets, digest);
        self.layout.entity_key(bucket)
    }

    fn read(&self, key: &str) -> Result<(Vec<Entity>, u32), StoreError> {
        match self.shared.get(key).map_err(StoreError::Host)? {
            Some((bytes, cas)) => {
                let entities = decode(&bytes).map_err(|_| {
                    StoreError::Host(HostFault(format!(
                        "entity bucket `{key}` is in a format this version cannot read"
                    )))
                })?;
                Ok((entities, cas))
            }
            None => Ok((Vec::new(), u32::MAX)),
        }
    }

    fn write(&self, key: &str, entities: &[Entity], cas: u32) -> Result<bool, StoreError> {
        match self.shared.set(key, &encode(entities), cas) {
            Ok(()) => Ok(true),
            Err(SetError::CasMismatch) => Ok(false),
            Err(SetError::Fault(f)) => Err(StoreError::Host(f)),
        }
    }

    /// Claims `digest` for `version` (see `Entity::claim`). A new entity takes a free
    /// slot, else the slot of an entity whose state has expired, else that of the entity
    /// whose applied version expires first (`evicted_unexpired`: an older version of
    /// that entity could then run); never one with a live flight (`BucketFull`).
    pub fn claim(
        &self,
        digest: &Digest,
        version: &Version,
        token: u64,
        now_ms: u64,
        flight_until_ms: u64,
    ) -> Result<EntityClaim, StoreError> {
        let key = self.key_of(digest);
        for _ in 0..MAX_ATTEMPTS {
            let (mut entities, cas) = self.read(&key)?;
            let mut evicted_unexpired = false;
            let at = match entities.iter().position(|e| e.digest == *digest) {
                Some(i) => i,
                None => match free_slot(&mut entities, self.fresh(digest), now_ms) {
                    Some(i) => i,
                    None => {
                        let victim = entities
                            .iter()
                            .enumerate()
                            .filter(|(_, e)| {
                                e.live_flight(now_ms).is_none()
                                    && (self.layout.evict_any_scope
                                        || e.scope == self.scope
                                        || e.scope == 0)
                            })
                            .min_by_key(|(_, e)| e.applied.as_ref().map_or(0, |a| a.expires_ms))
                            .map(|(i, _)| i);
                        let Some(i) = victim else {
                            return Err(StoreError::BucketFull);
                        };
                        entities[i] = self.fresh(digest);
                        evicted_unexpired = true;
                        i
                    }
                },
            };
            let Some(entity) = entities.get_mut(at) else {
                return Err(StoreError::Contention);
            };
            let outcome = entity.claim(token, version, now_ms, flight_until_ms);
            if !matches!(outcome, EntityClaim::Claimed { .. }) {
                return Ok(outcome);
            }
            if self.write(&key, &entities, cas)? {
                return Ok(EntityClaim::Claimed { evicted_unexpired });
            }
        }
        Err(StoreError::Contention)
    }

    /// Settles the flight of `token` on `digest` (see `Entity::settle`). A completion
    /// whose entity is gone from its bucket writes it again (a free or dead slot only:
    /// the applied version is kept where it costs no other entity's). Returns whether
    /// the flight was still `token`'s.
    pub fn settle(
        &self,
        digest: &Digest,
        token: u64,
        how: &Settle,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let key = self.key_of(digest);
        for _ in 0..MAX_ATTEMPTS {
            let (mut entities, cas) = self.read(&key)?;
            let at = match entities.iter().position(|e| e.digest == *digest) {
                Some(i) => i,
                None if matches!(how, Settle::Complete { .. }) => {
                    match free_slot(&mut entities, self.fresh(digest), now_ms) {
                        Some(i) => i,
                        None => return Ok(false),
                    }
                }
                None => return Ok(false),
            };
            let Some(entity) = entities.get_mut(at) else {
                return Err(StoreError::Contention);
            };
            let before = entity.clone();
            let owned = entity.settle(token, how, now_ms);
            if *entity == before {
                return Ok(owned);
            }
            if self.write(&key, &entities, cas)? {
                return Ok(owned);
            }
        }
        Err(StoreError::Contention)
    }

    /// The entity's state now (`None`: unknown to this store), for tests and operators.
    pub fn get(&self, digest: &Digest) -> Result<Option<Entity>, StoreError> {
        let (entities, _) = self.read(&self.key_of(digest))?;
        Ok(entities.into_iter().find(|e| e.digest == *digest))
    }
}
