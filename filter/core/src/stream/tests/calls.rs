//! What a stream's calls hold back (`calls.rs`): the state the glue asks instead of
//! keeping flags of its own.

use crate::stream::{Answered, Decision, DedupStream, Holds, Origin};
use crate::testing::*;

#[test]
fn a_call_holds_the_request_or_the_response_until_it_answers() {
    let mut s = DedupStream::new(1);
    assert_eq!(s.pending_call(), None);
    s.call_sent(7, 1_000, Holds::Request);
    assert_eq!(s.pending_call(), Some(7));
    assert!(s.request_waits_on_call() && !s.response_held());
    assert_eq!(
        s.call_answered(1_030),
        Answered {
            request_waited: true,
            response_held: false,
            elapsed_ms: 30
        }
    );
    assert_eq!(s.pending_call(), None);
    assert!(!s.request_waits_on_call());

    s.call_sent(8, 2_000, Holds::Response);
    assert!(s.response_held() && !s.request_waits_on_call());
    assert_eq!(
        s.call_answered(2_500),
        Answered {
            request_waited: false,
            response_held: true,
            elapsed_ms: 500
        }
    );
    assert!(!s.response_held());
    // An answer nobody waited for (a clock that went back) holds nothing.
    assert_eq!(
        s.call_answered(0),
        Answered {
            request_waited: false,
            response_held: false,
            elapsed_ms: 0
        }
    );
}

/// A waiter wants its wake-ups, except while its read is out; once handed over to the
/// orphans, what is left wants nothing, and the orphan is the waiting stream.
#[test]
fn a_waiter_wants_wake_ups_unless_its_read_is_out_or_it_was_handed_over() {
    let p = plugin(r#"{"on_in_flight": "wait", "wait_timeout_ms": 5000}"#);
    let (mut a, mut b) = two_workers();
    let r = req("POST", "/orders").key("k");
    let mut first = DedupStream::new(1);
    assert_eq!(
        first.on_request_headers(&p, &mut a, r.head.clone(), true),
        Decision::Continue
    );
    let mut dup = DedupStream::new(2);
    assert!(!dup.wants_wake());
    assert_eq!(
        dup.on_request_headers(&p, &mut b, r.head.clone(), true),
        Decision::Pause
    );
    assert!(dup.wants_wake());
    dup.call_sent(3, 0, Holds::Request);
    assert!(!dup.wants_wake(), "its read is out: the store answers it");
    dup.call_answered(0);
    assert!(dup.wants_wake());
    assert!(!first.wants_wake(), "forwarded: nothing to wake");

    dup.call_sent(4, 0, Holds::Request);
    let orphan = dup.hand_over();
    assert!(dup.handed_over() && !dup.wants_wake() && dup.pending_call().is_none());
    assert!(!orphan.handed_over() && orphan.waiting());
    assert_eq!(orphan.pending_call(), Some(4));
}

/// With a store reached by calls, a storable response body is buffered (and then
/// offered whole each time: only its new bytes are read); past the replay cap, or with
/// shared data, it flows, each callback holding a new chunk.
#[test]
fn a_response_body_is_buffered_only_while_it_may_be_stored_remotely() {
    let p = plugin(r#"{"max_replay_body_bytes": 16}"#);
    let (_, mut env) = world();
    let mut s = send(&p, &mut env, &req("POST", "/orders").key("k")).unwrap();
    assert!(!s.buffer_response_body(true, 0), "not capturing yet");
    assert!(s
        .on_response_headers(&p, &mut env, 200, &Origin::upstream(), Vec::new, false)
        .is_none());
    assert_eq!(s.response_chunk_start(10), 0);
    assert!(s
        .on_response_body(&p, &mut env, b"0123456789", false)
        .is_none());
    assert!(!s.buffer_response_body(false, 10), "shared data: it flows");
    assert_eq!(s.response_chunk_start(4), 0, "flowing: each chunk is new");
    assert!(s.buffer_response_body(true, 10));
    assert_eq!(
        s.response_chunk_start(14),
        10,
        "buffered: the new bytes start at 10"
    );
    assert_eq!(
        s.response_chunk_start(9),
        0,
        "fewer bytes than seen: read them all"
    );
    assert!(s
        .on_response_body(&p, &mut env, b"0123456789", false)
        .is_none());
    assert!(
        !s.buffer_response_body(true, 20),
        "past the replay cap: it flows"
    );
    assert_eq!(s.response_chunk_start(25), 0);
    s.response_body_read(25);
    assert_eq!(s.response_chunk_start(30), 0);
}
