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

/// The byte formats, pinned: a format change fails here, and values written before it
/// must still decode.
pub(crate) mod format {
    use crate::response::*;
    use crate::wire::unhex;

    /// A response slot as every version so far writes it: a format change fails here,
    /// and slots written before it must still decode.
    pub(crate) const RESPONSE: &[&str] = &[
        "5044523133333333333333333333333333333333333333333333333333333333",
        "33333333000000000000000700c90002000c636f6e74656e742d747970650000",
        "00106170706c69636174696f6e2f6a736f6e0003782d6100000000000000087b",
        "226964223a317d",
    ];

    pub(crate) fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".to_string(), b"application/json".to_vec()),
                ("x-a".to_string(), Vec::new()),
            ],
            body: br#"{"id":1}"#.to_vec(),
        }
    }

    #[test]
    fn response_bytes_are_pinned() {
        let bytes = unhex(RESPONSE);
        assert_eq!(response().encode(&[0x33; 32], 7), bytes);
        assert_eq!(response().encoded_len(), bytes.len());
        assert_eq!(
            StoredResponse::decode(&bytes, &[0x33; 32], 7),
            Some(response())
        );
        assert!(StoredResponse::belongs(&bytes, &[0x33; 32], 7));
        // Another owner, a trailing byte or a cut value is no response.
        assert!(!StoredResponse::belongs(&bytes, &[0x33; 32], 8));
        assert_eq!(StoredResponse::decode(&bytes, &[0x34; 32], 7), None);
        assert_eq!(
            StoredResponse::decode(&[bytes.as_slice(), &[0]].concat(), &[0x33; 32], 7),
            None
        );
        assert_eq!(
            StoredResponse::decode(&bytes[..bytes.len() - 1], &[0x33; 32], 7),
            None
        );
    }
}
