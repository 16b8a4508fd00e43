//! Tests of the pending callout table.

use super::*;

const ROOT: u32 = 1;

fn stream(owner: u32) -> Option<Callout> {
    Some(Callout {
        root: ROOT,
        owner: Some(owner),
    })
}

/// A table with these calls registered: (token, root, owning stream).
fn table(calls: &[(u32, u32, Option<u32>)]) -> Callouts {
    let mut t = Callouts::new();
    for &(token, root, owner) in calls {
        t.register(token, root, owner);
    }
    t
}

/// The index agrees with the entries.
fn consistent(t: &Callouts) {
    let indexed: usize = t.by_owner.values().map(Vec::len).sum();
    let owned = t.by_token.values().filter(|c| c.owner.is_some()).count();
    assert_eq!(indexed, owned);
    for (owner, tokens) in &t.by_owner {
        assert!(!tokens.is_empty());
        for token in tokens {
            assert_eq!(t.by_token.get(token).and_then(|c| c.owner), Some(*owner));
        }
    }
}

#[test]
fn an_answer_finds_its_stream_once() {
    let mut t = Callouts::new();
    assert_eq!(t.register(7, ROOT, Some(2)), None);
    assert_eq!(t.owned_by(2), 1);
    assert_eq!(t.take(7), stream(2));
    assert_eq!(t.take(7), None);
    assert!(t.is_empty());
    assert_eq!(t.owned_by(2), 0);
    consistent(&t);
}

#[test]
fn an_unknown_token_is_none() {
    let mut t = Callouts::new();
    t.register(1, ROOT, Some(2));
    assert_eq!(t.take(99), None);
    assert_eq!(t.get(99), None);
    assert_eq!(t.len(), 1);
}

#[test]
fn a_reused_token_replaces_the_old_entry() {
    let mut t = Callouts::new();
    t.register(5, ROOT, Some(2));
    let replaced = t.register(5, ROOT, Some(3));
    assert_eq!(replaced, stream(2));
    assert_eq!(t.len(), 1);
    assert_eq!(t.owned_by(2), 0);
    assert_eq!(t.owned_by(3), 1);
    assert_eq!(t.take(5), stream(3));
    consistent(&t);
}

#[test]
fn an_ended_stream_leaves_orphans_to_the_root() {
    let mut t = table(&[(1, ROOT, Some(2)), (2, ROOT, Some(2)), (3, ROOT, Some(4))]);
    assert_eq!(t.orphan(2), 2);
    assert_eq!(t.orphan(2), 0);
    assert_eq!(t.len(), 3);
    consistent(&t);
    let orphan = Some(Callout {
        root: ROOT,
        owner: None,
    });
    assert_eq!(t.take(1), orphan);
    assert_eq!(t.take(3), stream(4));
    assert_eq!(t.take(2), orphan);
    assert!(t.is_empty());
    consistent(&t);
}

#[test]
fn a_context_id_reused_after_its_stream_ended_does_not_inherit_its_calls() {
    let mut t = Callouts::new();
    t.register(1, ROOT, Some(2));
    t.orphan(2);
    t.register(9, ROOT, Some(2));
    assert_eq!(t.owned_by(2), 1);
    assert_eq!(t.take(1).and_then(|c| c.owner), None);
    assert_eq!(t.take(9), stream(2));
    consistent(&t);
}

#[test]
fn a_root_that_goes_away_takes_its_calls() {
    let mut t = table(&[
        (1, ROOT, Some(2)),
        (2, ROOT, None),
        (3, 10, Some(11)),
        (4, ROOT, Some(5)),
    ]);
    t.orphan(5);
    assert_eq!(t.drop_root(ROOT), 3);
    assert_eq!(t.len(), 1);
    assert_eq!(t.owned_by(2), 0);
    consistent(&t);
    assert_eq!(
        t.take(3),
        Some(Callout {
            root: 10,
            owner: Some(11)
        })
    );
    assert_eq!(t.drop_root(ROOT), 0);
    assert!(t.is_empty());
}

#[test]
fn the_table_stays_bounded_by_the_pending_calls() {
    // The host's u32 call-id counter wraps: every token comes back many times while
    // some answers never arrive (their root was cancelled) and streams come and go.
    let mut t = Callouts::new();
    let mut root = 1u32;
    for round in 0..20u32 {
        for i in 0..500u32 {
            let stream = 1000 + (round * 500 + i) % 97;
            t.register(i, root, Some(stream));
            if i % 3 == 0 {
                t.take(i);
            }
            if i % 5 == 0 {
                t.orphan(stream);
            }
        }
        assert!(t.len() <= 500);
        consistent(&t);
        if round % 4 == 3 {
            t.drop_root(root);
            assert!(t.is_empty());
            root += 1;
        }
    }
}

#[test]
fn a_pending_callout_is_found_until_answered() {
    use crate::callouts::{Callout, Callouts};
    let mut t = Callouts::new();
    assert!(t.is_empty());
    t.register(4, 1, Some(9));
    assert!(!t.is_empty());
    let want = Some(Callout {
        root: 1,
        owner: Some(9),
    });
    assert_eq!(t.get(4), want);
    assert_eq!(t.get(4), want, "get does not take it");
    assert_eq!(t.take(4), want);
    assert_eq!(t.get(4), None);
    assert!(t.is_empty());
}
