//! gRPC calls and streams of the filter (`proxy_grpc_*`), answered by
//! in-process handlers or by real HTTP/2 servers on loopback, and delivered
//! as Envoy 1.40 delivers them: on the root context, a unary call's answer
//! as one `proxy_on_grpc_receive` (success) or one `proxy_on_grpc_close`
//! (any other status), a stream's as initial metadata, messages, trailing
//! metadata and close (observed with the ABI probe; `host-test/PROBES.md`).

use super::{Event, SimEnvoy};
use crate::grpc::{grpc_status, GrpcHandler, GrpcRequest};
use crate::grpc::{GrpcReply, GrpcReplyKind};
use crate::h2::{self, frame_message, take_messages, Client};
use crate::http::{header_get, Headers};
use crate::state::GrpcOp;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

pub(crate) enum GrpcCluster {
    InProcess(GrpcHandler),
    /// `ip:port` of an HTTP/2 gRPC server.
    H2(String),
}

/// One thing a gRPC call or stream delivers to the filter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GrpcEvent {
    Initial(Headers),
    Message(Vec<u8>),
    Trailing(Headers),
    Close(u32, String),
}

/// A call or stream the filter has open.
pub(crate) struct GrpcLive {
    cluster: String,
    stream: bool,
    request: GrpcRequest,
    timeout_ms: u32,
    /// Over HTTP/2: the connection and the stream id on it.
    h2: Option<(Client, u32)>,
    /// Unframed bytes received so far (HTTP/2).
    received: Vec<u8>,
    got_headers: bool,
}

// What Envoy 1.40's async gRPC client reports when no answer comes: status
// 14 and the router's local-reply text, with the stream's response code
// details in braces (`proxy_get_status` returns that message).
const TIMEOUT_STATUS: u32 = grpc_status::UNAVAILABLE;
const TIMEOUT_MESSAGE: &str = "upstream request timeout{response_timeout}";
const RESET_STATUS: u32 = grpc_status::UNAVAILABLE;
const RESET_MESSAGE: &str = "upstream connect error or disconnect/reset before headers. reset reason: remote reset{upstream_reset_before_response_started{remote_reset}}";
const CONNECT_FAILURE_MESSAGE: &str = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure{upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}}";

/// The message `proxy_get_status` gives for a status the server sent:
/// its `grpc-message`, then Envoy's response code details in braces.
fn upstream_message(message: &str) -> String {
    if message.is_empty() {
        "via_upstream".to_string()
    } else {
        format!("{message}{{via_upstream}}")
    }
}

/// The request headers Envoy's async gRPC client sends.
fn request_headers(
    cluster: &str,
    service: &str,
    method: &str,
    metadata: &Headers,
    timeout_ms: u32,
) -> Headers {
    let mut h: Headers = vec![
        (":method".into(), "POST".into()),
        (":path".into(), format!("/{service}/{method}")),
        (":authority".into(), cluster.to_string()),
        (":scheme".into(), "http".into()),
        ("te".into(), "trailers".into()),
    ];
    if timeout_ms > 0 {
        h.push(("grpc-timeout".into(), format!("{timeout_ms}m")));
    }
    h.push(("content-type".into(), "application/grpc".into()));
    h.extend(metadata.iter().cloned());
    h.push(("x-envoy-internal".into(), "true".into()));
    if timeout_ms > 0 {
        h.push((
            "x-envoy-expected-rq-timeout-ms".into(),
            timeout_ms.to_string(),
        ));
    }
    h
}

/// A unary call's outcome as the filter sees it.
fn unary_events(status: u32, message: &str, messages: Vec<Vec<u8>>) -> Vec<GrpcEvent> {
    match messages.into_iter().next() {
        Some(m) if status == grpc_status::OK => vec![GrpcEvent::Message(m)],
        _ => vec![GrpcEvent::Close(status, upstream_message(message))],
    }
}

/// A stream's answer as the filter sees it: initial metadata (with the
/// router's `x-envoy-upstream-service-time`), the messages, the trailers,
/// the close. A trailers-only answer (an error without messages) comes as
/// empty initial metadata and the whole header block as trailing metadata.
fn stream_events(reply: &GrpcReply) -> Vec<GrpcEvent> {
    let mut out = Vec::new();
    let head = crate::grpc::reply_head(reply);
    let service_time = (
        "x-envoy-upstream-service-time".to_string(),
        reply.delay.as_millis().to_string(),
    );
    match crate::grpc::reply_trailers(reply) {
        None => {
            let mut all = head;
            all.push(service_time);
            out.push(GrpcEvent::Initial(Vec::new()));
            out.push(GrpcEvent::Trailing(all));
        }
        Some(trailers) => {
            let mut initial = head;
            initial.push(service_time);
            out.push(GrpcEvent::Initial(initial));
            out.extend(reply.messages.iter().cloned().map(GrpcEvent::Message));
            out.push(GrpcEvent::Trailing(trailers));
        }
    }
    out.push(GrpcEvent::Close(
        reply.status,
        upstream_message(&reply.status_message),
    ));
    out
}

impl SimEnvoy {
    /// Carries out the gRPC operations a VM call asked for.
    pub(super) fn grpc_ops(&mut self, worker: usize, ops: Vec<GrpcOp>) {
        for op in ops {
            match op {
                GrpcOp::Open {
                    token,
                    cluster,
                    service,
                    method,
                    metadata,
                    call,
                } => {
                    let stream = call.is_none();
                    let (messages, timeout_ms) = match call {
                        Some((message, timeout_ms)) => (vec![message], timeout_ms),
                        None => (Vec::new(), 0),
                    };
                    let request = GrpcRequest {
                        metadata: request_headers(
                            &cluster, &service, &method, &metadata, timeout_ms,
                        ),
                        service,
                        method,
                        messages,
                        cancelled: false,
                    };
                    let mut live = GrpcLive {
                        cluster,
                        stream,
                        request,
                        timeout_ms,
                        h2: None,
                        received: Vec::new(),
                        got_headers: false,
                    };
                    if !stream {
                        self.grpc_live.insert((worker, token), live);
                        self.grpc_unary(worker, token);
                        continue;
                    }
                    if let Some(GrpcCluster::H2(addr)) = self.grpc_clusters.get(&live.cluster) {
                        match open_h2(addr, &live.request.metadata) {
                            Ok(c) => live.h2 = Some(c),
                            Err(()) => {
                                let close =
                                    GrpcEvent::Close(RESET_STATUS, CONNECT_FAILURE_MESSAGE.into());
                                self.grpc_answer(worker, token, vec![close], Duration::ZERO);
                            }
                        }
                    }
                    self.grpc_live.insert((worker, token), live);
                }
                GrpcOp::Send {
                    token,
                    message,
                    end,
                } => {
                    let Some(live) = self.grpc_live.get_mut(&(worker, token)) else {
                        continue;
                    };
                    live.request.messages.push(message.clone());
                    if let Some((client, id)) = &live.h2 {
                        let _ = client.data(*id, &frame_message(&message), end);
                    } else if end {
                        self.grpc_half_close(worker, token);
                    }
                }
                GrpcOp::Close { token } => {
                    let Some(live) = self.grpc_live.get_mut(&(worker, token)) else {
                        continue;
                    };
                    if let Some((client, id)) = &live.h2 {
                        let _ = client.data(*id, &[], true);
                    } else {
                        self.grpc_half_close(worker, token);
                    }
                }
                GrpcOp::Cancel { token } => {
                    if let Some(live) = self.grpc_live.remove(&(worker, token)) {
                        if let Some((client, id)) = &live.h2 {
                            let _ = client.reset(*id);
                        }
                    }
                }
            }
        }
    }

    /// A call or stream to an unknown cluster, closed at once.
    pub(super) fn grpc_refused(&mut self, worker: usize, token: u32) {
        let live = GrpcLive {
            cluster: String::new(),
            stream: false,
            request: GrpcRequest::default(),
            timeout_ms: 0,
            h2: None,
            received: Vec::new(),
            got_headers: false,
        };
        self.grpc_live.insert((worker, token), live);
        let close = GrpcEvent::Close(grpc_status::UNAVAILABLE, "Cluster not available".into());
        self.deliver_grpc(worker, token, vec![close]);
    }

    /// An in-process stream half-closed by the filter: the handler answers.
    fn grpc_half_close(&mut self, worker: usize, token: u32) {
        let Some(live) = self.grpc_live.get(&(worker, token)) else {
            return;
        };
        let request = live.request.clone();
        let Some(GrpcCluster::InProcess(handler)) = self.grpc_clusters.get_mut(&live.cluster)
        else {
            return;
        };
        let reply = handler(&request);
        match reply.kind {
            GrpcReplyKind::Answer => {
                let events = stream_events(&reply);
                self.grpc_answer(worker, token, events, reply.delay);
            }
            GrpcReplyKind::NoAnswer => {}
            GrpcReplyKind::Reset => {
                let close = GrpcEvent::Close(RESET_STATUS, RESET_MESSAGE.into());
                self.grpc_answer(worker, token, vec![close], reply.delay);
            }
        }
    }

    fn grpc_unary(&mut self, worker: usize, token: u32) {
        let Some(live) = self.grpc_live.get(&(worker, token)) else {
            return;
        };
        let (request, timeout_ms) = (live.request.clone(), live.timeout_ms);
        let timeout = || GrpcEvent::Close(TIMEOUT_STATUS, TIMEOUT_MESSAGE.into());
        match self.grpc_clusters.get_mut(&live.cluster) {
            Some(GrpcCluster::InProcess(handler)) => {
                let reply = handler(&request);
                let delay = reply.delay;
                let late = timeout_ms > 0 && delay >= Duration::from_millis(u64::from(timeout_ms));
                let events = match reply.kind {
                    _ if late => {
                        let at = Duration::from_millis(u64::from(timeout_ms));
                        return self.grpc_answer(worker, token, vec![timeout()], at);
                    }
                    GrpcReplyKind::Answer => {
                        unary_events(reply.status, &reply.status_message, reply.messages)
                    }
                    GrpcReplyKind::Reset => {
                        vec![GrpcEvent::Close(RESET_STATUS, RESET_MESSAGE.into())]
                    }
                    GrpcReplyKind::NoAnswer if timeout_ms == 0 => return,
                    GrpcReplyKind::NoAnswer => {
                        let at = Duration::from_millis(u64::from(timeout_ms));
                        return self.grpc_answer(worker, token, vec![timeout()], at);
                    }
                };
                self.grpc_answer(worker, token, events, delay);
            }
            Some(GrpcCluster::H2(addr)) => {
                let addr = addr.clone();
                let events = h2_unary(&addr, &request, timeout_ms);
                self.grpc_answer(worker, token, events, Duration::ZERO);
            }
            None => {}
        }
    }

    /// Queues `events` for the filter after `delay` (virtual time), or on
    /// the next event-loop turn.
    fn grpc_answer(&mut self, worker: usize, token: u32, events: Vec<GrpcEvent>, delay: Duration) {
        let event = Event::Grpc {
            worker,
            token,
            events,
        };
        if delay.is_zero() {
            self.answer_callout(event);
        } else {
            let at = self.now_ns() + delay.as_nanos() as u64;
            self.schedule(at, event);
        }
    }

    /// Runs the filter's gRPC callbacks for `events`, on the root context.
    pub(super) fn deliver_grpc(&mut self, worker: usize, token: u32, events: Vec<GrpcEvent>) {
        for event in events {
            let Some(live) = self.grpc_live.get(&(worker, token)) else {
                return;
            };
            let stream = live.stream;
            let root = self.vms[worker].store.data().root_id as i32;
            let t = token as i32;
            let over = matches!(event, GrpcEvent::Close(..))
                || (!stream && matches!(event, GrpcEvent::Message(_)));
            if over {
                self.grpc_live.remove(&(worker, token));
                self.vms[worker]
                    .store
                    .data_mut()
                    .grpc_calls
                    .live
                    .remove(&token);
            }
            {
                let s = self.vms[worker].store.data_mut();
                s.grpc = Default::default();
                s.status = (0, String::new());
            }
            // The event is readable (maps, buffer, status) during its callback.
            let vm = &mut self.vms[worker];
            let (s, x) = (vm.store.data_mut(), &vm.exports);
            let (f, n) = match event {
                GrpcEvent::Initial(h) => (
                    &x.on_grpc_receive_initial_metadata,
                    held(&mut s.grpc.initial, h),
                ),
                GrpcEvent::Message(m) => (&x.on_grpc_receive, held(&mut s.grpc.message, m)),
                GrpcEvent::Trailing(h) => (
                    &x.on_grpc_receive_trailing_metadata,
                    held(&mut s.grpc.trailing, h),
                ),
                GrpcEvent::Close(code, message) => {
                    s.status = (code, message);
                    (&x.on_grpc_close, code as i32)
                }
            };
            let f = f.clone();
            self.invoke(worker, root as u32, move |_| f.clone(), (root, t, n));
            {
                let s = self.vms[worker].store.data_mut();
                s.grpc = Default::default();
                s.status = (0, String::new());
            }
            let (d, _) = self.take_deferred(worker);
            self.run_deferred(worker, d);
        }
    }

    /// Takes what HTTP/2 streams received since the last look.
    pub(super) fn poll_grpc_streams(&mut self) {
        let keys: Vec<(usize, u32)> = self
            .grpc_live
            .iter()
            .filter(|(_, l)| l.h2.is_some())
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            let mut events = Vec::new();
            if let Some(live) = self.grpc_live.get_mut(&key) {
                events = live.poll();
            }
            if !events.is_empty() {
                self.ready.push_back(Event::Grpc {
                    worker: key.0,
                    token: key.1,
                    events,
                });
            }
        }
    }

    /// Whether an HTTP/2 stream may still deliver something (real time).
    pub(super) fn grpc_streams_open(&self) -> bool {
        self.grpc_live.values().any(|l| l.h2.is_some())
    }
}

impl GrpcLive {
    fn poll(&mut self) -> Vec<GrpcEvent> {
        let mut out = Vec::new();
        let Some((client, id)) = &self.h2 else {
            return out;
        };
        let id = *id;
        let mut done = false;
        while let Ok((stream, event)) = client.events.try_recv() {
            if stream != id && stream != 0 {
                continue;
            }
            match event {
                h2::Event::Headers(mut h, eos) => {
                    let close = close_of(&h);
                    if !self.got_headers {
                        // The router adds its timing to the response headers
                        // (not measured here: 0).
                        h.push(("x-envoy-upstream-service-time".into(), "0".into()));
                    }
                    if eos {
                        if !self.got_headers {
                            out.push(GrpcEvent::Initial(Vec::new()));
                        }
                        out.push(GrpcEvent::Trailing(h));
                        out.push(close);
                        done = true;
                    } else {
                        out.push(GrpcEvent::Initial(h));
                    }
                    self.got_headers = true;
                }
                h2::Event::Data(bytes, _) => {
                    self.received.extend_from_slice(&bytes);
                    out.extend(
                        take_messages(&mut self.received)
                            .into_iter()
                            .map(GrpcEvent::Message),
                    );
                }
                h2::Event::Reset | h2::Event::Gone => {
                    out.push(GrpcEvent::Close(RESET_STATUS, RESET_MESSAGE.into()));
                    done = true;
                }
            }
            if done {
                break;
            }
        }
        if done {
            self.h2 = None;
        }
        out
    }
}

fn status_of(trailers: &Headers) -> (u32, String) {
    let code = header_get(trailers, "grpc-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(grpc_status::UNKNOWN);
    // Envoy hands the message on as it came (percent-encoded).
    let message = header_get(trailers, "grpc-message")
        .unwrap_or_default()
        .to_string();
    (code, message)
}

fn close_of(trailers: &Headers) -> GrpcEvent {
    let (code, message) = status_of(trailers);
    GrpcEvent::Close(code, upstream_message(&message))
}

fn open_h2(addr: &str, headers: &Headers) -> Result<(Client, u32), ()> {
    let sock = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or(())?;
    let mut client = Client::connect(sock, Duration::from_secs(1)).map_err(|_| ())?;
    let id = client.open(headers, false).map_err(|_| ())?;
    Ok((client, id))
}

/// A unary call over HTTP/2, waiting at most the call's timeout in real
/// time (0: no timeout; here 30 s).
fn h2_unary(addr: &str, request: &GrpcRequest, timeout_ms: u32) -> Vec<GrpcEvent> {
    let budget = if timeout_ms == 0 {
        Duration::from_secs(30)
    } else {
        Duration::from_millis(u64::from(timeout_ms))
    };
    let deadline = Instant::now() + budget;
    let Ok((client, id)) = open_h2(addr, &request.metadata) else {
        return vec![GrpcEvent::Close(
            RESET_STATUS,
            CONNECT_FAILURE_MESSAGE.into(),
        )];
    };
    let _ = client.data(id, &frame_message(request.message()), true);
    let mut received = Vec::new();
    let mut messages = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = client.reset(id);
            return vec![GrpcEvent::Close(TIMEOUT_STATUS, TIMEOUT_MESSAGE.into())];
        }
        let Ok((stream, event)) = client.events.recv_timeout(left) else {
            continue;
        };
        if stream != id && stream != 0 {
            continue;
        }
        match event {
            h2::Event::Headers(h, true) => {
                let (code, message) = status_of(&h);
                return unary_events(code, &message, messages);
            }
            h2::Event::Headers(_, false) => {}
            h2::Event::Data(bytes, _) => {
                received.extend_from_slice(&bytes);
                messages.extend(take_messages(&mut received));
            }
            h2::Event::Reset | h2::Event::Gone => {
                return vec![GrpcEvent::Close(RESET_STATUS, RESET_MESSAGE.into())];
            }
        }
    }
}

/// Puts what a gRPC callback reads in its slot; answers its length, the
/// callback's size argument.
fn held<T>(slot: &mut Option<Vec<T>>, value: Vec<T>) -> i32 {
    let n = value.len() as i32;
    *slot = Some(value);
    n
}
