"""Search spaces as Tune users write them, through RayTuneOperator and ``dag.test()`` on the real Ray head and S3
endpoint (``dags/space_cases.py``): Tune's own sample objects at depth give the spec and fingerprint of the JSON form
and trials get values Tune sampled from each domain; a primitive's arguments given by name are bound by Tune's names.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import METADATA_FINGERPRINT, SPEC_FILE, TRIALS_FILE, manifest_uri
from airflow_tune.common.spec import fingerprint_of
from tests.e2e.helpers import jobs_of, load_dag, run_dag

pytestmark = pytest.mark.usefixtures("stack")

DAG_FILE = "space_cases.py"


def _unique_date() -> datetime:
    return datetime(2012, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _on_grid(value: float, q: float) -> bool:
    return math.isclose(value / q, round(value / q), abs_tol=1e-6)


def _finished(run: Any, task_id: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The task's XCom result, the spec its experiment ran, every trial's row, and its Ray job."""
    assert run.task_states()[task_id] == "success", (task_id, run.errors(task_id))
    result = run.xcom(task_id)
    spec = storage.read_json(manifest_uri(result["experiment_uri"], SPEC_FILE))
    rows = storage.read_json(manifest_uri(result["experiment_uri"], TRIALS_FILE))["trials"]
    [job] = jobs_of(result["experiment"])
    assert job["status"] == "SUCCEEDED", job
    return result, spec, rows, job


@pytest.mark.timeout(420)
def test_tune_objects_at_depth_run_as_their_json_form_with_values_tune_sampled():
    dag = load_dag("aft_tune_objects", DAG_FILE)
    json_form = dict(dag.get_task("json_form").param_space)
    # Converted when the operator was built: the DAG file's objects are its JSON form already.
    assert dag.get_task("tune_objects").param_space == json_form

    run = run_dag(dag, logical_date=_unique_date())
    native_result, native_spec, rows, native_job = _finished(run, "tune_objects")
    _, json_spec, json_rows, json_job = _finished(run, "json_form")

    # One spec and one fingerprint: in the spec files, in the jobs' metadata.
    assert native_spec["param_space"] == json_spec["param_space"] == json_form
    assert fingerprint_of(native_spec) == fingerprint_of(json_spec)
    assert native_job["metadata"][METADATA_FINGERPRINT] == json_job["metadata"][METADATA_FINGERPRINT]
    assert native_job["metadata"][METADATA_FINGERPRINT] == fingerprint_of(native_spec)

    # Every trial got a value Tune sampled from its domain (never a repr string).
    assert native_result["num_trials"] == len(rows) == len(json_rows) == 6, rows
    for row in rows:
        config = row["config"]
        model, opt = config["model"], config["opt"]
        assert 1e-4 <= model["lr"] <= 1e-1, config
        low_layers, wide, log_layers = model["layers"]
        assert low_layers in (1, 2, 3), config
        assert isinstance(wide, int) and 8 <= wide <= 64 and wide % 8 == 0, config
        assert isinstance(log_layers, int) and 1 <= log_layers < 1000, config
        act = model["act"]
        assert act == "relu" or (act["kind"] == "leaky" and 0 <= act["slope"] <= 0.3), config
        assert isinstance(model["width"], int) and 2 <= model["width"] <= 1024 and model["width"] % 2 == 0, config
        assert 0 <= opt["momentum"] <= 1 and _on_grid(opt["momentum"], 0.1), config
        assert 1e-3 <= opt["decay"] <= 1 and _on_grid(opt["decay"], 1e-3), config
        assert isinstance(opt["noise"], float), config
        assert _on_grid(opt["jitter"], 0.5), config
        assert opt["name"] == "sgd" and config["steps"] == 1, config
    assert sorted(row["config"]["bs"] for row in rows) == [16, 16, 16, 32, 32, 32]
    # Sampled, not one constant.
    assert len({row["config"]["model"]["lr"] for row in rows}) == len(rows)
    assert len({row["config"]["opt"]["noise"] for row in rows}) == len(rows)


@pytest.mark.timeout(300)
def test_qrandn_by_name_samples_with_its_sd():
    run = run_dag(load_dag("aft_named_arguments", DAG_FILE), logical_date=_unique_date())
    _, spec, rows, _ = _finished(run, "named")
    assert spec["param_space"]["jitter"] == {"qrandn": {"mean": 100, "sd": 20, "q": 0.5}}
    values = [row["config"]["jitter"] for row in rows]
    assert len(values) == 8
    assert all(_on_grid(v, 0.5) for v in values), values
    # Bound by position in the spec file's sorted keys it ran as qrandn(100, 0.5, 20): every sample exactly 100.0.
    assert len(set(values)) >= 4, values
    assert max(values) - min(values) > 5, values
