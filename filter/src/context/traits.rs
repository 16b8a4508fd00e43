//! What our contexts implement: the callbacks any context, a root context and a stream's
//! context may get, and the stream callbacks' answer (`Action`) as the ABI encodes it.

use dedup_core::stream::CallAnswer;

/// What a stream callback tells the host, as the ABI encodes it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Continue = 0,
    Pause = 1,
}

/// Callbacks any context may get.
pub trait Context {
    /// The answer to a call this context dispatched (HTTP or gRPC, read from the host
    /// before this runs).
    fn on_call_answer(&mut self, _token_id: u32, _answer: CallAnswer) {}

    /// The host is about to delete this context; `false` would ask it to wait.
    fn on_done(&mut self) -> bool {
        true
    }
}

/// A plugin's root context: configuration, and the HTTP contexts of its streams.
pub trait RootContext {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        true
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        true
    }

    fn on_tick(&mut self) {}

    /// An item was put on a shared queue this VM registered.
    fn on_queue_ready(&mut self, _queue_id: u32) {}

    fn on_done(&mut self) -> bool {
        true
    }

    /// The answer to a call no live stream owns: one the root made itself, or one whose
    /// stream has ended (the host still answers it, on the root context).
    fn on_orphan_call_answer(&mut self, _token_id: u32, _answer: CallAnswer) {}

    /// The context of a new stream; `None` leaves the stream to pass through.
    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>>;
}

/// A stream's context. Each callback's answer says whether the stream goes on; one
/// implementation (`http::DedupHttp`) answers every callback.
pub trait HttpContext: Context {
    fn on_http_request_headers(&mut self, num_headers: usize, end_of_stream: bool) -> Action;

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action;

    fn on_http_request_trailers(&mut self, num_trailers: usize) -> Action;

    fn on_http_response_headers(&mut self, num_headers: usize, end_of_stream: bool) -> Action;

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action;

    fn on_http_response_trailers(&mut self, num_trailers: usize) -> Action;

    fn on_log(&mut self) {}

    /// Wait mode: the root wakes a stream it holds (see `wake_stream`).
    fn on_wake(&mut self) {}
}
