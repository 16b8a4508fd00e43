//! proxy-dedup's user-facing tools, as a library: `dedupctl` ([`ctl`]) and `oci-image`
//! (`src/bin/oci-image.rs`, on [`oci`]), and what the test kit (`dedup-envoy`) shares
//! with them: the loopback HTTP/1.1 client, the error type, the filter's Envoy block,
//! the template renderer and the Envoy YAML checks.

pub mod client;
pub mod ctl;
pub mod envoy_filter;
pub mod envoy_yaml;
pub mod error;
pub mod http;
pub mod inline;
pub mod members;
pub mod oci;
pub mod paths;
pub mod render;

pub use error::{Error, Result};
