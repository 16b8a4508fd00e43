use super::*;

fn digest(i: u32) -> Digest {
    let mut h = Sha256::new();
    h.update(i.to_be_bytes());
    h.finalize().into()
}

fn seeds(names: &[&str]) -> Vec<u64> {
    names.iter().map(|n| name_seed(n)).collect()
}

/// The placement is a format: these values are what every version so far computes
/// (checked once against an independent implementation in Python, `hashlib.sha256` and
/// the same finaliser). If this fails, records written before the change would be looked
/// for elsewhere and their keys could run again.
#[test]
fn placement_is_pinned() {
    assert_eq!(name_seed("a"), PIN_A);
    let three = seeds(&["a", "b", "c"]);
    let got: Vec<usize> = (0..16).map(|i| pick(&three, &digest(i)).unwrap()).collect();
    assert_eq!(got, PIN_PICKS.to_vec());
    assert_eq!(score(name_seed("a"), &digest(0)), PIN_SCORE);
}

const PIN_A: u64 = 0x180a_18ba_c647_ab5b;
const PIN_PICKS: [usize; 16] = [0, 1, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 2, 1, 2, 0];
const PIN_SCORE: u64 = 0xf597_fadb_f280_10ad;

#[test]
fn the_lists_order_never_moves_a_record() {
    let abc = seeds(&["a", "b", "c"]);
    let cab = seeds(&["c", "a", "b"]);
    for i in 0..2000 {
        let d = digest(i);
        assert_eq!(abc[pick(&abc, &d).unwrap()], cab[pick(&cab, &d).unwrap()]);
    }
}

#[test]
fn records_spread_evenly_over_the_shards() {
    for names in [
        &["a", "b"][..],
        &["a", "b", "c"],
        &["etcd-1", "etcd-2", "etcd-3", "etcd-4"],
    ] {
        let s = seeds(names);
        let mut counts = vec![0u32; s.len()];
        let n = 30_000u32;
        for i in 0..n {
            counts[pick(&s, &digest(i)).unwrap()] += 1;
        }
        let fair = f64::from(n) / s.len() as f64;
        for c in &counts {
            let off = (f64::from(*c) - fair).abs() / fair;
            assert!(off < 0.04, "{names:?}: {counts:?} is more than 4% off even");
        }
    }
}

/// Adding a shard moves only the records that go to the new one (about 1/(n+1) of
/// them); removing it moves them back and nothing else.
#[test]
fn adding_a_shard_moves_only_what_it_takes() {
    let two = seeds(&["a", "b"]);
    let three = seeds(&["a", "b", "c"]);
    let n = 30_000u32;
    let mut moved = 0u32;
    for i in 0..n {
        let d = digest(i);
        let before = two[pick(&two, &d).unwrap()];
        let after = three[pick(&three, &d).unwrap()];
        if before != after {
            assert_eq!(
                after,
                name_seed("c"),
                "a record moved between the old shards"
            );
            moved += 1;
        }
    }
    let share = f64::from(moved) / f64::from(n);
    assert!(
        (share - 1.0 / 3.0).abs() < 0.02,
        "{share} of the records moved"
    );
}

#[test]
fn no_shards_no_place() {
    assert_eq!(pick(&[], &digest(0)), None);
    assert_eq!(pick(&[name_seed("x")], &digest(0)), Some(0));
}

#[test]
fn a_shard_is_its_name_cluster_and_authority() {
    let id = shard_id("a", "etcd_a", "etcd_a");
    assert_ne!(id, shard_id("a", "etcd_b", "etcd_a"));
    assert_ne!(id, shard_id("a", "etcd_a", "other"));
    assert_ne!(id, shard_id("b", "etcd_a", "etcd_a"));
    // The parts are kept apart: moving a byte from one to the next changes it.
    assert_ne!(shard_id("ab", "c", "d"), shard_id("a", "bc", "d"));
}
