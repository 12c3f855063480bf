# The two commands a newcomer runs: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint unit integration e2e bench up down clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check --upgrade "pip>=24"
	$(PIP) install -q --disable-pip-version-check -c constraints.txt -e ".[test,lint,examples,optuna,hyperopt,local]"
	touch $(STAMP)

demo: venv
	RAY_AUTH_MODE=disabled $(PY) demo/run.py

lint: venv
	$(VENV)/bin/ruff check airflow_tune tests dags benchmarks demo
	$(VENV)/bin/ruff format --check airflow_tune tests dags benchmarks demo
	$(VENV)/bin/mypy airflow_tune

test: lint
	RAY_AUTH_MODE=disabled $(VENV)/bin/pytest -q

unit: venv
	$(VENV)/bin/pytest -q -m unit

integration: venv
	RAY_AUTH_MODE=disabled $(VENV)/bin/pytest -q -m integration

e2e: venv
	RAY_AUTH_MODE=disabled $(VENV)/bin/pytest -q -m e2e

bench: venv
	RAY_AUTH_MODE=disabled $(PY) -m benchmarks

up: venv
	RAY_AUTH_MODE=disabled $(PY) -m airflow_tune.local up

down: venv
	$(PY) -m airflow_tune.local down

clean: down
	rm -rf $(VENV) .stack .pytest_cache .mypy_cache .ruff_cache
