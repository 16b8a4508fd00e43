//! Inspection and control from a test: workers and their VMs, host-call
//! counts, upstreams and clusters, faults, the clock, logs, shared data
//! and metrics.

use super::*;

impl SimEnvoy {
    /// Worker threads (VMs that serve streams).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The main-thread VM trapped (in `on_tick`, say) and is failed.
    pub fn main_thread_failed(&self) -> bool {
        self.vms.get(self.workers).is_some_and(|v| v.failed)
    }

    /// The worker's VM trapped and is failed (every later stream: 503).
    pub fn worker_failed(&self, worker: usize) -> bool {
        self.vms.get(worker).is_some_and(|v| v.failed)
    }

    /// Size of a worker VM's linear memory in bytes (it only grows: the high-water
    /// mark of what the filter ever allocated).
    pub fn memory_bytes(&self, worker: usize) -> usize {
        self.vms
            .get(worker)
            .and_then(|v| v.store.data().memory.map(|m| m.data_size(&v.store)))
            .unwrap_or(0)
    }

    /// Host calls and bytes copied since the last [`SimEnvoy::reset_host_calls`],
    /// over every VM (empty unless built with
    /// [`EnvoyBuilder::count_host_calls`](crate::EnvoyBuilder::count_host_calls)).
    pub fn host_calls(&self) -> crate::state::HostCalls {
        let mut all = crate::state::HostCalls::default();
        for vm in &self.vms {
            if let Some(h) = &vm.store.data().host_calls {
                all.add(h);
            }
        }
        all
    }

    /// Starts the host-call counts anew.
    pub fn reset_host_calls(&mut self) {
        for vm in &mut self.vms {
            if let Some(h) = vm.store.data_mut().host_calls.as_mut() {
                *h = crate::state::HostCalls::default();
            }
        }
    }

    /// Requests that fully reached the upstream (any stream).
    pub fn upstream_calls(&self) -> u64 {
        self.upstream_calls
    }

    /// Replaces the upstream service.
    pub fn set_upstream(&mut self, handler: impl FnMut(&UpstreamRequest) -> Reply + 'static) {
        self.upstream = Box::new(handler);
    }

    /// Replaces (or adds) an in-process cluster's handler. Only clusters
    /// declared at build time exist for `proxy_http_call`.
    pub fn set_cluster(
        &mut self,
        name: &str,
        handler: impl FnMut(&UpstreamRequest) -> Reply + 'static,
    ) {
        self.clusters
            .insert(name.to_string(), Cluster::InProcess(Box::new(handler)));
    }

    /// Replaces (or adds) a gRPC cluster answered in process.
    pub fn set_grpc_cluster(
        &mut self,
        name: &str,
        handler: impl FnMut(&crate::GrpcRequest) -> crate::GrpcReply + 'static,
    ) {
        self.grpc_clusters
            .insert(name.to_string(), GrpcCluster::InProcess(Box::new(handler)));
    }

    /// Replaces (or adds) a gRPC cluster served by a real HTTP/2 server on loopback.
    pub fn set_grpc_cluster_addr(&mut self, name: &str, addr: &str) {
        self.grpc_clusters
            .insert(name.to_string(), GrpcCluster::H2(addr.to_string()));
    }

    pub fn set_faults(&mut self, faults: Faults) {
        lock(&self.shared).faults = faults;
    }

    /// The virtual wall clock.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.now_ns())
    }

    /// Every line logged so far, all workers, in order.
    pub fn logs(&self) -> Vec<LogLine> {
        lock(&self.shared).logs.clone()
    }

    /// Whether any log line contains `text`.
    pub fn log_contains(&self, text: &str) -> bool {
        lock(&self.shared)
            .logs
            .iter()
            .any(|l| l.message.contains(text))
    }

    /// Lines at `level` or above containing `text`.
    pub fn log_lines(&self, level: LogLevel, text: &str) -> Vec<LogLine> {
        lock(&self.shared)
            .logs
            .iter()
            .filter(|l| l.level >= level && l.message.contains(text))
            .cloned()
            .collect()
    }

    pub fn clear_logs(&mut self) {
        lock(&self.shared).logs.clear();
    }

    /// Number of shared-data keys (tombstones included) for this plugin's vm_id.
    pub fn shared_data_len(&self) -> usize {
        self.shared_data_len_for(&self.plugin.vm_id)
    }

    pub fn shared_data_len_for(&self, vm_id: &str) -> usize {
        lock(&self.shared).data.get(vm_id).map_or(0, |m| m.len())
    }

    /// A shared-data entry (value, cas) for this plugin's vm_id.
    pub fn shared_data(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        lock(&self.shared)
            .data
            .get(&self.plugin.vm_id)
            .and_then(|m| m.get(key))
            .cloned()
    }

    /// All shared-data keys for this plugin's vm_id, sorted.
    pub fn shared_data_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = lock(&self.shared)
            .data
            .get(&self.plugin.vm_id)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    /// Writes shared data as a filter would (cas 0: unconditional).
    pub fn put_shared_data(&mut self, key: &str, value: &[u8]) {
        let vm_id = self.plugin.vm_id.clone();
        let mut sh = lock(&self.shared);
        let saved = sh.faults;
        sh.faults = Faults::default();
        sh.set(&vm_id, key, value, 0);
        sh.faults = saved;
    }

    pub fn metric(&self, name: &str) -> Option<Metric> {
        lock(&self.shared).metrics.get(name).cloned()
    }

    /// A counter's value by the name the filter defined it with.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.metric(name)
            .filter(|m| m.kind == MetricKind::Counter)
            .map(|m| m.value)
    }

    pub fn gauge(&self, name: &str) -> Option<u64> {
        self.metric(name)
            .filter(|m| m.kind == MetricKind::Gauge)
            .map(|m| m.value)
    }

    /// All metrics, by name.
    pub fn metrics(&self) -> HashMap<String, Metric> {
        lock(&self.shared).metrics.clone()
    }
}
