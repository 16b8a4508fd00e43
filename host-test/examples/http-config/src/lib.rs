//! Acceptance example for host-test, after the SDK's `http_config`: the
//! plugin configuration, read once in `on_configure`, is added to every
//! response as `custom-header`.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { value: String::new() })
    });
}}

struct Root {
    value: String,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        if let Some(bytes) = self.get_plugin_configuration() {
            #[allow(clippy::unwrap_used)] // the example's behaviour: non-UTF-8 traps
            let value = String::from_utf8(bytes).unwrap();
            self.value = value;
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(AddHeader {
            value: self.value.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct AddHeader {
    value: String,
}

impl Context for AddHeader {}

impl HttpContext for AddHeader {
    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.add_http_response_header("custom-header", &self.value);
        Action::Continue
    }
}
