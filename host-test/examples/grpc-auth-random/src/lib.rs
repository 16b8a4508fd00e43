//! Acceptance example for host-test, after the SDK's `grpc_auth_random`:
//! only gRPC requests pass (others get 503); calls to the reflection service
//! go through at once; any other call is held while the `grpcbin` cluster's
//! `grpcbin.GRPCBin/RandomError` answers: an even gRPC status lets it
//! through, an odd one answers `ABORTED`. Responses get `powered-by`.

use log::info;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, GrpcStatusCode, LogLevel};
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(GrpcGate) });
}}

struct GrpcGate;

impl HttpContext for GrpcGate {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let grpc = self
            .get_http_request_header("content-type")
            .is_some_and(|t| t.starts_with("application/grpc"));
        if !grpc {
            let headers = vec![("Powered-By", "proxy-wasm")];
            let body = b"Service accessible only to gRPC clients.\n";
            self.send_http_response(503, headers, Some(body));
            return Action::Pause;
        }
        let reflection = self
            .get_http_request_header(":path")
            .is_some_and(|p| p.starts_with("/grpc.reflection"));
        if reflection {
            return Action::Continue;
        }
        let timeout = Duration::from_secs(1);
        #[allow(clippy::unwrap_used)] // the example's behaviour: a refused dispatch traps
        self.dispatch_grpc_call(
            "grpcbin",
            "grpcbin.GRPCBin",
            "RandomError",
            vec![],
            None,
            timeout,
        )
        .unwrap();
        Action::Pause
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.set_http_response_header("Powered-By", Some("proxy-wasm"));
        Action::Continue
    }
}

impl Context for GrpcGate {
    fn on_grpc_call_response(&mut self, _token: u32, status_code: u32, _message_size: usize) {
        if status_code.is_multiple_of(2) {
            info!("Access granted.");
            self.resume_http_request();
        } else {
            info!("Access forbidden.");
            let metadata = vec![("Powered-By", b"proxy-wasm".as_slice())];
            self.send_grpc_response(
                GrpcStatusCode::Aborted,
                Some("Aborted by Proxy-Wasm!"),
                metadata,
            );
        }
    }
}
