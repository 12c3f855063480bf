"""The oldest supported Ray on the Airflow side: trainables defined in a DAG file and pickled by value with that Ray
(the provider's ``ray`` extra in an environment of its own) run on the stack's cluster of the newest supported Ray."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from datetime import datetime, timezone

import pytest

from tests.e2e.helpers import RUN_DAG
from tests.support.compat_envs import REPO_ROOT, SIDE_RAY_RELEASE, airflow_side_ray_python


def _line(output: str, prefix: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(prefix + " ")]
    assert lines, output[-5000:]
    return lines[-1][len(prefix) + 1 :]


@pytest.mark.timeout(300)
def test_by_value_trainables_pickled_with_the_oldest_ray_run_on_a_cluster_of_the_newest(stack):
    python = str(airflow_side_ray_python())
    here = subprocess.run(
        [python, "-c", "import ray; print(ray.__version__)"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert here == SIDE_RAY_RELEASE
    from airflow_tune.hooks.ray import RayHook

    there = RayHook().get_ray_version()
    assert there != here, "the stack's cluster must run another Ray release than this Airflow side"

    date = datetime(2003, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    run = subprocess.run(
        [python, str(RUN_DAG), "aft_inline_blocking", date.isoformat(), "{}", "inline_trainables.py"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO_ROOT,
        env=os.environ.copy(),
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    assert _line(output, "DAG_RUN_STATE").startswith("success ")
    xcoms = json.JSONDecoder().raw_decode(_line(output, "DAG_RUN_XCOM"))[0]
    for task_id in ("tune_function", "tune_class"):
        result = xcoms[task_id]
        assert result["best_config"] == {"x": 3, "steps": 2}, (task_id, result)
        assert result["num_terminated"] == 3 and result["num_errored"] == 0, (task_id, result)
        assert result["best_metrics"]["loss"] == pytest.approx(0.5)
        assert result["best_checkpoint_uri"] is None or result["best_checkpoint_uri"].startswith("s3://")
