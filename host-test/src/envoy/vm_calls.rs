//! Calling into a worker's VM: the calls themselves (a trap fails the VM
//! as in Envoy), the work a module queued during a call (deferred resumes,
//! callouts, gRPC operations), held callouts, and starting a VM.

use super::*;

impl SimEnvoy {
    pub(super) fn invoke<P: WasmParams, R: WasmResults>(
        &mut self,
        worker: usize,
        ctx: u32,
        pick: impl Fn(&Exports) -> Option<Export<P, R>>,
        params: P,
    ) -> Call<R> {
        let vm = &mut self.vms[worker];
        if vm.failed {
            return Call::Trapped;
        }
        let Some(Export { name, func }) = pick(&vm.exports) else {
            return Call::Missing;
        };
        {
            let s = vm.store.data_mut();
            s.current = ctx;
            s.effective = None;
            s.stop_next_iteration = false;
        }
        let result = func.call(&mut vm.store, params);
        self.after_call(worker);
        match result {
            Ok(r) => Call::Done(r),
            Err(e) => {
                self.vms[worker].failed = true;
                // Envoy's line (cpp-host's fail message, as V8 words the
                // trap), then wasmtime's backtrace for whoever runs at debug.
                let mut shared = lock(&self.shared);
                shared.log(
                    worker,
                    LogLevel::Error,
                    format!("Function: {name} failed: {}", uncaught(&e)),
                );
                shared.log(
                    worker,
                    LogLevel::Debug,
                    format!("Function: {name} failed (wasmtime): {e:#}"),
                );
                Call::Trapped
            }
        }
    }

    /// Timer changes and new callouts, right after a VM call.
    pub(super) fn after_call(&mut self, worker: usize) {
        let (tick, callouts, grpc) = {
            let s = self.vms[worker].store.data_mut();
            (
                s.tick_request.take(),
                std::mem::take(&mut s.new_callouts),
                std::mem::take(&mut s.grpc_calls.ops),
            )
        };
        if !grpc.is_empty() {
            self.grpc_ops(worker, grpc);
        }
        if let Some(period) = tick {
            self.ticks[worker] = if period == 0 {
                None
            } else {
                let p = u64::from(period) * 1_000_000;
                Some((self.now_ns() + p, p))
            };
        }
        for c in callouts {
            let Some(cluster) = self.clusters.get_mut(&c.cluster) else {
                continue;
            };
            let answer = |response| Event::Callout {
                worker,
                token: c.token,
                response,
            };
            match callout::call(cluster, &c.request, c.timeout_ms) {
                CalloutResult::Response(reply) if !reply.delay.is_zero() => {
                    let at = self.now_ns() + reply.delay.as_nanos() as u64;
                    self.schedule(at, answer(Some(reply)));
                }
                CalloutResult::Response(reply) => self.answer_callout(answer(Some(reply))),
                CalloutResult::Reset => self.answer_callout(answer(None)),
                CalloutResult::Never => {}
                CalloutResult::TimeoutAfter(ms) => {
                    let at = self.now_ns() + u64::from(ms) * 1_000_000;
                    self.schedule(at, answer(Some(callout::timeout_reply())));
                }
                CalloutResult::ResetAfter(ms) => {
                    self.schedule(self.now_ns() + u64::from(ms) * 1_000_000, answer(None))
                }
            }
        }
    }

    pub(super) fn answer_callout(&mut self, event: Event) {
        if self.hold_callouts {
            self.held_callouts.push(event);
        } else {
            self.ready.push_back(event);
        }
    }

    /// Holds callout answers (in-process and TCP) instead of delivering
    /// them on the next event-loop turn, so a test can act while a callout
    /// is in flight. Timeouts still fire on the virtual clock.
    pub fn hold_callouts(&mut self, hold: bool) {
        self.hold_callouts = hold;
    }

    /// Callout answers held by [`SimEnvoy::hold_callouts`].
    pub fn held_callouts(&self) -> usize {
        self.held_callouts.len()
    }

    /// Delivers the held callout answers, in dispatch order.
    pub fn release_callouts(&mut self) {
        let held = std::mem::take(&mut self.held_callouts);
        self.ready.extend(held);
        self.pump();
    }

    pub(super) fn take_deferred(&mut self, worker: usize) -> (Vec<Deferred>, bool) {
        let s = self.vms[worker].store.data_mut();
        (std::mem::take(&mut s.deferred), s.stop_next_iteration)
    }

    pub(super) fn run_deferred(&mut self, worker: usize, deferred: Vec<Deferred>) {
        for d in deferred {
            match d {
                Deferred::Continue { ctx, response } => {
                    if let Some(sid) = self.by_ctx.get(&(worker, ctx)).copied() {
                        let side = if response {
                            Side::Response
                        } else {
                            Side::Request
                        };
                        self.resume(sid, side);
                    }
                }
                Deferred::GrpcRefused { token } => self.grpc_refused(worker, token),
                Deferred::Close { ctx } => {
                    if let Some(sid) = self.by_ctx.get(&(worker, ctx)).copied() {
                        self.cancel_upstream(sid);
                        self.finish(sid, true);
                    }
                }
                Deferred::LocalReply {
                    ctx,
                    status,
                    body,
                    headers,
                    details,
                    grpc_status,
                } => {
                    if let Some(sid) = self.by_ctx.get(&(worker, ctx)).copied() {
                        let reply = LocalReply {
                            status,
                            body,
                            extra: headers,
                            details,
                            grpc_status,
                        };
                        self.local_reply_of(sid, reply, true);
                    }
                }
            }
        }
    }

    pub(super) fn start_vm(&mut self, worker: usize) -> Result<(), Error> {
        let x = &self.vms[worker].exports;
        let (create, vm_start, configure) = (
            x.on_context_create.clone(),
            x.on_vm_start.clone(),
            x.on_configure.clone(),
        );
        if let Some(f) = create {
            let name = f.name;
            if let Call::Trapped =
                self.invoke(worker, ROOT, move |_| Some(f.clone()), (ROOT as i32, 0))
            {
                return Err(self.start_trap(name));
            }
        }
        let len = self.plugin.vm_config.len();
        self.start_callback(worker, vm_start, len, |logs| Error::VmStartFailed {
            worker,
            logs,
        })?;
        self.vms[worker].store.data_mut().in_configure = true;
        let len = self.plugin.plugin_config.len();
        let r = self.start_callback(worker, configure, len, |logs| Error::ConfigRejected {
            worker,
            logs,
        });
        self.vms[worker].store.data_mut().in_configure = false;
        r?;
        let (d, _) = self.take_deferred(worker);
        self.run_deferred(worker, d);
        Ok(())
    }

    /// `proxy_on_vm_start` or `proxy_on_configure`, given the size of its
    /// configuration: a trap fails the start naming the callback, a false
    /// return fails it with `refused`.
    fn start_callback(
        &mut self,
        worker: usize,
        export: Option<Export<(i32, i32), i32>>,
        len: usize,
        refused: impl FnOnce(Vec<LogLine>) -> Error,
    ) -> Result<(), Error> {
        let Some(f) = export else {
            return Ok(());
        };
        let name = f.name;
        match self.invoke(
            worker,
            ROOT,
            move |_| Some(f.clone()),
            (ROOT as i32, len as i32),
        ) {
            Call::Trapped => Err(self.start_trap(name)),
            Call::Done(0) => Err(refused(lock(&self.shared).logs.clone())),
            _ => Ok(()),
        }
    }

    fn start_trap(&self, function: &str) -> Error {
        Error::Trap {
            function: function.to_string(),
            message: "trapped (see log)".into(),
            logs: lock(&self.shared).logs.clone(),
        }
    }
}

/// The root context id a VM starts with.
const ROOT: u32 = 1;

/// A trap as Envoy 1.40's V8 reports it, e.g. `Uncaught RuntimeError:
/// unreachable` (seen for a Rust panic, which ends in `unreachable`; the
/// other messages are V8's for the same traps). An error that is no trap (a
/// host call that failed the VM, such as WASI `proc_exit`) keeps its own words.
fn uncaught(error: &wasmtime::Error) -> String {
    use wasmtime::Trap;
    let Some(trap) = error.downcast_ref::<Trap>() else {
        return error.root_cause().to_string();
    };
    let message = match trap {
        Trap::StackOverflow => {
            return "Uncaught RangeError: Maximum call stack size exceeded".into()
        }
        Trap::UnreachableCodeReached => "unreachable",
        Trap::MemoryOutOfBounds => "memory access out of bounds",
        Trap::HeapMisaligned => "operation does not support unaligned accesses",
        Trap::TableOutOfBounds => "table index is out of bounds",
        Trap::IndirectCallToNull | Trap::BadSignature => {
            "null function or function signature mismatch"
        }
        // wasmtime does not tell a remainder from a division by zero.
        Trap::IntegerDivisionByZero => "divide by zero",
        Trap::IntegerOverflow => "divide result unrepresentable",
        Trap::BadConversionToInteger => "float unrepresentable in integer range",
        other => return format!("Uncaught RuntimeError: {other}"),
    };
    format!("Uncaught RuntimeError: {message}")
}
