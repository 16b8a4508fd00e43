//! Acceptance example for host-test, after the SDK's `http_auth_random`: each
//! request is held while one byte is fetched from the `httpbin` cluster
//! (`GET /bytes/1`); an even byte lets it through, anything else (an odd
//! byte, an empty answer) answers 403. Responses get `powered-by`.

use log::info;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(CoinGate) });
}}

struct CoinGate;

impl HttpContext for CoinGate {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let call = vec![
            (":method", "GET"),
            (":path", "/bytes/1"),
            (":authority", "httpbin.org"),
        ];
        #[allow(clippy::unwrap_used)] // the example's behaviour: a refused dispatch traps
        self.dispatch_http_call("httpbin", call, None, vec![], Duration::from_secs(1))
            .unwrap();
        Action::Pause
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.set_http_response_header("Powered-By", Some("proxy-wasm"));
        Action::Continue
    }
}

impl Context for CoinGate {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, body_size: usize, _: usize) {
        let even = self
            .get_http_call_response_body(0, body_size)
            .and_then(|body| body.first().copied())
            .is_some_and(|byte| byte.is_multiple_of(2));
        if even {
            info!("Access granted.");
            self.resume_http_request();
        } else {
            info!("Access forbidden.");
            let headers = vec![("Powered-By", "proxy-wasm")];
            self.send_http_response(403, headers, Some(b"Access forbidden.\n"));
        }
    }
}
