//! A probe filter: each request says, in its `x-probe` header, which host
//! behaviour to exercise (shared-data CAS rules, body buffering, local
//! replies, metrics, timers, callouts, traps). Host results come back as a
//! JSON local reply, with raw status codes, so the same probe can be run in
//! host-test and in real Envoy and the answers compared.
//!
//! Host calls whose SDK wrappers panic on unexpected statuses are made through
//! the raw ABI here, so the probe reports the status instead of trapping.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use std::time::Duration;

#[path = "../../common/abi.rs"]
mod abi;
mod json;
mod origin;
mod raw;

use json::Json;
use origin::Origin;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Debug);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(ProbeRoot::default()) });
}}

const QUEUE_NAME: &str = "probe_queue";

#[derive(Default, Clone, Copy)]
struct Metrics {
    ticks: u32,
    queue_ready: u32,
}

#[derive(Default)]
struct ProbeRoot {
    metrics: Metrics,
}

impl Context for ProbeRoot {}

impl RootContext for ProbeRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self
            .get_plugin_configuration()
            .map(|c| String::from_utf8_lossy(&c).into_owned())
            .unwrap_or_default();
        if config.contains("\"reject\"") {
            log::error!("probe: configuration rejected: {config}");
            return false;
        }
        self.metrics.ticks = raw::define_metric(MetricType::Counter, "probe_ticks").unwrap_or(0);
        self.metrics.queue_ready =
            raw::define_metric(MetricType::Counter, "probe_queue_ready").unwrap_or(0);
        if let Some(ms) = number_after(&config, "\"tick_ms\":") {
            if let Err(status) = hostcalls::set_tick_period(Duration::from_millis(ms)) {
                log::error!("probe: set_tick_period failed: {status:?}");
            }
        }
        match raw::register_queue(QUEUE_NAME) {
            Ok(id) => log::debug!("probe: queue {QUEUE_NAME} registered as {id}"),
            Err(status) => log::error!("probe: register queue failed: {status}"),
        }
        log::info!("probe configured: {config}");
        true
    }

    fn on_tick(&mut self) {
        let now = raw::current_time_ns();
        log::debug!("probe tick at {now}");
        let _ = raw::increment_metric(self.metrics.ticks, 1);
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        while let (0, Some(value)) = raw::dequeue(queue_id) {
            log::info!("probe dequeued: {}", String::from_utf8_lossy(&value));
            let _ = raw::increment_metric(self.metrics.queue_ready, 1);
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(ProbeStream::default()))
    }
}

#[derive(Default)]
struct ProbeStream {
    probe: String,
    body_sizes: Vec<usize>,
    body_end: String,
    callout: Option<u32>,
}

impl ProbeStream {
    fn header(&self, name: &str) -> Option<String> {
        // Raw read: the SDK getter panics where Envoy answers BadArgument.
        raw::get_header(MapType::HttpRequestHeaders, name).1
    }

    fn reply(&self, status: u32, json: Json) -> Action {
        let body = json.finish();
        if let Err(e) = hostcalls::send_http_response(
            status,
            vec![
                ("content-type", "application/json"),
                ("x-probe", &self.probe),
            ],
            Some(body.as_bytes()),
        ) {
            log::error!("probe: send_http_response failed: {e:?}");
        }
        Action::Pause
    }

    fn shared_data(&self) -> Action {
        let prefix = self.header("x-key").unwrap_or_else(|| "probe".to_string());
        let script = match self.probe.as_str() {
            "sd" => self.header("x-ops").unwrap_or_default(),
            other => match preset(other, &prefix) {
                Some(s) => s,
                None => {
                    let mut j = Json::object();
                    j.str("error", &format!("unknown probe {other}"));
                    return self.reply(400, j);
                }
            },
        };
        let mut results = Json::array();
        let mut last_cas: u32 = 0;
        for op in script.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let parts: Vec<&str> = op.split_whitespace().collect();
            let mut r = Json::object();
            r.str("op", op);
            match parts.as_slice() {
                ["get", key] => {
                    let (status, value, cas) = raw::get_shared_data(key);
                    r.status("status", status);
                    match value {
                        Some(v) => r.str("value", &String::from_utf8_lossy(&v)),
                        None => r.null("value"),
                    };
                    if status == 0 {
                        r.num("cas", u64::from(cas));
                        last_cas = cas;
                    } else {
                        r.null("cas");
                    }
                }
                ["set", key, value, cas] => {
                    let cas = match *cas {
                        "$" => last_cas,
                        "max" | "MAX" => u32::MAX,
                        n => n.parse().unwrap_or(0),
                    };
                    let value: &[u8] = if *value == "-" { b"" } else { value.as_bytes() };
                    r.status("status", raw::set_shared_data(key, value, cas));
                }
                _ => {
                    r.str("error", "bad op");
                }
            }
            results.raw_item(r);
        }
        let mut j = Json::object();
        j.raw("results", results);
        self.reply(200, j)
    }

    fn properties(&self) -> Action {
        let mut j = Json::object();
        for path in [
            "request.path",
            "request.method",
            "request.host",
            "source.address",
            "plugin_name",
            "plugin_root_id",
            "plugin_vm_id",
        ] {
            let segments: Vec<&str> = path.split('.').collect();
            match hostcalls::get_property(segments) {
                Ok(Some(v)) => j.str(path, &String::from_utf8_lossy(&v)),
                Ok(None) => j.null(path),
                Err(status) => j.str(path, &format!("error {status:?}")),
            };
        }
        match hostcalls::get_property(vec!["request", "headers"]) {
            Ok(Some(bytes)) => {
                let mut h = Json::object();
                for (k, v) in raw::deserialize_pairs(&bytes) {
                    h.str(&k, &v);
                }
                j.raw("request.headers", h);
            }
            other => {
                j.str("request.headers", &format!("{other:?}"));
            }
        }
        match hostcalls::get_property(vec!["request", "headers", "x-probe"]) {
            Ok(Some(v)) => j.str("request.headers.x-probe", &String::from_utf8_lossy(&v)),
            _ => j.null("request.headers.x-probe"),
        };
        self.reply(200, j)
    }

    fn metrics(&self) -> Action {
        let mut j = Json::object();
        let counter = raw::define_metric(MetricType::Counter, "probe_counter").unwrap_or(0);
        let gauge = raw::define_metric(MetricType::Gauge, "probe_gauge").unwrap_or(0);
        let histogram = raw::define_metric(MetricType::Histogram, "probe_histogram").unwrap_or(0);
        j.status("counter_inc_1", raw::increment_metric(counter, 1));
        j.status("counter_inc_0", raw::increment_metric(counter, 0));
        j.status("counter_inc_neg", raw::increment_metric(counter, -1));
        j.status("counter_record_5", raw::record_metric(counter, 5));
        let (s, v) = raw::get_metric(counter);
        j.status("counter_get", s);
        j.num("counter_value", v);
        j.status("gauge_record_10", raw::record_metric(gauge, 10));
        j.status("gauge_inc_neg3", raw::increment_metric(gauge, -3));
        let (s, v) = raw::get_metric(gauge);
        j.status("gauge_get", s);
        j.num("gauge_value", v);
        j.status("histogram_record", raw::record_metric(histogram, 42));
        j.status("histogram_inc", raw::increment_metric(histogram, 1));
        j.status("histogram_get", raw::get_metric(histogram).0);
        j.status("unknown_inc", raw::increment_metric(0xfff0, 1));
        self.reply(200, j)
    }

    fn time(&self) -> Action {
        let mut j = Json::object();
        j.num("proxy_time_ns", raw::current_time_ns());
        let wasi = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        j.num("wasi_time_ns", wasi);
        self.reply(200, j)
    }

    fn enqueue(&self) -> Action {
        let mut j = Json::object();
        let (status, id) = raw::resolve_queue("", QUEUE_NAME);
        j.status("resolve", status);
        if status == 0 {
            let value = self.header("x-value").unwrap_or_default();
            j.status("enqueue", raw::enqueue(id, value.as_bytes()));
        }
        let (status, _) = raw::resolve_queue("", "no_such_queue");
        j.status("resolve_missing", status);
        self.reply(200, j)
    }

    fn http_call(&mut self) -> Action {
        let cluster = self
            .header("x-cluster")
            .unwrap_or_else(|| "upstream".into());
        let path = self
            .header("x-call-path")
            .unwrap_or_else(|| "/callout".into());
        let timeout = self
            .header("x-timeout-ms")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1000);
        let mut headers = vec![(":method", "POST"), (":path", path.as_str())];
        if self.header("x-omit-authority").is_none() {
            headers.push((":authority", "probe.local"));
        }
        let result = hostcalls::dispatch_http_call(
            &cluster,
            headers,
            Some(b"callout body"),
            vec![],
            Duration::from_millis(timeout),
        );
        match result {
            Ok(token) => {
                self.callout = Some(token);
                Action::Pause
            }
            Err(status) => {
                let mut j = Json::object();
                j.str("dispatch", &format!("{status:?}"));
                self.reply(200, j)
            }
        }
    }

    fn body_end(&mut self, size: usize) -> Action {
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let sizes: Vec<String> = self.body_sizes.iter().map(|s| s.to_string()).collect();
        let sizes = sizes.join(",");
        match self.body_end.as_str() {
            "continue" => {
                // The SDK panics if Envoy refuses the header write; that is
                // the behaviour under test.
                self.set_http_request_header("x-probe-body-sizes", Some(&sizes));
                Action::Continue
            }
            "rewrite" => {
                self.set_http_request_body(0, size, b"rewritten by probe");
                Action::Continue
            }
            "header-status" => {
                let mut j = Json::object();
                j.status(
                    "replace",
                    raw::replace_header(MapType::HttpRequestHeaders, "x-late", "1"),
                );
                j.status(
                    "get",
                    raw::get_header(MapType::HttpRequestHeaders, "x-probe").0,
                );
                let path = hostcalls::get_property(vec!["request", "path"]);
                j.str("request.path", &format!("{path:?}"));
                self.reply(200, j)
            }
            _ => {
                let mut j = Json::object();
                j.str("sizes", &sizes);
                j.num("body_len", body.len() as u64);
                j.str("body", &String::from_utf8_lossy(&body));
                let status = self
                    .header("x-reply-status")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(200);
                self.reply(status, j)
            }
        }
    }
}

impl Context for ProbeStream {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        if self.callout != Some(token) {
            log::warn!("probe: unexpected callout token {token}");
            return;
        }
        if self.probe == "resume-after-call" {
            if let Err(status) = hostcalls::resume_http_request() {
                log::error!("probe: resume failed: {status:?}");
            }
            return;
        }
        let mut j = Json::object();
        j.num("num_headers", headers as u64);
        j.num("num_trailers", trailers as u64);
        j.num("body_size", body as u64);
        let pairs = hostcalls::get_map(MapType::HttpCallResponseHeaders).unwrap_or_default();
        match pairs.iter().find(|(k, _)| k == ":status") {
            Some((_, v)) => j.str("status", v),
            None => j.null("status"),
        };
        let mut h = Json::object();
        for (k, v) in &pairs {
            h.str(k, v);
        }
        j.raw("headers", h);
        let bytes = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body)
            .ok()
            .flatten()
            .unwrap_or_default();
        j.str("body", &String::from_utf8_lossy(&bytes));
        self.reply(200, j);
    }
}

impl HttpContext for ProbeStream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.probe = self.header("x-probe").unwrap_or_default();
        self.body_end = self.header("x-body-end").unwrap_or_default();
        log::info!(
            "probe origin at=request probe={} {}",
            self.probe,
            Origin::read().line()
        );
        match self.probe.as_str() {
            "" | "pass" | "resp-body" => Action::Continue,
            "props" => self.properties(),
            "local-details" => {
                // A local reply with a details string (the SDK passes none).
                let status = self
                    .header("x-reply-status")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(418);
                let details = self.header("x-details").unwrap_or_default();
                let r = raw::send_local_response(status, &details, b"local with details");
                if r != 0 {
                    log::error!("probe: send_local_response failed: {r}");
                }
                Action::Pause
            }
            "metrics" => self.metrics(),
            "time" => self.time(),
            "enqueue" => self.enqueue(),
            "http-call" | "resume-after-call" => self.http_call(),
            "trap" => panic!("probe: trap requested"),
            "continue-then-trap" => Action::Continue,
            "body" => {
                let action = self.header("x-headers-action").unwrap_or_default();
                if end_of_stream {
                    return self.body_end(0);
                }
                if action == "continue" {
                    Action::Continue
                } else {
                    Action::Pause
                }
            }
            "log" => {
                log::trace!("probe trace line");
                log::debug!("probe debug line");
                log::info!("probe info line");
                log::warn!("probe warn line");
                log::error!("probe error line");
                println!("probe stdout line");
                eprintln!("probe stderr line");
                Action::Continue
            }
            _ => self.shared_data(),
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self.probe.as_str() {
            "continue-then-trap" => panic!("probe: trap in body"),
            "body" => {
                self.body_sizes.push(size);
                if !end_of_stream {
                    let per_chunk = self.header_cached_chunk_continue();
                    return if per_chunk {
                        Action::Continue
                    } else {
                        Action::Pause
                    };
                }
                self.body_end(size)
            }
            _ => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let status = raw::get_header(MapType::HttpResponseHeaders, ":status")
            .1
            .unwrap_or_default();
        let _ = raw::add_header(
            MapType::HttpResponseHeaders,
            "x-probe-response-seen",
            &status,
        );
        let origin = Origin::read();
        log::info!(
            "probe origin at=headers probe={} status={status} {}",
            self.probe,
            origin.line()
        );
        for (name, value) in origin.headers() {
            let _ = raw::add_header(MapType::HttpResponseHeaders, name, &value);
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        log::info!(
            "probe origin at=body probe={} size={size} eos={end_of_stream} {}",
            self.probe,
            Origin::read().line()
        );
        if self.probe != "resp-body" {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let replacement = format!("response body seen: {size} bytes");
        self.set_http_response_body(0, size, replacement.as_bytes());
        Action::Continue
    }

    fn on_log(&mut self) {
        let status = raw::get_header(MapType::HttpResponseHeaders, ":status")
            .1
            .unwrap_or_else(|| "none".into());
        log::info!("probe log: probe={} status={status}", self.probe);
        log::info!(
            "probe origin at=log probe={} status={status} {}",
            self.probe,
            Origin::read().line()
        );
    }
}

impl ProbeStream {
    // Chunk-by-chunk continue mode, read while the request headers are
    // still available (they are not after a Continue).
    fn header_cached_chunk_continue(&self) -> bool {
        self.body_end == "chunks"
    }
}

/// Named shared-data scenarios, the ones observed in real Envoy 1.40.
fn preset(name: &str, p: &str) -> Option<String> {
    let k = format!("{p}/{name}");
    Some(match name {
        "cas-absent-max" => format!("set {k} a max; get {k}"),
        "cas-present-max" => format!("set {k} a 0; set {k} b max; get {k}"),
        "remove" => format!("set {k} a 0; set {k} - 0; get {k}"),
        "tombstone-max" => format!("set {k} a 0; set {k} - 0; set {k} b max; get {k}"),
        "cas-zero-overwrites" => format!("set {k} a 0; set {k} b 0; get {k}"),
        "stale-cas" => format!("set {k} a 0; get {k}; set {k} b 0; set {k} c $; get {k}"),
        "fresh-cas" => format!("set {k} a 0; get {k}; set {k} b $; get {k}"),
        "absent-get" => format!("get {k}"),
        "absent-stale-cas" => format!("set {k} a 12345; get {k}"),
        _ => return None,
    })
}

fn number_after(text: &str, marker: &str) -> Option<u64> {
    let rest = text[text.find(marker)? + marker.len()..].trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}
