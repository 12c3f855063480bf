"""Ax and HEBO, the searchers that need PyTorch, each once as a real Ray job on a Ray head of their own virtualenv
(``make searchers-venv``: Ray 2.60 with ax-platform and HEBO on PyTorch's CPU build;
docker/requirements-ray-searchers.txt says what a cluster adds for them). Written as Tune's examples write them, from a
factory: AxSearch given the spec's metric by the Tuner, HEBOSearch carrying its own. Each runs the nested space of
test_factory_searchers.py (with its constants) seeded with a point that lacks a nested key: the engine samples it and
hands the point over in their "a/b" shape, to Ax with the space's constants (it failed without them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import separate_stack
from tests.integration.test_factory_searchers import SEED, _assert_seeded_and_suggested, _run
from tests.support.cluster_venv import REPO_ROOT
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(300)

SEARCHERS_PYTHON = Path(
    os.environ.get("AIRFLOW_TUNE_SEARCHERS_PYTHON", REPO_ROOT / ".searchers-venv" / "bin" / "python")
)


@pytest.fixture(scope="module")
def torch_stack():
    """A Ray head whose Python has Ax, HEBO and PyTorch; fails (never skips) when that virtualenv was not built."""
    if not os.access(SEARCHERS_PYTHON, os.X_OK):
        pytest.fail(f"no searchers virtualenv at {SEARCHERS_PYTHON.parent.parent}: build it with `make searchers-venv`")
    with separate_stack("torch-searchers-", num_cpus=2, airflow=False, cluster_python=SEARCHERS_PYTHON) as local:
        yield local.state


@pytest.mark.parametrize(
    ("factory", "args"),
    [("tune_testkit.factories:ax", {}), ("tune_testkit.factories:hebo", {})],
    ids=["ax", "hebo"],
)
def test_a_torch_searcher_from_a_factory_takes_a_nested_seed_first(torch_stack, tmp_path, factory, args):
    text, manifest, xcom = _run(
        torch_stack,
        tmp_path,
        factory.rsplit(":", 1)[1],
        num_samples=3,
        max_concurrent_trials=1,
        search={"factory": factory, "args": args},
        points_to_evaluate=[SEED],
    )
    _assert_seeded_and_suggested(text, manifest, 3)
    assert [m["x"] for m in read_markers(str(tmp_path), "start")][0] == 3.0
    assert xcom["best_metrics"]["loss"] == min(t["metrics"]["loss"] for t in manifest["trials"])
