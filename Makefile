# Strata: `make demo` sets everything up and shows the operator at work; `make test` runs every test tier
# that can run on this machine. Both install what they need by themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help setup setup-parts venv vllm-venv system controlplane node hub demo test test-unit test-integration lint crds crds-check csi-protos bench images kind-image e2e clean

help:
	@echo "make demo    set up (first run: ~35 min of builds, cached after) and run the demo (~20 min)"
	@echo "make test    set up, lint, check the CRDs and run every test tier (unit, integration, real node, kind)"
	@echo "make lint    ruff + mypy;  make crds  regenerate crds/ from the API models;  make csi-protos  the CSI plugin's gRPC modules"
	@echo "make bench   run the benchmarks in bench/;  make e2e  kind end-to-end suite (make kind-image: its offline node image)"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(STAMP)

system:
	@bash hack/setup-system.sh

controlplane:
	@bash hack/build-controlplane.sh
	@bash hack/build-helm.sh >/dev/null
	@bash hack/build-kstatus.sh >/dev/null
	@bash hack/build-kind.sh >/dev/null

# The real node: kubelet, kube-proxy and CoreDNS built once into the cache, and the images it runs (built on a
# local Debian base, no pull; rebuilt only when their inputs change). The tests serve with the stock vLLM image
# (images/vllm-cpu's `stock` stage: the engine, nothing of Strata's; the webhook adds Strata's packages): vLLM is
# installed once into a cached engine (~5-6 min, 3 GB downloaded). The demo's serving image (that engine + Strata
# built in) is built by `make demo` only: its layer is redone whenever Strata's code changes (~2 min).
node: system controlplane
	@bash hack/build-node.sh
	@bash hack/node/build-images.sh >/dev/null
	@bash hack/node/build-serving-image.sh stock >/dev/null

# The Hugging Face Hub server the hf:// tests run against (olah), in its own venv in the cache (first time ~1 min).
hub:
	@bash hack/build-olah.sh >/dev/null

# vLLM in its own virtualenv (it pins torch, numpy, protobuf...), cached outside the repo and keyed by the vLLM
# version and hack/vllm/requirements.txt: the tests and the bench that run vLLM's own code on CPU use it.
# First build ~9.4 GB, about 6 minutes.
vllm-venv:
	@bash hack/build-vllm-venv.sh >/dev/null
	@bash hack/build-vllm-venv.sh hack/vllm/cpu/requirements.txt >/dev/null

# The parts build side by side (three at a time): the vLLM venvs, the dev venv and the Hub server download and
# unpack while the Go builds keep the cores busy, instead of after them (a fresh machine's first build was ~46 min
# one after another). The builds that share a product (the CPU vLLM venv: vllm-venv and the serving image) take
# the same lock in the cache and build it once. Last, the Go build cache goes (hack/trim-go-cache.sh, ~6.6 GB):
# every Go binary, the kind tier's included, is built and cached by then, and that tier needs the disk.
setup:
	@$(MAKE) --no-print-directory -j3 setup-parts
	@bash hack/trim-go-cache.sh

setup-parts: venv system controlplane node hub vllm-venv

hub vllm-venv: | system

crds: venv
	$(PY) -m strata_operator.cli crds --output-dir crds

crds-check: venv
	$(PY) -m strata_operator.cli crds --output-dir crds --check

# The CSI plugin's gRPC modules (kvserver/strata_kv/csi/*_pb2*), generated from its .proto files and committed.
csi-protos: venv
	PYTHON=$(PY) bash hack/csi-protos.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check units operator/strata_operator kvserver loader testsupport realnode
	$(VENV)/bin/mypy

test-unit: venv
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

test: setup crds-check lint
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	@bash hack/node/build-serving-image.sh >/dev/null
	$(PY) hack/demo.py
	$(PY) bench/loader_demo.py --size-gib 2
	$(PY) bench/kv_demo.py

bench: setup
	$(PY) bench/loader_bench.py
	$(PY) bench/kv_throughput.py
	$(PY) bench/kv_hitratio.py

images:
	bash images/build.sh

# The kind CLI and a kind node image built here with no pull (hack/kind/build-node-image.sh; e2e/README.md).
kind-image: controlplane node
	bash hack/kind/build-node-image.sh

# The kind suite. Offline (this project's machines) it runs on the node image above, which it builds on first use;
# E2E_NODE_IMAGE=stock runs it on kind's own kindest/node (needs internet).
e2e: venv
	$(PY) -m pytest e2e -v

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
