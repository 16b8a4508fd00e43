//! Error answers in each `errors` format: the body and content type rewritten, the
//! status only for Stripe's idempotency errors, every other header kept, and anything
//! that is not an error left as it is.

use super::*;
use crate::config::Config;
use crate::response::StoredResponse;
use serde_json::{json, Value};

const EVERY: [Problem; 26] = [
    Problem::MissingKey,
    Problem::InvalidKey,
    Problem::AmbiguousKey,
    Problem::AmbiguousScope,
    Problem::AmbiguousPayload,
    Problem::InFlight,
    Problem::StaleVersion,
    Problem::MissingEntity,
    Problem::InvalidEntity,
    Problem::MissingVersion,
    Problem::InvalidVersion,
    Problem::OutcomeUnknown,
    Problem::AlreadyCompleted,
    Problem::ResponseNotStored,
    Problem::BodyTooLarge,
    Problem::PayloadMismatch,
    Problem::PrincipalMismatch,
    Problem::StoreUnavailable,
    Problem::StoreFull,
    Problem::UpstreamUnavailable,
    Problem::UpstreamFailed,
    Problem::StillRunning,
    Problem::BadAdminRequest,
    Problem::NoSuchRecord,
    Problem::RecordIsClaim,
    Problem::NotAdminPath,
];

/// The format of `errors` (JSON) at the top level.
fn format(errors: Value) -> ErrorFormat {
    Config::parse(json!({ "errors": errors }).to_string().as_bytes())
        .unwrap()
        .policy
        .errors
}

/// A problem reply as the stream builds it, with the headers a 409 carries.
fn built(p: Problem) -> LocalReply {
    p.reply(
        "it is \"busy\"\nretry",
        vec![
            ("retry-after".into(), b"4".to_vec()),
            (
                EXPIRES_HEADER.into(),
                b"Wed, 02 Dec 2026 05:00:00 GMT".to_vec(),
            ),
        ],
    )
}

fn json_of(r: &LocalReply) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

/// The headers but `content-type`, in order.
fn others(r: &LocalReply) -> Vec<(String, Vec<u8>)> {
    r.headers
        .iter()
        .filter(|(n, _)| n != "content-type")
        .cloned()
        .collect()
}

#[test]
fn problem_json_as_built_is_sent_unchanged() {
    for p in EVERY {
        let r = built(p);
        assert_eq!(r.clone().in_format(None), r);
        assert_eq!(r.clone().in_format(Some(&ErrorFormat::default())), r);
        let v = json_of(&r);
        assert_eq!(v["type"], format!("urn:proxy-dedup:problem:{}", p.slug()));
        assert_eq!(v["detail"], "it is \"busy\"\nretry");
        assert_eq!(
            r.header("content-type"),
            Some(&b"application/problem+json"[..])
        );
    }
    // Another content type: only that header changes.
    let r = built(Problem::InFlight)
        .in_format(Some(&format(json!({"content_type": "application/json"}))));
    assert_eq!(r.header("content-type"), Some(&b"application/json"[..]));
    assert_eq!(r.body, built(Problem::InFlight).body);
    assert_eq!(others(&r), others(&built(Problem::InFlight)));
}

#[test]
fn stripe_writes_the_error_object_and_answers_idempotency_errors_400() {
    let stripe = format(json!({"format": "stripe"}));
    let idempotency = [
        Problem::InFlight,
        Problem::OutcomeUnknown,
        Problem::AlreadyCompleted,
        Problem::ResponseNotStored,
        Problem::PayloadMismatch,
        Problem::PrincipalMismatch,
    ];
    for p in EVERY {
        let before = built(p);
        let r = before.clone().in_format(Some(&stripe));
        let v = json_of(&r);
        let kind = v["error"]["type"].as_str().unwrap();
        let code = v["error"]["code"].as_str().unwrap();
        assert_eq!(v["error"]["message"], "it is \"busy\"\nretry", "{p:?}");
        assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
        assert_eq!(v["error"].as_object().unwrap().len(), 3, "{v}");
        if idempotency.contains(&p) {
            // stripe-python raises `IdempotencyError` only for 400/404.
            assert_eq!((r.status, kind), (400, "idempotency_error"), "{p:?}");
        } else {
            assert_eq!(r.status, p.status(), "{p:?} keeps its status");
            let expected = if p.status() >= 500 {
                "api_error"
            } else {
                "invalid_request_error"
            };
            assert_eq!(kind, expected, "{p:?}");
        }
        let expected_code = match p {
            Problem::InFlight => "idempotency_key_in_use".to_string(),
            _ => p.slug().replace('-', "_"),
        };
        assert_eq!(code, expected_code);
        assert_eq!(r.header("content-type"), Some(&b"application/json"[..]));
        assert_eq!(
            others(&r),
            others(&before),
            "{p:?}: the other headers are kept"
        );
        assert_eq!(
            r.details, before.details,
            "the access log's details are kept"
        );
    }
}

#[test]
fn a_template_is_filled_from_the_reply_its_retry_after_included() {
    let t = format(
        json!({"format": "template", "content_type": "application/vnd.err+json",
        "body": "{\"code\": \"{{type}}\", \"status\": {{status_json}}, \"title\": {{title_json}}, \"msg\": {{detail_json}}, \"retry\": {{retry_after_json}}}"}),
    );
    let r = built(Problem::InFlight).in_format(Some(&t));
    assert_eq!(r.status, 409, "a template never changes the status");
    assert_eq!(
        json_of(&r),
        json!({"code": "in-flight", "status": 409, "title": Problem::InFlight.title(),
            "msg": "it is \"busy\"\nretry", "retry": 4})
    );
    assert_eq!(
        r.header("content-type"),
        Some(&b"application/vnd.err+json"[..])
    );
    assert_eq!(others(&r), others(&built(Problem::InFlight)));
    let r = Problem::PayloadMismatch
        .reply("other body", Vec::new())
        .in_format(Some(&t));
    assert_eq!((r.status, json_of(&r)["retry"].clone()), (422, Value::Null));
}

#[test]
fn answers_that_are_not_errors_are_never_rewritten() {
    let stored = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"text/csv".to_vec())],
        body: b"a,b".to_vec(),
    };
    let r = replay(stored, "idempotent-replayed");
    for f in [
        format(json!({"format": "stripe"})),
        format(json!({"format": "template", "body": "{\"e\": \"{{type}}\"}"})),
        format(json!({"content_type": "application/json"})),
    ] {
        assert_eq!(r.clone().in_format(Some(&f)), r);
    }
}
