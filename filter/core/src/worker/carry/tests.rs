//! Carrying out decisions through the fake host and a fake `StreamIo`: calls followed
//! until one is out, answers resuming the side that waited, local replies, detached
//! calls, the response held for a completion, and streams handed to the orphans.

use super::super::Worker;
use super::{Action, Answerer, Side, StreamIo};
use crate::fake::{FakeEtcd, FakeHost, FakeVm};
use crate::reply::LocalReply;
use crate::stream::{CallAnswer, Decision, DedupStream, Origin, UpstreamCall};
use crate::testing::req;

const ETCD: &str = r#"{"store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 500}}"#;

/// What the stream's host calls were asked to do.
#[derive(Default)]
struct FakeIo {
    replies: Vec<LocalReply>,
    reports: Vec<(String, bool, Option<String>)>,
    resumed: Vec<Side>,
    upstream: Vec<String>,
    refuse_upstream: bool,
}

impl StreamIo for FakeIo {
    fn dispatch_upstream(&mut self, call: &UpstreamCall) -> Result<u32, u32> {
        if self.refuse_upstream {
            return Err(1);
        }
        self.upstream.push(call.cluster.clone());
        Ok(900)
    }
    fn send_reply(&mut self, reply: &LocalReply) {
        self.replies.push(reply.clone());
    }
    fn report(&mut self, verdict: &str, record: Option<[u8; 12]>, rule: Option<&str>) {
        self.reports.push((
            verdict.to_string(),
            record.is_some(),
            rule.map(str::to_string),
        ));
    }
    fn resume(&mut self, side: Side) {
        self.resumed.push(side);
    }
}

fn worker(host: &FakeHost, config: &str) -> Worker {
    Worker::configure(host, config.as_bytes()).expect("configured")
}

/// Answers the host's last dispatched call from `etcd`: (token, answer).
fn answer_last(etcd: &FakeEtcd, host: &FakeHost) -> (u32, CallAnswer) {
    let (token, call) = host.calls.borrow().last().cloned().expect("a call out");
    let (status, body) = etcd.handle(call.path, &call.body, host.now_ms.get());
    (
        token,
        CallAnswer {
            status,
            body,
            ..Default::default()
        },
    )
}

fn headers(w: &mut Worker, host: &FakeHost, s: &mut DedupStream, key: &str) -> Decision {
    let head = req("POST", "/orders").key(key).head;
    w.run(host, |p, env| s.on_request_headers(p, env, head, true))
}

#[test]
fn a_claim_call_pauses_the_request_and_its_answer_resumes_it_forwarded() {
    let (etcd, host) = (FakeEtcd::new(), FakeHost::new(FakeVm::new(), 1));
    let mut w = worker(&host, ETCD);
    let (mut s, mut io) = (DedupStream::new(3), FakeIo::default());
    let d = headers(&mut w, &host, &mut s, "k");
    assert_eq!(
        w.drive(&host, &mut io, &mut s, Answerer::Stream, d),
        Action::Pause
    );
    assert!(s.pending_call().is_some() && s.request_waits_on_call());
    // Answers until the claim is decided (a lease grant, then the claim txn).
    while s.pending_call().is_some() && io.resumed.is_empty() {
        let (token, a) = answer_last(&etcd, &host);
        w.call_answered(&host, &mut io, &mut s, Answerer::Stream, token, a);
    }
    assert_eq!(
        io.resumed,
        [Side::Request],
        "forwarded: the request goes on"
    );
    assert_eq!(io.reports.last().map(|r| r.0.as_str()), Some("executed"));
    assert!(io.replies.is_empty());
    // The round trips were timed.
    assert!(!host.recorded.borrow().is_empty());
}

#[test]
fn a_call_that_cannot_be_sent_is_answered_at_once_and_the_stream_decides() {
    let host = FakeHost::new(FakeVm::new(), 1);
    host.refuse_calls.set(true);
    let mut w = worker(
        &host,
        r#"{"failure_mode": "closed", "store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 500}}"#,
    );
    let (mut s, mut io) = (DedupStream::new(3), FakeIo::default());
    let d = headers(&mut w, &host, &mut s, "k");
    assert_eq!(
        w.drive(&host, &mut io, &mut s, Answerer::Stream, d),
        Action::Pause
    );
    assert_eq!(io.replies.len(), 1, "failure_mode closed: 503");
    assert_eq!(io.replies[0].status, 503);
    assert_eq!(
        io.reports.last().map(|r| r.0.as_str()),
        Some("store_unavailable")
    );
    assert_eq!(s.pending_call(), None);
}

#[test]
fn a_completion_holds_the_response_until_etcd_answers_and_an_ended_stream_is_orphaned() {
    let (etcd, host) = (FakeEtcd::new(), FakeHost::new(FakeVm::new(), 1));
    let mut w = worker(&host, ETCD);
    let (mut s, mut io) = (DedupStream::new(3), FakeIo::default());
    let d = headers(&mut w, &host, &mut s, "k");
    w.drive(&host, &mut io, &mut s, Answerer::Stream, d);
    while s.pending_call().is_some() {
        let (token, a) = answer_last(&etcd, &host);
        w.call_answered(&host, &mut io, &mut s, Answerer::Stream, token, a);
    }
    let call = w.run(&host, |p, env| {
        s.on_response_headers(p, env, 201, &Origin::upstream(), Vec::new, true)
    });
    assert!(call.is_some(), "a completion call");
    assert_eq!(
        w.hold_response_for(&host, &mut io, &mut s, call),
        Action::Pause
    );
    assert!(s.response_held());
    let (token, a) = answer_last(&etcd, &host);
    w.call_answered(&host, &mut io, &mut s, Answerer::Stream, token, a);
    assert_eq!(
        io.resumed.last(),
        Some(&Side::Response),
        "settled: the response goes on"
    );
    assert_eq!(super::response_action(&s), Action::Continue);

    // Another stream ends with its completion out: the worker adopts it, and the
    // answer that comes to the stream's context is the orphan's.
    let mut s2 = DedupStream::new(4);
    let d = headers(&mut w, &host, &mut s2, "k2");
    w.drive(&host, &mut io, &mut s2, Answerer::Stream, d);
    while s2.pending_call().is_some() {
        let (token, a) = answer_last(&etcd, &host);
        w.call_answered(&host, &mut io, &mut s2, Answerer::Stream, token, a);
    }
    let call = w.run(&host, |p, env| {
        s2.on_response_headers(p, env, 201, &Origin::upstream(), Vec::new, true)
    });
    w.end_stream(&host, &mut io, &mut s2, call);
    assert!(s2.handed_over());
    assert_eq!(w.orphans(), 1);
    let (token, a) = answer_last(&etcd, &host);
    w.call_answered(&host, &mut io, &mut s2, Answerer::Stream, token, a);
    assert_eq!(w.orphans(), 0, "settled from the worker");
}

#[test]
fn a_detached_call_is_sent_by_the_stream_io_and_one_it_cannot_send_is_answered() {
    let host = FakeHost::new(FakeVm::new(), 1);
    let cfg = r#"{"upstream": {"detached": true, "cluster": "api", "timeout_ms": 5000}}"#;
    let mut w = worker(&host, cfg);
    let (mut s, mut io) = (DedupStream::new(3), FakeIo::default());
    let d = headers(&mut w, &host, &mut s, "k");
    assert!(matches!(d, Decision::Upstream(_)), "{d:?}");
    assert_eq!(
        w.drive(&host, &mut io, &mut s, Answerer::Stream, d),
        Action::Pause
    );
    assert_eq!(io.upstream, ["api"]);
    assert_eq!(s.pending_call(), Some(900));

    let mut io = FakeIo {
        refuse_upstream: true,
        ..FakeIo::default()
    };
    let mut s = DedupStream::new(5);
    let d = headers(&mut w, &host, &mut s, "k-other");
    assert_eq!(
        w.drive(&host, &mut io, &mut s, Answerer::Stream, d),
        Action::Pause
    );
    assert_eq!(io.replies.len(), 1);
    assert_eq!(
        io.replies[0].status, 503,
        "upstream-unavailable: nothing ran"
    );
}

#[test]
fn a_local_reply_is_sent_and_reported_and_a_pass_through_continues() {
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(&host, r#"{"key": {"required": true}}"#);
    let (mut s, mut io) = (DedupStream::new(3), FakeIo::default());
    let head = req("POST", "/orders").head;
    let d = w.run(&host, |p, env| s.on_request_headers(p, env, head, true));
    assert_eq!(
        w.drive(&host, &mut io, &mut s, Answerer::Stream, d),
        Action::Pause
    );
    assert_eq!(io.replies[0].status, 400);
    assert_eq!(io.reports, [("bad_key".to_string(), false, None)]);

    let mut w = worker(&host, "{}");
    let mut s = DedupStream::new(4);
    let head = req("POST", "/orders").head;
    let d = w.run(&host, |p, env| s.on_request_headers(p, env, head, true));
    let mut io = FakeIo::default();
    assert_eq!(
        w.drive(&host, &mut io, &mut s, Answerer::Stream, d),
        Action::Continue
    );
    assert_eq!(io.reports[0].0, "bypassed");
}

#[test]
fn a_woken_waiter_is_driven_on_and_its_request_resumed() {
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(
        &host,
        r#"{"on_in_flight": "wait", "wait_timeout_ms": 5000}"#,
    );
    let (mut first, mut io) = (DedupStream::new(3), FakeIo::default());
    let d = headers(&mut w, &host, &mut first, "k");
    assert_eq!(
        w.drive(&host, &mut io, &mut first, Answerer::Stream, d),
        Action::Continue
    );
    let mut dup = DedupStream::new(4);
    let d = headers(&mut w, &host, &mut dup, "k");
    assert_eq!(
        w.drive(&host, &mut io, &mut dup, Answerer::Stream, d),
        Action::Pause
    );
    // Not woken while the first runs: nothing happens.
    w.woken(&host, &mut io, &mut first);
    assert!(io.resumed.is_empty());
    // The first is released (a 503): the waiter claims the key, and goes on.
    let c = w.run(&host, |p, env| {
        first.on_response_headers(p, env, 503, &Origin::upstream(), Vec::new, true)
    });
    assert_eq!(c, None);
    w.woken(&host, &mut io, &mut dup);
    assert_eq!(io.resumed, [Side::Request]);
    assert_eq!(io.reports.last().map(|r| r.0.as_str()), Some("executed"));
}

#[test]
fn a_completion_whose_call_fails_is_resent_with_the_response_still_held() {
    let (etcd, host) = (FakeEtcd::new(), FakeHost::new(FakeVm::new(), 1));
    let mut w = worker(&host, ETCD);
    let (mut s, mut io) = (DedupStream::new(3), FakeIo::default());
    let d = headers(&mut w, &host, &mut s, "k");
    w.drive(&host, &mut io, &mut s, Answerer::Stream, d);
    while s.pending_call().is_some() {
        let (token, a) = answer_last(&etcd, &host);
        w.call_answered(&host, &mut io, &mut s, Answerer::Stream, token, a);
    }
    let call = w.run(&host, |p, env| {
        s.on_response_headers(p, env, 201, &Origin::upstream(), Vec::new, true)
    });
    assert_eq!(
        w.hold_response_for(&host, &mut io, &mut s, call),
        Action::Pause
    );
    let resumed = io.resumed.len();
    // A transport failure: resent, the response still held.
    let token = s.pending_call().unwrap();
    w.call_answered(
        &host,
        &mut io,
        &mut s,
        Answerer::Stream,
        token,
        CallAnswer::default(),
    );
    assert_eq!(io.resumed.len(), resumed, "still held");
    assert!(s.response_held());
    let (token, a) = answer_last(&etcd, &host);
    w.call_answered(&host, &mut io, &mut s, Answerer::Stream, token, a);
    assert_eq!(io.resumed.last(), Some(&Side::Response));
}

#[test]
fn a_local_reply_leaves_in_its_policys_error_format_and_the_operator_api_in_problem_json() {
    let host = FakeHost::new(FakeVm::new(), 1);
    let mut w = worker(
        &host,
        r#"{"errors": {"format": "stripe"},
            "rules": [{"name": "t", "match": {"path_prefix": "/t"},
                       "errors": {"format": "template", "body": "{\"code\": \"{{type}}\", \"s\": {{status_json}}}"}}]}"#,
    );
    // The first request with each key is forwarded; the second, still in flight, is not.
    let mut replies = Vec::new();
    for path in ["/orders", "/t/1"] {
        for _ in 0..2 {
            let (mut s, mut io) = (DedupStream::new(3), FakeIo::default());
            let head = req("POST", path).key(path).head;
            let d = w.run(&host, |p, env| s.on_request_headers(p, env, head, true));
            w.drive(&host, &mut io, &mut s, Answerer::Stream, d);
            replies.extend(io.replies);
        }
    }
    let [stripe, template] = &replies[..] else {
        panic!("{replies:?}")
    };
    // The top level's format: Stripe's, whose in-flight answer is a 400.
    assert_eq!(stripe.status, 400);
    let v: serde_json::Value = serde_json::from_slice(&stripe.body).unwrap();
    assert_eq!(v["error"]["type"], "idempotency_error");
    assert_eq!(v["error"]["code"], "idempotency_key_in_use");
    assert!(stripe.header("retry-after").is_some());
    // The rule's own.
    assert_eq!(template.status, 409);
    assert_eq!(template.body, br#"{"code": "in-flight", "s": 409}"#);
    assert_eq!(
        template.header("content-type"),
        Some(&b"application/json"[..])
    );
    // The operator API answers problem+json whatever its configuration's `errors` say.
    let mut admin_w = worker(
        &host,
        r#"{"role": "admin", "errors": {"format": "stripe"}}"#,
    );
    let mut admin = crate::admin::AdminStream::default();
    let (mut s, mut io) = (DedupStream::new(4), FakeIo::default());
    let d = admin_w.with_env(&host, |p, env| {
        admin.on_request(p, env, "GET", b"/nowhere", "127.0.0.1:1")
    });
    admin_w.drive(&host, &mut io, &mut s, Answerer::Admin(&mut admin), d);
    assert_eq!(io.replies.len(), 1);
    assert_eq!(
        io.replies[0].header("content-type"),
        Some(&b"application/problem+json"[..]),
        "{:?}",
        String::from_utf8_lossy(&io.replies[0].body)
    );
}
