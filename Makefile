# The two commands a newcomer runs: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: venv browser demo test lint unit integration e2e bench up down clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check --upgrade "pip>=24"
	$(PIP) install -q --disable-pip-version-check -c constraints.txt -e ".[test,lint,examples,optuna,hyperopt,local]"
	touch $(STAMP)

# The browser test's Chromium (Debian's package, never a downloaded browser) and Playwright to drive it. Best effort:
# where either cannot be installed, the browser test skips, saying why in one line, and the rest of the suite runs.
CHROMIUM ?= /usr/bin/chromium
browser: venv
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	  if [ "$$SUDO" = none ]; then echo "browser: $(CHROMIUM) missing and no root to install it; the browser test skips"; \
	  else ($$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null) \
	    || echo "browser: could not install chromium; the browser test skips"; fi; \
	fi
	@$(PY) -c "import playwright" 2>/dev/null || $(PIP) install -q --disable-pip-version-check -c constraints.txt \
	  "playwright>=1.40" || echo "browser: could not install playwright; the browser test skips"

demo: venv
	RAY_AUTH_MODE=disabled $(PY) demo/run.py

lint: venv
	$(VENV)/bin/ruff check airflow_tune tests dags benchmarks demo
	$(VENV)/bin/ruff format --check airflow_tune tests dags benchmarks demo
	$(VENV)/bin/mypy airflow_tune

test: lint browser
	RAY_AUTH_MODE=disabled $(VENV)/bin/pytest -q

unit: venv
	$(VENV)/bin/pytest -q -m unit

integration: venv
	RAY_AUTH_MODE=disabled $(VENV)/bin/pytest -q -m integration

e2e: venv browser
	RAY_AUTH_MODE=disabled $(VENV)/bin/pytest -q -m e2e

bench: venv
	RAY_AUTH_MODE=disabled $(PY) -m benchmarks

up: venv
	RAY_AUTH_MODE=disabled $(PY) -m airflow_tune.local up

down: venv
	$(PY) -m airflow_tune.local down

clean: down
	rm -rf $(VENV) .stack .pytest_cache .mypy_cache .ruff_cache .artifacts
