//! The nemesis: three lanes of faults on schedules drawn from the seed, run
//! concurrently so faults combine (a proxy restart during an etcd leader
//! kill during a burst of upstream resets).
//!
//! - etcd lane, one member at a time, the cluster healthy again before the
//!   next: kill -9 the leader or a follower and restart it; SIGSTOP a member
//!   longer than `store.timeout_ms`, then SIGCONT; cut a member off from
//!   proxies and peers by its relays, then heal. With several shards, one such
//!   lane per shard, all at once: their first faults start together (both
//!   shards faulted at once), then each lane keeps its own schedule, so faults
//!   on several shards overlap again and again (counted as "etcd faults on
//!   several shards at once").
//! - proxy lane: kill -9 proxy A or B and start it again (records are in
//!   etcd); push a changed filter configuration to A, B or C by LDS.
//! - upstream lane: windows in which requests ask the upstream to answer
//!   slowly (some beyond the route timeout), with 5xx or 429, or to reset
//!   (before answering, or mid-body). Outside them a few requests do too.
//! - regions lane (the regions variant, in place of the etcd lane): cut a region
//!   off (with two regions, every link between them) and heal it; kill -9 a
//!   region's etcd and restart it; SIGSTOP it longer than `store.timeout_ms`. One
//!   fault at a time, a cut first.
//!
//! Each lane first runs every kind of its faults once (in a seeded order),
//! so even a short run injects every kind, then draws kinds at random.

use super::cluster::{Cluster, STORE_TIMEOUT_MS};
use super::rng::Rng;
use crate::regions::Regions;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The kind of the regions lane's cut (`Regions::cut`).
pub const REGION_CUT: &str = "region cut off";

#[derive(Debug, Clone)]
pub struct FaultEvent {
    pub at: Duration,
    pub kind: &'static str,
    pub detail: String,
    /// The etcd shard it hit (etcd faults only).
    pub shard: Option<usize>,
}

/// What the upstream lane currently asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weather {
    Calm,
    Slow,
    Errors,
    Resets,
}

pub struct Nemesis {
    log: Mutex<Vec<FaultEvent>>,
    weather: Mutex<Weather>,
    /// Lane errors (a restart that failed…): reported, and they fail the run.
    errors: Mutex<Vec<String>>,
    /// The etcd shards with a fault injected and not yet healed.
    faulted: Mutex<BTreeSet<usize>>,
}

impl Default for Nemesis {
    fn default() -> Self {
        Self::new()
    }
}

impl Nemesis {
    pub fn new() -> Nemesis {
        Nemesis {
            log: Mutex::new(Vec::new()),
            weather: Mutex::new(Weather::Calm),
            errors: Mutex::new(Vec::new()),
            faulted: Mutex::new(BTreeSet::new()),
        }
    }

    fn log(&self) -> MutexGuard<'_, Vec<FaultEvent>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, c: &Cluster, kind: &'static str, detail: String) {
        self.log().push(FaultEvent {
            at: c.now(),
            kind,
            detail,
            shard: None,
        });
    }

    /// An etcd fault begins on `shard`; with several shards its detail names the
    /// shard, and a fault while another shard's is not healed is counted as such.
    fn record_etcd(&self, c: &Cluster, shard: usize, kind: &'static str, detail: String) {
        let sharded = c.shards.count() > 1;
        let detail = if sharded {
            format!("shard {}: {detail}", c.shards.name(shard))
        } else {
            detail
        };
        let others: Vec<&str> = {
            let mut faulted = self.faulted.lock().unwrap_or_else(|e| e.into_inner());
            faulted.insert(shard);
            faulted
                .iter()
                .filter(|s| **s != shard)
                .map(|s| c.shards.name(*s))
                .collect()
        };
        let at = c.now();
        let mut log = self.log();
        log.push(FaultEvent {
            at,
            kind,
            detail,
            shard: Some(shard),
        });
        if !others.is_empty() {
            log.push(FaultEvent {
                at,
                kind: "etcd faults on several shards at once",
                detail: format!(
                    "shard {} faulted while shard {} is",
                    c.shards.name(shard),
                    others.join(", ")
                ),
                shard: Some(shard),
            });
        }
    }

    /// `shard`'s fault is healed (the member restarted, resumed or reconnected).
    fn healed(&self, shard: usize) {
        self.faulted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&shard);
    }

    fn error(&self, c: &Cluster, what: String) {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{:.1}s: {what}", c.now().as_secs_f64()));
    }

    pub fn events(&self) -> Vec<FaultEvent> {
        self.log().clone()
    }

    pub fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Faults injected, by kind.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for e in self.log().iter() {
            *m.entry(e.kind).or_insert(0) += 1;
        }
        m
    }

    pub fn weather(&self) -> Weather {
        *self.weather.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_weather(&self, w: Weather) {
        *self.weather.lock().unwrap_or_else(|e| e.into_inner()) = w;
    }

    /// Run the three lanes (an etcd lane per shard) until `deadline`; returns with
    /// every fault healed (members running and connected, proxies up, weather calm).
    pub fn run(&self, c: &Cluster, seed: u64, deadline: Instant) {
        // Unsharded, the etcd lane draws its first pause itself (the schedule of a seed
        // stays what it was); sharded, every lane waits the same first pause.
        let together = (c.shards.count() > 1)
            .then(|| Duration::from_millis(Rng::fork(seed, 1000).between(1500, 4000)));
        std::thread::scope(|s| {
            if let Some(regions) = &c.regions {
                s.spawn(move || self.regions_lane(c, regions, Rng::fork(seed, 1004), deadline));
            }
            for shard in (0..c.shards.count()).filter(|_| c.regions.is_none()) {
                let label = if shard == 0 {
                    1001
                } else {
                    1100 + shard as u64
                };
                s.spawn(move || {
                    self.etcd_lane(c, shard, Rng::fork(seed, label), together, deadline)
                });
            }
            s.spawn(|| self.proxy_lane(c, Rng::fork(seed, 1002), deadline));
            s.spawn(|| self.upstream_lane(c, Rng::fork(seed, 1003), deadline));
        });
    }

    /// Faults on shard `shard`'s etcd, one member at a time; the first after
    /// `first_pause` when given.
    fn etcd_lane(
        &self,
        c: &Cluster,
        shard: usize,
        mut rng: Rng,
        mut first_pause: Option<Duration>,
        deadline: Instant,
    ) {
        let mut first = vec![0u8, 1, 2, 3];
        rng.shuffle(&mut first);
        let mut round = first.into_iter();
        loop {
            let pause = first_pause
                .take()
                .unwrap_or_else(|| Duration::from_millis(rng.between(1500, 4000)));
            if !sleep_until_or(deadline, pause) {
                return;
            }
            let kind = round.next().unwrap_or_else(|| rng.below(4) as u8);
            let leader = leader(c, shard);
            let member = match (kind, leader) {
                (0, Some(l)) => l,
                (1, Some(l)) => (l + 1 + rng.index(2)) % 3,
                _ => rng.index(3),
            };
            let is_leader = leader == Some(member);
            let role = match leader {
                Some(_) if is_leader => "leader",
                Some(_) => "follower",
                None => "member",
            };
            match kind {
                0 | 1 => {
                    let down = Duration::from_millis(rng.between(1000, 4000));
                    c.etcd(shard).kill(member);
                    self.record_etcd(
                        c,
                        shard,
                        if is_leader {
                            "etcd kill -9 leader"
                        } else {
                            "etcd kill -9 follower"
                        },
                        format!(
                            "member {} ({role}) down {down:?}, then restarted",
                            member + 1
                        ),
                    );
                    std::thread::sleep(down);
                    if let Err(e) = c.etcd(shard).restart(member) {
                        self.error(c, format!("restarting etcd {}: {e}", who(c, shard, member)));
                    }
                    self.healed(shard);
                }
                2 => {
                    let paused = Duration::from_millis(STORE_TIMEOUT_MS + rng.between(500, 2500));
                    c.etcd(shard).pause(member);
                    self.record_etcd(
                        c,
                        shard,
                        "etcd SIGSTOP member",
                        format!("member {} ({role}) stopped {paused:?} (store.timeout_ms {STORE_TIMEOUT_MS})", member + 1),
                    );
                    std::thread::sleep(paused);
                    c.etcd(shard).resume(member);
                    self.healed(shard);
                }
                _ => {
                    let cut = Duration::from_millis(rng.between(1500, 5000));
                    if let Err(e) = c.etcd(shard).cut(member) {
                        self.error(c, format!("cutting etcd {}: {e}", who(c, shard, member)));
                        continue;
                    }
                    self.record_etcd(
                        c,
                        shard,
                        "etcd partition member",
                        format!(
                            "member {} ({role}) cut off from proxies and peers for {cut:?}",
                            member + 1
                        ),
                    );
                    std::thread::sleep(cut);
                    c.etcd(shard).heal(member);
                    self.healed(shard);
                }
            }
            // The next fault only once every member is back in the quorum.
            let healthy = c.etcd(shard).wait_healthy(Duration::from_secs(30));
            if let Err(e) = healthy {
                self.error(
                    c,
                    format!(
                        "etcd {}not healthy after a fault: {e}",
                        match c.shards.count() {
                            1 => String::new(),
                            _ => format!("shard {} ", c.shards.name(shard)),
                        }
                    ),
                );
            }
        }
    }

    fn proxy_lane(&self, c: &Cluster, mut rng: Rng, deadline: Instant) {
        let mut first = vec![0u8, 1];
        rng.shuffle(&mut first);
        let mut round = first.into_iter();
        loop {
            if !sleep_until_or(deadline, Duration::from_millis(rng.between(3000, 7000))) {
                return;
            }
            let restart = match round.next() {
                Some(k) => k == 0,
                None => rng.percent(35),
            };
            if restart {
                let i = rng.index(2);
                match c.restart_proxy(i) {
                    Ok(down) => self.record(
                        c,
                        "proxy kill -9 and restart",
                        format!(
                            "proxy {} ({}) down {down:?}",
                            c.proxies[i].name,
                            match c.proxies[i].region {
                                Some(r) => format!("region {r}"),
                                None => "etcd store".into(),
                            }
                        ),
                    ),
                    Err(e) => self.error(c, format!("restarting proxy {}: {e}", c.proxies[i].name)),
                }
            } else {
                let i = rng.index(c.proxies.len());
                let at = c.now();
                match c.push_config(i) {
                    Ok(fields) => self.log().push(FaultEvent {
                        at,
                        kind: "proxy LDS push",
                        shard: None,
                        detail: format!(
                            "proxy {}: {fields}, taken in {:?}",
                            c.proxies[i].name,
                            c.now().saturating_sub(at)
                        ),
                    }),
                    Err(e) => self.error(c, format!("pushing to proxy {}: {e}", c.proxies[i].name)),
                }
            }
        }
    }

    /// The regions variant's faults, one at a time: the first a cut, then each other
    /// kind once, then a cut one time in two. The region's etcd is healthy again
    /// before the next.
    fn regions_lane(&self, c: &Cluster, regions: &Mutex<Regions>, mut rng: Rng, deadline: Instant) {
        let lock = || regions.lock().unwrap_or_else(|e| e.into_inner());
        let names: Vec<String> = lock().regions.iter().map(|r| r.name.clone()).collect();
        let mut first = vec![1u8, 2];
        rng.shuffle(&mut first);
        let mut round = std::iter::once(0u8).chain(first);
        loop {
            if !sleep_until_or(deadline, Duration::from_millis(rng.between(1500, 4000))) {
                return;
            }
            let kind = round.next().unwrap_or_else(|| match rng.percent(50) {
                true => 0,
                false => 1 + rng.below(2) as u8,
            });
            let i = rng.index(names.len());
            let name = &names[i];
            match kind {
                0 => {
                    let cut = Duration::from_millis(rng.between(1500, 5000));
                    if let Err(e) = lock().cut(name) {
                        self.error(c, format!("cutting region {name} off: {e}"));
                        continue;
                    }
                    self.record(
                        c,
                        REGION_CUT,
                        format!("region {name} cut off from the others for {cut:?} (held bytes pass on heal)"),
                    );
                    std::thread::sleep(cut);
                    if let Err(e) = lock().heal(name) {
                        self.error(c, format!("healing region {name}: {e}"));
                    }
                }
                1 => {
                    let down = Duration::from_millis(rng.between(1000, 4000));
                    lock().regions[i].etcd.kill(0);
                    self.record_region(
                        c,
                        i,
                        "region etcd kill -9",
                        format!("region {name}'s etcd down {down:?}, then restarted"),
                    );
                    std::thread::sleep(down);
                    if let Err(e) = lock().regions[i].etcd.restart(0) {
                        self.error(c, format!("restarting region {name}'s etcd: {e}"));
                    }
                }
                _ => {
                    let paused = Duration::from_millis(STORE_TIMEOUT_MS + rng.between(500, 2500));
                    lock().regions[i].etcd.pause(0);
                    self.record_region(c, i, "region etcd SIGSTOP", format!("region {name}'s etcd stopped {paused:?} (store.timeout_ms {STORE_TIMEOUT_MS})"));
                    std::thread::sleep(paused);
                    lock().regions[i].etcd.resume(0);
                }
            }
            if let Err(e) = lock().regions[i].etcd.wait_healthy(Duration::from_secs(30)) {
                self.error(
                    c,
                    format!("region {name}'s etcd not healthy after a fault: {e}"),
                );
            }
        }
    }

    /// An etcd fault on region `i` (its index among the regions and the proxies').
    fn record_region(&self, c: &Cluster, i: usize, kind: &'static str, detail: String) {
        self.log().push(FaultEvent {
            at: c.now(),
            kind,
            detail,
            shard: Some(i),
        });
    }

    fn upstream_lane(&self, c: &Cluster, mut rng: Rng, deadline: Instant) {
        let mut first = vec![Weather::Slow, Weather::Errors, Weather::Resets];
        rng.shuffle(&mut first);
        let mut round = first.into_iter();
        loop {
            if !sleep_until_or(deadline, Duration::from_millis(rng.between(1000, 4000))) {
                self.set_weather(Weather::Calm);
                return;
            }
            let w = round
                .next()
                .unwrap_or_else(|| [Weather::Slow, Weather::Errors, Weather::Resets][rng.index(3)]);
            let window = Duration::from_millis(rng.between(2000, 5000));
            self.set_weather(w);
            self.record(
                c,
                match w {
                    Weather::Slow => "upstream slow window",
                    Weather::Errors => "upstream 5xx/429 window",
                    _ => "upstream reset window",
                },
                format!("{window:?}"),
            );
            std::thread::sleep(window);
            self.set_weather(Weather::Calm);
        }
    }
}

/// "member 2", or "shard b member 2" when there are several.
fn who(c: &Cluster, shard: usize, member: usize) -> String {
    match c.shards.count() {
        1 => format!("member {}", member + 1),
        _ => format!("shard {} member {}", c.shards.name(shard), member + 1),
    }
}

/// The current leader of shard `shard`'s etcd, asked a few times (an election may be
/// under way).
fn leader(c: &Cluster, shard: usize) -> Option<usize> {
    for _ in 0..10 {
        if let Ok(l) = c.etcd(shard).leader() {
            return Some(l);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Sleep `d`, unless `deadline` comes first; false if the deadline has passed.
fn sleep_until_or(deadline: Instant, d: Duration) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    std::thread::sleep(d.min(deadline - now));
    Instant::now() < deadline
}
