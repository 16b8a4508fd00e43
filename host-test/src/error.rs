//! Errors of host-test, each saying what to do about it.

use crate::shared::LogLine;
use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum Error {
    /// The .wasm file does not exist: it has to be built first.
    WasmMissing(PathBuf),
    /// The module imports functions host-test does not provide.
    UnknownImports(Vec<String>),
    /// `proxy_on_configure` returned false (Envoy rejects the config).
    ConfigRejected { worker: usize, logs: Vec<LogLine> },
    /// `proxy_on_vm_start` returned false.
    VmStartFailed { worker: usize, logs: Vec<LogLine> },
    /// The module trapped while starting.
    Trap {
        function: String,
        message: String,
        logs: Vec<LogLine>,
    },
    /// The stream can make no progress: the filter holds it and nothing it
    /// waits for (callout, timer) is pending. Real Envoy would hang.
    Stalled {
        stream: crate::http::StreamId,
        waiting: String,
    },
    /// A misuse of the test API (unknown stream, step out of order).
    Usage(String),
    /// wasmtime failed in a way unrelated to the filter.
    Host(String),
}

fn lines(logs: &[LogLine]) -> String {
    logs.iter()
        .map(|l| format!("\n  [worker {}] [{:?}] {}", l.worker, l.level, l.message))
        .collect()
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::WasmMissing(path) => write!(
                f,
                "{} does not exist: build the wasm modules first with `make wasm`",
                path.display()
            ),
            Error::UnknownImports(names) => write!(
                f,
                "the module imports functions host-test does not provide: {}",
                names.join(", ")
            ),
            Error::ConfigRejected { worker, logs } => write!(
                f,
                "plugin configuration rejected: proxy_on_configure returned false on worker {worker}; VM log:{}",
                lines(logs)
            ),
            Error::VmStartFailed { worker, logs } => write!(
                f,
                "proxy_on_vm_start returned false on worker {worker}; VM log:{}",
                lines(logs)
            ),
            Error::Trap {
                function,
                message,
                logs,
            } => write!(f, "wasm trap in {function}: {message}; VM log:{}", lines(logs)),
            Error::Stalled { stream, waiting } => {
                write!(f, "stream {stream:?} stalled: {waiting}")
            }
            Error::Usage(m) => write!(f, "host-test usage: {m}"),
            Error::Host(m) => write!(f, "host-test: {m}"),
        }
    }
}

impl std::error::Error for Error {}
