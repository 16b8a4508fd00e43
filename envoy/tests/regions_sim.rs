//! The multi-region simulation itself (`dedup_envoy::regions`, for issue 34's tests):
//! three regions, each its own real etcd; every cross-region path adds the same
//! one-way delay both ways, a region's own path adds none, and a region cut off is
//! unreachable from the others (and they from it) until healed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use dedup_envoy::client;
use dedup_envoy::regions::Regions;
use dedup_envoy::Request;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const ONE_WAY: Duration = Duration::from_millis(40);

/// One etcd range read (JSON gateway) on `port`, on a fresh connection: its time.
fn range_read(port: u16, timeout: Duration) -> Result<Duration, String> {
    let req = Request::post("/v3/kv/range")
        .header("content-type", "application/json")
        .body(r#"{"key": "cmVnaW9ucw=="}"#)
        .timeout(timeout);
    let t = Instant::now();
    let r =
        client::send(SocketAddr::from(([127, 0, 0, 1], port)), &req).map_err(|e| e.to_string())?;
    if r.status != 200 {
        return Err(format!("range answered {}", r.status));
    }
    Ok(t.elapsed())
}

#[test]
fn every_cross_region_path_costs_the_same_round_trip_and_a_cut_region_is_unreachable() {
    let names = ["a", "b", "c"];
    let regions = Regions::start("regions-sim", &names, 1, ONE_WAY).unwrap();
    for from in names {
        for to in names {
            let port = regions.ports(from, to).unwrap()[0];
            // The best of three: a round trip is at least twice the one-way delay
            // across regions, and well under one delay at home.
            let best = (0..3)
                .map(|_| range_read(port, Duration::from_secs(5)).unwrap())
                .min()
                .unwrap();
            if from == to {
                assert!(best < ONE_WAY, "{from} -> {to} (home): {best:?}");
            } else {
                assert!(best >= 2 * ONE_WAY, "{from} -> {to}: {best:?}");
                assert!(
                    best < 2 * ONE_WAY + Duration::from_millis(60),
                    "{from} -> {to}: {best:?}"
                );
            }
            eprintln!("{from} -> {to}: {best:?}");
        }
    }
    regions.cut("a").unwrap();
    for (from, to) in [("b", "a"), ("a", "b"), ("c", "a"), ("a", "c")] {
        let port = regions.ports(from, to).unwrap()[0];
        assert!(
            range_read(port, Duration::from_millis(500)).is_err(),
            "{from} -> {to} passed while a was cut off"
        );
    }
    // Paths that do not touch the cut region, and a's own, still pass.
    for (from, to) in [("b", "c"), ("c", "b"), ("a", "a"), ("b", "b")] {
        range_read(regions.ports(from, to).unwrap()[0], Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{from} -> {to} with a cut off: {e}"));
    }
    regions.heal("a").unwrap();
    range_read(regions.ports("b", "a").unwrap()[0], Duration::from_secs(5)).unwrap();
    assert!(regions.ports("a", "z").is_err());
    assert!(Regions::start("regions-sim-dup", &["a", "a"], 1, ONE_WAY).is_err());
}
