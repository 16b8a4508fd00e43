//! Tests of stored responses: decoding any bytes, and the capture's cap.

use crate::response::{Capture, StoredResponse};
use crate::testing::*;

#[test]
fn stored_response_decoding_is_total() {
    let r = StoredResponse {
        status: 201,
        headers: vec![("a".into(), b"1".to_vec())],
        body: b"hello".to_vec(),
    };
    let d = digest(1);
    let bytes = r.encode(&d, 42);
    assert_eq!(StoredResponse::decode(&bytes, &d, 42), Some(r));
    assert_eq!(StoredResponse::decode(&bytes, &d, 43), None);
    assert_eq!(StoredResponse::decode(&bytes, &digest(2), 42), None);
    for cut in 0..bytes.len() {
        assert_eq!(StoredResponse::decode(&bytes[..cut], &d, 42), None);
    }
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(StoredResponse::decode(&long, &d, 42), None);
}

#[test]
fn capture_caps_the_body() {
    let mut c = Capture::new(200, vec![("x".into(), b"1".to_vec())], 4);
    c.body(b"ab");
    c.body(b"cd");
    assert_eq!(c.clone().finish().unwrap().body, b"abcd");
    c.body(b"e");
    assert_eq!(c.finish(), None);
}
