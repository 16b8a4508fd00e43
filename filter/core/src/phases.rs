//! The phase-timed build (`--features phase-timing`; never the default build): where a
//! request's time goes inside the filter. A `span` reads the host's clock when it starts
//! and when it ends (`set_clock`: the glue's `proxy_get_current_time_nanoseconds`); the
//! nanoseconds and the count per phase add up in this VM until the worker reports them
//! as counters (`proxy_dedup_phase_<phase>_ns` and `_count`, `Worker::stream_ended`),
//! so a mean per phase can be read from Envoy's stats after a load run (`make
//! bench-envoy`, the "Where the time goes" section). Spans may nest: a phase's time
//! includes the phases inside it (`Complete` includes its bucket reads and writes).
//!
//! In the default build a span is a zero-sized value and every function here compiles
//! away: nothing of it reaches the shipped module.

/// A phase of a request inside the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The request's header map read and its head built (glue).
    HeadRead,
    /// The rule whose policy applies chosen.
    RuleSelect,
    /// The key: a header's value checked, a JSON body's field, or a fingerprint.
    Key,
    /// The record's digest (SHA-256 of the record's identity).
    RecordDigest,
    /// The request body hashed (BLAKE3).
    BodyHash,
    /// The payload digest (method, path, body; canonical JSON when configured).
    PayloadDigest,
    /// The caller's tag sealed into the payload digest.
    Principal,
    /// The scope tag (shared data's eviction and bounds, waiters' bounds).
    ScopeTag,
    /// A shared-data read of a bucket or slot (one host call).
    SharedRead,
    /// A bucket decoded whole.
    BucketDecode,
    /// A bucket encoded for a write.
    BucketEncode,
    /// A shared-data write, with its compare (one host call).
    SharedWrite,
    /// The request body read from Envoy at its end (one host call; glue).
    BodyRead,
    /// The response's headers read and kept for the record (glue and core).
    Capture,
    /// The completed record written, its response with it.
    Complete,
    /// A local reply sent (glue).
    LocalReply,
    /// The access-log properties set (glue).
    LogProperties,
    /// The ordering guard's entity claimed (or settled) in the store.
    Entity,
}

impl Phase {
    pub const ALL: [Phase; 18] = [
        Phase::HeadRead,
        Phase::RuleSelect,
        Phase::Key,
        Phase::RecordDigest,
        Phase::BodyHash,
        Phase::PayloadDigest,
        Phase::Principal,
        Phase::ScopeTag,
        Phase::SharedRead,
        Phase::BucketDecode,
        Phase::BucketEncode,
        Phase::SharedWrite,
        Phase::BodyRead,
        Phase::Capture,
        Phase::Complete,
        Phase::LocalReply,
        Phase::LogProperties,
        Phase::Entity,
    ];

    /// Its name in the counters' names.
    pub fn name(self) -> &'static str {
        match self {
            Phase::HeadRead => "head_read",
            Phase::RuleSelect => "rule_select",
            Phase::Key => "key",
            Phase::RecordDigest => "record_digest",
            Phase::BodyHash => "body_hash",
            Phase::PayloadDigest => "payload_digest",
            Phase::Principal => "principal",
            Phase::ScopeTag => "scope_tag",
            Phase::SharedRead => "shared_read",
            Phase::BucketDecode => "bucket_decode",
            Phase::BucketEncode => "bucket_encode",
            Phase::SharedWrite => "shared_write",
            Phase::BodyRead => "body_read",
            Phase::Capture => "capture",
            Phase::Complete => "complete",
            Phase::LocalReply => "local_reply",
            Phase::LogProperties => "log_properties",
            Phase::Entity => "entity",
        }
    }

    #[cfg(feature = "phase-timing")]
    fn index(self) -> usize {
        self as usize
    }
}

/// Whether this build times phases.
pub const ENABLED: bool = cfg!(feature = "phase-timing");

#[cfg(feature = "phase-timing")]
mod timing {
    use super::Phase;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    static CLOCK: OnceLock<fn() -> u64> = OnceLock::new();
    static NANOS: [AtomicU64; Phase::ALL.len()] = [const { AtomicU64::new(0) }; Phase::ALL.len()];
    static COUNTS: [AtomicU64; Phase::ALL.len()] = [const { AtomicU64::new(0) }; Phase::ALL.len()];

    pub fn set_clock(clock: fn() -> u64) {
        let _ = CLOCK.set(clock);
    }

    fn now() -> u64 {
        CLOCK.get().map_or(0, |c| c())
    }

    /// A phase under way; its time is added when it ends (dropped).
    #[must_use = "a span times the phase until it is dropped"]
    pub struct Span {
        phase: Phase,
        start: u64,
    }

    pub fn span(phase: Phase) -> Span {
        Span {
            phase,
            start: now(),
        }
    }

    impl Drop for Span {
        fn drop(&mut self) {
            let i = self.phase.index();
            let elapsed = now().saturating_sub(self.start);
            NANOS[i].fetch_add(elapsed, Ordering::Relaxed);
            COUNTS[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Each phase's time (ns) and count since the last call, taken.
    pub fn take() -> Vec<(Phase, u64, u64)> {
        Phase::ALL
            .iter()
            .map(|&p| {
                let i = p.index();
                (
                    p,
                    NANOS[i].swap(0, Ordering::Relaxed),
                    COUNTS[i].swap(0, Ordering::Relaxed),
                )
            })
            .collect()
    }
}

#[cfg(not(feature = "phase-timing"))]
mod timing {
    use super::Phase;

    pub fn set_clock(_clock: fn() -> u64) {}

    /// Nothing: the default build does not time phases.
    pub struct Span;

    #[inline(always)]
    pub fn span(_phase: Phase) -> Span {
        Span
    }

    pub fn take() -> Vec<(Phase, u64, u64)> {
        Vec::new()
    }
}

pub use timing::{set_clock, span, take, Span};

#[cfg(all(test, feature = "phase-timing"))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static FAKE_NOW: AtomicU64 = AtomicU64::new(0);

    #[test]
    fn a_span_adds_its_time_and_one_count_to_its_phase() {
        set_clock(|| FAKE_NOW.load(Ordering::Relaxed));
        let _ = take();
        {
            let _s = span(Phase::RecordDigest);
            FAKE_NOW.fetch_add(1500, Ordering::Relaxed);
        }
        let got = take();
        let digest = got.iter().find(|(p, ..)| *p == Phase::RecordDigest);
        assert_eq!(digest.map(|&(_, ns, n)| (ns, n)), Some((1500, 1)));
        assert!(take().iter().all(|&(_, ns, n)| ns == 0 && n == 0), "taken");
    }
}
