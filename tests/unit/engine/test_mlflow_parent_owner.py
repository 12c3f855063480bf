"""Whose MLflow parent run the engine adopts (issue 30, finding 6): only one whose owner tags are this spec's owner,
compared as ``contract.owner_differs`` compares owners; another owner's, or one without owner tags, is refused at the
engine's start, before anything is written to it. Against the stand-in client of test_mlflow_tracking.py (the real
server is in tests/integration/test_mlflow_tracking.py)."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec
from tests.unit.engine.test_mlflow_tracking import BASE, TRACKING, FakeClient

pytest.importorskip("mlflow")

OWNER = {"dag_id": "dag_a", "task_id": "tune", "map_index": -1, "run_id": "manual__a"}


def _spec(owner: dict[str, Any] | None) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, "mlflow": TRACKING, "owner": owner, "param_space": {"x": 1}})


def _start(client: FakeClient, owner: dict[str, Any] | None) -> Any:
    from airflow_tune.engine.mlflow_tracking import MLflowTracking

    tracker = MLflowTracking(_spec(owner), client_factory=lambda uri: client, out=io.StringIO())
    tracker.start()
    return tracker


def _finished_parent(client: FakeClient, owner: dict[str, Any] | None) -> str:
    """The owner's experiment ran once: its parent run ended FINISHED with one best_loss and one trial run."""
    tracker = _start(client, owner)
    trial = type("T", (), {"trial_id": "t1", "config": {"x": 1}})()
    tracker.on_trial_start(0, [], trial)
    tracker.on_trial_result(0, [], trial, {"loss": 0.5, "training_iteration": 1})
    tracker.on_trial_complete(0, [], trial)
    manifest = {"best_trial_id": "t1", "best_metrics": {"loss": 0.5}}
    tracker.finish(unfinished=[], interrupted=False, manifest=manifest, failed=False)
    return str(tracker.parent_run_id)


def _refused(client: FakeClient, owner: dict[str, Any] | None) -> str:
    from airflow_tune.engine.imports import EngineError

    before = copy.deepcopy(client.runs)
    with pytest.raises(EngineError) as caught:
        _start(client, owner)
    assert client.runs == before, "nothing written to MLflow: no status, tag, metric or run"
    return str(caught.value)


def test_the_parent_run_carries_every_owner_tag_the_check_needs():
    client = FakeClient()
    parent = client.runs[_start(client, {**OWNER, "map_index": 3}).parent_run_id]["tags"]
    assert {k: v for k, v in parent.items() if k.split(".")[-1] in OWNER} == {
        "airflow_tune.dag_id": "dag_a",
        "airflow_tune.task_id": "tune",
        "airflow_tune.map_index": "3",
        "airflow_tune.run_id": "manual__a",
    }
    # A named experiment's owner has no run: no run_id tag, and map index 0 is written (not dropped as falsy).
    client = FakeClient()
    parent = client.runs[_start(client, {**OWNER, "map_index": 0, "run_id": None}).parent_run_id]["tags"]
    assert parent["airflow_tune.map_index"] == "0" and "airflow_tune.run_id" not in parent


@pytest.mark.parametrize(
    "other", [{"dag_id": "dag_b"}, {"task_id": "other_task"}, {"map_index": 2}, {"run_id": "manual__b"}]
)
def test_another_owners_parent_run_is_refused_naming_the_experiment_the_run_and_its_owner(other):
    client = FakeClient()
    parent = _finished_parent(client, OWNER)
    message = _refused(client, {**OWNER, **other})
    assert "MLflow experiment 'airflow-tune/d/t'" in message and f"parent run {parent}" in message
    assert "belongs to DAG 'dag_a', task 'tune'" in message and "experiment_name" in message
    assert "no trial has run" in message
    assert "\n" not in message, "one line: the job's verdict"
    assert "manual__a" not in message and "0.5" not in message, "no value of the other run is shown"


def test_a_mapped_instances_parent_run_names_its_map_index():
    client = FakeClient()
    _finished_parent(client, {**OWNER, "map_index": 1})
    assert "map index 1" in _refused(client, {**OWNER, "map_index": 2})


def test_a_parent_run_without_owner_tags_is_refused():
    client = FakeClient()
    experiment_id = client.create_experiment("airflow-tune/d/t")
    tags = {"airflow_tune.experiment": "exp-1", "airflow_tune.role": "parent"}
    run_id = client.create_run(experiment_id, run_name="exp-1", tags=tags).info.run_id
    client.set_terminated(run_id, status="FINISHED")
    message = _refused(client, OWNER)
    assert f"parent run {run_id}" in message and "no recorded owner" in message


def test_the_same_owners_retry_adopts_its_parent_run_and_trial_runs():
    client = FakeClient()
    parent = _finished_parent(client, OWNER)
    again = _start(client, OWNER)
    assert again.parent_run_id == parent and list(again.runs) == ["t1"]
    assert client.runs[parent]["status"] == "RUNNING"
    # A named experiment (no run id recorded) is adopted by the task's next DAG run too, as its storage is.
    client = FakeClient()
    named = {**OWNER, "run_id": None}
    parent = _finished_parent(client, named)
    assert _start(client, named).parent_run_id == parent


def test_a_parent_run_of_the_version_before_map_index_was_tagged_counts_as_unmapped():
    """Parent runs written before this version carry dag_id, task_id (and run_id) but no map index: an unmapped task
    adopts its own; a mapped instance, which cannot tell whose it was, refuses it."""
    client = FakeClient()
    parent = _finished_parent(client, OWNER)
    del client.runs[parent]["tags"]["airflow_tune.map_index"]
    assert _start(client, OWNER).parent_run_id == parent
    client.runs[parent]["status"] = "FINISHED"
    assert f"parent run {parent}" in _refused(client, {**OWNER, "map_index": 0})


def test_the_first_parent_run_decides_when_two_drivers_raced():
    """Two parent runs of one experiment name (two drivers created one each at the same moment): the first is the
    experiment's, as its storage belongs to its first writer; its owner adopts it, the other owner is refused."""
    client = FakeClient()
    first = _finished_parent(client, OWNER)
    experiment_id = client.experiments["airflow-tune/d/t"]
    tags = {**client.runs[first]["tags"], "airflow_tune.dag_id": "dag_b"}
    client.create_run(experiment_id, run_name="exp-1", tags=tags)
    assert _start(client, OWNER).parent_run_id == first
    client.runs[first]["status"] = "FINISHED"
    assert f"parent run {first}" in _refused(client, {**OWNER, "dag_id": "dag_b"})


def test_a_spec_without_owner_adopts_as_the_storage_checks_do():
    """The operator always sets the owner; a job submitted by hand without one is not checked (``owner_differs``
    with no owner), as its experiment's storage is not."""
    client = FakeClient()
    parent = _finished_parent(client, OWNER)
    assert _start(client, None).parent_run_id == parent
