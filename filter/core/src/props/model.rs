//! Model-based fuzzing of the stream machine. Proptest draws a sequence of operations:
//! requests started on random workers (shared data: three workers over one store; etcd:
//! two proxies of two workers over one etcd, the second proxy's clock running ahead),
//! their bodies, store answers that arrive late, lost (applied, answer dropped), failed,
//! duplicated (applied twice) or answered "unavailable", store calls applied again much
//! later, upstream answers of every origin (stored statuses, released statuses, local
//! replies of Envoy or a later filter, unknown outcomes), cut bodies, client hang-ups, and
//! clock jumps. Every decision is checked against a small reference model of the contract
//! (README): at most one execution per (scope, key) while a claim could be live, a claim
//! released only when the upstream answered a status not stored or certainly never ran
//! it; replays equal to the stored response of that execution; 409 and 422 only when the
//! contract says; no replay across scopes or payloads. A divergence is shrunk to a minimal
//! sequence, printed as "minimal failing input", with the trace of that run.

use crate::config::Config;
use crate::fake::{FakeEnv, FakeEtcd, FakeShared};
use crate::key::RequestHead;
use crate::metrics::Counter;
use crate::outcome::flags;
use crate::props::decoders::config as proptest_config;
use crate::reply::LocalReply;
use crate::response::StoredResponse;
use crate::stores::etcd::wire::{self as etcd, EtcdAnswer};
use crate::stream::{CallAnswer, Decision, DedupStream, Origin, Plugin, StoreCall};
use proptest::prelude::*;
use std::sync::Arc;

// `impl World` is split by concern: starting requests and their decisions, the
// reference checks, etcd calls under faults, and the response side.
mod checks;
mod requests;
mod responses;
mod store_calls;

const IN_FLIGHT_MS: u64 = 5_000;
const TTL_MS: u64 = 20_000;
/// `max_replay_body_bytes`: some responses are too large to keep.
const CAP: usize = 8;
const START_MS: u64 = 1_700_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Shared,
    Etcd,
}

/// The configuration of one run.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    store: StoreKind,
    unknown: Unknown,
    reject: bool,
    closed: bool,
    /// How far the second proxy's clock runs ahead of etcd's (etcd store).
    skew_ms: u64,
    /// etcd store: two workers per proxy (else one).
    two_workers: bool,
    /// etcd store: a resharding from map `{a}` to `{a, c}` under way, proxy A on the
    /// first step and proxy B on the second (`RESHARD_STEPS`).
    reshard: Option<(u8, u8)>,
}

/// The steps of a resharding from `OLD` to `NEW` (docs/src/deployment/sharding.md), as
/// the `store` fields each step pushes.
const RESHARD_STEPS: [&str; 4] = [
    r#""shards": [{"name": "a", "cluster": "etcd_a"}]"#,
    r#""shards": [{"name": "a", "cluster": "etcd_a"}], "next_shards": [{"name": "a", "cluster": "etcd_a"}, {"name": "c", "cluster": "etcd_b"}]"#,
    r#""shards": [{"name": "a", "cluster": "etcd_a"}, {"name": "c", "cluster": "etcd_b"}], "previous_shards": [{"name": "a", "cluster": "etcd_a"}]"#,
    r#""shards": [{"name": "a", "cluster": "etcd_a"}, {"name": "c", "cluster": "etcd_b"}]"#,
];

/// `on_unknown_outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unknown {
    Keep,
    Hold,
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    NoKey,
    TwoKeys,
    TwoScopes,
    /// Not deduplicated (GET): passes untouched.
    Get,
}

/// What happens to a store call's answer.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Normal,
    /// Applied, but the answer is lost (connection reset): 503 without body.
    Lost,
    /// Refused before etcd saw it (if not applied yet): 503 without body.
    Failed,
    /// Applied twice (a resent request); the second application's answer arrives.
    Duplicated,
    /// A member without a leader: gRPC "unavailable", not applied.
    Unavailable,
    /// Applied now; the answer arrives just before Envoy's timeout for the call.
    Late,
}

#[derive(Debug, Clone, Copy)]
enum Resp {
    /// The upstream answered `status` with a body of `len` bytes.
    Upstream { status: u16, len: u8 },
    /// Envoy or a later filter answered: the upstream never got the request.
    NotSent(u8),
    /// Envoy answered after the request may have reached the upstream.
    Unknown(u8),
}

/// Why a stream ends before its response headers.
#[derive(Debug, Clone, Copy)]
enum EndWhy {
    ClientGone,
    UpstreamReset,
    Refused,
    NoHealthy,
}

#[derive(Debug, Clone)]
enum Op {
    Start {
        worker: u8,
        scope: u8,
        key: u8,
        /// The body (`payload % 3`; 0: no body, 1, 2: two bodies) and the caller
        /// (`payload / 3`: two named by `authorization`, then one that names none).
        payload: u8,
        bad: Option<Bad>,
        /// Shared data: which of two configurations (capacities) serves it.
        layout: u8,
    },
    Body {
        s: u8,
    },
    /// etcd applies a pending call; its answer comes later.
    Apply {
        s: u8,
    },
    Deliver {
        s: u8,
        fate: Fate,
    },
    Respond {
        s: u8,
        r: Resp,
    },
    /// The next chunk of a response body (the last one ends it, or trailers do).
    RespBody {
        s: u8,
        trailers: bool,
    },
    End {
        s: u8,
        why: EndWhy,
    },
    Tick {
        ms: u32,
    },
    /// etcd applies an already answered call once more (a delayed duplicate).
    Zombie {
        c: u8,
    },
}

fn not_sent_origin(i: u8) -> (u16, Origin) {
    let (status, details, f) = match i % 4 {
        0 => (503, "no_healthy_upstream", flags::UH),
        1 => (429, "local_rate_limited", flags::RL),
        // A direct response of 200: a success status, but not the upstream's.
        2 => (200, "direct_response", 0),
        _ => (
            503,
            "upstream_reset_before_response_started{connection_failure}",
            flags::UF,
        ),
    };
    (status, origin(details, f))
}

fn unknown_origin(i: u8) -> (u16, Origin) {
    let (status, details, f) = match i % 3 {
        0 => (504, "response_timeout", flags::UT),
        1 => (
            503,
            "upstream_reset_before_response_started{connection_termination}",
            flags::UC,
        ),
        _ => (504, "upstream_per_try_timeout", flags::UT),
    };
    (status, origin(details, f))
}

fn end_origin(why: EndWhy) -> Origin {
    match why {
        EndWhy::ClientGone => origin("", flags::DC),
        EndWhy::UpstreamReset => origin(
            "upstream_reset_before_response_started{remote_reset}",
            flags::UR,
        ),
        EndWhy::Refused => origin(
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            flags::UF,
        ),
        EndWhy::NoHealthy => origin("no_healthy_upstream", flags::UH),
    }
}

fn origin(details: &str, f: u64) -> Origin {
    Origin {
        details: details.to_string(),
        flags: f,
    }
}

/// The contract's default `store_statuses`.
fn stored_status(s: u16) -> bool {
    (200..500).contains(&s) && ![408, 425, 429].contains(&s)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqPhase {
    AwaitBody,
    Deciding,
    Decided,
}

struct Pending {
    call: StoreCall,
    sent_at: u64,
    applied: Option<(u16, Vec<u8>)>,
    /// For a claim call: what the contract demanded when etcd applied it.
    demand: Option<Option<String>>,
}

impl Pending {
    /// A call the stream just sent, not applied yet.
    fn sent(call: StoreCall, now: u64) -> Self {
        Pending {
            call,
            sent_at: now,
            applied: None,
            demand: None,
        }
    }
}

/// The response as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RespPhase {
    None,
    /// Headers passed; `capturing` while the model expects the body to be kept.
    Headers {
        status: u16,
        origin: Origin,
        len: usize,
        sent: usize,
        capturing: bool,
        done: bool,
    },
}

/// A request's scope, key, payload (0: no body) and what is wrong with it, if anything.
type Who = (u8, u8, u8, Option<Bad>);

struct Sim {
    worker: usize,
    scope: u8,
    key: u8,
    payload: u8,
    bad: Option<Bad>,
    plugin: usize,
    s: DedupStream,
    req: ReqPhase,
    call: Option<Pending>,
    exec: Option<usize>,
    resp: RespPhase,
    ended: bool,
    /// A fault touched one of its store calls: failing open or closed is allowed.
    faulted: bool,
    /// etcd applied one of its claim transactions: a record of its claim may exist
    /// whatever the stream learnt (an answer lost, then a timeout: it failed open or
    /// closed not knowing it holds the claim, which then stays until its lease ends).
    claim_applied: bool,
    /// When the claim transaction etcd last applied for it was built (sent): its
    /// record's in-flight time runs from then, by this stream's worker's clock.
    claim_sent: Option<u64>,
    /// Its worker's `proxy_dedup_failed_open` when it started (a resharding's check
    /// that fails under `failure_mode: "open"` forwards with the claim kept, counted
    /// there).
    failed_open_before: u64,
    /// One of its transactions was applied again long after (`Op::Zombie`).
    zombie: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ExecState {
    /// Forwarded; no answer yet (or its body is being captured).
    Running,
    /// Outcome unknown, held until the in-flight timeout (`"hold"`).
    Held,
    /// Outcome unknown, kept until the TTL from `at` (`"keep"`, the default).
    Kept {
        at: u64,
    },
    Released,
    Completed {
        stored: Option<StoredResponse>,
        /// Completion time by the completing proxy's clock + TTL.
        expires: u64,
        /// The completion certainly reached the store.
        sure: bool,
    },
}

#[derive(Debug)]
struct Exec {
    stream: usize,
    scope: u8,
    key: u8,
    payload: u8,
    forward_at: u64,
    /// When its record's in-flight time ends, by the clock of the worker that wrote it
    /// (the claim is built before it is won, so this may come before
    /// `forward_at + IN_FLIGHT_MS`).
    claim_ends: u64,
    state: ExecState,
}

/// A claim attempt: a decision about this identity was taken (the record may exist).
struct Attempt {
    stream: usize,
    scope: u8,
    key: u8,
    payload: u8,
    at: u64,
}

struct World {
    knobs: Knobs,
    plugins: Vec<Plugin>,
    envs: Vec<FakeEnv>,
    etcd: Arc<FakeEtcd>,
    /// A resharding: the etcd of each shard's cluster (`etcd_a`, `etcd_b`).
    shards: std::collections::HashMap<String, Arc<FakeEtcd>>,
    now: u64,
    sims: Vec<Sim>,
    execs: Vec<Exec>,
    attempts: Vec<Attempt>,
    /// Calls already answered, for `Zombie`, with the stream that sent each.
    answered: Vec<(StoreCall, usize)>,
    trace: Vec<String>,
    seen: Seen,
}

/// What clients saw, to compare with the counters.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
struct Seen {
    requests: u64,
    executed: u64,
    replayed: u64,
    in_flight: u64,
    mismatch: u64,
    bad_key: u64,
    bypassed: u64,
}

/// The configuration of a run; with a resharding, that of the proxy on `step`.
fn plugin_json(k: &Knobs, capacity: u32, step: Option<u8>) -> String {
    let store = match (k.store, step) {
        (StoreKind::Shared, _) => String::new(),
        (StoreKind::Etcd, Some(step)) => format!(
            r#", "store": {{"kind": "etcd", "timeout_ms": 3000, {}}}"#,
            RESHARD_STEPS[usize::from(step) % RESHARD_STEPS.len()]
        ),
        (StoreKind::Etcd, None) => {
            r#", "store": {"kind": "etcd", "cluster": "etcd", "timeout_ms": 3000}"#.to_string()
        }
    };
    format!(
        r#"{{"key": {{"required": true}}, "scope": {{"headers": ["x-tenant"]}},
            "ttl_seconds": {}, "in_flight_timeout_seconds": {}, "capacity": {capacity},
            "max_replay_body_bytes": {CAP}, "on_unknown_outcome": "{}", "on_duplicate": "{}",
            "failure_mode": "{}"{store}}}"#,
        TTL_MS / 1000,
        IN_FLIGHT_MS / 1000,
        match k.unknown {
            Unknown::Keep => "keep",
            Unknown::Hold => "hold",
            Unknown::Release => "release",
        },
        if k.reject { "reject" } else { "replay" },
        if k.closed { "closed" } else { "open" },
    )
}

/// A model payload's body (0: none) and caller (2: none named); see `Op::Start`.
fn body_of(payload: u8) -> u8 {
    payload % 3
}

fn caller_of(payload: u8) -> u8 {
    payload / 3
}

/// What a record of `stored`'s payload answers a request of `mine`'s, when they differ:
/// another body is a payload mismatch; the same body of another caller, a principal one.
fn mismatch_of(stored: u8, mine: u8) -> Option<&'static str> {
    if body_of(stored) != body_of(mine) {
        Some("422")
    } else if stored != mine {
        Some("422 principal")
    } else {
        None
    }
}

fn problem_slug(r: &LocalReply) -> String {
    serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_string))
        .and_then(|t| {
            t.strip_prefix("urn:proxy-dedup:problem:")
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("status {} (not problem+json)", r.status))
}

fn short(a: &Decision) -> String {
    match a {
        Decision::Continue => "continue".into(),
        Decision::Pause => "pause".into(),
        Decision::Call(c) => format!("call {}", c.path),
        Decision::Upstream(c) => format!("detached call to {}", c.cluster),
        Decision::Reply(r) if r.header("idempotent-replayed").is_some() => format!(
            "replay of execution {}",
            String::from_utf8_lossy(r.header("x-exec").unwrap_or(b"?"))
        ),
        Decision::Reply(r) => format!("{} {}", r.status, problem_slug(r)),
    }
}

fn run_case(knobs: Knobs, ops: &[Op]) -> Result<(), String> {
    let mut world = World::new(knobs)?;
    let mut result = Ok(());
    for op in ops {
        result = world.run(op);
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        result = world.counters();
    }
    result.map_err(|e| {
        format!(
            "{e}\nknobs: {knobs:?}\ntrace:\n  {}",
            world.trace.join("\n  ")
        )
    })
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![Just(StoreKind::Shared), Just(StoreKind::Etcd)],
        prop_oneof![
            3 => Just(Unknown::Keep),
            1 => Just(Unknown::Hold),
            1 => Just(Unknown::Release),
        ],
        prop::bool::weighted(0.2),
        any::<bool>(),
        prop_oneof![Just(0u64), 1u64..3_000],
        any::<bool>(),
        prop_oneof![
            3 => Just(None),
            // Two adjacent steps (a push under way), or both on one step.
            2 => (0u8..3).prop_map(|s| Some((s, s + 1))),
            1 => (0u8..4).prop_map(|s| Some((s, s))),
        ],
    )
        .prop_map(
            |(store, unknown, reject, closed, skew_ms, two_workers, reshard)| Knobs {
                store,
                unknown,
                reject,
                closed,
                skew_ms,
                two_workers,
                reshard: if store == StoreKind::Etcd {
                    reshard
                } else {
                    None
                },
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    let bad = prop_oneof![
        Just(Bad::NoKey),
        Just(Bad::TwoKeys),
        Just(Bad::TwoScopes),
        Just(Bad::Get)
    ];
    let fate = prop_oneof![
        6 => Just(Fate::Normal),
        1 => Just(Fate::Lost),
        1 => Just(Fate::Failed),
        1 => Just(Fate::Duplicated),
        1 => Just(Fate::Unavailable),
        2 => Just(Fate::Late),
    ];
    let resp = prop_oneof![
        6 => (prop::sample::select(vec![200u16, 201, 302, 404, 409, 429, 500, 503]), 0u8..13)
            .prop_map(|(status, len)| Resp::Upstream { status, len }),
        1 => (0u8..4).prop_map(Resp::NotSent),
        1 => (0u8..3).prop_map(Resp::Unknown),
    ];
    let why = prop_oneof![
        Just(EndWhy::ClientGone),
        Just(EndWhy::UpstreamReset),
        Just(EndWhy::Refused),
        Just(EndWhy::NoHealthy)
    ];
    prop_oneof![
        5 => (any::<u8>(), 0u8..2, 0u8..2, 0u8..9, prop::option::weighted(0.08, bad), 0u8..2)
            .prop_map(|(worker, scope, key, payload, bad, layout)| Op::Start { worker, scope, key, payload, bad, layout }),
        3 => any::<u8>().prop_map(|s| Op::Body { s }),
        2 => any::<u8>().prop_map(|s| Op::Apply { s }),
        6 => (any::<u8>(), fate).prop_map(|(s, fate)| Op::Deliver { s, fate }),
        3 => (any::<u8>(), resp).prop_map(|(s, r)| Op::Respond { s, r }),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(s, trailers)| Op::RespBody { s, trailers }),
        2 => (any::<u8>(), why).prop_map(|(s, why)| Op::End { s, why }),
        3 => prop::sample::select(vec![1u32, 40, 400, 999, 1_500, 3_000, 4_999, 5_000, 9_000, 21_000])
            .prop_map(|ms| Op::Tick { ms }),
        1 => any::<u8>().prop_map(|c| Op::Zombie { c }),
    ]
}

proptest! {
    #![proptest_config(proptest_config(256))]

    /// Random histories across two proxies mid-resharding (each on its own step of the
    /// procedure, adjacent or the same) keep the contract: a moved key runs at most once
    /// whichever map each proxy writes under, under every store fault.
    #[test]
    fn resharding_histories_keep_the_contract(
        knobs in (knobs(), 0u8..4, any::<bool>()).prop_map(|(mut k, s, same)| {
            k.store = StoreKind::Etcd;
            k.reshard = Some(if same || s == 3 { (s, s) } else { (s, s + 1) });
            k
        }),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        if let Err(e) = run_case(knobs, &ops) {
            return Err(TestCaseError::fail(e));
        }
    }

    /// Random histories across workers and proxies keep the contract.
    #[test]
    fn random_histories_keep_the_contract(
        knobs in knobs(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        if let Err(e) = run_case(knobs, &ops) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// The history that showed leases counted from a late grant answer ending claims early
/// (fixed in `LeaseCache::put`): the model must flag it, and the filter must pass it.
#[test]
fn a_late_lease_grant_history_keeps_the_contract() {
    let knobs = Knobs {
        store: StoreKind::Etcd,
        unknown: Unknown::Hold,
        reject: false,
        closed: false,
        skew_ms: 0,
        reshard: None,
        two_workers: false,
    };
    let start = |worker, key| Op::Start {
        worker,
        scope: 0,
        key,
        payload: 0,
        bad: None,
        layout: 0,
    };
    let deliver = |fate| Op::Deliver { s: 0, fate };
    let ops = vec![
        start(0, 0),
        // The in-flight lease is granted now, and its answer comes 999 ms later.
        deliver(Fate::Late),
        deliver(Fate::Normal),
        deliver(Fate::Normal),
        Op::Tick { ms: 400 },
        // Another claim on that worker, with the same lease.
        start(0, 1),
        deliver(Fate::Normal),
        // 4999 ms after that claim, a retry on the other proxy.
        Op::Tick { ms: 4_999 },
        start(1, 1),
        deliver(Fate::Normal),
        deliver(Fate::Normal),
        deliver(Fate::Normal),
    ];
    if let Err(e) = run_case(knobs, &ops) {
        panic!("{e}");
    }
}

/// The resharding runs move keys: of the model's four identities, some live on another
/// shard under the new map than under the old (and some stay), so histories exercise
/// both the check and its absence.
#[test]
fn the_resharding_runs_move_some_of_the_models_keys() {
    let knobs = Knobs {
        store: StoreKind::Etcd,
        unknown: Unknown::Keep,
        reject: false,
        closed: false,
        skew_ms: 0,
        two_workers: false,
        reshard: Some((0, 3)),
    };
    let mut world = World::new(knobs).unwrap();
    let mut moved = 0;
    for scope in 0..2u8 {
        for key in 0..2u8 {
            let head = RequestHead {
                method: "POST".into(),
                path: "/orders?x=1".into(),
                authority: "api.example".into(),
                headers: vec![
                    ("x-tenant".into(), format!("tenant-{scope}").into_bytes()),
                    ("idempotency-key".into(), format!("key-{key}").into_bytes()),
                ],
                protocol: String::new(),
                properties: Vec::new(),
            };
            let shard = |world: &mut World, p: usize| {
                let plugin = &world.plugins[p];
                match DedupStream::new(0).on_request_headers(
                    plugin,
                    &mut world.envs[0],
                    head.clone(),
                    true,
                ) {
                    Decision::Call(c) => c.route.shard.clone(),
                    d => panic!("{d:?}"),
                }
            };
            if shard(&mut world, 0) != shard(&mut world, 1) {
                moved += 1;
            }
        }
    }
    assert!((1..4).contains(&moved), "{moved} of 4 identities move");
}
