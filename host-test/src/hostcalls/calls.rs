//! HTTP callouts (`proxy_http_call`) and foreign functions (not modelled).

use super::guest::*;
use crate::abi::*;
use crate::http::{header_get, Headers, UpstreamRequest};
use crate::state::NewCallout;

/// `proxy_http_call` and `proxy_call_foreign_function`.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
        "proxy_http_call",
        i32_args!(
            |c, up, ul, hp, hl, bp, bl, tp, tl, timeout, token_ptr| -> i32 {
                let (Some(cluster), Some(headers), Some(body), Some(trailers)) = (
                    read_str(&mut c, up, ul),
                    read(&mut c, hp, hl),
                    read(&mut c, bp, bl),
                    read(&mut c, tp, tl),
                ) else {
                    return INVALID_MEMORY;
                };
                if !write_u32(&mut c, token_ptr, 0) {
                    return INVALID_MEMORY;
                }
                if timeout < 0 || !c.data().plugin.clusters.contains(&cluster) {
                    return BAD_ARGUMENT;
                }
                let headers: Headers = decode_pairs(&headers)
                    .into_iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v))
                    .collect();
                if [":path", ":method", ":authority"]
                    .iter()
                    .any(|h| header_get(&headers, h).is_none())
                {
                    return BAD_ARGUMENT;
                }
                // What reaches the cluster (seen in Envoy 1.40): pseudo headers
                // first, the filter's headers, content-length, then what the
                // router adds for an internal request.
                let mut headers = pseudo_first(headers);
                if !body.is_empty() {
                    headers.retain(|(k, _)| k != "content-length");
                    headers.push(("content-length".into(), body.len().to_string()));
                }
                headers.push(("x-envoy-internal".into(), "true".into()));
                if timeout > 0 {
                    headers.push(("x-envoy-expected-rq-timeout-ms".into(), timeout.to_string()));
                }
                let s = c.data_mut();
                // Envoy 1.40's tokens: a counter per kind, shifted left by two,
                // the kind in the low bits (HTTP 0, gRPC call 1, gRPC stream 2).
                let token = s.next_callout_token << 2;
                s.next_callout_token += 1;
                s.new_callouts.push(NewCallout {
                    token,
                    cluster,
                    request: UpstreamRequest {
                        headers,
                        body,
                        trailers: decode_pairs(&trailers),
                    },
                    timeout_ms: timeout as u32,
                });
                put_u32(&mut c, token_ptr, token)
            }
        ),
    )?;
    // Not modelled: foreign functions. They answer as a host without them.
    i.func(
        "proxy_call_foreign_function",
        |_c: C, _a: i32, _b: i32, _d: i32, _e: i32, _f: i32, _g: i32| -> i32 { NOT_FOUND },
    )?;
    Ok(())
}

/// Envoy's header maps keep pseudo headers in front, in their order.
fn pseudo_first(headers: Headers) -> Headers {
    let (mut pseudo, rest): (Headers, Headers) =
        headers.into_iter().partition(|(k, _)| k.starts_with(':'));
    pseudo.extend(rest);
    pseudo
}
