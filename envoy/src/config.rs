//! Envoy configs from the templates in `envoy/configs/`: `{{NAME}}` placeholders
//! replaced by ports, the module path and the filter's JSON configuration.

use crate::paths::config_file;
use crate::ports::free_port;
use crate::{fail, Result};
use std::path::{Path, PathBuf};

/// The main template: listener -> dedup Wasm filter -> router -> upstream.
pub const SINGLE_NODE: &str = "single-node.yaml";
/// The same listener and cluster without any Wasm filter (benchmark baseline).
pub const NO_FILTER: &str = "no-filter.yaml";

/// Replace every `{{NAME}}` outside comment lines with its value from `vars`.
/// A placeholder with no value is an error; comment lines are left as written
/// (they document the placeholders).
pub fn render(template: &str, vars: &[(&str, String)]) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    for line in template.split_inclusive('\n') {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("{{") {
            let Some(len) = rest[at..].find("}}") else {
                fail!("unterminated placeholder in config line {line:?}");
            };
            let name = &rest[at + 2..at + len];
            let Some((_, value)) = vars.iter().find(|(n, _)| *n == name) else {
                fail!("no value for placeholder {{{{{name}}}}} in config line {line:?}");
            };
            out.push_str(&rest[..at]);
            out.push_str(value);
            rest = &rest[at + len + 2..];
        }
        out.push_str(rest);
    }
    Ok(out)
}

/// A filter configuration inside the template's single-quoted YAML string.
fn yaml_single_quoted(json: &str) -> String {
    json.replace('\'', "''")
}

/// Everything needed to render one Envoy config.
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    pub template: PathBuf,
    pub listen_port: u16,
    pub admin_port: u16,
    pub upstream_port: u16,
    pub wasm_path: Option<PathBuf>,
    /// The filter's JSON configuration (`{}`: defaults).
    pub filter_config: String,
}

impl EnvoyConfig {
    /// `single-node.yaml` with `wasm` and `filter_config`, on fresh loopback ports.
    pub fn single_node(upstream_port: u16, wasm: &Path, filter_config: &str) -> Result<Self> {
        Ok(EnvoyConfig {
            template: config_file(SINGLE_NODE),
            listen_port: free_port()?,
            admin_port: free_port()?,
            upstream_port,
            wasm_path: Some(wasm.to_path_buf()),
            filter_config: filter_config.to_string(),
        })
    }

    /// `no-filter.yaml`, on fresh loopback ports.
    pub fn no_filter(upstream_port: u16) -> Result<Self> {
        Ok(EnvoyConfig {
            template: config_file(NO_FILTER),
            listen_port: free_port()?,
            admin_port: free_port()?,
            upstream_port,
            wasm_path: None,
            filter_config: "{}".into(),
        })
    }

    /// New listener and admin ports (after a bind clash).
    pub fn reassign_ports(&mut self) -> Result<()> {
        self.listen_port = free_port()?;
        self.admin_port = free_port()?;
        Ok(())
    }

    pub fn render(&self) -> Result<String> {
        let template = match std::fs::read_to_string(&self.template) {
            Ok(t) => t,
            Err(e) => fail!("cannot read {}: {e}", self.template.display()),
        };
        let wasm = self
            .wasm_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        render(
            &template,
            &[
                ("LISTEN_PORT", self.listen_port.to_string()),
                ("ADMIN_PORT", self.admin_port.to_string()),
                ("UPSTREAM_PORT", self.upstream_port.to_string()),
                ("WASM_PATH", wasm),
                ("FILTER_CONFIG", yaml_single_quoted(&self.filter_config)),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_rejects_leftovers() {
        let t = "  # {{P}} stays in comments\nport: {{P}}\nv: '{{C}}'\n";
        let c = yaml_single_quoted("{\"a\":{\"b\":\"it's\"}}");
        let out = render(t, &[("P", "80".into()), ("C", c)]).unwrap();
        assert_eq!(
            out,
            "  # {{P}} stays in comments\nport: 80\nv: '{\"a\":{\"b\":\"it''s\"}}'\n"
        );
        assert!(render("port: {{P}}\nx: {{Q}}\n", &[("P", "1".into())]).is_err());
    }
}
