//! Shared queues: register, resolve, enqueue, dequeue.

use super::guest::*;
use crate::abi::*;
use crate::shared::lock;

/// The shared-queue imports.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
        "proxy_register_shared_queue",
        |mut c: C, np: i32, nl: i32, tp: i32| -> i32 {
            let Some(name) = read_str(&mut c, np, nl) else {
                return INVALID_MEMORY;
            };
            let token = {
                let s = c.data();
                let mut sh = lock(&s.shared);
                let key = (s.plugin.vm_id.clone(), name);
                let token = match sh.queue_tokens.get(&key) {
                    Some(t) => *t,
                    None => {
                        let t = sh.next_queue_token;
                        sh.next_queue_token += 1;
                        sh.queue_tokens.insert(key, t);
                        t
                    }
                };
                let queue = sh
                    .queues
                    .entry(token)
                    .or_insert_with(|| crate::shared::Queue {
                        items: Default::default(),
                        owner_worker: s.worker,
                        owner_context: s.root_id,
                    });
                queue.owner_worker = s.worker;
                queue.owner_context = s.root_id;
                token
            };
            put_u32(&mut c, tp, token)
        },
    )?;
    i.func(
        "proxy_resolve_shared_queue",
        |mut c: C, vp: i32, vl: i32, np: i32, nl: i32, tp: i32| -> i32 {
            let (Some(vm_id), Some(name)) = (read_str(&mut c, vp, vl), read_str(&mut c, np, nl))
            else {
                return INVALID_MEMORY;
            };
            let token = {
                let s = c.data();
                let vm_id = if vm_id.is_empty() {
                    s.plugin.vm_id.clone()
                } else {
                    vm_id
                };
                lock(&s.shared).queue_tokens.get(&(vm_id, name)).copied()
            };
            match token {
                Some(t) => put_u32(&mut c, tp, t),
                None => NOT_FOUND,
            }
        },
    )?;
    i.func(
        "proxy_enqueue_shared_queue",
        |mut c: C, token: i32, vp: i32, vl: i32| -> i32 {
            let Some(value) = read(&mut c, vp, vl) else {
                return INVALID_MEMORY;
            };
            let s = c.data();
            let mut sh = lock(&s.shared);
            let token = token as u32;
            let Some(q) = sh.queues.get_mut(&token) else {
                return NOT_FOUND;
            };
            q.items.push_back(value);
            let owner = (q.owner_worker, q.owner_context, token);
            sh.queue_ready.push(owner);
            OK
        },
    )?;
    i.func(
        "proxy_dequeue_shared_queue",
        |mut c: C, token: i32, vpp: i32, vsp: i32| -> R {
            let item = {
                let s = c.data();
                let mut sh = lock(&s.shared);
                match sh.queues.get_mut(&(token as u32)) {
                    None => return Ok(NOT_FOUND),
                    Some(q) => match q.items.pop_front() {
                        None => return Ok(Status::Empty as i32),
                        Some(v) => v,
                    },
                }
            };
            copy_out(&mut c, &item, vpp, vsp)
        },
    )?;
    Ok(())
}
