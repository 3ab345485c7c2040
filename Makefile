# The two commands a newcomer needs: `make demo` and `make test`.
# Each one sets up what it needs: the virtualenv (.venv) and the control-plane
# binaries (built from Go modules into ~/.cache/kserve-controller, reused).

PYTHON ?= python3
# Python caches each module it compiles (__pycache__, and pytest its rewritten
# test modules) unless PYTHONDONTWRITEBYTECODE is set, as it is on some machines
# and images. The suite starts hundreds of Python processes (pytest workers,
# model servers, runners, kubectl infer): with the variable set, each compiled
# every module it imports from source, e.g. 24 CPU-s to collect the suite
# against 6.4 s from the cache. Every recipe here runs without it.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# xdist workers for the unit tests (no servers), which run beside the parallel run.
UNIT_WORKERS ?= 2
# xdist workers for the tiers that mostly wait (hack/suite.py); each has its own control plane.
TEST_WORKERS ?= 4
# xdist workers for the fault tier, each with a control plane of its own (its outages stay there).
FAULT_WORKERS ?= 4
# When the suite's four runs go: ',' between runs one after the other, '+' between runs at
# the same time; `make test TEST_ORDER=node,faults,parallel,unit` runs them one by one, reversed.
TEST_ORDER ?= unit+parallel,faults+node

.PHONY: chart chart-package chart-docs help setup lock binaries node-prereqs storage-prereqs demo demo-node test unit integration node lint format cluster clean

help:
	@echo "make demo    - the whole system end to end on a local control plane"
	@echo "make test    - lint + the whole test suite (unit, integration, e2e, faults, node)"
	@echo "              TEST_ORDER=unit+parallel,faults+node (',' one after the other, '+' together),"
	@echo "              UNIT_WORKERS=2 TEST_WORKERS=4 FAULT_WORKERS=4 (xdist workers),"
	@echo "              PYTEST_ARGS=... (every run)"
	@echo "make demo-node - the demo on real kubelets: both images built, the Helm chart installed (root)"
	@echo "make unit    - only the unit tests (no binaries, no servers)"
	@echo "make node    - only the real-node tier (images, chart, real kubelets; root)"
	@echo "make cluster - a local control plane in the foreground (Ctrl-C stops it)"
	@echo "make lock    - update uv.lock (LOCK_ARGS=--upgrade for newest) and the image pins"
	@echo "make lint    - uv.lock current, ruff check, ruff format --check, mypy, lint-imports (layering)"
	@echo "make chart   - the chart's generated files: its copy of crds/ (files/crds/)"
	@echo "make chart-package - make chart, then helm package into dist/"
	@echo "make chart-docs - the chart README's values table from values.yaml (helm-docs)"

# The install is locked: uv.lock pins every distribution (the `dev` extra with
# the test tools, and uv itself), so a fresh clone gets exactly what CI got.
# uv is bootstrapped at its locked version, then `uv sync --frozen` makes .venv
# match the lock (the project editable, nothing else) and never re-resolves.
$(STAMP): pyproject.toml uv.lock
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python >= 3.11 is required")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(VENV)/bin/uv || $(PY) -m pip install --quiet --disable-pip-version-check \
		"uv==$$($(PYTHON) -m hack.lock uv-version)"
	UV_PROJECT_ENVIRONMENT=$(VENV) $(VENV)/bin/uv sync --quiet --frozen --extra dev --python $(PY)
	touch $(STAMP)

setup: $(STAMP) chart

# The chart's copy of crds/ (files/crds/, ignored by git): helm reads only files
# inside the chart. Every target that renders or installs the chart makes it first;
# so do the tests (hack/chart.py runs the same generate_crds before helm).
chart: $(STAMP)
	$(PY) -m hack.chart crds

chart-package: chart
	$(PY) -m hack.chart package --destination dist

# Updates uv.lock after a change to pyproject.toml (LOCK_ARGS=--upgrade takes the
# newest versions allowed), then the image requirement files made from it.
lock: $(STAMP)
	$(VENV)/bin/uv lock $(LOCK_ARGS)
	$(PY) -m hack.lock images
	$(MAKE) setup

binaries: $(STAMP)
	$(PY) -m hack.binaries

# The chart README (its values table from values.yaml's `# --` comments) made by helm-docs.
chart-docs: $(STAMP)
	$(PY) -c 'from hack.chart import helm_docs; helm_docs()'

# mypy keeps its incremental cache with the tool builds, outside the clone
# (KSC_CACHE_DIR, as hack/gobuild.sh): a fresh clone checks in ~5 CPU-seconds
# what takes ~35 from nothing. mypy checks each cached module against its
# source's hash, so a cache from another clone or commit is only a head start.
CACHE_ROOT := $(or $(KSC_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kserve-controller)

lint: $(STAMP)
	$(PY) -m hack.lock check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --cache-dir "$(CACHE_ROOT)/mypy"
	$(VENV)/bin/lint-imports --no-logo --no-cache

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

unit: $(STAMP) chart
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

integration: $(STAMP) chart binaries storage-prereqs
	$(PY) -m pytest -m "integration or e2e" -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The real-node tier's one-time pieces (packages, kubelet, base image) are
# built here rather than inside a test's time limit; where a real node cannot
# run this says why and the tier skips (under CI=true it fails instead).
node-prereqs: $(STAMP)
	$(PY) -m hack.realnode prepare --if-possible

# The runner's postgres tests start their own server from Debian's postgresql
# package (hack/postgres.py), installed here when missing (as root, like the
# real-node tier's packages); under CI=true a missing install fails.
storage-prereqs: $(STAMP)
	$(PY) -m hack.postgres prepare --if-possible

# Four pytest runs (hack/suite.py), while it builds the tools (hack/binaries.py):
# the unit tests on UNIT_WORKERS xdist workers once helm is built, beside the
# integration and e2e tiers on TEST_WORKERS workers once every tool is; then the
# fault tier on FAULT_WORKERS workers at the same time as the real-node tier (one
# process). Cold, the unit tests run while the control plane compiles. Every run goes ahead; any failure fails `make test`; the last line
# sums them in pytest's format.
test: $(STAMP) chart storage-prereqs lint
	$(PY) -m hack.suite --unit-workers $(UNIT_WORKERS) --workers $(TEST_WORKERS) \
		--fault-workers $(FAULT_WORKERS) --order $(TEST_ORDER) -- $(PYTEST_ARGS)

demo: $(STAMP) chart binaries storage-prereqs
	$(PY) -m hack.demo $(DEMO_ARGS)

# Real kubelets and containerd (hack/realnode.py): installs Debian packages and
# builds kubelet, the base image and both images on first use (cached).
demo-node: $(STAMP) chart binaries
	$(PY) -m hack.demo_node $(DEMO_ARGS)

node: $(STAMP) chart binaries node-prereqs
	$(PY) -m pytest -m node $(PYTEST_ARGS)

cluster: $(STAMP) chart binaries
	$(PY) -m hack.cluster up

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
