//! Acceptance example for host-test, after the SDK's `http_headers`: every
//! request and response header is logged with the stream's context id; a
//! request for `/hello` is answered by the filter itself; the end of each
//! stream is logged.

use log::info;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream { id: context_id }))
    }
}

struct Stream {
    id: u32,
}

impl Stream {
    fn log_headers(&self, arrow: &str, headers: &[(String, String)]) {
        for (name, value) in headers {
            info!("#{} {arrow} {name}: {value}", self.id);
        }
    }
}

impl Context for Stream {}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.log_headers("->", &self.get_http_request_headers());
        if self.get_http_request_header(":path").as_deref() != Some("/hello") {
            return Action::Continue;
        }
        let headers = vec![("Hello", "World"), ("Powered-By", "proxy-wasm")];
        self.send_http_response(200, headers, Some(b"Hello, World!\n"));
        Action::Pause
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.log_headers("<-", &self.get_http_response_headers());
        Action::Continue
    }

    fn on_log(&mut self) {
        info!("#{} completed.", self.id);
    }
}
