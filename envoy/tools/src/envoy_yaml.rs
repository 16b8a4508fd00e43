//! The proxy-dedup filters inside an Envoy or Istio YAML file, checked as the filter
//! would check them (`dedupctl check-config FILE.yaml`, `dedupctl render`): a bootstrap's
//! static listeners, an LDS file's listeners, an Istio `WasmPlugin`'s `pluginConfig`
//! and an `EnvoyFilter`'s patched-in Wasm filter. Each configuration goes through the
//! filter's own parser, and every Envoy cluster it names (the etcd store's clusters and
//! shards, a detached upstream's cluster) must be one the file (or another file given)
//! defines: Envoy's own `--mode validate` checks neither when the module is fetched
//! remotely or the listener comes by LDS, and a missing cluster shows only at run time
//! (every store call or detached call fails).

use dedup_core::config::Config;
use serde_json::Value as Json;
use yaml_rust2::{Yaml, YamlLoader};

const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";

/// One proxy-dedup filter found in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Where it is, for messages: `listener ingress, filter proxy_dedup`.
    pub at: String,
    /// Its configuration (JSON text), or why it cannot be read.
    pub config: Result<String, String>,
}

/// What a file holds: its proxy-dedup filters and the clusters it defines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    pub filters: Vec<Found>,
    /// `static_resources.clusters[].name` of every bootstrap in the file.
    pub clusters: Vec<String>,
    /// Whether a bootstrap in it defines clusters at all (statically or by CDS): an LDS
    /// file or an Istio object does not, and its clusters cannot be checked alone.
    pub defines_clusters: bool,
    /// Whether clusters also come by CDS (then a missing one may still arrive).
    pub cds: bool,
}

/// Reads `text` (one or more YAML documents).
pub fn inspect(text: &str) -> Result<Inspection, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    let mut out = Inspection::default();
    for doc in &docs {
        if let Some(list) = doc["static_resources"]["clusters"].as_vec() {
            out.defines_clusters = true;
            out.clusters.extend(
                list.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_string)),
            );
        }
        if !doc["dynamic_resources"]["cds_config"].is_badvalue() {
            out.defines_clusters = true;
            out.cds = true;
        }
        if doc["kind"].as_str() == Some("WasmPlugin") {
            let name = doc["metadata"]["name"].as_str().unwrap_or("?");
            if is_ours(&[name, doc["spec"]["url"].as_str().unwrap_or("")]) {
                let config = match &doc["spec"]["pluginConfig"] {
                    Yaml::BadValue | Yaml::Null => Ok(String::new()),
                    v => to_json(v).map(|j| j.to_string()),
                };
                out.filters.push(Found {
                    at: format!("WasmPlugin {name}, pluginConfig"),
                    config,
                });
            }
            continue;
        }
        let label = match (doc["kind"].as_str(), doc["metadata"]["name"].as_str()) {
            (Some(kind), Some(name)) => format!("{kind} {name}, "),
            _ => String::new(),
        };
        walk(doc, &label, &mut out.filters);
    }
    Ok(out)
}

/// Whether a Wasm filter is proxy-dedup's: its name, VM or module says so.
fn is_ours(names: &[&str]) -> bool {
    names.iter().any(|n| n.contains("dedup"))
}

fn walk(node: &Yaml, at: &str, found: &mut Vec<Found>) {
    match node {
        Yaml::Array(list) => list.iter().for_each(|n| walk(n, at, found)),
        Yaml::Hash(map) => {
            // A listener names what follows.
            let here = match (node["name"].as_str(), node["filter_chains"].is_badvalue()) {
                (Some(name), false) => format!("{at}listener {name}, "),
                _ => at.to_string(),
            };
            let wasm = if node["@type"].as_str() == Some(WASM_TYPE) {
                Some(node)
            } else if node["type_url"].as_str() == Some(WASM_TYPE) {
                Some(&node["value"]) // a TypedStruct
            } else {
                None
            };
            if let Some(w) = wasm {
                let c = &w["config"];
                let name = c["name"].as_str().unwrap_or("?");
                let code = &c["vm_config"]["code"];
                let module = code["local"]["filename"]
                    .as_str()
                    .or(code["remote"]["http_uri"]["uri"].as_str())
                    .unwrap_or("");
                let vm = c["vm_config"]["vm_id"].as_str().unwrap_or("");
                if is_ours(&[name, module, vm]) {
                    found.push(Found {
                        at: format!("{here}filter {name}"),
                        config: configuration(&c["configuration"]),
                    });
                }
                return;
            }
            map.values().for_each(|v| walk(v, &here, found));
        }
        _ => {}
    }
}

/// The plugin configuration of a Wasm filter's `configuration` (a StringValue).
fn configuration(c: &Yaml) -> Result<String, String> {
    match c {
        Yaml::BadValue | Yaml::Null => Ok(String::new()),
        _ if c["@type"].as_str() == Some(STRING_VALUE) => match &c["value"] {
            Yaml::String(s) => Ok(s.clone()),
            Yaml::BadValue | Yaml::Null => Ok(String::new()),
            other => Err(format!(
                "`configuration.value` must be a string (the JSON, quoted), not {other:?}"
            )),
        },
        _ => Err(format!(
            "`configuration` must be a {STRING_VALUE} holding the JSON configuration"
        )),
    }
}

/// A YAML value as JSON (an Istio `pluginConfig` is handed to the filter as JSON).
pub fn to_json(y: &Yaml) -> Result<Json, String> {
    Ok(match y {
        Yaml::Null => Json::Null,
        Yaml::Boolean(b) => Json::Bool(*b),
        Yaml::Integer(i) => Json::from(*i),
        Yaml::String(s) => Json::String(s.clone()),
        Yaml::Real(r) => match r.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
            Some(n) => Json::Number(n),
            None => return Err(format!("`{r}` is not a JSON number")),
        },
        Yaml::Array(list) => Json::Array(list.iter().map(to_json).collect::<Result<_, _>>()?),
        Yaml::Hash(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => return Err(format!("a mapping key JSON cannot hold: {other:?}")),
                };
                out.insert(key, to_json(v)?);
            }
            Json::Object(out)
        }
        Yaml::Alias(_) | Yaml::BadValue => return Err("a YAML alias JSON cannot hold".into()),
    })
}

/// The Envoy clusters a configuration names, each with its field: `store.cluster`,
/// `store.shards[1].cluster` (and the previous or next map's), `upstream.cluster`,
/// `rules[2].upstream.cluster`. Read from the JSON as written, so a message names the
/// field the user wrote.
pub fn clusters_named(config: &Json) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let store = &config["store"];
    if let Some(c) = store["cluster"].as_str() {
        out.push(("store.cluster".to_string(), c.to_string()));
    }
    for map in ["shards", "previous_shards", "next_shards"] {
        for (i, s) in store[map].as_array().into_iter().flatten().enumerate() {
            if let Some(c) = s["cluster"].as_str() {
                out.push((format!("store.{map}[{i}].cluster"), c.to_string()));
            }
        }
    }
    let upstream = |prefix: &str, policy: &Json, out: &mut Vec<(String, String)>| {
        if let Some(c) = policy["upstream"]["cluster"].as_str() {
            out.push((format!("{prefix}upstream.cluster"), c.to_string()));
        }
    };
    upstream("", config, &mut out);
    for (i, r) in config["rules"].as_array().into_iter().flatten().enumerate() {
        upstream(&format!("rules[{i}]."), r, &mut out);
    }
    out
}

/// The problems of one filter's configuration (empty: none): the parser's error, or
/// each cluster it names that `defined` lacks (`None`: clusters not known here).
pub fn problems(config: &str, defined: Option<&[String]>, file: &str) -> Vec<String> {
    if let Err(e) = Config::parse(config.as_bytes()) {
        return vec![e.to_string()];
    }
    let Some(defined) = defined else {
        return Vec::new();
    };
    let value: Json = if config.trim().is_empty() {
        Json::Object(Default::default())
    } else {
        serde_json::from_str(config).unwrap_or_default()
    };
    clusters_named(&value)
        .into_iter()
        .filter(|(_, c)| !defined.iter().any(|d| d == c))
        .map(|(field, c)| {
            let have = if defined.is_empty() {
                "none".to_string()
            } else {
                defined
                    .iter()
                    .map(|d| format!("`{d}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "`{field}` names the Envoy cluster `{c}`, which {file} does not define (its clusters: {have}): \
                 every call to it would fail at run time; add a cluster named `{c}` or name one of these"
            )
        })
        .collect()
}

/// Whether a file given to `check-config` is YAML (an Envoy or Istio file), not the
/// filter's JSON: by its name, else by its first character.
pub fn is_yaml(path: &str, text: &str) -> bool {
    // A `.json` file, or JSON text (an object, or an array the filter refuses with its
    // own message), is the filter's configuration itself.
    if path.ends_with(".json") {
        return false;
    }
    path.ends_with(".yaml")
        || path.ends_with(".yml")
        || !(text.trim_start().starts_with(['{', '[']) || text.trim().is_empty())
}

/// The clusters other files define (`--clusters-from`): a listener file's filter may
/// name the bootstrap's clusters.
pub fn clusters_of_files(files: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        let i = inspect(&text).map_err(|e| format!("{f}: {e}"))?;
        if !i.defines_clusters {
            return Err(format!(
                "{f}: defines no clusters (static_resources.clusters)"
            ));
        }
        out.extend(i.clusters);
    }
    Ok(out)
}

/// Checks every proxy-dedup filter of an inspected file, writing one line per filter
/// to `out` (ok) or `err` (its problems); whether all passed. `name` is the file as
/// messages name it; `others` the clusters of `--clusters-from` files (`None`: none given).
pub fn report(
    name: &str,
    i: &Inspection,
    others: Option<&[String]>,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<bool> {
    if i.filters.is_empty() {
        writeln!(err, "{name}: no proxy-dedup filter found (a Wasm filter whose name, vm_id or module names dedup, or an Istio WasmPlugin)")?;
        return Ok(false);
    }
    let mut defined: Vec<String> = i.clusters.clone();
    defined.extend(others.into_iter().flatten().cloned());
    // Clusters are known when the file or a --clusters-from file defines them, and
    // none may come by CDS.
    let known = (i.defines_clusters || others.is_some()) && !i.cds;
    let mut ok = true;
    for f in &i.filters {
        let config = match &f.config {
            Ok(c) => c,
            Err(e) => {
                writeln!(err, "{name}: {}: {e}", f.at)?;
                ok = false;
                continue;
            }
        };
        let found = problems(config, known.then_some(&defined[..]), name);
        if found.is_empty() {
            let note = if known {
                ""
            } else if i.cds {
                " (clusters not checked: they come by CDS)"
            } else {
                " (clusters not checked: the file defines none; for an LDS listener file, name its bootstrap with --clusters-from)"
            };
            writeln!(out, "{name}: {}: ok{note}", f.at)?;
        } else {
            ok = false;
            for p in found {
                writeln!(err, "{name}: {}: {p}", f.at)?;
            }
        }
    }
    Ok(ok)
}

/// `dedupctl check-config FILE.yaml [--clusters-from FILE]...`: every proxy-dedup filter
/// in an Envoy bootstrap, an LDS file or Istio objects. Exit status 0, 1 (a problem) or
/// 2 (usage, unreadable).
pub fn check_command(
    file: &str,
    text: &str,
    flags: &[String],
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<u8> {
    let mut from = Vec::new();
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next()) {
            ("--clusters-from", Some(f)) => from.push(f.clone()),
            (other, _) => {
                writeln!(err, "check-config {file}: unexpected `{other}` (a YAML file takes --clusters-from FILE)")?;
                return Ok(2);
            }
        }
    }
    let others = match clusters_of_files(&from) {
        Ok(c) => c,
        Err(e) => {
            writeln!(err, "{e}")?;
            return Ok(2);
        }
    };
    let i = match inspect(text) {
        Ok(i) => i,
        Err(e) => {
            writeln!(err, "{file}: {e}")?;
            return Ok(1);
        }
    };
    let ok = report(
        file,
        &i,
        (!from.is_empty()).then_some(&others[..]),
        out,
        err,
    )?;
    Ok(if ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const BOOTSTRAP: &str = r#"
static_resources:
  listeners:
  - name: ingress
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          http_filters:
          - name: proxy_dedup
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher
              extension_config:
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
                  config:
                    name: proxy_dedup
                    configuration:
                      "@type": type.googleapis.com/google.protobuf.StringValue
                      value: '{"upstream": {"detached": true, "cluster": "payments"}}'
          - name: other
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config: { name: other, configuration: { "@type": type.googleapis.com/google.protobuf.StringValue, value: "not json" } }
  clusters:
  - name: service
"#;

    #[test]
    fn a_bootstraps_filter_and_clusters_are_found() {
        let i = inspect(BOOTSTRAP).unwrap();
        assert_eq!(i.clusters, ["service"]);
        assert!(i.defines_clusters && !i.cds);
        assert_eq!(i.filters.len(), 1, "{:?}", i.filters);
        let f = &i.filters[0];
        assert_eq!(f.at, "listener ingress, filter proxy_dedup");
        let config = f.config.clone().unwrap();
        let p = problems(&config, Some(&i.clusters), "envoy.yaml");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("`upstream.cluster` names the Envoy cluster `payments`, which envoy.yaml does not define (its clusters: `service`)"),
            "{}",
            p[0]
        );
        let fixed = config.replace("payments", "service");
        assert!(problems(&fixed, Some(&i.clusters), "envoy.yaml").is_empty());
        let bad = problems(r#"{"ttl_second": 1}"#, None, "x");
        assert!(bad[0].contains("ttl_second"), "{bad:?}");
    }

    #[test]
    fn istio_objects_are_read() {
        let text = r#"
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: proxy-dedup }
spec:
  url: oci://r/proxy-dedup@sha256:00
  pluginConfig:
    key: { required: true }
    ttl_seconds: 60
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: { name: proxy-dedup }
spec:
  configPatches:
  - patch:
      value:
        name: proxy_dedup
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
          config:
            name: proxy_dedup
            configuration:
              "@type": type.googleapis.com/google.protobuf.StringValue
              value: '{"ttl_second": 1}'
"#;
        let i = inspect(text).unwrap();
        assert!(!i.defines_clusters);
        assert_eq!(i.filters.len(), 2);
        assert_eq!(i.filters[0].at, "WasmPlugin proxy-dedup, pluginConfig");
        let plugin: Json = serde_json::from_str(i.filters[0].config.as_ref().unwrap()).unwrap();
        assert_eq!(
            plugin,
            serde_json::json!({"key": {"required": true}, "ttl_seconds": 60})
        );
        assert_eq!(
            i.filters[1].at,
            "EnvoyFilter proxy-dedup, filter proxy_dedup"
        );
        let p = problems(i.filters[1].config.as_ref().unwrap(), None, "istio.yaml");
        assert!(p[0].contains("`ttl_second`"), "{p:?}");
    }

    #[test]
    fn every_named_cluster_has_its_field() {
        let c = serde_json::json!({"store": {"kind": "etcd", "shards": [{"cluster": "a"}, {"cluster": "b"}],
            "next_shards": [{"cluster": "c"}]},
            "rules": [{"name": "r", "upstream": {"detached": true, "cluster": "d"}}]});
        let named: Vec<String> = clusters_named(&c)
            .into_iter()
            .map(|(f, c)| format!("{f}={c}"))
            .collect();
        assert_eq!(
            named,
            [
                "store.shards[0].cluster=a",
                "store.shards[1].cluster=b",
                "store.next_shards[0].cluster=c",
                "rules[0].upstream.cluster=d"
            ]
        );
    }
}
