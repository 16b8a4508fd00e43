//! The ordering guard's entities: per entity, the highest version that completed
//! (`applied`, kept until its expiry) and the one version in flight (`flight`), and the
//! shared-data buckets that hold them.
//!
//! An entity bucket is one shared-data key, `<namespace>/<entity buckets>/o/<bucket>`,
//! written with CAS like a record bucket: a fixed set of keys whatever the traffic
//! (shared data has no delete). Its bytes (format 1):
//!
//! ```text
//! u8 format (0xE1) · u8 entries · entries
//! entry: [u8; 32] digest · u8 flags (1 applied, 2 flight, 4 held) · u32 scope tag
//!        applied: u64 expires_ms · u8 len · version bytes
//!        flight:  u64 token · u64 expires_ms · u8 len · version bytes
//! ```

use super::Version;
use crate::geometry::WAYS;
use crate::key::Digest;
use crate::wire::{Reader, WireError, Writer};

const FORMAT: u8 = 0xE1;
const APPLIED: u8 = 1;
const FLIGHT: u8 = 2;
const HELD: u8 = 4;

/// The highest version of an entity that completed, until `expires_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub version: Version,
    pub expires_ms: u64,
}

/// The version of an entity in flight: its claim's token, until `expires_ms` (the
/// claim's own lifetime; a hold moves it), `held` once its outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flight {
    pub token: u64,
    pub version: Version,
    pub expires_ms: u64,
    pub held: bool,
}

/// One entity's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    pub digest: Digest,
    /// Its scope's tag (`key::scope_tag`; 0: unknown): a full bucket evicts only its
    /// own scope's entities (unless `store.eviction: "oldest"`).
    pub scope: u32,
    pub applied: Option<Applied>,
    pub flight: Option<Flight>,
}

/// What a claim of an entity found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityClaim {
    /// This request's version is the entity's one in flight now: forward it.
    Claimed { evicted_unexpired: bool },
    /// The version is at or below the applied one: not forwarded.
    Stale { applied: Version },
    /// Another version is in flight (`held_until`: its outcome is unknown, held until
    /// then).
    Busy {
        version: Version,
        held_until: Option<u64>,
    },
}

/// How a claimed version ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// It completed: the applied version rises to it (never falls), for `ttl_ms`.
    Complete { version: Version, ttl_ms: u64 },
    /// It certainly did not run: the applied version stays.
    Release,
    /// Its outcome is unknown: the flight stays, held until `until_ms` (else until its
    /// own expiry).
    Hold { until_ms: Option<u64> },
}

impl Entity {
    /// An entity the store has not seen: no applied version, nothing in flight.
    pub fn fresh(digest: Digest) -> Entity {
        Entity {
            digest,
            scope: 0,
            applied: None,
            flight: None,
        }
    }

    pub(crate) fn live_flight(&self, now_ms: u64) -> Option<&Flight> {
        self.flight.as_ref().filter(|f| f.expires_ms > now_ms)
    }

    fn live_applied(&self, now_ms: u64) -> Option<&Applied> {
        self.applied.as_ref().filter(|a| a.expires_ms > now_ms)
    }

    /// Holds nothing that still counts: its slot may be reused.
    fn is_dead(&self, now_ms: u64) -> bool {
        self.live_flight(now_ms).is_none() && self.live_applied(now_ms).is_none()
    }

    /// The claim of `version` by `token` at `now_ms`, its flight ending at
    /// `flight_until_ms`: the decision, and whether the entity changed.
    pub fn claim(
        &mut self,
        token: u64,
        version: &Version,
        now_ms: u64,
        flight_until_ms: u64,
    ) -> EntityClaim {
        if let Some(f) = self.live_flight(now_ms) {
            if f.token != token {
                return EntityClaim::Busy {
                    version: f.version.clone(),
                    held_until: f.held.then_some(f.expires_ms),
                };
            }
        }
        if let Some(a) = self.live_applied(now_ms) {
            if *version <= a.version {
                return EntityClaim::Stale {
                    applied: a.version.clone(),
                };
            }
        } else {
            self.applied = None;
        }
        self.flight = Some(Flight {
            token,
            version: version.clone(),
            expires_ms: flight_until_ms,
            held: false,
        });
        EntityClaim::Claimed {
            evicted_unexpired: false,
        }
    }

    /// Ends the flight of `token` as `how` says; a completion raises the applied version
    /// even when the flight is no longer this token's (it ran). Returns whether the
    /// flight was still `token`'s.
    pub fn settle(&mut self, token: u64, how: &Settle, now_ms: u64) -> bool {
        let owned = self.flight.as_ref().is_some_and(|f| f.token == token);
        match how {
            Settle::Complete { version, ttl_ms } => {
                let higher = self
                    .live_applied(now_ms)
                    .is_none_or(|a| *version > a.version);
                if higher {
                    self.applied = Some(Applied {
                        version: version.clone(),
                        expires_ms: now_ms.saturating_add(*ttl_ms),
                    });
                }
                if owned {
                    self.flight = None;
                }
            }
            Settle::Release => {
                if owned {
                    self.flight = None;
                }
            }
            Settle::Hold { until_ms } => {
                if let Some(f) = self.flight.as_mut().filter(|f| f.token == token) {
                    f.held = true;
                    if let Some(u) = until_ms {
                        f.expires_ms = f.expires_ms.max(*u);
                    }
                }
            }
        }
        owned
    }
}

/// An entity bucket's entries.
pub fn decode(bytes: &[u8]) -> Result<Vec<Entity>, WireError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = Reader::new(bytes);
    if r.u8()? != FORMAT {
        return Err(WireError);
    }
    let n = r.u8()?;
    let mut out = Vec::with_capacity(usize::from(n));
    let version = |r: &mut Reader<'_>| -> Result<Version, WireError> {
        let len = r.u8()?;
        Version::from_stored(r.bytes(usize::from(len))?).ok_or(WireError)
    };
    for _ in 0..n {
        let digest = r.array::<32>()?;
        let flags = r.u8()?;
        let scope = r.u32()?;
        let applied = if flags & APPLIED != 0 {
            let expires_ms = r.u64()?;
            Some(Applied {
                version: version(&mut r)?,
                expires_ms,
            })
        } else {
            None
        };
        let flight = if flags & FLIGHT != 0 {
            let token = r.u64()?;
            let expires_ms = r.u64()?;
            Some(Flight {
                token,
                version: version(&mut r)?,
                expires_ms,
                held: flags & HELD != 0,
            })
        } else {
            None
        };
        out.push(Entity {
            digest,
            scope,
            applied,
            flight,
        });
    }
    r.end()?;
    Ok(out)
}

pub fn encode(entities: &[Entity]) -> Vec<u8> {
    let mut w = Writer::with_capacity(2 + entities.len() * 96);
    w.u8(FORMAT).u8(entities.len().min(255) as u8);
    let version = |w: &mut Writer, v: &Version| {
        let b = v.as_bytes();
        w.u8(b.len().min(255) as u8)
            .bytes(b.get(..255).unwrap_or(b));
    };
    for e in entities.iter().take(255) {
        let mut flags = 0;
        if e.applied.is_some() {
            flags |= APPLIED;
        }
        if let Some(f) = &e.flight {
            flags |= FLIGHT;
            if f.held {
                flags |= HELD;
            }
        }
        w.bytes(&e.digest).u8(flags).u32(e.scope);
        if let Some(a) = &e.applied {
            w.u64(a.expires_ms);
            version(&mut w, &a.version);
        }
        if let Some(f) = &e.flight {
            w.u64(f.token).u64(f.expires_ms);
            version(&mut w, &f.version);
        }
    }
    w.finish()
}

/// A slot for a new entity `digest` in a bucket's `entities`: a free one, else that of
/// an entity whose state has expired (`None`: every slot holds a live entity).
pub(crate) fn free_slot(entities: &mut Vec<Entity>, fresh: Entity, now_ms: u64) -> Option<usize> {
    if entities.len() < WAYS {
        entities.push(fresh);
        return Some(entities.len() - 1);
    }
    let i = entities.iter().position(|e| e.is_dead(now_ms))?;
    entities[i] = fresh;
    Some(i)
}
