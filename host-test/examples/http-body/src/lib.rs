//! Acceptance example for host-test, after the SDK's `http_body`: the
//! response body is buffered to its end and replaced by a note of its size
//! when it mentions "secret" (so `content-length` goes at the headers). A
//! body that is not UTF-8 panics, as the SDK's example does (the VM traps).

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

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Redactor))
    }
}

struct Redactor;

impl Context for Redactor {}

impl HttpContext for Redactor {
    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        // The body may change size; the headers are the last chance to drop its length.
        self.set_http_response_header("content-length", None);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            // Keep buffering: the last call sees the whole body.
            return Action::Pause;
        }
        let Some(bytes) = self.get_http_response_body(0, body_size) else {
            return Action::Continue;
        };
        #[allow(clippy::unwrap_used)] // the example's behaviour: a non-UTF-8 body traps
        let text = String::from_utf8(bytes).unwrap();
        if text.contains("secret") {
            let note = format!("Original message body ({body_size} bytes) redacted.\n");
            self.set_http_response_body(0, body_size, note.as_bytes());
        }
        Action::Continue
    }
}
