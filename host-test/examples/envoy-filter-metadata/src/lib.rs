//! Acceptance example for host-test, after the SDK's `envoy_filter_metadata`:
//! when a filter before this one (a Lua filter, in the example) has put
//! `uppercased-custom-metadata` in its dynamic metadata, the request is
//! answered here with that value; otherwise it goes on.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(Echo {}) });
}}

const PATH: [&str; 4] = [
    "metadata",
    "filter_metadata",
    "envoy.filters.http.lua",
    "uppercased-custom-metadata",
];

struct Echo {}

impl Context for Echo {}

impl HttpContext for Echo {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(bytes) = self.get_property(PATH.to_vec()) else {
            return Action::Continue;
        };
        let Ok(value) = String::from_utf8(bytes) else {
            return Action::Continue;
        };
        let headers = vec![
            ("Powered-By", "proxy-wasm"),
            ("uppercased-metadata", &value),
        ];
        let body = format!("Custom response with Envoy metadata: {value:?}\n");
        self.send_http_response(200, headers, Some(body.as_bytes()));
        Action::Pause
    }
}
