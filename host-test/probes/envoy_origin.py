#!/usr/bin/env python3
"""Runs the shared-data probe in a real Envoy (1.40) and records, for each way a
response can come about, what the filter reads of its origin:
`response.code_details`, `response.flags`, `response.code`, `upstream.address`
at request headers, response headers, each response body callback and in
on_log (plus Envoy's own access log, to compare).

    make wasm   # builds dist/shared_data_probe.wasm (with the other modules)
    python3 host-test/probes/envoy_origin.py [path/to/shared_data_probe.wasm]

Everything runs on loopback; Envoy and the upstream are stopped at the end.
The results are in host-test/PROBES.md ("Response origin").
"""

import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WASM = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "dist", "shared_data_probe.wasm")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LISTEN, LISTEN_RL, ADMIN, UP, CLOSED = (free_port() for _ in range(5))


# ---- the upstream: what it does depends on the path --------------------------

# Closing with linger 0 sends RST instead of FIN.
LINGER_RST = struct.pack("ii", 1, 0)


def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    m = re.search(rb"content-length:\s*(\d+)", head, re.I)
    need = int(m.group(1)) if m else 0
    while len(rest) < need:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head.split(b" ")[1].decode()


def response(status, body=b"ok"):
    return f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


def serve(conn):
    with conn:
        while True:
            path = read_request(conn)
            if path is None:
                return
            if path.startswith("/hc"):
                conn.sendall(response(503, b"unhealthy"))
            elif "/status/" in path:
                conn.sendall(response(int(path.rsplit("/", 1)[1])))
            elif "/sleep/" in path:
                time.sleep(float(path.rsplit("/", 1)[1]))
                try:
                    conn.sendall(response(200, b"late"))
                except OSError:
                    return
            elif path.endswith("/close"):
                return  # FIN after reading the request, no response
            elif path.endswith("/rst"):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
                return  # RST
            elif path.endswith("/partial"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
                time.sleep(0.2)
                return  # FIN mid-body
            elif path.endswith("/partial-rst"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
                time.sleep(0.2)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
                return
            elif "/slowbody/" in path:
                # Headers and half the body now, the rest after a pause.
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n0123456789")
                time.sleep(float(path.rsplit("/", 1)[1]))
                try:
                    conn.sendall(b"abcdefghij")
                except OSError:
                    return
            else:
                conn.sendall(response(200))


def upstream():
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", UP))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


# ---- Envoy -------------------------------------------------------------------

WASM_FILTER = f"""
          - name: probe
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                vm_config: {{ vm_id: probe, runtime: envoy.wasm.runtime.v8, code: {{ local: {{ filename: {WASM} }} }} }}
                configuration: {{ "@type": type.googleapis.com/google.protobuf.StringValue, value: '{{}}' }}
                root_id: ""
                name: probe"""

ACCESS_LOG = """
          access_log:
          - name: envoy.access_loggers.stdout
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
              log_format:
                text_format_source:
                  inline_string: "ACCESS %REQ(:PATH)% code=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% details=%RESPONSE_CODE_DETAILS% upstream=%UPSTREAM_HOST% failure=%UPSTREAM_TRANSPORT_FAILURE_REASON%\\n"
"""



def http_connection_manager(stat_prefix):
    """A listener's filter chain up to its route config, with the access log."""
    return f"""
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {stat_prefix}{ACCESS_LOG}"""


CONFIG = f"""
admin: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {ADMIN} }} }} }}
static_resources:
  listeners:
  - name: main
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {LISTEN} }} }}
    per_connection_buffer_limit_bytes: 16384{http_connection_manager('main')}
          route_config:
            validate_clusters: false
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/direct" }}
                direct_response: {{ status: 200, body: {{ inline_string: "direct" }} }}
              - match: {{ prefix: "/closed" }}
                route: {{ cluster: closed }}
              - match: {{ prefix: "/empty" }}
                route: {{ cluster: empty }}
              - match: {{ prefix: "/unhealthy" }}
                route: {{ cluster: unhealthy }}
              - match: {{ prefix: "/overflow" }}
                route: {{ cluster: overflow }}
              - match: {{ prefix: "/nocluster" }}
                route: {{ cluster: no_such_cluster }}
              - match: {{ prefix: "/timeout" }}
                route: {{ cluster: up, timeout: 1s }}
              - match: {{ prefix: "/retry5xx" }}
                route:
                  cluster: up
                  retry_policy: {{ retry_on: "5xx", num_retries: 1 }}
              - match: {{ prefix: "/retryclosed" }}
                route:
                  cluster: closed
                  retry_policy: {{ retry_on: "connect-failure", num_retries: 1 }}
              - match: {{ prefix: "/up" }}
                route: {{ cluster: up, timeout: 10s }}
          http_filters:{WASM_FILTER}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: ratelimited
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {LISTEN_RL} }} }}{http_connection_manager('rl')}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: up }}
          http_filters:{WASM_FILTER}
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: rl
              token_bucket: {{ max_tokens: 1, tokens_per_fill: 1, fill_interval: 3600s }}
              filter_enabled:
                default_value: {{ numerator: 100, denominator: HUNDRED }}
              filter_enforced:
                default_value: {{ numerator: 100, denominator: HUNDRED }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: up
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: up
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {UP} }} }} }} }}] }}]
  - name: closed
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: closed
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {CLOSED} }} }} }} }}] }}]
  - name: empty
    type: STATIC
    connect_timeout: 1s
    load_assignment: {{ cluster_name: empty }}
  - name: unhealthy
    type: STATIC
    connect_timeout: 1s
    # Without this, a cluster with no healthy host routes to all of them (panic mode).
    common_lb_config: {{ healthy_panic_threshold: {{ value: 0 }} }}
    health_checks:
    - timeout: 1s
      interval: 1s
      unhealthy_threshold: 1
      healthy_threshold: 1
      http_health_check: {{ path: /hc }}
    load_assignment:
      cluster_name: unhealthy
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {UP} }} }} }} }}] }}]
  - name: overflow
    type: STATIC
    connect_timeout: 1s
    circuit_breakers:
      thresholds: [{{ max_connections: 0, max_pending_requests: 0, max_requests: 0, max_retries: 0 }}]
    load_assignment:
      cluster_name: overflow
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {UP} }} }} }} }}] }}]
"""


def send(port, path, headers=None, hang_up_after=None, timeout=5.0):
    """One HTTP/1.1 request on a fresh connection; returns what came back."""
    headers = dict(headers or {})
    # "x-partial-body": a POST announcing 10 body bytes and sending 5.
    # "x-big-body": a POST with that many body bytes.
    partial = headers.pop("x-partial-body", None)
    big = int(headers.pop("x-big-body", "0"))
    method = "POST" if partial or big else "GET"
    lines = [f"{method} {path} HTTP/1.1", "host: probe.local"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if partial:
        lines.append("content-length: 10")
    if big:
        lines.append(f"content-length: {big}")
    body = b"01234" if partial else b"x" * big
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(raw)
    if hang_up_after is not None:
        time.sleep(hang_up_after)
        s.close()
        return "(client hung up)"
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                m = re.search(rb"content-length:\s*(\d+)", head, re.I)
                if m and len(body) >= int(m.group(1)):
                    break
    except (socket.timeout, ConnectionResetError) as e:
        data += f" <{type(e).__name__}>".encode()
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    keep = [l for l in lines[1:] if l.split(":")[0].lower() in ("content-type", "content-length")]
    return f"{lines[0]} [{'; '.join(keep)}] body={body[:200]!r} ({len(body)} bytes)"


CASES = [
    ("a1 upstream 200", LISTEN, "/up/status/200", {}, None),
    ("a2 upstream 503", LISTEN, "/up/status/503", {}, None),
    ("a3 upstream 429", LISTEN, "/up/status/429", {}, None),
    ("b connection refused", LISTEN, "/closed", {}, None),
    ("b2 refused, connect-failure retry", LISTEN, "/retryclosed", {}, None),
    ("c1 route timeout (1s, upstream sleeps 3s)", LISTEN, "/timeout/sleep/3", {}, None),
    ("c2 route timeout (1s) after the headers, mid-body", LISTEN, "/timeout/slowbody/3", {}, None),
    ("d1 upstream closes (FIN) before response", LISTEN, "/up/close", {}, None),
    ("d2 upstream resets (RST) before response", LISTEN, "/up/rst", {}, None),
    ("e1 headers then FIN mid-body", LISTEN, "/up/partial", {}, None),
    ("e2 headers then RST mid-body", LISTEN, "/up/partial-rst", {}, None),
    ("f1 client hangs up while upstream works", LISTEN, "/up/sleep/2", {}, 0.5),
    ("f2 client hangs up after the response headers, mid-body", LISTEN, "/up/slowbody/2", {}, 0.5),
    ("f3 client hangs up while the filter holds the request (paused at headers)", LISTEN, "/up",
     {"x-probe": "body", "x-partial-body": "1"}, 0.5),
    ("g1 cluster with no endpoints", LISTEN, "/empty", {}, None),
    ("g2 cluster whose only host fails health checks", LISTEN, "/unhealthy", {}, None),
    ("g3 circuit breaker overflow", LISTEN, "/overflow", {}, None),
    ("h1 local_ratelimit after the wasm filter (1st, passes)", LISTEN_RL, "/status/200", {}, None),
    ("h2 local_ratelimit after the wasm filter (2nd, limited)", LISTEN_RL, "/status/200", {}, None),
    ("h3 direct_response route", LISTEN, "/direct", {}, None),
    ("i1 no route", LISTEN, "/nothing-matches", {}, None),
    ("i2 route to an unknown cluster", LISTEN, "/nocluster", {}, None),
    ("i3 upstream 503 with retry_on 5xx, retries exhausted", LISTEN, "/retry5xx/status/503", {}, None),
    ("k1 request body over the buffer limit while the filter buffers it (Continue at headers)",
     LISTEN, "/up", {"x-probe": "body", "x-headers-action": "continue", "x-big-body": "100000"}, None),
    ("j1 filter's own local reply (SDK send_http_response)", LISTEN, "/up", {"x-probe": "cas-absent-max"}, None),
    ("j2 filter's own local reply with details", LISTEN, "/up",
     {"x-probe": "local-details", "x-details": "dedup_in_flight", "x-reply-status": "409"}, None),
    ("j3 filter's own local reply, details with spaces", LISTEN, "/up",
     {"x-probe": "local-details", "x-details": "two words", "x-reply-status": "409"}, None),
]


def main():
    threading.Thread(target=upstream, daemon=True).start()
    work = tempfile.mkdtemp(prefix="envoy-origin-")
    cfg = os.path.join(work, "envoy.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    log = open(os.path.join(work, "envoy.log"), "w")
    envoy = subprocess.Popen(
        ["envoy", "-c", cfg, "--concurrency", "1", "-l", "info", "--file-flush-interval-msec", "50", "--base-id", str(os.getpid() % 60000)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    results = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", LISTEN), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2.5)  # health checks mark the unhealthy host down
        for name, port, path, headers, hang in CASES:
            mark = len(open(log.name).read())
            got = send(port, path, {**headers, "x-case": name[:3].strip()}, hang_up_after=hang)
            time.sleep(2.8 if hang else 0.5)
            text = open(log.name).read()[mark:]
            lines = [
                re.sub(r"^.*?\] ", "", l)
                for l in text.splitlines()
                if "probe origin" in l or l.startswith("ACCESS") or "probe log:" in l
            ]
            results.append({"case": name, "path": path, "client": got, "lines": lines})
            print(f"== {name}  {path}\n   client: {got}")
            for l in lines:
                print("   " + l)
    finally:
        envoy.terminate()
        envoy.wait(timeout=10)
        log.close()
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nEnvoy log and results.json in {work}")


if __name__ == "__main__":
    main()
