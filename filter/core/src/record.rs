//! A record's state, the same in both stores (shared-data buckets and etcd values), and
//! its byte in their formats.

/// A record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    InFlight = 1,
    /// Completed; the response is stored with the record (shared data: in the way's
    /// response slot; etcd: in the value).
    Completed = 2,
    /// Completed, but the response was too large to keep.
    CompletedNotStored = 3,
    /// Forwarded, but the filter cannot know whether the upstream ran it (client gone,
    /// route timeout, reset after sending): held like a claim until it expires.
    Held = 4,
}

impl RecordState {
    pub const ALL: [RecordState; 4] = [
        RecordState::InFlight,
        RecordState::Completed,
        RecordState::CompletedNotStored,
        RecordState::Held,
    ];

    /// The name operators see.
    pub fn name(self) -> &'static str {
        match self {
            RecordState::InFlight => "in_flight",
            RecordState::Held => "held",
            RecordState::Completed => "completed",
            RecordState::CompletedNotStored => "completed_not_stored",
        }
    }

    /// A claim that still stands for a possibly running request: never evicted,
    /// never released by an operator without `force`.
    pub fn is_claim(self) -> bool {
        matches!(self, RecordState::InFlight | RecordState::Held)
    }

    /// The state of its byte in a record; `None` for a byte no version writes.
    pub fn from_byte(b: u8) -> Option<RecordState> {
        match b {
            1 => Some(RecordState::InFlight),
            2 => Some(RecordState::Completed),
            3 => Some(RecordState::CompletedNotStored),
            4 => Some(RecordState::Held),
            _ => None,
        }
    }
}

/// What a duplicate's answer can tell about its record's times (Unix ms), as far as the
/// store knows them; `None`: not known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordTimes {
    /// When the answer stops holding: a completed record's expiry (its TTL), a claim's
    /// in-flight expiry, a held claim's end.
    pub expires_ms: Option<u64>,
    /// When a completed record completed.
    pub completed_ms: Option<u64>,
}

impl RecordTimes {
    /// Times with an expiry only.
    pub fn expiring(expires_ms: u64) -> Self {
        RecordTimes {
            expires_ms: Some(expires_ms),
            completed_ms: None,
        }
    }
}

/// A record as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView {
    /// `in_flight`, `held` (outcome unknown), `completed` or `completed_not_stored`.
    pub state: &'static str,
    pub expires_ms: u64,
    pub payload: crate::key::Digest,
    /// The stored response's status and body size, when there is one.
    pub response: Option<(u16, usize)>,
    /// The layout (bucket count) it lives in (shared data; 0 elsewhere).
    pub buckets: u64,
    /// Whether a kept claim (`on_unknown_outcome: "keep"`) lives until the TTL in this
    /// store's view (shared data); an etcd claim's expiry stays its in-flight time (its
    /// lease ends it).
    pub claim_lives_to_ttl: bool,
    /// The shard it was found on (etcd).
    pub shard: Option<String>,
}
