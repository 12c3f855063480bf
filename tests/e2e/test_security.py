"""A user who may only trigger DAGs sends confs that try to run code on the cluster; every one is refused before a
Ray job exists, with a message naming the field, and the payload (which would create a marker file) never runs."""

from __future__ import annotations

import json
import pickle
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag

pytestmark = pytest.mark.usefixtures("stack")
FILE = "hostile_confs.py"


def _payload(marker: Path) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


class _TouchOnUnpickle:
    """Unpickling it creates a file: what a conf could make Tune's state decoder do with the cluster's credentials."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


def _pickled(marker: Path) -> dict[str, str]:
    """Tune's JSON form of a pickle: its state decoder ``cloudpickle.loads`` it when it reads the experiment back."""
    return {"_type": "CLOUDPICKLE_FALLBACK", "value": pickle.dumps(_TouchOnUnpickle(marker)).hex()}


def _confs(marker: Path) -> list[tuple[str, dict, str]]:
    code = {"eval": _payload(marker)}
    command = f"touch {marker}"
    pickled = _pickled(marker)
    return [
        ("pickle-in-choice", {"space": {"x": {"choice": [1, pickled]}, "steps": 1}}, "param_space.x.choice[1]"),
        ("pickle-as-a-value", {"space": {"x": {"grid_search": [1]}, "steps": pickled}}, "param_space.steps"),
        ("pickle-nested", {"space": {"x": {"grid_search": [1]}, "opts": {"a": [pickled]}}}, "param_space.opts.a[0]"),
        ("pickle-in-kwargs", {"kwargs": {"opts": pickled}}, "trainable_kwargs.opts"),
        (
            "pickle-in-pbt-mutations",
            {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"x": [1, pickled]}}}},
            "scheduler.args.hyperparam_mutations.x[1]",
        ),
        ("eval-in-choice", {"space": {"x": {"choice": [1, code]}, "steps": 1}}, "param_space.x.choice[1]"),
        ("eval-as-the-space", {"space": code}, "param_space = "),
        ("eval-in-const", {"space": {"x": {"const": {"deep": [code]}}}}, "param_space.x.const.deep[0]"),
        ("eval-in-kwargs", {"kwargs": {"opts": code}}, "trainable_kwargs.opts"),
        (
            "eval-in-pbt-mutations",
            {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"x": [1, code]}}}},
            "scheduler.args.hyperparam_mutations.x[1]",
        ),
        (
            "scheduler-factory",
            {"scheduler": {"factory": "subprocess:getoutput", "args": {"cmd": command}}},
            "scheduler.factory = 'subprocess:getoutput'",
        ),
        ("scheduler-factory-string", {"scheduler": "subprocess:getoutput"}, "scheduler.factory"),
        (
            "search-factory",
            {"search": {"factory": "subprocess:getoutput", "args": {"cmd": command}}},
            "search.factory = 'subprocess:getoutput'",
        ),
        (
            "sample-from",
            {"space": {"x": {"sample_from": "os:system"}, "steps": 1}},
            "param_space.x = 'os:system'",
        ),
    ]


def _date() -> datetime:
    return datetime(2003, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def test_the_payload_is_real(tmp_path):
    """The marker payloads do create the file when something runs them, so their absence below means something."""
    marker = tmp_path / "control"
    eval(_payload(marker))  # noqa: S307 - the control for the refusals below
    assert marker.exists()
    unpickled = tmp_path / "control-pickle"
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    _loads_with_cloudpickle(json.dumps({"config": {"x": _pickled(unpickled)}}))  # as Tune reads a trial's state
    assert unpickled.exists()


@pytest.mark.timeout(300)
def test_confs_that_carry_code_are_refused_before_any_job_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    benign = {
        "space": {"x": {"grid_search": [1, 3]}, "steps": 1},
        "scheduler": "fifo",
        "search": "random",
        "kwargs": {},
    }
    for case, conf, field in _confs(marker):
        # Every param in every conf: dag.test() in one process merges a conf into the params' defaults.
        run = run_dag(load_dag("aft_conf_as_data", FILE), {**benign, **conf}, logical_date=_date())
        assert run.state == "failed", case
        [error] = run.errors("tune")
        assert isinstance(error, ValueError), (case, error)
        assert field in str(error), (case, str(error))
        assert jobs_of(experiment("aft_conf_as_data", run.run_id)) == [], case
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_a_trainable_named_by_a_conf_is_refused_even_with_native_rendering():
    run = run_dag(load_dag("aft_trainable_from_conf", FILE), {"trainable": "subprocess:getoutput"}, _date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    assert "trainable = 'subprocess:getoutput'" in str(error) and "allowed_code_references" in str(error)
    assert jobs_of(experiment("aft_trainable_from_conf", run.run_id)) == []


@pytest.mark.timeout(240)
def test_a_path_the_dag_file_wrote_as_a_choice_value_is_not_code_a_conf_may_name():
    """The DAG file lists model classes as a choice's values (data the trainable reads); a conf that names one as
    a ``sample_from`` (code Tune would call on the driver) is refused before any Ray job, and the same DAG runs."""
    dag = load_dag("aft_choice_is_data", FILE)
    model = "tune_testkit.classes:Stepper"
    run = run_dag(dag, {"extra": {"sample_from": model}}, _date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    assert isinstance(error, ValueError)
    assert f"param_space.extra = {model!r}" in str(error) and "allowed_code_references" in str(error), str(error)
    assert jobs_of(experiment("aft_choice_is_data", run.run_id)) == []

    run = run_dag(dag, {"extra": 1}, _date())
    assert run.state == "success", run.errors("tune")
    assert run.xcom("tune")["best_config"]["model"] in ("tune_testkit.classes:Stepper", "tune_testkit.classes:Reusable")


@pytest.mark.timeout(180)
def test_a_trainable_mapped_from_an_xcom_is_refused_and_one_mapped_from_a_literal_list_runs():
    run = run_dag(load_dag("aft_trainable_from_xcom", FILE), {"trainable": "subprocess:getoutput"}, _date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    assert isinstance(error, ValueError)
    assert "trainable = 'subprocess:getoutput'" in str(error) and "allowed_code_references" in str(error)
    assert jobs_of(experiment("aft_trainable_from_xcom", run.run_id)) == []

    run = run_dag(load_dag("aft_trainable_from_literal_expand", FILE), None, _date())
    assert run.state == "success", run.errors("tune")
    assert run.xcom("tune")["best_config"]["x"] == 1  # the one mapped instance's result
