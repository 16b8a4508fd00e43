//! The filter's table of pending HTTP callouts: which context a `proxy_http_call` token
//! belongs to, so its answer reaches the right place.
//!
//! Envoy (proxy-wasm-cpp-host) makes every `proxy_http_call` on the ROOT context, whatever
//! context dispatched it: a callout outlives the stream that made it, and its answer comes
//! back as `proxy_on_http_call_response(root_context_id, token, ..)`. The table maps the
//! token to the root it was made on and to the stream context that owns it (if any).
//!
//! - A stream that ends hands its pending tokens to the root ([`Callouts::orphan`]): their
//!   answers then go to a root-level handler instead of being dropped.
//! - A root context that goes away takes its entries with it ([`Callouts::drop_root`]):
//!   Envoy cancels a root's pending calls when it destroys the root, so no answer can come.
//! - A token dispatched again while an entry still holds it (the host's call-id counter
//!   wrapped, or an answer never came) replaces that entry; an unknown token is `None`.
//!
//! So the table holds only calls that can still be answered; nothing here panics.

use hashbrown::HashMap;

/// Where a pending callout belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Callout {
    /// The root context the call was made on (Envoy answers on it).
    pub root: u32,
    /// The stream (HTTP) context that dispatched it and still waits for it; `None` for a
    /// call the root made itself, or whose stream has ended (an orphan).
    pub owner: Option<u32>,
}

/// Pending callouts by token, with an index of the tokens each stream context owns.
#[derive(Debug, Default)]
pub struct Callouts {
    by_token: HashMap<u32, Callout>,
    /// Tokens per owning stream context (only non-empty lists are kept).
    by_owner: HashMap<u32, Vec<u32>>,
}

impl Callouts {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a dispatched call. Returns the entry the token replaced, if the token was
    /// still in the table (the host reused it: that old call can no longer be told apart).
    pub fn register(&mut self, token: u32, root: u32, owner: Option<u32>) -> Option<Callout> {
        let replaced = self.take(token);
        self.by_token.insert(token, Callout { root, owner });
        if let Some(owner) = owner {
            self.by_owner.entry(owner).or_default().push(token);
        }
        replaced
    }

    /// Removes and returns the entry of an answered call; `None` for an unknown token.
    pub fn take(&mut self, token: u32) -> Option<Callout> {
        let callout = self.by_token.remove(&token)?;
        if let Some(owner) = callout.owner {
            self.unindex(owner, token);
        }
        Some(callout)
    }

    /// The entry of a pending call, if any.
    pub fn get(&self, token: u32) -> Option<Callout> {
        self.by_token.get(&token).copied()
    }

    /// A stream context ends: its pending calls become orphans (owned by their root).
    /// Returns how many there were.
    pub fn orphan(&mut self, owner: u32) -> usize {
        let Some(tokens) = self.by_owner.remove(&owner) else {
            return 0;
        };
        for token in &tokens {
            if let Some(callout) = self.by_token.get_mut(token) {
                callout.owner = None;
            }
        }
        tokens.len()
    }

    /// A root context is gone: the host cancelled its pending calls, forget them.
    /// Returns how many entries were dropped.
    pub fn drop_root(&mut self, root: u32) -> usize {
        let before = self.by_token.len();
        let by_owner = &mut self.by_owner;
        self.by_token.retain(|token, callout| {
            if callout.root != root {
                return true;
            }
            if let Some(owner) = callout.owner {
                if let Some(tokens) = by_owner.get_mut(&owner) {
                    tokens.retain(|t| t != token);
                    if tokens.is_empty() {
                        by_owner.remove(&owner);
                    }
                }
            }
            false
        });
        before - self.by_token.len()
    }

    /// Pending calls owned by a stream context.
    pub fn owned_by(&self, owner: u32) -> usize {
        self.by_owner.get(&owner).map_or(0, Vec::len)
    }

    /// Pending calls in all.
    pub fn len(&self) -> usize {
        self.by_token.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }

    fn unindex(&mut self, owner: u32, token: u32) {
        if let Some(tokens) = self.by_owner.get_mut(&owner) {
            if let Some(at) = tokens.iter().position(|t| *t == token) {
                tokens.swap_remove(at);
            }
            if tokens.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: u32 = 1;

    fn stream(owner: u32) -> Option<Callout> {
        Some(Callout {
            root: ROOT,
            owner: Some(owner),
        })
    }

    /// A table with calls registered as (token, root, owner).
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
        let mut t = table(&[(1, ROOT, Some(2))]);
        assert_eq!(t.take(99), None);
        assert_eq!(t.get(99), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_reused_token_replaces_the_old_entry() {
        let mut t = table(&[(5, ROOT, Some(2))]);
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
        let mut t = table(&[(1, ROOT, Some(2))]);
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
}
