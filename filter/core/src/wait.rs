//! Wait mode (`on_in_flight: "wait"`): the per-worker registry of duplicates held until the
//! first request's answer, and the shared-data board of the workers' wake-up queues.
//! Host-independent: the glue registers a shared queue, enqueues digests to the queues on
//! the board, and runs the streams `Waiters::take_due` names (from its tick or queue).

use crate::key::Digest;
use crate::shared_data::{HostFault, SetError, SharedData, StoreError};
use std::collections::HashSet;

/// Tick period of a worker while it holds waiters (ms); no tick without waiters.
pub const TICK_MS: u64 = 100;
/// Most workers on the board (older entries are dropped first).
const MAX_BOARD: usize = 256;
const MAX_ATTEMPTS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiter {
    stream: u32,
    digest: Digest,
    deadline_ms: u64,
    next_check_ms: u64,
    woken: bool,
    /// The waiter's scope tag (0: none), bounded by `max_waiters_per_scope`.
    scope: u32,
}

/// The duplicates one worker holds, bounded by `max_waiters`.
#[derive(Debug, Default)]
pub struct Waiters {
    entries: Vec<Waiter>,
}

impl Waiters {
    /// Holds `stream` for `digest` until `deadline_ms`; false (nothing added) when the
    /// worker already holds `max` waiters.
    pub fn add(
        &mut self,
        stream: u32,
        digest: Digest,
        deadline_ms: u64,
        first_check_ms: u64,
        max: usize,
    ) -> bool {
        self.add_for_scope(stream, digest, deadline_ms, first_check_ms, (0, max, max))
    }

    /// `add`, for a waiter of scope tag `limits.0`: refused too when that scope already
    /// holds `limits.2` waiters on this worker (`limits.1` is `max_waiters`), so one
    /// scope cannot take the whole pool.
    pub fn add_for_scope(
        &mut self,
        stream: u32,
        digest: Digest,
        deadline_ms: u64,
        first_check_ms: u64,
        limits: (u32, usize, usize),
    ) -> bool {
        let (scope, max, max_per_scope) = limits;
        if let Some(w) = self.entries.iter_mut().find(|w| w.stream == stream) {
            w.digest = digest;
            w.deadline_ms = deadline_ms;
            w.next_check_ms = first_check_ms;
            return true;
        }
        if self.entries.len() >= max {
            return false;
        }
        if scope > 0 && self.entries.iter().filter(|w| w.scope == scope).count() >= max_per_scope {
            return false;
        }
        self.entries.push(Waiter {
            stream,
            digest,
            deadline_ms,
            next_check_ms: first_check_ms,
            woken: false,
            scope,
        });
        true
    }

    /// Forgets `stream` (answered, executing, or gone).
    pub fn remove(&mut self, stream: u32) {
        self.entries.retain(|w| w.stream != stream);
    }

    pub fn contains(&self, stream: u32) -> bool {
        self.entries.iter().any(|w| w.stream == stream)
    }

    /// The record changed: its waiters re-check at the next `take_due`.
    pub fn wake(&mut self, digest: &Digest) -> usize {
        let mut n = 0;
        for w in self.entries.iter_mut().filter(|w| &w.digest == digest) {
            w.woken = true;
            n += 1;
        }
        n
    }

    /// The waiters to re-check now: every woken one and every one past its deadline, and
    /// of those whose periodic check is due, one per record (the others are rescheduled:
    /// when that one finds the record changed it wakes them). Each named waiter's next
    /// periodic check is `interval_ms` away.
    pub fn take_due(&mut self, now_ms: u64, interval_ms: u64) -> Vec<u32> {
        let mut due = Vec::new();
        let mut polled: HashSet<Digest> = HashSet::new();
        for w in self.entries.iter_mut() {
            let urgent = w.woken || now_ms >= w.deadline_ms;
            let periodic = now_ms >= w.next_check_ms;
            if !urgent && !periodic {
                continue;
            }
            w.woken = false;
            w.next_check_ms = now_ms.saturating_add(interval_ms);
            if urgent || polled.insert(w.digest) {
                due.push(w.stream);
            }
        }
        due
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The shared-data key listing the workers' wake-up queues (`<namespace>/wait-queues`).
pub fn board_key(namespace: &str) -> String {
    format!("{namespace}/wait-queues")
}

/// Entries: 4-byte queue token, 8-byte expiry (ms), little-endian.
fn decode_board(bytes: &[u8]) -> Vec<(u32, u64)> {
    bytes
        .chunks_exact(12)
        .filter_map(|c| {
            let token = u32::from_le_bytes(c.get(0..4)?.try_into().ok()?);
            let until = u64::from_le_bytes(c.get(4..12)?.try_into().ok()?);
            Some((token, until))
        })
        .collect()
}

fn encode_board(entries: &[(u32, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 12);
    for (token, until) in entries {
        out.extend_from_slice(&token.to_le_bytes());
        out.extend_from_slice(&until.to_le_bytes());
    }
    out
}

/// Puts this worker's queue `token` on the board until `until_ms` (a worker announces
/// itself while it holds waiters; expired entries are dropped on every write).
pub fn announce<S: SharedData + ?Sized>(
    shared: &S,
    namespace: &str,
    token: u32,
    until_ms: u64,
    now_ms: u64,
) -> Result<(), StoreError> {
    let key = board_key(namespace);
    for _ in 0..MAX_ATTEMPTS {
        let (mut entries, cas) = match shared.get(&key).map_err(StoreError::Host)? {
            Some((v, cas)) => (decode_board(&v), cas),
            None => (Vec::new(), u32::MAX),
        };
        entries.retain(|(t, until)| *t != token && *until > now_ms);
        entries.push((token, until_ms));
        if entries.len() > MAX_BOARD {
            entries.sort_by_key(|(_, until)| std::cmp::Reverse(*until));
            entries.truncate(MAX_BOARD);
        }
        match shared.set(&key, &encode_board(&entries), cas) {
            Ok(()) => return Ok(()),
            Err(SetError::CasMismatch) => continue,
            Err(SetError::Fault(f)) => return Err(StoreError::Host(f)),
        }
    }
    Err(StoreError::Contention)
}

/// The queue tokens of the workers that hold waiters now.
pub fn listeners<S: SharedData + ?Sized>(
    shared: &S,
    namespace: &str,
    now_ms: u64,
) -> Result<Vec<u32>, HostFault> {
    Ok(match shared.get(&board_key(namespace))? {
        Some((v, _)) => decode_board(&v)
            .into_iter()
            .filter(|(_, until)| *until > now_ms)
            .map(|(t, _)| t)
            .collect(),
        None => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeShared;

    fn d(n: u8) -> Digest {
        [n; 32]
    }

    #[test]
    fn waiters_are_bounded_and_removed() {
        let mut w = Waiters::default();
        assert!(w.add(1, d(1), 1000, 100, 2));
        assert!(w.add(2, d(1), 1000, 100, 2));
        assert!(!w.add(3, d(1), 1000, 100, 2), "above max_waiters");
        assert!(
            w.add(2, d(2), 2000, 100, 2),
            "re-adding a waiter is no new entry"
        );
        w.remove(1);
        assert!(!w.contains(1));
        assert!(w.add(3, d(1), 1000, 100, 2));
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn wake_names_only_that_records_waiters_and_deadlines_always_come_due() {
        let mut w = Waiters::default();
        w.add(1, d(1), 10_000, 5_000, 10);
        w.add(2, d(2), 10_000, 5_000, 10);
        w.add(3, d(1), 1_000, 5_000, 10);
        assert!(w.take_due(0, 500).is_empty());
        assert_eq!(w.wake(&d(1)), 2);
        assert_eq!(w.take_due(10, 5_000), vec![1, 3]);
        assert!(w.take_due(20, 5_000).is_empty(), "a wake-up is used once");
        assert_eq!(w.take_due(1_000, 5_000), vec![3], "past its deadline");
    }

    #[test]
    fn periodic_checks_poll_one_waiter_per_record() {
        let mut w = Waiters::default();
        for s in 1..=4 {
            w.add(s, d(if s <= 3 { 1 } else { 2 }), 60_000, 250, 10);
        }
        assert_eq!(w.take_due(250, 250), vec![1, 4]);
        assert!(
            w.take_due(400, 250).is_empty(),
            "the others were rescheduled"
        );
        assert_eq!(w.take_due(500, 250), vec![1, 4]);
    }

    #[test]
    fn the_board_lists_live_queues_only() {
        let sd = FakeShared::default();
        assert_eq!(listeners(&sd, "ns", 0).unwrap(), Vec::<u32>::new());
        announce(&sd, "ns", 7, 1_000, 0).unwrap();
        announce(&sd, "ns", 9, 5_000, 0).unwrap();
        announce(&sd, "ns", 7, 3_000, 10).unwrap();
        assert_eq!(listeners(&sd, "ns", 100).unwrap(), vec![9, 7]);
        assert_eq!(listeners(&sd, "ns", 3_000).unwrap(), vec![9]);
        assert_eq!(listeners(&sd, "other", 0).unwrap(), Vec::<u32>::new());
        announce(&sd, "ns", 1, 9_000, 4_000).unwrap();
        assert_eq!(listeners(&sd, "ns", 4_000).unwrap(), vec![9, 1]);
    }

    #[test]
    fn the_board_stays_bounded() {
        let sd = FakeShared::default();
        for t in 0..(MAX_BOARD as u32 + 50) {
            announce(&sd, "ns", t, 10_000 + u64::from(t), 0).unwrap();
        }
        let live = listeners(&sd, "ns", 0).unwrap();
        assert_eq!(live.len(), MAX_BOARD);
        assert!(live.contains(&(MAX_BOARD as u32 + 49)), "the newest stays");
    }

    #[test]
    fn a_garbled_board_reads_as_what_it_can() {
        let sd = FakeShared::default();
        sd.set(&board_key("ns"), &[1, 2, 3], 0).unwrap();
        assert_eq!(listeners(&sd, "ns", 0).unwrap(), Vec::<u32>::new());
        announce(&sd, "ns", 5, 100, 0).unwrap();
        assert_eq!(listeners(&sd, "ns", 0).unwrap(), vec![5]);
    }
}
