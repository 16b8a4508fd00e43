//! Wait mode's glue: this worker's tick (on only while it holds waiters), its wake-up
//! queue on the shared board, and the wake-ups that run the waiting streams.
//!
//! A worker that completes or releases a record enqueues its digest to every queue on the
//! board (`WasmEnv::wake_waiters`); Envoy runs `proxy_on_queue_ready` on each queue's
//! worker, which wakes its waiters of that record. The tick re-checks the rest: deadlines,
//! and a periodic re-read (shared data) or poll (etcd) for what no queue reports.

use crate::abi;
use crate::context::wake_stream;
use crate::WorkerState;
use dedup_core::key::Digest;
use dedup_core::stream::recheck_interval_ms;
use dedup_core::wait::{announce, listeners, TICK_MS};

/// How long past its waiters' deadlines a worker stays on the board.
const BOARD_MARGIN_MS: u64 = 5_000;
/// Most items taken from the queue in one callback.
const MAX_DEQUEUE: usize = 4096;

/// After a stream callback: a worker that holds waiters ticks and is on the board.
pub(crate) fn waiters_changed(shared: &WorkerState) {
    let empty = shared.waiters.try_borrow().map_or(true, |w| w.is_empty());
    if empty {
        return;
    }
    if !shared.ticking.get() {
        match abi::set_tick_period(TICK_MS as u32) {
            Ok(()) => shared.ticking.set(true),
            Err(status) => abi::log(
                abi::LOG_WARN,
                &format!("proxy-dedup: cannot start the wait tick (status {status})"),
            ),
        }
    }
    let now = abi::now_ms();
    let wait_ms = shared.plugin.config.longest_wait_ms();
    if shared.announced_until.get() >= now.saturating_add(wait_ms) {
        return;
    }
    let namespace = shared.plugin.config.namespace();
    let token = match shared.queue.get() {
        Some(t) => t,
        None => {
            let name = format!("{namespace}/wake/{:016x}", shared.token_seed);
            match abi::register_shared_queue(&name) {
                Ok(t) => {
                    shared.queue.set(Some(t));
                    t
                }
                Err(status) => {
                    abi::log(
                        abi::LOG_WARN,
                        &format!(
                            "proxy-dedup: cannot register the wake-up queue (status {status}); \
                             waiters re-check on the tick only"
                        ),
                    );
                    return;
                }
            }
        }
    };
    let until = now.saturating_add(wait_ms).saturating_add(BOARD_MARGIN_MS);
    match announce(&abi::HostSharedData, namespace, token, until, now) {
        Ok(()) => shared.announced_until.set(until),
        Err(e) => abi::log(
            abi::LOG_WARN,
            &format!("proxy-dedup: cannot put the wake-up queue on the board: {e}"),
        ),
    }
}

/// A record changed: every worker holding waiters hears of it (this one too).
pub(crate) fn wake_everywhere(shared: &WorkerState, digest: &Digest) {
    let now = abi::now_ms();
    let tokens = match listeners(&abi::HostSharedData, shared.plugin.config.namespace(), now) {
        Ok(t) => t,
        Err(e) => {
            abi::log(
                abi::LOG_WARN,
                &format!("proxy-dedup: cannot read the wake-up board: {}", e.0),
            );
            return;
        }
    };
    for token in tokens {
        if let Err(status) = abi::enqueue_shared_queue(token, digest) {
            if abi::log_level() <= abi::LOG_DEBUG {
                abi::log(
                    abi::LOG_DEBUG,
                    &format!("proxy-dedup: wake-up queue {token}: status {status}"),
                );
            }
        }
    }
}

/// This worker's queue has digests of records that changed: wake their waiters.
pub(crate) fn on_queue_ready(shared: &WorkerState, queue_id: u32) {
    let mut woken = 0;
    for _ in 0..MAX_DEQUEUE {
        match abi::dequeue_shared_queue(queue_id) {
            Ok(Some(item)) => {
                if let (Ok(digest), Ok(mut w)) = (
                    <Digest>::try_from(item.as_slice()),
                    shared.waiters.try_borrow_mut(),
                ) {
                    woken += w.wake(&digest);
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    if woken > 0 {
        run_due(shared);
    }
}

/// The tick (or a wake-up): runs the waiters that are due; stops the tick when none is
/// left.
pub(crate) fn run_due(shared: &WorkerState) {
    let now = abi::now_ms();
    let due = {
        let Ok(mut w) = shared.waiters.try_borrow_mut() else {
            return;
        };
        if w.is_empty() {
            if shared.ticking.get() && abi::set_tick_period(0).is_ok() {
                shared.ticking.set(false);
            }
            return;
        }
        w.take_due(now, recheck_interval_ms(&shared.plugin))
    };
    for id in due {
        if !wake_stream(id) {
            // Its stream is gone without telling us: forget it.
            if let Ok(mut w) = shared.waiters.try_borrow_mut() {
                w.remove(id);
            }
        }
    }
}
