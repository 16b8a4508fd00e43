//! host-test in the test kit's words, for the differential tests: a kit
//! [`Request`] becomes host-test's, host-test's response becomes a kit
//! [`Response`], so that one table drives both and both answers read alike.
//! (Its own module: only the tests that run host-test link it.)
#![allow(dead_code)]

use dedup_envoy::client::Body;
use dedup_envoy::http::Head;
use dedup_envoy::{Request, Response};

/// The same request for host-test: method, path, header lines in order,
/// `host` as `:authority`, and the body.
pub fn request(r: &Request) -> host_test::Request {
    let mut h = host_test::Request::new(&r.method, &r.path);
    for (n, v) in &r.headers {
        h = h.header(n, v);
    }
    if let Some(a) = &r.host {
        h = h.authority(a);
    }
    match &r.body {
        Body::Empty => h,
        Body::Fixed(b) => h.body(b),
        Body::Chunked(parts, _) => h.chunks(parts),
    }
}

/// What the client got from host-test, as the kit's client would have read it.
pub fn response(r: host_test::Response) -> Response {
    Response {
        status: r.status,
        head: Head {
            start: format!("HTTP/1.1 {}", r.status),
            headers: r
                .headers
                .into_iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
                .collect(),
        },
        body: r.body,
    }
}
