//! Envoy configs from the templates in `envoy/configs/`: `{{NAME}}` placeholders
//! replaced by ports, the module path and the filter's JSON configuration.

use crate::paths::config_file;
use crate::ports::free_port;
use crate::{fail, Result};
use std::path::{Path, PathBuf};

/// Worker threads (Envoy's `--concurrency`) of a config unless it says otherwise: the
/// machine has 2 cores, and 2 workers exercise the cross-worker claim (two VMs sharing
/// one shared-data store). Here, not in `envoy.rs`, which starts configs: a config
/// needs nothing from the process that runs it.
pub const WORKERS: u32 = 2;

/// The main template: listener -> dedup Wasm filter -> router -> upstream.
pub const SINGLE_NODE: &str = "single-node.yaml";
/// The same listener and cluster without any Wasm filter (benchmark baseline).
pub const NO_FILTER: &str = "no-filter.yaml";
/// `single-node.yaml` with the listener served by LDS from a file
/// (`LDS_LISTENER`), so that a test can push a changed filter configuration.
pub const SINGLE_NODE_LDS: &str = "single-node-lds.yaml";
/// The listener resource of `SINGLE_NODE_LDS` (a DiscoveryResponse).
pub const LDS_LISTENER: &str = "lds/ingress-listener.yaml";
/// `single-node.yaml` with the module fetched over HTTP
/// (`vm_config.code.remote`, checked against its SHA-256).
pub const REMOTE_MODULE: &str = "remote-module.yaml";

/// Replace every `{{NAME}}` outside comment lines with its value from `vars`, quoted
/// for where it stands: `dedupctl render`'s own filler (`dedup_tools::render::fill`),
/// so the tests run the templates exactly as users render them. A placeholder with no
/// value is an error; comment lines are left as written (they document the placeholders).
pub fn render(template: &str, vars: &[(&str, String)]) -> Result<String> {
    dedup_tools::render::fill(template, vars).map_err(crate::Error)
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
    /// More placeholders of a template, with their values.
    pub vars: Vec<(String, String)>,
    /// More listener ports, by placeholder name (new ones after a bind clash).
    pub ports: Vec<(String, u16)>,
    /// A listener template that Envoy reads by LDS from a file
    /// (`{{LDS_DIR}}` / `{{LDS_PATH}}` in the bootstrap template); it gets the
    /// same placeholders as the bootstrap.
    pub lds_template: Option<PathBuf>,
    /// Envoy's `--concurrency` (default `WORKERS`).
    pub workers: u32,
    /// CPUs Envoy is pinned to (`taskset -c`), e.g. "0"; `None`: not pinned.
    pub cpus: Option<String>,
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
            vars: Vec::new(),
            ports: Vec::new(),
            lds_template: None,
            workers: WORKERS,
            cpus: None,
        })
    }

    /// Another template (any path) with `wasm` and `filter_config`, on fresh
    /// loopback ports; the same placeholders as `single-node.yaml`.
    pub fn from_template(
        template: &Path,
        upstream_port: u16,
        wasm: &Path,
        filter_config: &str,
    ) -> Result<Self> {
        let mut c = Self::single_node(upstream_port, wasm, filter_config)?;
        c.template = template.to_path_buf();
        Ok(c)
    }

    /// `single-node-lds.yaml`: the listener comes by LDS from a file in the
    /// run's directory, rewritten by `EnvoyProcess::push_filter_config`.
    pub fn single_node_lds(upstream_port: u16, wasm: &Path, filter_config: &str) -> Result<Self> {
        let mut c = Self::from_template(
            &config_file(SINGLE_NODE_LDS),
            upstream_port,
            wasm,
            filter_config,
        )?;
        c.lds_template = Some(config_file(LDS_LISTENER));
        Ok(c)
    }

    /// One more placeholder with a fixed value.
    pub fn with_var(mut self, name: &str, value: &str) -> Self {
        self.vars.push((name.into(), value.into()));
        self
    }

    /// One more placeholder that gets a fresh loopback port.
    pub fn with_port(mut self, name: &str) -> Result<Self> {
        self.ports.push((name.into(), free_port()?));
        Ok(self)
    }

    /// Envoy with `workers` worker threads, pinned to `cpus` (`taskset -c`
    /// syntax) when given.
    pub fn with_workers(mut self, workers: u32, cpus: Option<&str>) -> Self {
        self.workers = workers;
        self.cpus = cpus.map(str::to_string);
        self
    }

    /// The port given to placeholder `name` by `with_port`.
    pub fn port(&self, name: &str) -> Option<u16> {
        self.ports.iter().find(|(n, _)| n == name).map(|(_, p)| *p)
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
            vars: Vec::new(),
            ports: Vec::new(),
            lds_template: None,
            workers: WORKERS,
            cpus: None,
        })
    }

    /// `remote-module.yaml`: Envoy fetches the module from
    /// `http://127.0.0.1:<module_port>/dedup_filter.wasm` and refuses it unless
    /// its SHA-256 is `sha256` (hex).
    pub fn remote_module(
        upstream_port: u16,
        module_port: u16,
        sha256: &str,
        filter_config: &str,
    ) -> Result<Self> {
        let mut c = Self::no_filter(upstream_port)?;
        c.template = config_file(REMOTE_MODULE);
        c.filter_config = filter_config.to_string();
        Ok(c.with_var("MODULE_PORT", &module_port.to_string())
            .with_var("MODULE_SHA256", sha256))
    }

    /// New listener and admin ports (after a bind clash).
    pub fn reassign_ports(&mut self) -> Result<()> {
        self.listen_port = free_port()?;
        self.admin_port = free_port()?;
        for (_, port) in &mut self.ports {
            *port = free_port()?;
        }
        Ok(())
    }

    fn vars(&self) -> Vec<(&str, String)> {
        let wasm = self
            .wasm_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let mut vars = vec![
            ("LISTEN_PORT", self.listen_port.to_string()),
            ("ADMIN_PORT", self.admin_port.to_string()),
            ("UPSTREAM_PORT", self.upstream_port.to_string()),
            ("WASM_PATH", wasm),
            (
                "FILTER_CONFIG",
                dedup_tools::render::one_line_json(&self.filter_config),
            ),
            (
                "DEDUP_METHODS",
                crate::envoy_filter::methods_regex_of(&self.filter_config),
            ),
        ];
        vars.extend(self.vars.iter().map(|(n, v)| (n.as_str(), v.clone())));
        vars.extend(self.ports.iter().map(|(n, p)| (n.as_str(), p.to_string())));
        vars
    }

    /// The rendered config (a template without LDS).
    pub fn render(&self) -> Result<String> {
        if self.lds_template.is_some() {
            fail!("a config with an LDS listener file is rendered with render_in(dir)");
        }
        render(&read_template(&self.template)?, &self.vars())
    }

    /// The rendered config for a run in `dir`; with an LDS listener template,
    /// its file is written first (`lds_path(dir)`).
    pub fn render_in(&self, dir: &Path) -> Result<String> {
        let Some(_) = &self.lds_template else {
            return self.render();
        };
        self.write_lds(dir)?;
        let mut vars = self.vars();
        vars.push((
            "LDS_DIR",
            lds_path(dir)
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ));
        vars.push(("LDS_PATH", lds_path(dir).display().to_string()));
        render(&read_template(&self.template)?, &vars)
    }

    /// Render the LDS listener template and move it into place atomically
    /// (write a temporary file in the watched directory, then rename: Envoy
    /// reloads on the rename).
    pub fn write_lds(&self, dir: &Path) -> Result<()> {
        let Some(template) = &self.lds_template else {
            fail!("no LDS listener template in this config");
        };
        let text = render(&read_template(template)?, &self.vars())?;
        let path = lds_path(dir);
        let Some(lds_dir) = path.parent() else {
            fail!("LDS path {} has no directory", path.display());
        };
        std::fs::create_dir_all(lds_dir)?;
        let tmp = lds_dir.join(".listeners.yaml.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }
}

/// Where a run in `dir` keeps its LDS listener file.
pub fn lds_path(dir: &Path) -> PathBuf {
    dir.join("lds").join("listeners.yaml")
}

fn read_template(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) => fail!("cannot read {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_rejects_leftovers() {
        let t = "  # {{P}} stays in comments\nport: {{P}}\nv: '{{C}}'\n";
        let c = "{\"a\":{\"b\":\"it's\"}}".to_string();
        let out = render(t, &[("P", "80".into()), ("C", c)]).unwrap();
        assert_eq!(
            out,
            "  # {{P}} stays in comments\nport: 80\nv: '{\"a\":{\"b\":\"it''s\"}}'\n"
        );
        assert!(render("port: {{P}}\nx: {{Q}}\n", &[("P", "1".into())]).is_err());
    }
}
