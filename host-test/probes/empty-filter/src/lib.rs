//! The smallest useful proxy-wasm HTTP filter: a root context and an HTTP
//! context that continue everything. Baseline for per-request cost, in
//! host-test and in real Envoy.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(EmptyRoot) });
}}

struct EmptyRoot;

impl Context for EmptyRoot {}

impl RootContext for EmptyRoot {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(EmptyStream))
    }
}

struct EmptyStream;

impl Context for EmptyStream {}

impl HttpContext for EmptyStream {}
