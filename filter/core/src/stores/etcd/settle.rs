//! Settling a won etcd claim: the completion, release or hold transaction, retried on
//! the same classifier as claims within the budget, checked against the current record
//! when its compare fails, and written again with a fresh lease when etcd lost the
//! completed one.

use super::EtcdStore;
use super::{attempt_timeout, lease_lost, lease_plan, retryable, EtcdClaim, MAX_RETRIES};
use super::{etcd_call_mut, worker, EtcdCall};
use crate::key::Digest;
use crate::metrics::{Counter, Remote};
use crate::record::{RecordState, RecordTimes};
use crate::response::StoredResponse;
use crate::stores::etcd::local::LocalEntry;
use crate::stores::etcd::wire::{self as etcd, EtcdAnswer, EtcdRecord, LeasePurpose};
use crate::stream::{wake, CallAnswer, Decision, DedupStream, Duplicate, Env, Plugin, StoreCall};
use std::sync::Arc;

/// What a settling call does to the claim's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    Complete,
    Release,
    Hold,
}

impl Settle {
    fn what(self) -> &'static str {
        match self {
            Settle::Complete => "completion",
            Settle::Release => "release",
            Settle::Hold => "hold",
        }
    }
}

pub(crate) struct Settling {
    pub(crate) kind: Settle,
    /// Kept to learn the completed record locally once etcd confirms it.
    pub(crate) learned: Option<(Digest, LocalEntry)>,
    pub(crate) digest: Digest,
    pub(crate) token: u64,
    /// Resent on a transport failure within the budget.
    pub(crate) call: StoreCall,
    pub(crate) retries: u32,
    pub(crate) deadline_ms: u64,
    /// A completion whose lease etcd no longer has is written again with a fresh one.
    pub(crate) regrant: Option<Regrant>,
    /// Detached execution: the client's answer, sent once the record is settled.
    pub(crate) then_reply: Option<crate::reply::LocalReply>,
    /// A claim that yielded to a live record on its other shard (resharding): answered
    /// as that record's duplicate once the release is done.
    pub(crate) then_duplicate: Option<(Duplicate, RecordTimes)>,
}

/// What a completion needs to be written again with a fresh lease.
pub(crate) struct Regrant {
    pub(crate) key: String,
    pub(crate) mod_revision: i64,
    /// A lease grant is out (`call` is that grant), sent at this time.
    pub(crate) granting: Option<u64>,
    pub(crate) rounds: u8,
}

impl DedupStream {
    /// The answer to a completion or release. A transport failure is retried within the
    /// budget (the response is held meanwhile); a failed compare is checked against the
    /// current record, because a retried write whose first attempt went through fails
    /// its compare on our own record.
    pub(crate) fn settled(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        mut st: Box<Settling>,
        answer: &CallAnswer,
    ) -> Decision {
        let parsed = etcd::read_answer(st.call.path, answer.status, &answer.body);
        let retryable = retryable(answer, &parsed);
        let now = env.now_ms();
        if !retryable {
            if let Some(next) = self.regranted(p, ec, env, &mut st, &parsed, now) {
                self.phase = ec.pending(EtcdCall::Settling(st));
                return Decision::Call(next);
            }
        }
        if retryable && st.retries < MAX_RETRIES && now < st.deadline_ms {
            st.retries += 1;
            st.call.timeout_ms = attempt_timeout(ec, st.deadline_ms, now);
            let call = st.call.clone();
            self.phase = ec.pending(EtcdCall::Settling(st));
            return Decision::Call(call);
        }
        let confirmed = match &parsed {
            Some(EtcdAnswer::Txn {
                succeeded: true, ..
            }) => Some(true),
            Some(EtcdAnswer::Txn {
                succeeded: false,
                existing,
                ..
            }) => Some(match existing {
                // Released: the record is gone, by us or by its lease.
                None => st.kind == Settle::Release,
                Some((_, value)) => EtcdRecord::decode(value, &st.digest).is_some_and(|r| {
                    r.token == st.token
                        && match st.kind {
                            Settle::Complete => matches!(
                                r.state,
                                RecordState::Completed | RecordState::CompletedNotStored
                            ),
                            Settle::Hold => r.state == RecordState::Held,
                            Settle::Release => false,
                        }
                }),
            }),
            _ => None,
        };
        match confirmed {
            Some(true) => {
                env.debug(format_args!(
                    "stream {}: {} confirmed by etcd",
                    self.id,
                    st.kind.what()
                ));
                if let Some((digest, entry)) = st.learned {
                    worker(env).local.insert(digest, entry, now);
                }
                // A hold wakes waiters too: kept until its TTL, they are answered now;
                // held until the in-flight timeout, they wait on.
                wake(p, env, &st.digest);
            }
            Some(false) => {
                env.count(Counter::ClaimsLost);
                env.warn(&format!(
                    "stream {}: {}: the claim expired or was taken over first",
                    self.id,
                    st.kind.what()
                ));
            }
            None => {
                env.count(Counter::StoreErrors);
                env.warn(&format!(
                    "stream {}: {} failed (status {})",
                    self.id,
                    st.kind.what(),
                    answer.status
                ));
            }
        }
        if let Some((dup, times)) = st.then_duplicate {
            return self.duplicate(p, env, dup, times);
        }
        match st.then_reply {
            Some(reply) => Decision::Reply(reply),
            None => Decision::Continue,
        }
    }

    /// A completion answered "lease not found" (etcd lost or revoked the completed lease
    /// cached at claim time; the in-flight record is still there, or the compare would
    /// have failed first): take a fresh completed lease and write the completion again,
    /// twice at most, within the budget. Returns the next call, if any.
    pub(crate) fn regranted(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        st: &mut Settling,
        parsed: &Option<EtcdAnswer>,
        now: u64,
    ) -> Option<StoreCall> {
        let proto = ec.config.protocol;
        let r = st.regrant.as_mut()?;
        if let Some(sent_ms) = r.granting {
            let Some(EtcdAnswer::Lease { id }) = parsed else {
                return None;
            };
            r.granting = None;
            let plan = lease_plan(ec, p.config.policy_at(self.rule));
            worker(env).leases.put(
                st.call.route.shard_id,
                LeasePurpose::Completed,
                &plan,
                *id,
                sent_ms,
            );
            let (_, entry) = st.learned.as_ref()?;
            let record = EtcdRecord {
                state: if entry.response.is_some() {
                    RecordState::Completed
                } else {
                    RecordState::CompletedNotStored
                },
                token: st.token,
                expires_ms: entry.expires_ms,
                payload: entry.payload,
                response: entry.response.clone(),
            };
            st.call = ec.call(
                &Arc::clone(&st.call.route),
                proto.txn_path(),
                proto.replace_txn(&r.key, r.mod_revision, &record.encode(&st.digest), *id),
                attempt_timeout(ec, st.deadline_ms, now),
            );
            st.retries = 0;
            return Some(st.call.clone());
        }
        let lost = matches!(parsed, Some(EtcdAnswer::Error { code, message })
            if lease_lost(*code, message));
        if !lost || r.rounds >= 2 || now >= st.deadline_ms {
            return None;
        }
        env.warn(&format!(
            "stream {}: completion: etcd lost its lease; writing it again with a fresh one",
            self.id
        ));
        worker(env).leases.forget(st.call.route.shard_id);
        r.rounds += 1;
        r.granting = Some(now);
        st.call = ec.call(
            &Arc::clone(&st.call.route),
            proto.lease_grant_path(),
            proto.lease_grant(
                lease_plan(ec, p.config.policy_at(self.rule)).ttl_s(LeasePurpose::Completed),
            ),
            attempt_timeout(ec, st.deadline_ms, now),
        );
        st.retries = 0;
        Some(st.call.clone())
    }

    /// Sends a completion or release txn and waits for it in `Settling`.
    pub(crate) fn settle(
        &mut self,
        ec: &EtcdStore,
        now: u64,
        o: &EtcdClaim,
        kind: Settle,
        body: Vec<u8>,
        learned: Option<LocalEntry>,
    ) -> StoreCall {
        let deadline_ms = now.saturating_add(ec.config.timeout_ms);
        let call = ec.call(
            &o.route,
            ec.config.protocol.txn_path(),
            body,
            attempt_timeout(ec, deadline_ms, now),
        );
        self.phase = ec.pending(EtcdCall::Settling(Box::new(Settling {
            kind,
            learned: learned.map(|l| (o.digest, l)),
            digest: o.digest,
            token: o.token,
            call: call.clone(),
            retries: 0,
            deadline_ms,
            regrant: None,
            then_reply: None,
            then_duplicate: None,
        })));
        call
    }

    /// An unknown outcome: mark the record held. Held until its in-flight expiry, it
    /// stays on the in-flight lease, which alone ends it; kept until `until_ms` (its
    /// TTL), it moves to the completed lease, as a completion would.
    pub(crate) fn hold_etcd(
        &mut self,
        ec: &EtcdStore,
        env: &mut dyn Env,
        o: &EtcdClaim,
        until_ms: Option<u64>,
    ) -> StoreCall {
        let (expires_ms, lease) = match until_ms {
            Some(until) => (until.max(o.expires_ms), o.completed_lease),
            None => (o.expires_ms, o.in_flight_lease),
        };
        let record = EtcdRecord {
            state: RecordState::Held,
            token: o.token,
            expires_ms,
            payload: o.payload,
            response: None,
        };
        let body = ec.config.protocol.replace_txn(
            &o.key,
            o.mod_revision,
            &record.encode(&o.digest),
            lease,
        );
        self.settle(ec, env.now_ms(), o, Settle::Hold, body, None)
    }

    /// Releases a won claim never forwarded (its entity refused it): not counted.
    pub(crate) fn unwind_etcd(
        &mut self,
        ec: &EtcdStore,
        env: &mut dyn Env,
        o: &EtcdClaim,
    ) -> StoreCall {
        let body = ec.config.protocol.delete_txn(&o.key, o.mod_revision);
        self.settle(ec, env.now_ms(), o, Settle::Release, body, None)
    }

    pub(crate) fn release_etcd(
        &mut self,
        ec: &EtcdStore,
        env: &mut dyn Env,
        o: &EtcdClaim,
    ) -> StoreCall {
        env.count(Counter::Released);
        let body = ec.config.protocol.delete_txn(&o.key, o.mod_revision);
        self.settle(ec, env.now_ms(), o, Settle::Release, body, None)
    }

    /// Writes the completed record on the completed lease (without the response when
    /// etcd would refuse its size), and keeps what a lease regrant needs.
    pub(crate) fn complete_etcd(
        &mut self,
        p: &Plugin,
        ec: &EtcdStore,
        env: &mut dyn Env,
        o: EtcdClaim,
        response: Option<StoredResponse>,
        now: u64,
    ) -> StoreCall {
        let expires_ms = now.saturating_add(p.config.policy_at(self.rule).ttl_ms);
        let mut record = EtcdRecord {
            state: if response.is_some() {
                RecordState::Completed
            } else {
                RecordState::CompletedNotStored
            },
            token: o.token,
            expires_ms,
            payload: o.payload,
            response,
        };
        let mut value = record.encode(&o.digest);
        if record.response.is_some() && value.len() > ec.config.max_record_bytes {
            // etcd would refuse it and the key would stay in flight: keep the
            // completion without the response instead.
            env.count(Counter::ResponseNotStored);
            record.state = RecordState::CompletedNotStored;
            record.response = None;
            value = record.encode(&o.digest);
        }
        let body =
            ec.config
                .protocol
                .replace_txn(&o.key, o.mod_revision, &value, o.completed_lease);
        let learned = LocalEntry {
            payload: o.payload,
            expires_ms,
            response: record.response,
        };
        if let Some(region) = o.route.remote {
            env.count_remote(Remote::Completions, region);
        }
        let call = self.settle(ec, now, &o, Settle::Complete, body, Some(learned));
        if let Some(EtcdCall::Settling(st)) = etcd_call_mut(&mut self.phase) {
            st.regrant = Some(Regrant {
                key: o.key,
                mod_revision: o.mod_revision,
                granting: None,
                rounds: 0,
            });
        }
        call
    }
}
