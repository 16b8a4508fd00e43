//! Model-based fuzzing of the ordering guard (shared data). Proptest draws a sequence of
//! operations on two entities, versions 1 to 4, each delivered under one of two keys
//! (so a delivery is repeated with its own key, or the same version comes again with a
//! fresh one): requests started on two workers, upstream answers (a stored status, a
//! 5xx, a local reply that never reached the upstream, a timeout whose outcome is
//! unknown), client hang-ups and resets, shared-data faults (the whole operation, or
//! from its first or second write on), clock jumps past in-flight timeouts, holds and
//! both TTLs, and races: a request of another worker slipped between an operation's
//! read and its CAS (`FakeShared::before_next_set`).
//!
//! Every decision is checked against a small reference model of the documented rules
//! (`docs/src/reference/fields.md`, the `ordering.*` rows; `ordering_model/reference.rs`):
//! deduplication first (a duplicate replays or gets its 409, never `stale-version`);
//! then, per entity, a request at or below the applied version (the highest version
//! completed with a stored status, kept `ordering.ttl_seconds` from the completion that
//! set it) gets `409 stale-version`, one version runs at a time (`409 in-flight`), a
//! released version raises nothing and an unknown outcome holds the entity like the
//! record. On every step: no request is forwarded at or below a live applied version,
//! no two versions of an entity are forwarded and unsettled at once (but where a flight
//! expired), the store's applied version never decreases while live and, where the
//! model knows the state, equals the model's. Under faults `failure_mode: "closed"`
//! answers `503`; `"open"` may forward a request unordered (see `reference.rs`).

use crate::config::Config;
use crate::fake::{FakeEnv, FakeShared};
use crate::key::{BodyHasher, Digest, RequestHead};
use crate::metrics::Counter;
use crate::outcome::flags;
use crate::props::decoders::config as proptest_config;
use crate::reply::LocalReply;
use crate::stream::{Decision, DedupStream, Origin, Plugin};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

// The reference model (its state and its rules) and the driver (operations applied to
// the plugin, faults and races).
mod reference;
mod world;

use reference::{Ent, Keyed};

const IN_FLIGHT_MS: u64 = 5_000;
/// The records' `ttl_seconds`.
const TTL_MS: u64 = 20_000;
const START_MS: u64 = 1_700_000_000_000;
const ENTITIES: usize = 2;

/// The configuration of one run.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    unknown: Unknown,
    closed: bool,
    /// `ordering.ttl_seconds` × 1000: shorter or longer than the records' TTL.
    order_ttl_ms: u64,
}

/// `on_unknown_outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unknown {
    Keep,
    Hold,
    Release,
}

/// Shared-data faults during one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Every read and write fails.
    Whole,
    /// The operation's n-th write fails, and everything after it (a process's first
    /// write registers the layout: the first request's entity claim is its third).
    FromWrite(u8),
}

#[derive(Debug, Clone, Copy)]
enum Resp {
    /// The upstream answered a status that is stored (completes the request).
    Stored(u16),
    /// The upstream answered a status that is not stored (releases it).
    NotStored(u16),
    /// Envoy answered; the upstream never got the request (releases it).
    NotSent,
    /// Envoy answered after the request may have reached the upstream.
    Unknown,
}

/// Why a forwarded stream ends before its response.
#[derive(Debug, Clone, Copy)]
enum EndWhy {
    ClientGone,
    UpstreamReset,
    /// The connection was refused: never sent.
    Refused,
}

#[derive(Debug, Clone)]
enum Op {
    Start {
        worker: u8,
        entity: u8,
        version: u8,
        copy: u8,
        fault: Fault,
    },
    Respond {
        s: u8,
        r: Resp,
        fault: Fault,
    },
    End {
        s: u8,
        why: EndWhy,
        fault: Fault,
    },
    Tick {
        ms: u32,
    },
    /// The next operation's first (or second) write is preceded by this request on
    /// another worker: what the operation read before it is stale, its CAS fails.
    Race {
        entity: u8,
        version: u8,
        copy: u8,
        /// 2: between the operation's first and second write (its record's, then its
        /// entity's), only for another key (the record's state in between is not one
        /// the model names).
        at_write: u8,
    },
}

/// A request: its entity, version and which of its two keys.
type Delivery = (u8, u8, u8);

/// Where a stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Answered by the filter: nothing forwarded.
    Answered,
    /// Forwarded, no outcome yet.
    Executing,
    /// Completed or released (`clean`: no fault touched its settling).
    Settled { clean: bool },
    /// Ended with its outcome unknown at `at`.
    Unknown { at: u64, clean: bool },
}

struct Sim {
    worker: usize,
    d: Delivery,
    s: DedupStream,
    life: Life,
    /// Forwarded at; holds the record's claim; holds the entity's flight (not failed open).
    forwarded: Option<(u64, bool, bool)>,
    exec: Option<usize>,
}

/// An execution: a request that reached the upstream.
#[derive(Debug)]
struct Exec {
    stream: usize,
    d: Delivery,
    /// Completed with a stored status.
    completed: bool,
}

/// What a request got, as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    /// Forwarded; `claimed`: with its record's claim; `ordered`: with its entity's flight.
    Forward {
        claimed: bool,
        ordered: bool,
    },
    Replay(usize),
    /// `409 in-flight` from its record (a duplicate).
    RecInFlight,
    /// `409 outcome-unknown` from its record.
    RecUnknown,
    /// `409 in-flight` from its entity: another version runs, or is held; `retry-after`.
    EntBusy {
        retry: u64,
    },
    /// `409 stale-version`, naming the applied version.
    Stale {
        applied: u8,
    },
    /// `503 store-unavailable`.
    Unavailable,
}

/// A request of the racing worker, run inside another operation's write.
struct Racer {
    plugin: Plugin,
    env: Option<FakeEnv>,
    head: RequestHead,
    /// Its stream and decision, once it ran.
    ran: Option<(DedupStream, Decision)>,
}

struct World {
    knobs: Knobs,
    plugin: Plugin,
    shared: Arc<FakeShared>,
    envs: Vec<FakeEnv>,
    now: u64,
    sims: Vec<Sim>,
    execs: Vec<Exec>,
    recs: HashMap<Delivery, Keyed>,
    ents: Vec<Ent>,
    digests: Vec<Digest>,
    armed: Option<(Delivery, u8)>,
    trace: Vec<String>,
    seen_stale: u64,
    seen_executed: u64,
}

fn plugin_json(k: &Knobs) -> String {
    format!(
        r#"{{"key": {{"required": true}}, "ttl_seconds": {}, "in_flight_timeout_seconds": {},
            "on_unknown_outcome": "{}", "failure_mode": "{}",
            "ordering": {{"entity": {{"header": "x-entity"}}, "version": {{"header": "x-version"}},
                          "ttl_seconds": {}}}}}"#,
        TTL_MS / 1000,
        IN_FLIGHT_MS / 1000,
        match k.unknown {
            Unknown::Keep => "keep",
            Unknown::Hold => "hold",
            Unknown::Release => "release",
        },
        if k.closed { "closed" } else { "open" },
        k.order_ttl_ms / 1000,
    )
}

fn head_of((entity, version, copy): Delivery) -> RequestHead {
    RequestHead {
        method: "POST".into(),
        path: "/hook".into(),
        authority: "api.example".into(),
        headers: vec![
            (
                "idempotency-key".into(),
                format!("e{entity}-v{version}-{copy}").into_bytes(),
            ),
            ("x-entity".into(), format!("o{entity}").into_bytes()),
            ("x-version".into(), version.to_string().into_bytes()),
        ],
        protocol: String::new(),
        properties: Vec::new(),
    }
}

fn origin(details: &str, f: u64) -> Origin {
    Origin {
        details: details.to_string(),
        flags: f,
    }
}

fn problem(r: &LocalReply) -> (String, String) {
    let v = serde_json::from_slice::<serde_json::Value>(&r.body).unwrap_or_default();
    let slug = v["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:proxy-dedup:problem:"))
        .map_or_else(|| format!("status {}", r.status), str::to_string);
    (slug, v["detail"].as_str().unwrap_or("").to_string())
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
        prop_oneof![
            3 => Just(Unknown::Keep),
            2 => Just(Unknown::Hold),
            1 => Just(Unknown::Release),
        ],
        any::<bool>(),
        prop_oneof![Just(10_000u64), Just(40_000u64)],
    )
        .prop_map(|(unknown, closed, order_ttl_ms)| Knobs {
            unknown,
            closed,
            order_ttl_ms,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let fault = || {
        prop_oneof![
            12 => Just(Fault::None),
            1 => Just(Fault::Whole),
            1 => Just(Fault::FromWrite(1)),
            1 => Just(Fault::FromWrite(2)),
            1 => Just(Fault::FromWrite(3)),
        ]
    };
    let resp = prop_oneof![
        4 => prop::sample::select(vec![200u16, 201, 404]).prop_map(Resp::Stored),
        2 => prop::sample::select(vec![500u16, 503]).prop_map(Resp::NotStored),
        1 => Just(Resp::NotSent),
        1 => Just(Resp::Unknown),
    ];
    let why = prop_oneof![
        Just(EndWhy::ClientGone),
        Just(EndWhy::UpstreamReset),
        Just(EndWhy::Refused)
    ];
    prop_oneof![
        6 => (0u8..2, 0u8..ENTITIES as u8, 1u8..5, 0u8..2, fault())
            .prop_map(|(worker, entity, version, copy, fault)| Op::Start { worker, entity, version, copy, fault }),
        4 => (any::<u8>(), resp, fault()).prop_map(|(s, r, fault)| Op::Respond { s, r, fault }),
        1 => (any::<u8>(), why, fault()).prop_map(|(s, why, fault)| Op::End { s, why, fault }),
        3 => prop::sample::select(vec![1u32, 999, 4_999, 5_000, 9_000, 10_001, 20_000, 40_001])
            .prop_map(|ms| Op::Tick { ms }),
        2 => (0u8..ENTITIES as u8, 1u8..5, 0u8..2, 1u8..3)
            .prop_map(|(entity, version, copy, at_write)| Op::Race { entity, version, copy, at_write }),
    ]
}

proptest! {
    #![proptest_config(proptest_config(256))]

    /// Random histories of ordered deliveries keep the ordering guard's rules.
    #[test]
    fn random_ordered_histories_keep_the_rules(
        knobs in knobs(),
        ops in prop::collection::vec(op(), 1..50),
    ) {
        if let Err(e) = run_case(knobs, &ops) {
            return Err(TestCaseError::fail(e));
        }
    }
}

fn start(worker: u8, entity: u8, version: u8, copy: u8) -> Op {
    Op::Start {
        worker,
        entity,
        version,
        copy,
        fault: Fault::None,
    }
}

fn respond(s: u8, r: Resp) -> Op {
    Op::Respond {
        s,
        r,
        fault: Fault::None,
    }
}

const KEEP: Knobs = Knobs {
    unknown: Unknown::Keep,
    closed: true,
    order_ttl_ms: 40_000,
};

/// The rules on a plain history: the model demands each answer exactly.
#[test]
fn a_plain_history_keeps_the_rules() {
    let ops = vec![
        start(0, 0, 3, 0),
        // Version 4 on the other worker while 3 runs: 409 in-flight (its entity).
        start(1, 0, 4, 0),
        respond(0, Resp::Stored(201)),
        // 2 after 3: stale; 3 again with its own key: replayed; with another: stale.
        start(1, 0, 2, 0),
        start(0, 0, 3, 0),
        start(0, 0, 3, 1),
        // 4 fails with a 503: released; it may run again, and 3 stays applied.
        start(1, 0, 4, 0),
        respond(0, Resp::NotStored(503)),
        start(1, 0, 4, 1),
        respond(0, Resp::Stored(200)),
        // Past the ordering TTL: any version runs again.
        Op::Tick { ms: 40_001 },
        start(0, 0, 1, 0),
        respond(0, Resp::Stored(200)),
    ];
    if let Err(e) = run_case(KEEP, &ops) {
        panic!("{e}");
    }
}

/// A race: version 2 of the racing worker completes between the read and the CAS of
/// version 1's claim, so 1 is stale.
#[test]
fn a_version_completed_between_a_read_and_its_cas_makes_the_claim_stale() {
    let ops = vec![
        Op::Race {
            entity: 1,
            version: 2,
            copy: 0,
            at_write: 1,
        },
        start(0, 1, 1, 0),
    ];
    let mut world = World::new(KEEP).unwrap();
    for op in &ops {
        world.run(op).unwrap_or_else(|e| panic!("{e}"));
    }
    // The racer was forwarded and holds the entity; version 1 got 409 in-flight.
    assert_eq!(world.sims.len(), 2, "{:?}", world.trace);
    assert_eq!(world.sims[0].life, Life::Executing, "{:?}", world.trace);
    assert_eq!(world.sims[1].life, Life::Answered, "{:?}", world.trace);
}

/// Found by the model: under `failure_mode: "open"`, a request whose entity claim hit
/// a store fault is forwarded unordered; its completion, once the store answers again,
/// still raises the entity's applied version (the semantics page, "The stores"), so a
/// version below it that comes later is stale.
#[test]
fn a_completion_forwarded_unordered_still_raises_the_applied_version() {
    let open = Knobs {
        closed: false,
        ..KEEP
    };
    let ops = vec![
        // The record's claim is written, the entity's claim write fails: forwarded
        // unordered (failure_mode open).
        Op::Start {
            worker: 0,
            entity: 0,
            version: 5,
            copy: 0,
            fault: Fault::FromWrite(3),
        },
        // Completed (200) with the store healthy again.
        respond(0, Resp::Stored(200)),
        start(1, 0, 4, 0),
    ];
    let mut world = World::new(open).unwrap();
    for op in &ops {
        world.run(op).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(
        world.sims[0].forwarded.map(|f| (f.1, f.2)),
        Some((true, false)),
        "version 5 is forwarded with its record's claim, unordered: {:#?}",
        world.trace
    );
    assert_eq!(
        world.sims[1].life,
        Life::Answered,
        "version 4 after version 5 completed is stale: {:#?}",
        world.trace
    );
}
