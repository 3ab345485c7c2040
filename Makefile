# The two commands a newcomer needs: `make demo` and `make test`.
# Each one sets up what it needs: the virtualenv (.venv) and the control-plane
# binaries (built from Go modules into ~/.cache/kserve-controller, reused).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help setup binaries node-prereqs demo demo-node test unit integration node lint format cluster bench clean

help:
	@echo "make demo    - the whole system end to end on a local control plane"
	@echo "make test    - lint + the whole test suite (unit, integration, e2e)"
	@echo "make demo-node - the demo on real kubelets: both images built, the Helm chart installed (root)"
	@echo "make unit    - only the unit tests (no binaries, no servers)"
	@echo "make node    - only the real-node tier (images, chart, real kubelets; root)"
	@echo "make cluster - a local control plane in the foreground (Ctrl-C stops it)"
	@echo "make lint    - ruff check, ruff format --check, mypy, lint-imports (layering)"

# uv installs the test extra (KServe, scikit-learn) in seconds where pip takes minutes.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python >= 3.11 is required")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

binaries:
	bash hack/controlplane/build.sh >/dev/null
	bash hack/helm/build.sh >/dev/null
	bash hack/kstatus/build.sh >/dev/null
	bash hack/promtool/build.sh >/dev/null
	bash hack/kwok/build.sh >/dev/null

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo --no-cache

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

unit: $(STAMP)
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

integration: $(STAMP) binaries
	$(PY) -m pytest -m "integration or e2e" $(PYTEST_ARGS)

# The real-node tier's one-time pieces (packages, kubelet, base image) are
# built here rather than inside a test's time limit; where a real node cannot
# run this says why and the tier skips (under CI=true it fails instead).
node-prereqs: $(STAMP)
	$(PY) -m hack.realnode prepare --if-possible

test: $(STAMP) binaries node-prereqs lint
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP) binaries
	$(PY) -m hack.demo $(DEMO_ARGS)

# Real kubelets and containerd (hack/realnode.py): installs Debian packages and
# builds kubelet, the base image and both images on first use (cached).
demo-node: $(STAMP) binaries
	$(PY) -m hack.demo_node $(DEMO_ARGS)

node: $(STAMP) binaries node-prereqs
	$(PY) -m pytest -m node $(PYTEST_ARGS)

cluster: $(STAMP) binaries
	$(PY) -m hack.cluster up

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
