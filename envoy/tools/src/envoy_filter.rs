//! The filter's Envoy block generated from its configuration (`dedupctl envoy-filter`):
//! the Wasm filter wrapped in Envoy's own matching (`ExtensionWithMatcher`), so a
//! request whose method no policy deduplicates skips the filter (`SkipFilter`) and
//! never enters Wasm. The configuration is checked by the filter's own parser first,
//! so the block and the filter cannot disagree.

use dedup_core::config::{Config, Role};

/// Where the generated block's Wasm module and VM come from.
#[derive(Debug, Clone)]
pub struct FilterBlock<'a> {
    /// The filter's JSON configuration, as the plugin's `configuration` carries it.
    pub config: &'a str,
    pub wasm_path: &'a str,
    pub vm_id: &'a str,
}

/// The methods some policy (top level or a rule that is not bypassed) deduplicates,
/// sorted and without repeats.
pub fn deduplicated_methods(config: &Config) -> Vec<String> {
    let mut methods: Vec<String> = std::iter::once(&config.policy)
        .chain(config.rules.iter().map(|r| &r.policy))
        .filter(|p| !p.bypass)
        .flat_map(|p| p.methods.iter().cloned())
        .collect();
    methods.sort();
    methods.dedup();
    methods
}

/// The value of the templates' `{{DEDUP_METHODS}}`: an RE2 alternation of the methods
/// the configuration deduplicates (`POST|PATCH`), which Envoy's matcher compares with
/// the whole `:method`. Methods are upper-case letters only (the parser refuses
/// others), so nothing needs escaping. The operator API (`"role": "admin"`) answers
/// every method: `.*`, so the matcher never skips it.
pub fn methods_regex(config: &Config) -> String {
    if config.role == Role::Admin {
        return ".*".to_string();
    }
    deduplicated_methods(config).join("|")
}

/// `methods_regex` of a JSON configuration; one the filter refuses gets the methods
/// of the defaults (Envoy refuses the configuration anyway).
pub fn methods_regex_of(config_json: &str) -> String {
    match Config::parse(config_json.as_bytes()) {
        Ok(c) => methods_regex(&c),
        Err(_) => methods_regex(&Config::default()),
    }
}

/// What `request_id_preserved: true` says of the http_connection_manager, printed as
/// YAML comments above the block (they belong on the connection manager, not the
/// filter list).
pub const REQUEST_ID_SETTINGS: &str = "\
# request_id_preserved: set these on this http_connection_manager (beside
# stat_prefix), or Envoy generates an x-request-id for every request without one
# and replaces an outside client's before the filter reads it:
#   preserve_external_request_id: true
#   generate_request_id: false
# With tracing, also keep Envoy from rewriting a client's UUID:
#   request_id_extension:
#     typed_config:
#       \"@type\": type.googleapis.com/envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig
#       pack_trace_reason: false";

/// YAML single-quoted scalar.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl FilterBlock<'_> {
    /// One `http_filters` entry, indented for a list at `indent` spaces. `Err` names the
    /// configuration field the filter would refuse, as it would log it.
    pub fn render(&self, indent: usize) -> Result<String, String> {
        let config = Config::parse(self.config.as_bytes()).map_err(|e| e.to_string())?;
        let pad = " ".repeat(indent);
        let mut out = String::new();
        let mut line = |depth: usize, text: &str| {
            out.push_str(&pad);
            out.push_str(&"  ".repeat(depth));
            out.push_str(text);
            out.push('\n');
        };
        if config.request_id_preserved {
            // `request_id_preserved` asserts these of the connection manager; without
            // them Envoy puts its own `x-request-id` where the filter reads the client's.
            for text in REQUEST_ID_SETTINGS.lines() {
                line(0, text);
            }
        }
        line(0, "- name: proxy_dedup");
        line(1, "typed_config:");
        line(
            2,
            "\"@type\": type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher",
        );
        line(2, "extension_config:");
        line(3, "name: proxy_dedup");
        line(3, "typed_config:");
        line(
            4,
            "\"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        );
        line(4, "config:");
        line(5, "name: proxy_dedup");
        line(5, "root_id: \"\"");
        line(5, "failure_policy: FAIL_CLOSED");
        line(5, "allow_on_headers_stop_iteration: true");
        line(5, "configuration:");
        line(
            6,
            "\"@type\": type.googleapis.com/google.protobuf.StringValue",
        );
        line(6, &format!("value: {}", quoted(self.config)));
        line(5, "vm_config:");
        line(6, &format!("vm_id: {}", quoted(self.vm_id)));
        line(6, "runtime: envoy.wasm.runtime.v8");
        line(6, "code:");
        line(7, "local:");
        line(8, &format!("filename: {}", quoted(self.wasm_path)));
        // Skip the filter when the method is none of those deduplicated (the same
        // matcher as the shipped templates', with `{{DEDUP_METHODS}}` filled in).
        line(2, "xds_matcher:");
        line(3, "matcher_list:");
        line(4, "matchers:");
        line(4, "- predicate:");
        line(6, "not_matcher:");
        line(7, "single_predicate:");
        line(8, "input:");
        line(9, "name: method");
        line(9, "typed_config:");
        line(
            10,
            "\"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
        );
        line(10, "header_name: \":method\"");
        line(8, "value_match:");
        line(
            9,
            &format!(
                "safe_regex: {{ google_re2: {{}}, regex: \"{}\" }}",
                methods_regex(&config)
            ),
        );
        line(5, "on_match:");
        line(6, "action:");
        line(7, "name: skip");
        line(7, "typed_config:");
        line(
            8,
            "\"@type\": type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter",
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_methods_are_those_some_policy_deduplicates() {
        let c = Config::parse(
            br#"{"methods": ["POST"], "rules": [
                {"name": "put", "match": {"path_prefix": "/p"}, "methods": ["PUT", "POST"]},
                {"name": "skip", "match": {"path_prefix": "/s"}, "bypass": true}]}"#,
        )
        .unwrap();
        assert_eq!(deduplicated_methods(&c), ["POST", "PUT"]);
        assert_eq!(methods_regex(&c), "POST|PUT");
        let admin = Config::parse(br#"{"role": "admin"}"#).unwrap();
        assert_eq!(methods_regex(&admin), ".*");
        assert_eq!(methods_regex_of("{"), "PATCH|POST");
    }

    #[test]
    fn a_preserved_request_id_prints_the_connection_managers_settings() {
        let with = FilterBlock {
            config: r#"{"request_id_preserved": true, "key": {"headers": ["x-request-id"]}}"#,
            wasm_path: "/w.wasm",
            vm_id: "proxy_dedup",
        };
        let y = with.render(10).unwrap();
        for want in [
            "#   preserve_external_request_id: true",
            "#   generate_request_id: false",
            "pack_trace_reason: false",
        ] {
            assert!(y.contains(want), "{want}: {y}");
        }
        assert!(y.lines().all(|l| l.starts_with(&" ".repeat(10))), "{y}");
        let without = FilterBlock {
            config: "{}",
            ..with
        };
        assert!(!without
            .render(0)
            .unwrap()
            .contains("preserve_external_request_id"));
        // Without the assertion, naming x-request-id is refused, with the settings named.
        let refused = FilterBlock {
            config: r#"{"key": {"headers": ["x-request-id"]}}"#,
            ..with
        };
        assert!(refused
            .render(0)
            .unwrap_err()
            .contains("preserve_external_request_id"));
    }

    #[test]
    fn a_bad_configuration_is_refused_with_the_field_the_filter_names() {
        let b = FilterBlock {
            config: r#"{"ttl_seconds": 0}"#,
            wasm_path: "/x.wasm",
            vm_id: "proxy_dedup",
        };
        assert!(b.render(0).unwrap_err().contains("ttl_seconds"));
    }

    #[test]
    fn the_block_quotes_the_configuration_and_matches_every_method() {
        let b = FilterBlock {
            config: r#"{"methods": ["POST", "PATCH"], "replayed_header": "x-it's"}"#,
            wasm_path: "/w.wasm",
            vm_id: "proxy_dedup",
        };
        let y = b.render(2).unwrap();
        assert!(
            y.contains(r#"value: '{"methods": ["POST", "PATCH"], "replayed_header": "x-it''s"}'"#),
            "{y}"
        );
        assert!(
            y.contains(r#"safe_regex: { google_re2: {}, regex: "PATCH|POST" }"#),
            "{y}"
        );
        assert!(y.lines().all(|l| l.starts_with("  ")), "{y}");
    }
}
