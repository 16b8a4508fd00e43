//! Test fakes: shared data with Envoy's exact rules, and an `Env` around it.
#![allow(dead_code)]

use crate::metrics::{Counter, Remote};
use crate::shared_data::{HostFault, SetError, SharedData};
use crate::stream::{Env, StoreWorker};
use crate::wait::Waiters;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Hook = Box<dyn FnMut() + Send>;

/// Envoy's shared data for one vm_id: one mutex, one global cas counter (never 0),
/// absent keys ignore the cas argument, cas 0 overwrites, empty values stay as tombstones.
#[derive(Default)]
pub struct FakeShared {
    inner: Mutex<Inner>,
    /// Runs once just before the next set takes the lock: lets a test slip another
    /// worker's operation between a read and its CAS.
    hook: Mutex<Option<Hook>>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    fail: bool,
    sets: u64,
    /// Reads by key.
    gets: HashMap<String, u64>,
}

impl FakeShared {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeShared::default())
    }

    pub fn key_count(&self) -> usize {
        self.inner.lock().unwrap().map.len()
    }

    pub fn keys(&self) -> Vec<String> {
        self.inner.lock().unwrap().map.keys().cloned().collect()
    }

    pub fn raw(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.inner.lock().unwrap().map.get(key).cloned()
    }

    pub fn set_failing(&self, fail: bool) {
        self.inner.lock().unwrap().fail = fail;
    }

    /// How many times `key` was read.
    pub fn gets_of(&self, key: &str) -> u64 {
        self.inner
            .lock()
            .unwrap()
            .gets
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn sets(&self) -> u64 {
        self.inner.lock().unwrap().sets
    }

    pub fn before_next_set(&self, f: impl FnMut() + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(f));
    }
}

impl SharedData for FakeShared {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        let mut inner = self.inner.lock().unwrap();
        if inner.fail {
            return Err(HostFault("injected fault".into()));
        }
        *inner.gets.entry(key.to_string()).or_default() += 1;
        Ok(inner.map.get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(mut h) = hook {
            h();
        }
        let mut inner = self.inner.lock().unwrap();
        if inner.fail {
            return Err(SetError::Fault(HostFault("injected fault".into())));
        }
        if let Some((_, current)) = inner.map.get(key) {
            if cas != 0 && cas != *current {
                return Err(SetError::CasMismatch);
            }
        }
        inner.next_cas = inner.next_cas.wrapping_add(1);
        if inner.next_cas == 0 {
            inner.next_cas = 1;
        }
        let new_cas = inner.next_cas;
        inner.map.insert(key.to_string(), (value.to_vec(), new_cas));
        inner.sets += 1;
        Ok(())
    }
}

/// One worker's view: the shared store, a settable clock, counters, a log.
pub struct FakeEnv {
    pub shared: Arc<FakeShared>,
    pub now_ms: u64,
    pub next_token: u64,
    pub counters: HashMap<Counter, u64>,
    /// Regions: remote calls by kind and home region index.
    pub remote: HashMap<(Remote, u16), u64>,
    /// What the configured store keeps per worker.
    pub store: StoreWorker,
    pub etcd: Arc<FakeEtcd>,
    /// How far this worker's clock runs ahead of etcd's (leases follow etcd's clock).
    pub clock_ahead_ms: u64,
    /// Warnings logged, in order.
    pub warnings: std::cell::RefCell<Vec<String>>,
    /// Duplicates this worker holds in wait mode.
    pub waiters: Waiters,
    /// Records whose waiters this worker notified (every worker's, in the glue).
    pub wake_calls: Vec<crate::key::Digest>,
    /// A sharded store: the etcd of each Envoy cluster by name (a call to a cluster not
    /// listed goes to `etcd`).
    pub etcd_clusters: HashMap<String, Arc<FakeEtcd>>,
}

impl FakeEnv {
    pub fn new(shared: Arc<FakeShared>, worker: u64) -> Self {
        FakeEnv {
            shared,
            now_ms: 1_700_000_000_000,
            next_token: worker << 48,
            counters: HashMap::new(),
            remote: HashMap::new(),
            store: StoreWorker::default(),
            etcd: FakeEtcd::new(),
            clock_ahead_ms: 0,
            warnings: Default::default(),
            waiters: Waiters::default(),
            wake_calls: Vec::new(),
            etcd_clusters: HashMap::new(),
        }
    }

    /// The fake etcd a call to `cluster` reaches.
    pub fn etcd_of(&self, cluster: &str) -> &Arc<FakeEtcd> {
        self.etcd_clusters.get(cluster).unwrap_or(&self.etcd)
    }

    pub fn count_of(&self, c: Counter) -> u64 {
        self.counters.get(&c).copied().unwrap_or(0)
    }
}

impl SharedData for FakeEnv {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        self.shared.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        self.shared.set(key, value, cas)
    }
}

impl Env for FakeEnv {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn new_token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }
    fn count(&mut self, counter: Counter) {
        *self.counters.entry(counter).or_default() += 1;
    }
    fn count_remote(&mut self, what: Remote, region: u16) {
        *self.remote.entry((what, region)).or_default() += 1;
    }
    fn debug(&self, message: std::fmt::Arguments<'_>) {
        // Formatting is part of what is tested: it must not panic.
        let _ = message.to_string();
    }
    fn warn(&self, message: &str) {
        self.warnings.borrow_mut().push(message.to_string());
    }
    fn store_worker(&mut self) -> &mut StoreWorker {
        &mut self.store
    }
    fn waiters(&mut self) -> &mut Waiters {
        &mut self.waiters
    }
    fn wake_waiters(&mut self, digest: &crate::key::Digest) {
        self.wake_calls.push(*digest);
        self.waiters.wake(digest);
    }
}

/// etcd's v3 JSON gateway, as far as the filter uses it: txn with CREATE/MOD compares,
/// put (with lease), range, delete; lease grant; leases expiring with the test clock.
#[derive(Default)]
pub struct FakeEtcd {
    inner: Mutex<EtcdInner>,
}

#[derive(Default)]
struct EtcdInner {
    /// key -> (create_revision, mod_revision, value, lease)
    kv: HashMap<Vec<u8>, (i64, i64, Vec<u8>, i64)>,
    revision: i64,
    /// lease id -> expiry (ms)
    leases: HashMap<i64, u64>,
    next_lease: i64,
    /// Answer this many calls with a transport failure (status 503, empty body).
    failing: u32,
    /// Apply this many calls but answer them as if the connection broke.
    losing: u32,
    down: bool,
    pub grants: u32,
    pub txns: u32,
}

impl FakeEtcd {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeEtcd::default())
    }

    /// An etcd whose lease ids start past `base` (clusters of a sharded store grant
    /// different ids, so a lease used on the wrong shard is "not found").
    pub fn with_lease_ids_from(base: i64) -> Arc<Self> {
        let e = FakeEtcd::default();
        e.inner.lock().unwrap().next_lease = base;
        Arc::new(e)
    }

    pub fn set_down(&self, down: bool) {
        self.inner.lock().unwrap().down = down;
    }

    pub fn fail_next(&self, n: u32) {
        self.inner.lock().unwrap().failing = n;
    }

    pub fn lose_next_answers(&self, n: u32) {
        self.inner.lock().unwrap().losing = n;
    }

    pub fn grants(&self) -> u32 {
        self.inner.lock().unwrap().grants
    }

    pub fn key_count(&self, now_ms: u64) -> usize {
        let mut i = self.inner.lock().unwrap();
        i.expire(now_ms);
        i.kv.len()
    }

    /// The live keys, sorted (as text).
    pub fn keys(&self, now_ms: u64) -> Vec<String> {
        let mut i = self.inner.lock().unwrap();
        i.expire(now_ms);
        let mut keys: Vec<String> =
            i.kv.keys()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
        keys.sort();
        keys
    }

    /// Replaces every value with bytes no version of the record format reads.
    pub fn corrupt_all(&self) {
        let mut inner = self.inner.lock().unwrap();
        for v in inner.kv.values_mut() {
            v.2 = vec![0xff; 60];
        }
    }

    /// Rewrites every record value (its key ends in the digest's hex) through `f`, as
    /// another version of the filter could have written it.
    pub fn rewrite_records(
        &self,
        f: impl Fn(&crate::key::Digest, &mut crate::stores::etcd::wire::EtcdRecord),
    ) {
        let mut inner = self.inner.lock().unwrap();
        for (k, v) in inner.kv.iter_mut() {
            let Some(hex) = k.len().checked_sub(64).map(|at| &k[at..]) else {
                continue;
            };
            let Ok(text) = std::str::from_utf8(hex) else {
                continue;
            };
            let mut digest = [0u8; 32];
            let parsed = (0..32).all(|i| {
                u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                    .map(|b| digest[i] = b)
                    .is_ok()
            });
            if !parsed {
                continue;
            }
            if let Some(mut rec) = crate::stores::etcd::wire::EtcdRecord::decode(&v.2, &digest) {
                f(&digest, &mut rec);
                v.2 = rec.encode(&digest);
            }
        }
    }

    pub fn revoke_all_leases(&self) {
        let mut i = self.inner.lock().unwrap();
        let ids: Vec<i64> = i.leases.keys().copied().collect();
        for id in ids {
            i.leases.remove(&id);
            i.kv.retain(|_, v| v.3 != id);
        }
    }

    /// Answers one call: (status, body). A gRPC call (`/etcdserverpb.…`) is answered as
    /// the filter's glue hands it over: status 200 and the response message, or status 0
    /// and `etcdpb::status_body` (a transport failure: UNAVAILABLE, as Envoy reports it).
    pub fn handle(&self, path: &str, body: &[u8], now_ms: u64) -> (u16, Vec<u8>) {
        if path.starts_with("/etcdserverpb.") {
            let (json_path, json_body) = grpc_request_as_json(path, body);
            let (status, out) = self.handle(json_path, &json_body, now_ms);
            return json_answer_as_grpc(path, status, &out);
        }
        let answer = self.apply(path, body, now_ms);
        let mut i = self.inner.lock().unwrap();
        if i.losing > 0 && answer.0 == 200 {
            i.losing -= 1;
            return (503, Vec::new());
        }
        answer
    }

    fn apply(&self, path: &str, body: &[u8], now_ms: u64) -> (u16, Vec<u8>) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut i = self.inner.lock().unwrap();
        if i.down {
            return (503, Vec::new());
        }
        if i.failing > 0 {
            i.failing -= 1;
            return (503, Vec::new());
        }
        i.expire(now_ms);
        let req: serde_json::Value = serde_json::from_slice(body).unwrap();
        let header = |rev: i64| serde_json::json!({"revision": rev.to_string()});
        if path == "/v3/lease/grant" {
            i.grants += 1;
            i.next_lease += 1;
            let id = 7_000 + i.next_lease;
            let ttl: u64 = req["TTL"].as_str().unwrap().parse().unwrap();
            i.leases.insert(id, now_ms + ttl * 1000);
            let out = serde_json::json!({"header": header(i.revision), "ID": id.to_string(), "TTL": ttl.to_string()});
            return (200, out.to_string().into_bytes());
        }
        if path == "/v3/kv/range" {
            let from = b64.decode(req["key"].as_str().unwrap()).unwrap();
            if req.get("range_end").is_none() {
                // One key (a waiter's poll).
                let kvs: Vec<serde_json::Value> = i
                    .kv
                    .get(&from)
                    .iter()
                    .map(|(c, m, v, l)| {
                        serde_json::json!({"key": b64.encode(&from), "create_revision": c.to_string(), "mod_revision": m.to_string(), "value": b64.encode(v), "lease": l.to_string()})
                    })
                    .collect();
                let mut out = serde_json::json!({"header": header(i.revision)});
                if !kvs.is_empty() {
                    out["count"] = serde_json::json!(kvs.len().to_string());
                    out["kvs"] = serde_json::Value::Array(kvs);
                }
                return (200, out.to_string().into_bytes());
            }
            // The admin API: a count of the keys in [key, range_end).
            let to = b64.decode(req["range_end"].as_str().unwrap()).unwrap();
            assert_eq!(req["count_only"], true);
            let n = i.kv.keys().filter(|k| **k >= from && **k < to).count();
            let out = serde_json::json!({"header": header(i.revision), "count": n.to_string()});
            return (200, out.to_string().into_bytes());
        }
        assert_eq!(path, "/v3/kv/txn");
        i.txns += 1;
        let cmp = &req["compare"][0];
        let key = b64.decode(cmp["key"].as_str().unwrap()).unwrap();
        let cur = i.kv.get(&key).cloned();
        let ok = match cmp["target"].as_str().unwrap() {
            "CREATE" => {
                cur.as_ref().map_or(0, |c| c.0).to_string()
                    == cmp["create_revision"].as_str().unwrap()
            }
            "MOD" => {
                cur.as_ref().map_or(0, |c| c.1).to_string() == cmp["mod_revision"].as_str().unwrap()
            }
            t => panic!("compare target {t}"),
        };
        let ops = if ok { &req["success"] } else { &req["failure"] };
        let mut responses = Vec::new();
        for op in ops.as_array().cloned().unwrap_or_default() {
            if let Some(put) = op.get("request_put") {
                let lease: i64 = put["lease"].as_str().unwrap().parse().unwrap();
                if lease != 0 && !i.leases.contains_key(&lease) {
                    let e = serde_json::json!({"error": "etcdserver: requested lease not found", "message": "etcdserver: requested lease not found", "code": 5});
                    return (404, e.to_string().into_bytes());
                }
                i.revision += 1;
                let rev = i.revision;
                let k = b64.decode(put["key"].as_str().unwrap()).unwrap();
                let v = b64.decode(put["value"].as_str().unwrap()).unwrap();
                let create = i.kv.get(&k).map_or(rev, |c| c.0);
                i.kv.insert(k, (create, rev, v, lease));
                responses.push(serde_json::json!({"response_put": {"header": header(rev)}}));
            } else if op.get("request_range").is_some() {
                let kvs: Vec<serde_json::Value> = cur
                    .iter()
                    .map(|(c, m, v, l)| {
                        serde_json::json!({"key": b64.encode(&key), "create_revision": c.to_string(), "mod_revision": m.to_string(), "value": b64.encode(v), "lease": l.to_string()})
                    })
                    .collect();
                responses.push(serde_json::json!({"response_range": {"header": header(i.revision), "kvs": kvs, "count": kvs.len().to_string()}}));
            } else if op.get("request_delete_range").is_some() {
                if i.kv.remove(&key).is_some() {
                    i.revision += 1;
                }
                responses.push(
                    serde_json::json!({"response_delete_range": {"header": header(i.revision)}}),
                );
            }
        }
        let mut out = serde_json::json!({"header": header(i.revision), "responses": responses});
        if ok {
            // grpc-gateway leaves out false booleans.
            out["succeeded"] = serde_json::Value::Bool(true);
        }
        (200, out.to_string().into_bytes())
    }
}

impl EtcdInner {
    fn expire(&mut self, now_ms: u64) {
        let dead: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, e)| **e <= now_ms)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.leases.remove(&id);
            self.kv.retain(|_, v| v.3 != id);
        }
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(v: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or(""))
        .unwrap()
}

fn num(v: &serde_json::Value) -> i64 {
    v.as_str().map_or(0, |s| s.parse().unwrap())
}

/// A gRPC request message as the gateway's JSON request (what the fake applies).
fn grpc_request_as_json(path: &str, body: &[u8]) -> (&'static str, Vec<u8>) {
    use crate::stores::etcd::pb::testing::{all, bytes_of, int_of};
    use serde_json::json;
    let fs = all(body);
    match path {
        crate::stores::etcd::pb::LEASE_GRANT => {
            let ttl = int_of(&fs, 1).unwrap_or(0);
            (
                "/v3/lease/grant",
                json!({"TTL": ttl.to_string()}).to_string().into_bytes(),
            )
        }
        crate::stores::etcd::pb::RANGE if bytes_of(&fs, 2).is_empty() => {
            // One key (a waiter's poll).
            let key = bytes_of(&fs, 1)[0];
            let j = json!({"key": b64(key)});
            ("/v3/kv/range", j.to_string().into_bytes())
        }
        crate::stores::etcd::pb::RANGE => {
            let key = bytes_of(&fs, 1)[0];
            let end = bytes_of(&fs, 2)[0];
            assert_eq!(int_of(&fs, 9), Some(1));
            let j = json!({"key": b64(key), "range_end": b64(end), "count_only": true});
            ("/v3/kv/range", j.to_string().into_bytes())
        }
        crate::stores::etcd::pb::TXN => {
            let cmp = all(bytes_of(&fs, 1)[0]);
            let key = b64(bytes_of(&cmp, 3)[0]);
            let compare = match int_of(&cmp, 2) {
                Some(1) => json!({"key": key, "target": "CREATE",
                    "create_revision": int_of(&cmp, 5).unwrap().to_string()}),
                Some(2) => json!({"key": key, "target": "MOD",
                    "mod_revision": int_of(&cmp, 6).unwrap().to_string()}),
                t => panic!("compare target {t:?}"),
            };
            let ops = |n: u64| -> Vec<serde_json::Value> {
                bytes_of(&fs, n)
                    .into_iter()
                    .map(|op| {
                        let op = all(op);
                        let (f, inner) = match op[0] {
                            (f, crate::stores::etcd::pb::Value::Bytes(b)) => (f, all(b)),
                            _ => panic!("request op"),
                        };
                        let k = b64(bytes_of(&inner, 1)[0]);
                        match f {
                            1 => json!({"request_range": {"key": k}}),
                            2 => json!({"request_put": {"key": k,
                                "value": b64(bytes_of(&inner, 2).first().copied().unwrap_or(b"")),
                                "lease": int_of(&inner, 3).unwrap_or(0).to_string()}}),
                            3 => json!({"request_delete_range": {"key": k}}),
                            f => panic!("request op {f}"),
                        }
                    })
                    .collect()
            };
            let j = json!({"compare": [compare], "success": ops(2), "failure": ops(3)});
            ("/v3/kv/txn", j.to_string().into_bytes())
        }
        other => panic!("gRPC method {other}"),
    }
}

/// The gateway's JSON `kvs` as encoded `KeyValue` messages.
fn json_kvs_as_grpc(kvs: &serde_json::Value) -> Vec<Vec<u8>> {
    use crate::stores::etcd::pb::testing as pb;
    kvs.as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|kv| {
            pb::kv(
                &unb64(&kv["key"]),
                num(&kv["create_revision"]),
                num(&kv["mod_revision"]),
                &unb64(&kv["value"]),
                num(&kv["lease"]),
            )
        })
        .collect()
}

/// The gateway's JSON answer as the gRPC answer the glue would hand over.
fn json_answer_as_grpc(path: &str, status: u16, body: &[u8]) -> (u16, Vec<u8>) {
    use crate::stores::etcd::pb::testing as pb;
    if status != 200 {
        if body.is_empty() {
            return (
                0,
                crate::stores::etcd::pb::status_body(14, b"upstream connect error"),
            );
        }
        let e: serde_json::Value = serde_json::from_slice(body).unwrap();
        let code = e["code"].as_i64().unwrap() as u32;
        let msg = e["message"].as_str().unwrap_or("");
        return (
            0,
            crate::stores::etcd::pb::status_body(code, msg.as_bytes()),
        );
    }
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let rev = num(&v["header"]["revision"]);
    let out = match path {
        crate::stores::etcd::pb::LEASE_GRANT => {
            pb::lease_response(rev, num(&v["ID"]), num(&v["TTL"]))
        }
        crate::stores::etcd::pb::RANGE => {
            pb::range_response(rev, &json_kvs_as_grpc(&v["kvs"]), num(&v["count"]))
        }
        _ => {
            let ops: Vec<(u32, Vec<u8>)> = v["responses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|r| {
                    if let Some(rr) = r.get("response_range") {
                        let kvs = json_kvs_as_grpc(&rr["kvs"]);
                        let n = kvs.len() as i64;
                        (
                            1,
                            pb::range_response(num(&rr["header"]["revision"]), &kvs, n),
                        )
                    } else if let Some(p) = r.get("response_put") {
                        (2, pb::put_response(num(&p["header"]["revision"])))
                    } else {
                        let d = &r["response_delete_range"];
                        (3, pb::put_response(num(&d["header"]["revision"])))
                    }
                })
                .collect();
            pb::txn_response(rev, v["succeeded"] == true, &ops)
        }
    };
    (200, out)
}

/// One Envoy process as a worker's `Host` sees it: shared data and shared queues (one
/// per process, so two hosts over the same `FakeVm` are two workers of one Envoy), and
/// this worker's own metrics, logs, tick and store calls.
pub struct FakeHost {
    pub vm: Arc<FakeVm>,
    pub now_ms: std::cell::Cell<u64>,
    pub seed: u64,
    pub debug: bool,
    /// Log lines, in order.
    pub logs: std::cell::RefCell<Vec<(crate::worker::Level, String)>>,
    /// Metrics defined, by id (counters and histograms), and their increments.
    pub metrics: std::cell::RefCell<Vec<String>>,
    pub increments: std::cell::RefCell<HashMap<u32, u64>>,
    /// Every tick period set, in order.
    pub ticks: std::cell::RefCell<Vec<u32>>,
    /// Store calls dispatched, by token; `refuse_calls` makes dispatch fail.
    pub calls: std::cell::RefCell<Vec<(u32, crate::stream::StoreCall)>>,
    pub refuse_calls: std::cell::Cell<bool>,
    /// Histogram values recorded, (metric, value), in order.
    pub recorded: std::cell::RefCell<Vec<(u32, u64)>>,
    pub random: Result<[u8; crate::stores::shared::SECRET_LEN], u16>,
}

/// Shared data and the shared queues of one Envoy process.
#[derive(Default)]
pub struct FakeVm {
    pub shared: Arc<FakeShared>,
    /// Queue token -> (name, items).
    pub queues: Mutex<Vec<(String, std::collections::VecDeque<Vec<u8>>)>>,
    next_call: Mutex<u32>,
}

impl FakeVm {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeVm::default())
    }
}

impl FakeHost {
    pub fn new(vm: Arc<FakeVm>, seed: u64) -> Self {
        FakeHost {
            vm,
            now_ms: std::cell::Cell::new(1_700_000_000_000),
            seed,
            debug: false,
            logs: Default::default(),
            metrics: Default::default(),
            increments: Default::default(),
            ticks: Default::default(),
            calls: Default::default(),
            refuse_calls: Default::default(),
            recorded: Default::default(),
            random: Ok([seed as u8; crate::stores::shared::SECRET_LEN]),
        }
    }

    /// How often the counter `c` was incremented.
    pub fn count(&self, c: Counter) -> u64 {
        let metrics = self.metrics.borrow();
        let Some(id) = metrics.iter().position(|m| m == c.name()) else {
            return 0;
        };
        self.increments
            .borrow()
            .get(&(id as u32))
            .copied()
            .unwrap_or(0)
    }

    pub fn logged(&self, level: crate::worker::Level, part: &str) -> bool {
        self.logs
            .borrow()
            .iter()
            .any(|(l, m)| *l == level && m.contains(part))
    }
}

impl SharedData for FakeHost {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostFault> {
        self.vm.shared.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), SetError> {
        self.vm.shared.set(key, value, cas)
    }
}

impl crate::worker::Host for FakeHost {
    fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }
    fn log(&self, level: crate::worker::Level, message: &str) {
        self.logs.borrow_mut().push((level, message.to_string()));
    }
    fn debug_enabled(&self) -> bool {
        self.debug
    }
    fn define_counter(&self, name: &str) -> Result<u32, u32> {
        let mut m = self.metrics.borrow_mut();
        m.push(name.to_string());
        Ok(m.len() as u32 - 1)
    }
    fn define_histogram(&self, name: &str) -> Result<u32, u32> {
        self.define_counter(name)
    }
    fn increment(&self, metric: u32) {
        *self.increments.borrow_mut().entry(metric).or_default() += 1;
    }
    fn add(&self, metric: u32, n: u64) {
        *self.increments.borrow_mut().entry(metric).or_default() += n;
    }
    fn record(&self, metric: u32, value: u64) {
        self.recorded.borrow_mut().push((metric, value));
    }
    fn random_bytes(&self) -> Result<[u8; crate::stores::shared::SECRET_LEN], u16> {
        self.random
    }
    fn random_seed(&self) -> u64 {
        self.seed
    }
    fn set_tick_period(&self, period_ms: u32) -> Result<(), u32> {
        self.ticks.borrow_mut().push(period_ms);
        Ok(())
    }
    fn register_queue(&self, name: &str) -> Result<u32, u32> {
        let mut q = self.vm.queues.lock().unwrap();
        if let Some(i) = q.iter().position(|(n, _)| n == name) {
            return Ok(i as u32 + 1);
        }
        q.push((name.to_string(), Default::default()));
        Ok(q.len() as u32)
    }
    fn enqueue(&self, queue: u32, item: &[u8]) -> Result<(), u32> {
        let mut q = self.vm.queues.lock().unwrap();
        match q.get_mut((queue as usize).wrapping_sub(1)) {
            Some((_, items)) => {
                items.push_back(item.to_vec());
                Ok(())
            }
            None => Err(1),
        }
    }
    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, u32> {
        let mut q = self.vm.queues.lock().unwrap();
        match q.get_mut((queue as usize).wrapping_sub(1)) {
            Some((_, items)) => Ok(items.pop_front()),
            None => Err(1),
        }
    }
    fn dispatch(&self, call: &crate::stream::StoreCall) -> Result<u32, crate::stream::CallAnswer> {
        if self.refuse_calls.get() {
            return Err(crate::stream::CallAnswer::default());
        }
        let mut next = self.vm.next_call.lock().unwrap();
        *next += 1;
        self.calls.borrow_mut().push((*next, call.clone()));
        Ok(*next)
    }
}
