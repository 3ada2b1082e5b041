# pdserve — the two commands are `make run` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Torch is pinned: an open range pulls a multi-GB CUDA build.
TORCH   := torch==2.13.0

.PHONY: run test install proto bench-engine bench-transfer bench-router bench-goodput clean down

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(TORCH)
	$(VPY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VPY) -m services.cli demo

test: $(STAMP)
	$(VPY) -m pytest -q -p no:cacheprovider tests

proto: $(STAMP)
	$(VPY) -m services.rpc.gen

bench-engine: $(STAMP)
	$(VPY) bench/engine.py

bench-transfer: $(STAMP)
	$(VPY) bench/transfer.py

bench-router: $(STAMP)
	$(VPY) bench/router.py

bench-goodput: $(STAMP)
	$(VPY) bench/goodput.py

down: $(STAMP)
	$(VPY) -m services.cli down

clean:
	rm -rf $(VENV) .pdserve
