//! The etcd clusters of a rendered template (`dedupctl render --members`): the shipped
//! `multi-proxy-etcd.yaml` has one Envoy cluster named `etcd`, whose endpoint lines end
//! in `# etcd member N`. `--members NAME=HOST:PORT,...` points a cluster at its members:
//! for `etcd`, the template's own cluster; for any other name, a copy of it (its HTTP/2
//! options, health checks, outlier detection and timeouts) renamed to NAME, one per
//! shard of `store.shards`. When no `--members` names `etcd`, the copies take its place;
//! when one does, they follow it.

/// One `--members` value: an Envoy cluster and its members, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    pub cluster: String,
    pub hosts: Vec<(String, u16)>,
}

/// The marker that ends each member's endpoint line.
pub const MEMBER_MARKER: &str = "# etcd member ";
/// The template's etcd cluster entry.
const ENTRY: &str = "  - name: etcd\n";

impl Members {
    /// `NAME=HOST:PORT[,HOST:PORT]...` (an IPv6 address in brackets: `[::1]:2379`).
    pub fn parse(text: &str) -> Result<Members, String> {
        let (cluster, list) = text.split_once('=').ok_or(format!(
            "--members {text}: expected CLUSTER=HOST:PORT[,HOST:PORT]..."
        ))?;
        let name_ok = !cluster.is_empty()
            && cluster.len() <= 64
            && cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !name_ok {
            return Err(format!(
                "--members {text}: the cluster name {cluster:?} must be 1-64 letters, digits, `_`, `-` or `.`"
            ));
        }
        let mut hosts = Vec::new();
        for member in list.split(',') {
            let (host, port) = member
                .rsplit_once(':')
                .ok_or(format!("--members {text}: {member:?} is not HOST:PORT"))?;
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or(format!("--members {text}: {member:?} has no port 1-65535"))?;
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let host_ok = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
            if !host_ok {
                return Err(format!(
                    "--members {text}: {host:?} is not a host name or address"
                ));
            }
            hosts.push((host.to_string(), port));
        }
        Ok(Members {
            cluster: cluster.to_string(),
            hosts,
        })
    }

    /// Every member an IP address: the cluster can stay `STATIC`.
    fn all_addresses(&self) -> bool {
        self.hosts
            .iter()
            .all(|(h, _)| h.parse::<std::net::IpAddr>().is_ok())
    }
}

/// Where the template's `etcd` cluster entry starts and ends (`  - name: etcd`, to the
/// next entry of the list or the end of the file).
pub fn etcd_cluster_span(template: &str) -> Result<(usize, usize), String> {
    let start = template
        .find(ENTRY)
        .ok_or("the template has no `  - name: etcd` cluster to point at members")?;
    let body_from = start + ENTRY.len();
    let mut len = 0;
    for line in template[body_from..].split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if !text.is_empty() && (indent < 4 || line.starts_with("  - ")) {
            break;
        }
        len += line.len();
    }
    Ok((start, body_from + len))
}

/// The `etcd` cluster entry `block` as the cluster `m.cluster` of `m.hosts`: renamed
/// (`name`, `load_assignment.cluster_name`), its member lines replaced by one per host,
/// and `STRICT_DNS` instead of `STATIC` when a host is a name.
pub fn cluster_copy(block: &str, m: &Members) -> Result<String, String> {
    let mut out = String::with_capacity(block.len());
    let mut members_written = false;
    for line in block.split_inclusive('\n') {
        let code = line.split('#').next().unwrap_or("");
        if line.contains(MEMBER_MARKER) && !line.trim_start().starts_with('#') {
            if !members_written {
                let indent = &line[..line.len() - line.trim_start().len()];
                for (i, (host, port)) in m.hosts.iter().enumerate() {
                    out.push_str(&format!(
                        "{indent}- endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}   {MEMBER_MARKER}{}\n",
                        i + 1
                    ));
                }
                members_written = true;
            }
            continue;
        }
        if line == ENTRY {
            out.push_str(&format!("  - name: {}\n", m.cluster));
        } else if code.trim() == "cluster_name: etcd" {
            out.push_str(&line.replacen(
                "cluster_name: etcd",
                &format!("cluster_name: {}", m.cluster),
                1,
            ));
        } else if code.trim() == "type: STATIC" && !m.all_addresses() {
            out.push_str(&line.replacen("type: STATIC", "type: STRICT_DNS", 1));
        } else {
            out.push_str(line);
        }
    }
    if !members_written {
        return Err(format!(
            "the template's etcd cluster has no endpoint line ending in `{MEMBER_MARKER}N`"
        ));
    }
    Ok(out)
}

/// `text` with its `etcd` cluster pointed at members as `members` say (see the module).
pub fn apply(text: &str, members: &[Members]) -> Result<String, String> {
    if members.is_empty() {
        return Ok(text.to_string());
    }
    for (i, m) in members.iter().enumerate() {
        if members[..i].iter().any(|o| o.cluster == m.cluster) {
            return Err(format!("--members names the cluster {} twice", m.cluster));
        }
    }
    let (start, end) = etcd_cluster_span(text)?;
    // The template's own cluster first (when named), then the copies in the given order.
    let mut ordered: Vec<&Members> = members.iter().filter(|m| m.cluster == "etcd").collect();
    ordered.extend(members.iter().filter(|m| m.cluster != "etcd"));
    let copies = cluster_copies(&text[start..end], ordered)?;
    Ok(format!("{}{copies}{}", &text[..start], &text[end..]))
}

/// The `etcd` cluster entry `block` once per `members`, in order (`cluster_copy`).
pub fn cluster_copies<'m>(
    block: &str,
    members: impl IntoIterator<Item = &'m Members>,
) -> Result<String, String> {
    let mut copies = String::new();
    for m in members {
        copies.push_str(&cluster_copy(block, m)?);
    }
    Ok(copies)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TEMPLATE: &str = "static_resources:\n  clusters:\n  - name: service\n    type: STATIC\n  - name: etcd\n    type: STATIC\n    # a comment: cluster_name: etcd\n    load_assignment:\n      cluster_name: etcd\n      endpoints:\n      - lb_endpoints:\n        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 2379 } } }   # etcd member 1\n        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 22379 } } }  # etcd member 2\n";

    #[test]
    fn members_parse_hosts_ports_and_refuse_what_is_not_one() {
        let m = Members::parse("etcd_a=10.0.0.1:2379,etcd-1.example:2379,[::1]:12379").unwrap();
        assert_eq!(m.cluster, "etcd_a");
        assert_eq!(
            m.hosts,
            vec![
                ("10.0.0.1".into(), 2379),
                ("etcd-1.example".into(), 2379),
                ("::1".into(), 12379)
            ]
        );
        for bad in [
            "etcd",
            "=1.2.3.4:1",
            "a b=1.2.3.4:1",
            "e=1.2.3.4",
            "e=1.2.3.4:0",
            "e=1.2.3.4:x",
            "e=:2379",
            "e=a/b:1",
        ] {
            assert!(Members::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_etcd_cluster_gets_its_members_and_shards_get_copies_in_its_place() {
        let own = apply(
            TEMPLATE,
            &[Members::parse("etcd=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3").unwrap()],
        )
        .unwrap();
        assert!(
            own.contains("port_value: 1 } } }   # etcd member 1\n"),
            "{own}"
        );
        assert!(
            own.contains("port_value: 3 } } }   # etcd member 3\n"),
            "{own}"
        );
        assert!(!own.contains("2379"), "{own}");
        assert!(own.starts_with("static_resources:\n  clusters:\n  - name: service\n"));

        let shards = apply(
            TEMPLATE,
            &[
                Members::parse("etcd_a=127.0.0.1:7").unwrap(),
                Members::parse("etcd_b=etcd-b.example:2379").unwrap(),
            ],
        )
        .unwrap();
        assert!(!shards.contains("  - name: etcd\n"), "{shards}");
        let a = shards.find("  - name: etcd_a\n").unwrap();
        let b = shards.find("  - name: etcd_b\n").unwrap();
        assert!(a < b);
        assert_eq!(
            shards.matches("cluster_name: etcd_a\n").count(),
            1,
            "{shards}"
        );
        assert_eq!(shards.matches("cluster_name: etcd_b\n").count(), 1);
        // A comment naming the cluster is left alone; a DNS member needs STRICT_DNS.
        assert_eq!(
            shards.matches("# a comment: cluster_name: etcd\n").count(),
            2
        );
        assert_eq!(
            shards[b..].matches("type: STRICT_DNS").count(),
            1,
            "{shards}"
        );
        assert_eq!(shards[a..b].matches("type: STATIC").count(), 1);
        assert!(shards[b..].contains("address: etcd-b.example, port_value: 2379"));

        let both = apply(
            TEMPLATE,
            &[
                Members::parse("etcd_b=127.0.0.1:8").unwrap(),
                Members::parse("etcd=127.0.0.1:9").unwrap(),
            ],
        )
        .unwrap();
        assert!(both.find("  - name: etcd\n").unwrap() < both.find("  - name: etcd_b\n").unwrap());

        let twice = [
            Members::parse("e=1.1.1.1:1").unwrap(),
            Members::parse("e=1.1.1.1:2").unwrap(),
        ];
        assert!(apply(TEMPLATE, &twice).unwrap_err().contains("twice"));
        assert!(apply("static_resources: {}\n", &twice[..1])
            .unwrap_err()
            .contains("no `  - name: etcd`"));
    }
}
