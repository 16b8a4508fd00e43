//! What a stream's calls hold back: the request paused on a store (or detached) call,
//! the response held until a completion or release is settled, the call out and since
//! when, a stream handed over to the worker's orphans, and how much of a buffered
//! response body was already read. The glue asks these instead of keeping flags.

use super::DedupStream;

/// The call state of a stream (see `DedupStream::call_sent`).
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// The call this stream waits for, if any, and when it was sent (ms).
    pending: Option<u32>,
    pending_since_ms: u64,
    /// The request is paused on a call: resumed when the answer lets it through.
    request_waits: bool,
    /// The response is held until the store confirms its completion or release, so a
    /// client that has the response finds the record settled on every proxy.
    response_held: bool,
    /// The stream ended with a call out and went to the worker's orphans: this one is
    /// what is left behind.
    handed_over: bool,
    /// Response body bytes already read while Envoy buffers the body for us.
    response_seen: usize,
    response_buffering: bool,
}

/// Who waits for a call just sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// The request (a claim, a waiter's read, a detached call): paused until the answer.
    Request,
    /// The response (a completion, release or hold): paused until the store settles it.
    Response,
}

/// What had waited for a call that answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    /// The request was paused on it.
    pub request_waited: bool,
    /// The response was held for it.
    pub response_held: bool,
    /// Its round trip (ms).
    pub elapsed_ms: u64,
}

impl DedupStream {
    /// A call was sent as `token` at `now_ms`; `holds` waits for its answer.
    pub fn call_sent(&mut self, token: u32, now_ms: u64, holds: Holds) {
        let c = &mut self.calls;
        c.pending = Some(token);
        c.pending_since_ms = now_ms;
        match holds {
            Holds::Request => c.request_waits = true,
            Holds::Response => c.response_held = true,
        }
    }

    /// The call out, if any.
    pub fn pending_call(&self) -> Option<u32> {
        self.calls.pending
    }

    /// The call out answered at `now_ms`: nothing waits for it any more.
    pub fn call_answered(&mut self, now_ms: u64) -> Answered {
        let c = &mut self.calls;
        c.pending = None;
        Answered {
            request_waited: std::mem::take(&mut c.request_waits),
            response_held: std::mem::take(&mut c.response_held),
            elapsed_ms: now_ms.saturating_sub(c.pending_since_ms),
        }
    }

    /// True while the request is paused on a call: its body and trailers wait too
    /// (Envoy buffers them).
    pub fn request_waits_on_call(&self) -> bool {
        self.calls.request_waits
    }

    /// True while the response is held for a call: every response callback pauses.
    pub fn response_held(&self) -> bool {
        self.calls.response_held
    }

    /// Whether a wake-up (tick, queue) concerns this stream: a waiter whose read is not
    /// out (that one hears from the store instead), or a detached call's stream (for its
    /// client's deadline); never a stream handed over.
    pub fn wants_wake(&self) -> bool {
        let waiter = self.waiting() && !self.calls.request_waits;
        !self.calls.handed_over && (waiter || self.detached())
    }

    /// The stream ended with a call out: it goes to the worker's orphans (returned), and
    /// what stays is an empty stream that knows it was handed over.
    pub fn hand_over(&mut self) -> DedupStream {
        let mut left = DedupStream::new(self.id);
        left.calls.handed_over = true;
        std::mem::replace(self, left)
    }

    /// True once the stream was handed over (its callbacks then do nothing).
    pub fn handed_over(&self) -> bool {
        self.calls.handed_over
    }

    /// Where the new bytes of a response body callback start, when Envoy offers
    /// `body_size` bytes: while we buffer (pause), Envoy offers the whole buffered body
    /// each time; once we let it flow, each callback holds just the new chunk.
    pub fn response_chunk_start(&self, body_size: usize) -> usize {
        let c = &self.calls;
        if c.response_buffering && body_size >= c.response_seen {
            c.response_seen
        } else {
            0
        }
    }

    /// After a response body callback that read up to `body_size`: whether to buffer
    /// (pause) the body. With a store reached by calls, the last bytes must not reach the
    /// client before the store has the completed record (a client that has the response
    /// would otherwise get 409 from another proxy). Envoy may deliver the last bytes
    /// before the end of the stream, so the body is buffered while it is still small
    /// enough to be stored; a larger one flows on (its duplicates get 409
    /// response-not-stored anyway).
    /// (`store_makes_calls`: `Store::makes_calls`; the worker asks, `response_body_read`.)
    pub fn buffer_response_body(&mut self, store_makes_calls: bool, body_size: usize) -> bool {
        self.calls.response_seen = body_size;
        let buffer = store_makes_calls && self.capture_within_cap();
        self.calls.response_buffering = buffer;
        buffer
    }

    /// The end of the response body was read (up to `body_size`).
    pub fn response_body_read(&mut self, body_size: usize) {
        self.calls.response_seen = body_size;
    }
}
