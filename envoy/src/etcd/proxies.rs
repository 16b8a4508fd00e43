//! Envoys in front of the cluster: the multi-proxy template with the
//! members' ports written into its `etcd` cluster, and the health of that
//! cluster as an Envoy sees it.

use super::EtcdCluster;
use crate::config::EnvoyConfig;
use crate::envoy::EnvoyProcess;
use crate::paths::config_file;
use crate::{fail, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The multi-proxy template: listener -> dedup filter (etcd store) -> router,
/// plus the `etcd` cluster.
pub const MULTI_PROXY_ETCD: &str = "multi-proxy-etcd.yaml";
/// Marker at the end of each etcd endpoint line of the template.
const MEMBER_MARKER: &str = "# etcd member ";

/// Put the members' client ports into the template's etcd endpoint lines:
/// each line ending in `# etcd member N` gets `port_value: <port of member N>`.
/// The template keeps real, editable defaults there (2379, 22379, 32379), so
/// it stays a valid Envoy config without this step.
pub fn render_etcd_endpoints(template: &str, ports: &[u16]) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut seen = vec![false; ports.len()];
    for line in template.split_inclusive('\n') {
        let trimmed = line.trim_end();
        let member = trimmed
            .rsplit_once(MEMBER_MARKER)
            .filter(|(code, _)| !code.trim_start().starts_with('#'))
            .and_then(|(_, n)| n.trim().parse::<usize>().ok());
        let Some(n) = member else {
            out.push_str(line);
            continue;
        };
        let Some(port) = n.checked_sub(1).and_then(|i| ports.get(i)) else {
            fail!(
                "template line {trimmed:?} names etcd member {n}, but the cluster has {} members",
                ports.len()
            );
        };
        let Some(at) = line.find("port_value:") else {
            fail!("etcd member line without port_value: {trimmed:?}");
        };
        let after = &line[at + "port_value:".len()..];
        let digits_at = after.len() - after.trim_start().len();
        let digits = after[digits_at..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len() - digits_at);
        out.push_str(&line[..at]);
        out.push_str(&format!("port_value: {port}"));
        out.push_str(&after[digits_at + digits..]);
        seen[n - 1] = true;
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        fail!(
            "the template has no line ending in \"{MEMBER_MARKER}{}\"",
            missing + 1
        );
    }
    Ok(out)
}

/// `multi-proxy-etcd.yaml` pointed at `etcd`'s members, with `wasm` and
/// `filter_config`, on fresh loopback ports. The etcd endpoints are written
/// into a copy of the template in the cluster's directory; the remaining
/// placeholders are rendered by `EnvoyProcess::start` as for `single-node.yaml`.
pub fn multi_proxy_config(
    etcd: &EtcdCluster,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    etcd_proxy_config(
        etcd,
        &config_file(MULTI_PROXY_ETCD),
        upstream_port,
        wasm,
        filter_config,
    )
}

/// `multi_proxy_config` for the filter's `store.protocol: "json"`: the same
/// template with its `etcd` cluster on HTTP/1.1 (the `typed_extension_protocol_options`
/// block that makes it HTTP/2 removed, as the template's comments tell users to do),
/// since etcd serves its JSON gateway on HTTP/1.1 only.
pub fn multi_proxy_json_config(
    etcd: &EtcdCluster,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let template = match std::fs::read_to_string(config_file(MULTI_PROXY_ETCD)) {
        Ok(t) => t,
        Err(e) => fail!("cannot read {MULTI_PROXY_ETCD}: {e}"),
    };
    let http1 = without_http2_options(&template)?;
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let path = etcd.dir.join(format!(
        "json-template-{}.yaml",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    if let Err(e) = std::fs::write(&path, http1) {
        fail!("cannot write {}: {e}", path.display());
    }
    etcd_proxy_config(etcd, &path, upstream_port, wasm, filter_config)
}

/// `template` without its `typed_extension_protocol_options:` block (the line and the
/// more deeply indented lines after it).
pub fn without_http2_options(template: &str) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut skipping: Option<usize> = None;
    let mut found = false;
    for line in template.split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        if let Some(at) = skipping {
            if indent > at && !line.trim().is_empty() {
                continue;
            }
            skipping = None;
        }
        if line
            .trim_start()
            .starts_with("typed_extension_protocol_options:")
        {
            skipping = Some(indent);
            found = true;
            continue;
        }
        out.push_str(line);
    }
    if !found {
        fail!("the template has no typed_extension_protocol_options block");
    }
    Ok(out)
}

/// `multi_proxy_config` from another template with the same `# etcd member N`
/// endpoint lines (e.g. one whose listener comes by LDS).
pub fn etcd_proxy_config(
    etcd: &EtcdCluster,
    template_path: &Path,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let template = match std::fs::read_to_string(template_path) {
        Ok(t) => t,
        Err(e) => fail!("cannot read {}: {e}", template_path.display()),
    };
    let rendered = render_etcd_endpoints(&template, &etcd.proxy_ports())?;
    // Next to the cluster's logs: removed with them.
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let path = etcd.dir.join(format!(
        "envoy-template-{}.yaml",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, rendered)?;
    let mut config = EnvoyConfig::single_node(upstream_port, wasm, filter_config)?;
    config.template = path;
    Ok(config)
}

/// The template's `etcd` cluster (the `  - name: etcd` entry, to the next entry or the
/// end) written once per shard of a sharded store: a copy named after the shard's
/// Envoy cluster (`name` and `cluster_name`), its `# etcd member N` lines pointing at
/// that shard's members. What a user does by hand: one copy of the cluster per shard.
pub fn render_shard_clusters(template: &str, shards: &[(&str, Vec<u16>)]) -> Result<String> {
    const ENTRY: &str = "  - name: etcd\n";
    let Some(start) = template.find(ENTRY) else {
        fail!("the template has no `  - name: etcd` cluster");
    };
    let body_from = start + ENTRY.len();
    let rest = &template[body_from..];
    let mut len = 0;
    for line in rest.split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if !text.is_empty() && (indent < 4 || line.starts_with("  - ")) {
            break;
        }
        len += line.len();
    }
    let block = &template[start..body_from + len];
    let mut copies = String::new();
    for (cluster, ports) in shards {
        let named = block
            .replacen(ENTRY, &format!("  - name: {cluster}\n"), 1)
            .replace(
                "cluster_name: etcd\n",
                &format!("cluster_name: {cluster}\n"),
            );
        copies.push_str(&render_etcd_endpoints(&named, ports)?);
    }
    Ok(format!(
        "{}{copies}{}",
        &template[..start],
        &template[body_from + len..]
    ))
}

/// `multi-proxy-etcd.yaml` for a sharded store: its `etcd` cluster once per shard,
/// named `shards[i].0` and pointed at `shards[i].1`'s members (`render_shard_clusters`),
/// with `wasm` and `filter_config` (whose `store.shards` names those clusters).
pub fn sharded_proxy_config(
    shards: &[(&str, &EtcdCluster)],
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let Some((_, first)) = shards.first() else {
        fail!("a sharded store needs one shard at least");
    };
    let template = match std::fs::read_to_string(config_file(MULTI_PROXY_ETCD)) {
        Ok(t) => t,
        Err(e) => fail!("cannot read {MULTI_PROXY_ETCD}: {e}"),
    };
    let ports: Vec<(&str, Vec<u16>)> = shards
        .iter()
        .map(|(name, etcd)| (*name, etcd.proxy_ports()))
        .collect();
    let rendered = render_shard_clusters(&template, &ports)?;
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let path = first.dir.join(format!(
        "sharded-template-{}.yaml",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, rendered)?;
    let mut config = EnvoyConfig::single_node(upstream_port, wasm, filter_config)?;
    config.template = path;
    Ok(config)
}

/// Health of the `etcd` cluster's hosts as one Envoy sees them (admin
/// `/clusters`): (healthy, total).
pub fn etcd_hosts_health(envoy: &EnvoyProcess) -> Result<(usize, usize)> {
    cluster_hosts_health(envoy, "etcd")
}

/// Health of the hosts of the Envoy cluster `cluster` as one Envoy sees them.
pub fn cluster_hosts_health(envoy: &EnvoyProcess, cluster: &str) -> Result<(usize, usize)> {
    let text = envoy.admin("/clusters")?.text();
    let mut total = 0;
    let mut healthy = 0;
    let prefix = format!("{cluster}::");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        if let Some((_, flags)) = rest.split_once("::health_flags::") {
            total += 1;
            if flags.trim() == "healthy" {
                healthy += 1;
            }
        }
    }
    Ok((healthy, total))
}

/// Wait until `envoy` sees `want` healthy etcd hosts (active health checks).
pub fn wait_etcd_hosts_healthy(envoy: &EnvoyProcess, want: usize, limit: Duration) -> Result<()> {
    wait_cluster_hosts_healthy(envoy, "etcd", want, limit)
}

/// Wait until `envoy` sees `want` healthy hosts in the Envoy cluster `cluster`.
pub fn wait_cluster_hosts_healthy(
    envoy: &EnvoyProcess,
    cluster: &str,
    want: usize,
    limit: Duration,
) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        let (healthy, total) = cluster_hosts_health(envoy, cluster)?;
        if healthy == want {
            return Ok(());
        }
        if Instant::now() >= end {
            fail!("Envoy sees {healthy}/{total} healthy etcd hosts after {limit:?}, wanted {want}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_json_template_is_the_copyable_one_without_http2() {
        let template = std::fs::read_to_string(config_file(MULTI_PROXY_ETCD)).unwrap();
        assert!(template.contains("http2_protocol_options"));
        let http1 = without_http2_options(&template).unwrap();
        let config_lines = || http1.lines().filter(|l| !l.trim_start().starts_with('#'));
        assert!(!config_lines().any(|l| l.contains("typed_extension_protocol_options")));
        assert!(!config_lines().any(|l| l.contains("http2_protocol_options")));
        // Only those lines went: the cluster and its members are still there.
        let removed = template.lines().count() - http1.lines().count();
        assert_eq!(removed, 5, "{http1}");
        assert!(http1.contains("# etcd member 3"));
        assert!(http1.contains("    connect_timeout: 0.25s"));
        assert!(without_http2_options("a: 1\n").is_err());
    }

    #[test]
    fn endpoints_are_rendered_by_member_marker() {
        let t = "# port_value: 1 # etcd member 1\n  - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 2379 } } }  # etcd member 1\n  x: { port_value: 22379 } # etcd member 2\n";
        let out = render_etcd_endpoints(t, &[5001, 5002]).unwrap();
        assert_eq!(
            out,
            "# port_value: 1 # etcd member 1\n  - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 5001 } } }  # etcd member 1\n  x: { port_value: 5002 } # etcd member 2\n"
        );
        assert!(render_etcd_endpoints(t, &[5001, 5002, 5003]).is_err());
        assert!(render_etcd_endpoints(t, &[5001]).is_err());
    }

    #[test]
    fn a_sharded_template_has_the_etcd_cluster_once_per_shard() {
        let template = std::fs::read_to_string(config_file(MULTI_PROXY_ETCD)).unwrap();
        let out = render_shard_clusters(
            &template,
            &[
                ("etcd_a", vec![5001, 5002, 5003]),
                ("etcd_b", vec![6001, 6002, 6003]),
            ],
        )
        .unwrap();
        let config_lines = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .map(str::to_string)
                .collect()
        };
        let lines = config_lines(&out);
        for name in ["etcd_a", "etcd_b"] {
            assert!(lines.contains(&format!("  - name: {name}")), "{out}");
            assert!(
                lines.contains(&format!("      cluster_name: {name}")),
                "{out}"
            );
        }
        assert!(!lines.iter().any(|l| l == "  - name: etcd"), "{out}");
        for port in [5001, 5003, 6001, 6003] {
            assert!(out.contains(&format!("port_value: {port} ")), "{port}");
        }
        // Each copy is the whole cluster: one HTTP/2 block and one health check each.
        let count = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
        assert_eq!(count("http2_protocol_options"), 2);
        assert_eq!(count("http_health_check:"), 2);
        // Everything before the cluster stays as it was, once.
        let before = &template[..template.find("  - name: etcd\n").unwrap()];
        assert!(out.starts_with(before));
        assert!(render_shard_clusters("static_resources: {}\n", &[]).is_err());
    }
}
