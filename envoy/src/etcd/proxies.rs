//! Envoys in front of the cluster: the multi-proxy template with the
//! members' ports written into its `etcd` cluster (once per shard for a sharded
//! store, also behind an LDS listener or beside another bootstrap's listeners), and
//! the health of that cluster as an Envoy sees it.

use super::EtcdCluster;
use crate::config::{EnvoyConfig, LDS_LISTENER, SINGLE_NODE_LDS};
use crate::envoy::EnvoyProcess;
use crate::paths::config_file;
use crate::{fail, Result};
use dedup_tools::members::{self, cluster_copies, etcd_cluster_span, Members, MEMBER_MARKER};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The multi-proxy template: listener -> dedup filter (etcd store) -> router,
/// plus the `etcd` cluster.
pub const MULTI_PROXY_ETCD: &str = "multi-proxy-etcd.yaml";

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
    let template = read_template(&config_file(MULTI_PROXY_ETCD))?;
    let http1 = without_http2_options(&template)?;
    let path = write_template(&etcd.dir, "json-template", &http1)?;
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
    let template = read_template(template_path)?;
    let rendered = render_etcd_endpoints(&template, &etcd.proxy_ports())?;
    let path = write_template(&etcd.dir, "envoy-template", &rendered)?;
    let mut config = EnvoyConfig::single_node(upstream_port, wasm, filter_config)?;
    config.template = path;
    Ok(config)
}

/// The shards as `dedupctl render --members` values: each shard's Envoy cluster with
/// its members on loopback.
fn shard_members(shards: &[(&str, Vec<u16>)]) -> Vec<Members> {
    shards
        .iter()
        .map(|(cluster, ports)| Members {
            cluster: cluster.to_string(),
            hosts: ports
                .iter()
                .map(|p| ("127.0.0.1".to_string(), *p))
                .collect(),
        })
        .collect()
}

/// The template's `etcd` cluster once per shard: a copy named after the shard's Envoy
/// cluster (`name` and `cluster_name`), its `# etcd member N` lines pointing at that
/// shard's members. What a user does with `dedupctl render --members`.
fn shard_cluster_copies(template: &str, shards: &[(&str, Vec<u16>)]) -> Result<String> {
    let (start, end) = etcd_cluster_span(template).map_err(crate::Error)?;
    cluster_copies(&template[start..end], &shard_members(shards)).map_err(crate::Error)
}

/// The template's `etcd` cluster (the `  - name: etcd` entry, to the next entry or the
/// end) written once per shard of a sharded store, in its place (`shard_cluster_copies`).
pub fn render_shard_clusters(template: &str, shards: &[(&str, Vec<u16>)]) -> Result<String> {
    if shards.is_empty() {
        fail!("a sharded store needs one shard at least");
    }
    members::apply(template, &shard_members(shards)).map_err(crate::Error)
}

/// `bootstrap` (a template whose `static_resources.clusters` list ends the file, as
/// `single-node-lds.yaml` and `admin-api.yaml`) with `multi-proxy-etcd.yaml`'s `etcd`
/// cluster appended once per shard (`shard_cluster_copies`).
pub fn append_shard_clusters(bootstrap: &str, shards: &[(&str, Vec<u16>)]) -> Result<String> {
    let Some(at) = bootstrap.find("\n  clusters:\n") else {
        fail!("the bootstrap has no `  clusters:` list under static_resources");
    };
    // Nothing after the list but its entries (indented), blank lines and comments.
    let after = &bootstrap[at + 1..];
    if let Some(line) = after
        .lines()
        .skip(1)
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#') && !l.starts_with("  "))
    {
        fail!("the bootstrap's clusters list does not end the file: {line:?} follows it");
    }
    let template = read_template(&config_file(MULTI_PROXY_ETCD))?;
    let copies = shard_cluster_copies(&template, shards)?;
    let sep = if bootstrap.ends_with('\n') { "" } else { "\n" };
    Ok(format!("{bootstrap}{sep}{copies}"))
}

/// The members' ports of each shard, by the shard's Envoy cluster name.
fn shard_ports<'a>(shards: &[(&'a str, &EtcdCluster)]) -> Result<Vec<(&'a str, Vec<u16>)>> {
    if shards.is_empty() {
        fail!("a sharded store needs one shard at least");
    }
    Ok(shards
        .iter()
        .map(|(name, etcd)| (*name, etcd.proxy_ports()))
        .collect())
}

/// `multi-proxy-etcd.yaml` with its `etcd` cluster once per shard, each shard's members
/// given by port (`render_shard_clusters`), written in `dir`: a proxy of one region
/// reaching each region's etcd its own way (`regions::Regions::proxy_config`). With
/// `lds`, the listener comes by LDS (`single-node-lds.yaml`), so that a test can push
/// another filter configuration.
pub fn proxy_config_on_ports(
    dir: &Path,
    shards: &[(&str, Vec<u16>)],
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
    lds: bool,
) -> Result<EnvoyConfig> {
    let rendered = if lds {
        append_shard_clusters(&read_template(&config_file(SINGLE_NODE_LDS))?, shards)?
    } else {
        render_shard_clusters(&read_template(&config_file(MULTI_PROXY_ETCD))?, shards)?
    };
    let path = write_template(dir, "regions-template", &rendered)?;
    let mut config = EnvoyConfig::single_node(upstream_port, wasm, filter_config)?;
    config.template = path;
    if lds {
        config.lds_template = Some(config_file(LDS_LISTENER));
    }
    Ok(config)
}

/// `rendered` as the template of a config on fresh ports: written next to the first
/// shard's logs.
fn sharded_config(
    shards: &[(&str, &EtcdCluster)],
    rendered: &str,
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let Some((_, first)) = shards.first() else {
        fail!("a sharded store needs one shard at least");
    };
    let path = write_template(&first.dir, "sharded-template", rendered)?;
    let mut config = EnvoyConfig::single_node(upstream_port, wasm, filter_config)?;
    config.template = path;
    Ok(config)
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
    let ports = shard_ports(shards)?;
    proxy_config_on_ports(
        &shards[0].1.dir,
        &ports,
        upstream_port,
        wasm,
        filter_config,
        false,
    )
}

/// `sharded_proxy_config` for `store.protocol: "json"`: every shard's cluster on
/// HTTP/1.1 (as `multi_proxy_json_config`).
pub fn sharded_proxy_json_config(
    shards: &[(&str, &EtcdCluster)],
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let template = read_template(&config_file(MULTI_PROXY_ETCD))?;
    let rendered = render_shard_clusters(&template, &shard_ports(shards)?)?;
    let http1 = without_http2_options(&rendered)?;
    sharded_config(shards, &http1, upstream_port, wasm, filter_config)
}

/// Another bootstrap template (`append_shard_clusters`: its clusters list ends the file)
/// with the shards' clusters appended, with `wasm` and `filter_config`; its own
/// placeholders as `single-node.yaml`'s (more with `EnvoyConfig::with_port`/`with_var`).
pub fn sharded_bootstrap_config(
    bootstrap: &Path,
    shards: &[(&str, &EtcdCluster)],
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let template = read_template(bootstrap)?;
    let rendered = append_shard_clusters(&template, &shard_ports(shards)?)?;
    sharded_config(shards, &rendered, upstream_port, wasm, filter_config)
}

/// A sharded store behind a listener that comes by LDS (`single-node-lds.yaml` with
/// the shards' clusters, its listener `lds/ingress-listener.yaml`), so that a test can
/// push another shard map live (`EnvoyProcess::apply_filter_config`). Every cluster a
/// pushed map may name must be among `shards` from the start: the clusters are static.
pub fn sharded_proxy_lds_config(
    shards: &[(&str, &EtcdCluster)],
    upstream_port: u16,
    wasm: &Path,
    filter_config: &str,
) -> Result<EnvoyConfig> {
    let ports = shard_ports(shards)?;
    proxy_config_on_ports(
        &shards[0].1.dir,
        &ports,
        upstream_port,
        wasm,
        filter_config,
        true,
    )
}

fn read_template(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) => fail!("cannot read {}: {e}", path.display()),
    }
}

/// Write a rendered template as `<stem>-<n>.yaml` in `dir` (a cluster's run directory:
/// removed with its logs).
fn write_template(dir: &Path, stem: &str, text: &str) -> Result<PathBuf> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let path = dir.join(format!(
        "{stem}-{}.yaml",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    if let Err(e) = std::fs::write(&path, text) {
        fail!("cannot write {}: {e}", path.display());
    }
    Ok(path)
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

    #[test]
    fn shard_clusters_are_appended_to_a_bootstrap_whose_clusters_end_it() {
        for bootstrap in [crate::config::SINGLE_NODE_LDS, "admin-api.yaml"] {
            let template = std::fs::read_to_string(config_file(bootstrap)).unwrap();
            let out = append_shard_clusters(
                &template,
                &[
                    ("etcd_a", vec![5001, 5002, 5003]),
                    ("etcd_c", vec![7001, 7002, 7003]),
                ],
            )
            .unwrap();
            assert!(out.starts_with(&template), "{bootstrap}");
            let added = &out[template.len()..];
            assert!(
                added.starts_with("  - name: etcd_a\n"),
                "{bootstrap}: {added}"
            );
            assert!(
                added.contains("\n  - name: etcd_c\n"),
                "{bootstrap}: {added}"
            );
            assert!(
                added.contains("      cluster_name: etcd_c\n"),
                "{bootstrap}"
            );
            assert!(added.contains("port_value: 7003 "), "{bootstrap}");
            assert!(!added.contains("port_value: 2379 "), "{bootstrap}");
        }
        // A bootstrap without a clusters list, or with one that another top-level
        // section follows, is refused.
        assert!(append_shard_clusters("static_resources:\n  listeners: []\n", &[]).is_err());
        let t = "static_resources:\n  clusters:\n  - name: service\nlayered_runtime: {}\n";
        assert!(append_shard_clusters(t, &[]).is_err());
    }
}
