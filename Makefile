# The two commands a newcomer runs: `make demo` and `make test`. Both create .venv when missing. `make help` lists
# every target; `make check` is the fast one to run before a commit.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# The Ray cluster's own virtualenv (the multi-node tests run every Ray node from it): Ray and the examples' packages
# from docker/requirements-ray.txt, as in the Ray image; no Airflow, no airflow-tune, no moto.
CLUSTER_VENV ?= .cluster-venv
CLUSTER_STAMP := $(CLUSTER_VENV)/.installed
CLUSTER_ENV := AIRFLOW_TUNE_CLUSTER_PYTHON=$(abspath $(CLUSTER_VENV))/bin/python

.PHONY: help venv cluster-venv mlflow-venv searchers-venv compat-envs browser demo test check docs lint unit packaging integration \
  e2e compat bench bench-quick up down clean

# The targets with a `## ` note on their line, in the order written.
help: ## list the targets
	@grep -E '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## /\1\t/' | \
	  awk -F '\t' '{printf "  make %-13s %s\n", $$1, $$2}'

venv: $(STAMP) ## .venv: the provider (editable) with its extras, the test, lint and docs groups, from constraints.txt

cluster-venv: $(CLUSTER_STAMP) ## .cluster-venv: the Ray cluster's own virtualenv (Ray and the examples' packages)

$(CLUSTER_STAMP): docker/requirements-ray.txt constraints.txt | $(STAMP)
	test -x $(CLUSTER_VENV)/bin/python || $(PYTHON) -m venv $(CLUSTER_VENV)
	$(UV) pip install -q --python $(CLUSTER_VENV)/bin/python --compile-bytecode -c constraints.txt \
	  -r docker/requirements-ray.txt
	touch $(CLUSTER_STAMP)

# The local stack's MLflow tracking server runs from a virtualenv of its own (the server's pins are not Airflow's),
# installed with uv from docker/requirements-mlflow.txt (the mlflow image's too). Not --compile-bytecode: that
# compiles all of pandas, scipy and scikit-learn too (a minute); the server's first start compiles what it imports.
MLFLOW_VENV ?= .mlflow-venv
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed
MLFLOW_ENV := AIRFLOW_TUNE_MLFLOW_PYTHON=$(abspath $(MLFLOW_VENV))/bin/python

mlflow-venv: $(MLFLOW_STAMP) ## .mlflow-venv: the local stack's MLflow tracking server

$(MLFLOW_STAMP): docker/requirements-mlflow.txt | $(STAMP)
	rm -rf $(MLFLOW_VENV)
	$(UV) venv -q --no-python-downloads --python $(PYTHON) $(MLFLOW_VENV)
	$(UV) pip install -q --python $(MLFLOW_VENV)/bin/python -r docker/requirements-mlflow.txt
	touch $@

# A Ray cluster virtualenv with the searchers that need PyTorch (Ax and HEBO), for their test on a Ray head of its own
# (tests/integration/test_torch_searchers.py): requirements-ray.txt and requirements-ray-searchers.txt. torch first,
# by pip: pip takes the CPU build this machine keeps on disk, where uv would download a CUDA build of several GB; the
# rest by uv, without constraints.txt (HEBO pins numpy<1.25; the file says why).
SEARCHERS_VENV ?= .searchers-venv
SEARCHERS_STAMP := $(SEARCHERS_VENV)/.installed
SEARCHERS_ENV := AIRFLOW_TUNE_SEARCHERS_PYTHON=$(abspath $(SEARCHERS_VENV))/bin/python
TORCH ?= torch==2.13.0

searchers-venv: $(SEARCHERS_STAMP) ## .searchers-venv: a Ray cluster's virtualenv with Ax and HEBO (PyTorch's CPU build)

$(SEARCHERS_STAMP): docker/requirements-ray.txt docker/requirements-ray-searchers.txt | $(STAMP)
	rm -rf $(SEARCHERS_VENV)
	$(PYTHON) -m venv $(SEARCHERS_VENV)
	$(SEARCHERS_VENV)/bin/pip install -q --disable-pip-version-check $(TORCH)
	$(UV) pip install -q --python $(SEARCHERS_VENV)/bin/python -r docker/requirements-ray.txt \
	  -r docker/requirements-ray-searchers.txt
	touch $@

# The compatibility tier's own environments (tests/compat), installed from the registries with uv (a Ray cluster
# virtualenv in 25 s where pip takes 90): a cluster virtualenv for each of Ray's supported ends and one release
# between, and an Airflow environment for each older supported Airflow (the oldest on the oldest supported Python),
# with the provider installed without its `ray` extra (no Ray on that Airflow side).
COMPAT ?= .compat
UV := $(VENV)/bin/uv
COMPAT_RAY_RELEASES ?= 2.43.0 2.50.1
COMPAT_RAY_STAMPS := $(foreach r,$(COMPAT_RAY_RELEASES),$(COMPAT)/ray-$(r)/.installed)
# The oldest supported Airflow first; 3.3 is the main venv's.
COMPAT_AIRFLOW_RELEASES ?= 3.1.8 3.2.2
# The oldest supported Python: this machine has it from pyenv (not on PATH); uv never downloads one (no internet).
COMPAT_AIRFLOW_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python3.10) \
  $(shell command -v python3.10) python3.10)
COMPAT_AIRFLOW_STAMPS := $(foreach r,$(COMPAT_AIRFLOW_RELEASES),$(COMPAT)/airflow-$(r)/.installed)
# And the oldest supported Ray on the Airflow side (with the newest Airflow: the Airflow end is the env above).
COMPAT_SIDE_RAY ?= 2.43.0
COMPAT_SIDE_RAY_STAMP := $(COMPAT)/airflow-side-ray-$(COMPAT_SIDE_RAY)/.installed
# A Python below the supported range (Ray 2.43 to 2.51 still ship wheels for 3.9): the engine must refuse it at its
# start, saying what it needs (tests/compat/test_python_ends.py; a bare interpreter, nothing installed).
COMPAT_UNSUPPORTED_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.9.*/bin/python3.9) \
  $(shell command -v python3.9) python3.9)
COMPAT_ENV := AIRFLOW_TUNE_COMPAT_DIR=$(abspath $(COMPAT)) AIRFLOW_TUNE_COMPAT_RAY="$(COMPAT_RAY_RELEASES)" \
  AIRFLOW_TUNE_COMPAT_AIRFLOW="$(COMPAT_AIRFLOW_RELEASES)" AIRFLOW_TUNE_COMPAT_SIDE_RAY=$(COMPAT_SIDE_RAY) \
  AIRFLOW_TUNE_COMPAT_UNSUPPORTED_PYTHON=$(COMPAT_UNSUPPORTED_PYTHON)
# The newest supported Python (the official Airflow image's default), on both sides: Airflow 3.3 with the provider
# and its `ray` extra, and a Ray 2.60 cluster, each in an environment of its own (pyenv's, as the oldest above).
COMPAT_NEWEST_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13.*/bin/python3.13) \
  $(shell command -v python3.13) python3.13)
COMPAT_NEWEST_STAMPS := $(COMPAT)/airflow-python-3.13/.installed $(COMPAT)/ray-python-3.13/.installed

compat-envs: $(COMPAT_RAY_STAMPS) $(COMPAT_AIRFLOW_STAMPS) $(COMPAT_SIDE_RAY_STAMP) $(COMPAT_NEWEST_STAMPS) ## .compat: other Ray, Airflow and Python releases

$(COMPAT)/ray-%/.installed: docker/requirements-ray.txt | $(STAMP)
	rm -rf $(COMPAT)/ray-$*
	$(UV) venv -q --no-python-downloads --python $(PYTHON) $(COMPAT)/ray-$*
	$(UV) pip install -q --python $(COMPAT)/ray-$*/bin/python "ray[default,tune]==$*" \
	  $$(grep -v '^ray\[' docker/requirements-ray.txt | grep -v '^#')
	touch $@

# The oldest Airflow on the oldest Python, the others on this machine's. An Airflow release is installed with the
# constraints of its day; the newest of everything breaks older ones: FastAPI 0.137 and newer (with cadwyn 9) fail
# Airflow 3.2.2's execution API at import ("TITerminalStatePayload needs a discriminator field").
COMPAT_AIRFLOW_PINS ?= "fastapi<0.137"
$(COMPAT_AIRFLOW_STAMPS): $(COMPAT)/airflow-%/.installed: pyproject.toml | $(STAMP)
	rm -rf $(COMPAT)/airflow-$*
	$(UV) venv -q --no-python-downloads --python \
	  $(if $(filter $*,$(firstword $(COMPAT_AIRFLOW_RELEASES))),$(COMPAT_AIRFLOW_PYTHON),$(PYTHON)) $(COMPAT)/airflow-$*
	$(UV) pip install -q --python $(COMPAT)/airflow-$*/bin/python "apache-airflow==$*" $(COMPAT_AIRFLOW_PINS) -e . --group test
	rm -rf airflow_tune.egg-info
	touch $@

$(COMPAT_SIDE_RAY_STAMP): pyproject.toml constraints.txt | $(STAMP)
	rm -rf $(COMPAT)/airflow-side-ray-$(COMPAT_SIDE_RAY)
	$(UV) venv -q --no-python-downloads --python $(PYTHON) $(COMPAT)/airflow-side-ray-$(COMPAT_SIDE_RAY)
	$(UV) pip install -q --python $(COMPAT)/airflow-side-ray-$(COMPAT_SIDE_RAY)/bin/python \
	  "apache-airflow==$$(grep '^apache-airflow==' constraints.txt | cut -d= -f3)" "ray[tune]==$(COMPAT_SIDE_RAY)" \
	  -e ".[ray]" --group test
	rm -rf airflow_tune.egg-info
	touch $@

$(COMPAT)/airflow-python-3.13/.installed: pyproject.toml constraints.txt | $(STAMP)
	rm -rf $(COMPAT)/airflow-python-3.13
	$(UV) venv -q --no-python-downloads --python $(COMPAT_NEWEST_PYTHON) $(COMPAT)/airflow-python-3.13
	$(UV) pip install -q --python $(COMPAT)/airflow-python-3.13/bin/python -c constraints.txt -e ".[ray]" --group test
	rm -rf airflow_tune.egg-info
	touch $@

$(COMPAT)/ray-python-3.13/.installed: docker/requirements-ray.txt constraints.txt | $(STAMP)
	rm -rf $(COMPAT)/ray-python-3.13
	$(UV) venv -q --no-python-downloads --python $(COMPAT_NEWEST_PYTHON) $(COMPAT)/ray-python-3.13
	$(UV) pip install -q --python $(COMPAT)/ray-python-3.13/bin/python -c constraints.txt -r docker/requirements-ray.txt
	touch $@

# The editable install leaves airflow_tune.egg-info in the checkout (setuptools runs egg_info there for the build
# requirements): a second copy of the package's metadata for every process with the checkout on sys.path (pytest,
# `python -m` here), in which Airflow would then register the Experiment view's plugin twice. The venv has its own.
# pip brings uv, and uv installs the rest (from its cache, a fresh clone's venv in a fraction of pip's time), compiled
# to bytecode as pip would. The developers' tools are pyproject.toml's dependency groups (PEP 735, never published),
# which uv installs with `--group` (read from ./pyproject.toml).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -c constraints.txt uv
	$(UV) pip install -q --python $(PY) --compile-bytecode -c constraints.txt \
	  -e ".[ray,examples,optuna,hyperopt,bayesopt,nevergrad,zoopt,bohb,local,openlineage,mlflow]" --group test --group lint --group docs
	rm -rf airflow_tune.egg-info
	touch $(STAMP)

# The browser test's Chromium (Debian's package, never a downloaded browser) and Playwright to drive it. Best effort:
# where either cannot be installed, the browser test skips, saying why in one line, and the rest of the suite runs.
CHROMIUM ?= /usr/bin/chromium
browser: venv ## Chromium (Debian's) and Playwright for the browser test, best effort
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	  if [ "$$SUDO" = none ]; then echo "browser: $(CHROMIUM) missing and no root to install it; the browser test skips"; \
	  else ($$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null) \
	    || echo "browser: could not install chromium; the browser test skips"; fi; \
	fi
	@$(PY) -c "import playwright" 2>/dev/null || $(UV) pip install -q --python $(PY) -c constraints.txt \
	  --group browser || echo "browser: could not install playwright; the browser test skips"

# RAY_AUTH_MODE=disabled is for the client processes only (a local ray.init() in token mode would write
# ~/.ray/auth_token); the local stack's Ray nodes run with token auth on, and clients send its token.
demo: venv mlflow-venv ## the retraining DAG twice on a local Ray head, S3 endpoint and MLflow server
	RAY_AUTH_MODE=disabled $(PY) demo/run.py

# The docs tree as the docs test builds it in `make test` (tests/packaging/test_docs.py): warnings are errors, so a
# broken include, reference or example marker fails. The pages land in .artifacts/docs (open index.html).
docs: venv ## build the docs (docs/, Sphinx) into .artifacts/docs, warnings as errors
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs .artifacts/docs

lint: venv ## ruff (check and format), mypy and the import contract (lint-imports)
	$(VENV)/bin/ruff check airflow_tune tests dags benchmarks demo
	$(VENV)/bin/ruff format --check airflow_tune tests dags benchmarks demo
	$(VENV)/bin/mypy airflow_tune
	$(VENV)/bin/lint-imports

# Three pytest workers, each with its own Ray head, S3 endpoint and Airflow home (four were slower: the 2 cores are
# busy the whole run); a file's tests stay on one worker, so module-scoped stacks start once. Files are handed out in
# collection order (compat, e2e, integration, unit), not xdist's default of the files with most tests first: that put
# the few-test, minutes-long files last, where one of them held the run while the other workers had nothing left.
# Every test's duration lands in .artifacts/test-durations.xml (JUnit), to see which files hold the critical worker.
TEST_WORKERS ?= 3
test: lint browser cluster-venv mlflow-venv searchers-venv compat-envs ## lint and every test (about 25 min on 2 cores)
	RAY_AUTH_MODE=disabled $(CLUSTER_ENV) $(MLFLOW_ENV) $(SEARCHERS_ENV) $(COMPAT_ENV) $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder --junitxml=.artifacts/test-durations.xml

# Before a commit: what `make test` checks first, in a minute or two (no services, no environments but .venv).
check: lint ## lint and the unit tests, in a minute or two
	$(VENV)/bin/pytest -q -m unit -n 2

unit: venv ## the unit tests (no services)
	$(VENV)/bin/pytest -q -m unit

# Builds the sdist and wheel from a clean copy of the tree and installs the wheel into a fresh venv (in `make test`).
packaging: venv ## the sdist and wheel as PyPI users get them
	$(VENV)/bin/pytest -q -m packaging

integration: venv cluster-venv mlflow-venv searchers-venv ## the integration tests (a real Ray head and S3 endpoint)
	RAY_AUTH_MODE=disabled $(CLUSTER_ENV) $(MLFLOW_ENV) $(SEARCHERS_ENV) $(VENV)/bin/pytest -q -m integration

e2e: venv browser cluster-venv ## the end-to-end tests (Airflow against the local stack)
	RAY_AUTH_MODE=disabled $(CLUSTER_ENV) $(VENV)/bin/pytest -q -m e2e

compat: venv cluster-venv compat-envs ## the compatibility tier (other Ray and Airflow releases)
	RAY_AUTH_MODE=disabled $(CLUSTER_ENV) $(COMPAT_ENV) $(VENV)/bin/pytest -q -m compat

bench: venv ## the benchmarks (about an hour)
	RAY_AUTH_MODE=disabled $(PY) -m benchmarks

bench-quick: venv ## the engine against plain Tune at a glance (about five minutes)
	RAY_AUTH_MODE=disabled $(PY) -m benchmarks --quick

up: venv mlflow-venv ## start the local stack (Ray head, S3 endpoint, MLflow)
	RAY_AUTH_MODE=disabled $(PY) -m airflow_tune.local up --mlflow-python $(MLFLOW_VENV)/bin/python

down: venv ## stop the local stack
	$(PY) -m airflow_tune.local down

clean: down ## stop the local stack and remove every environment and cache
	rm -rf $(VENV) $(CLUSTER_VENV) $(MLFLOW_VENV) $(SEARCHERS_VENV) $(COMPAT) .stack .pytest_cache .mypy_cache .ruff_cache .artifacts
