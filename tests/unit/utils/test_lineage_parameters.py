"""OpenLineage run parameters, no services: the tune task's search and winner and the promote task's decision in the
standard ``executionParameters`` run facet, JSON-safe, bounded, without credentials, valid against the spec's
run facet and execution parameters facet schemas, and never failing the task."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.utils import lineage_parameters
from airflow_tune.utils.lineage_parameters import (
    FACET_KEY,
    MAX_VALUE_CHARS,
    PRODUCER,
    bounded_json,
    promote_parameters,
    tune_parameters,
    without_credentials,
)
from tests.support.openlineage_schemas import EXECUTION_PARAMETERS_SCHEMA_URL, validate_run_facet

EXP = "s3://ml-bucket/experiments/retrain__tune__run1"
CKPT = f"{EXP}/trial_0001/checkpoint_000002"
REGISTRY = "s3://ml-bucket/models/digits"
SPACE = {"lr": {"loguniform": [1e-4, 1e-1]}, "depth": {"choice": [2, 4, 8]}, "bs": {"grid_search": [16, 32]}}
SECRETS = ("user", "secret", "token", "frag", "pw")


def _spec(**overrides: Any) -> ExperimentSpec:
    return ExperimentSpec.from_dict(
        {
            "trainable": "p.m:f",
            "name": "retrain__tune__run1",
            "storage_path": "s3://ml-bucket/experiments",
            "metric": "loss",
            "mode": "min",
            "num_samples": 4,
            "param_space": SPACE,
            **overrides,
        }
    )


def _result(**overrides: Any) -> dict[str, Any]:
    return {
        "experiment": "retrain__tune__run1",
        "experiment_uri": EXP,
        "job_id": "j1",
        "metric": "loss",
        "mode": "min",
        "best_trial_id": "trial_0001",
        "best_config": {"lr": 0.01, "depth": 4, "bs": 32},
        "best_metrics": {"loss": 0.25, "accuracy": 0.9},
        "best_checkpoint_uri": CKPT,
        "num_trials": 8,
        "num_terminated": 7,
        "num_errored": 1,
        "dashboard_url": None,
        **overrides,
    }


def _values(params: list[dict[str, str]]) -> dict[str, str]:
    keys = [p["key"] for p in params]
    assert len(keys) == len(set(keys)), keys
    return {p["key"]: p["value"] for p in params}


def _facet_json(lineage: Any) -> dict[str, Any]:
    """The facet as the OpenLineage client serializes it into the event."""
    from openlineage.client.serde import Serde

    return json.loads(Serde.to_json(lineage.run_facets[FACET_KEY]))


# -- the tune task ---------------------------------------------------------------------------------------------------


def test_a_finished_search_names_its_metric_space_winner_and_trials() -> None:
    values = _values(tune_parameters(_result(), _spec()))
    assert values == {
        "tune.experiment": "retrain__tune__run1",
        "tune.metric": "loss",
        "tune.mode": "min",
        "tune.search_space": json.dumps(SPACE, sort_keys=True, separators=(",", ":")),
        "tune.num_samples": "4",
        "tune.best_value": "0.25",
        "tune.best_config": '{"bs":32,"depth":4,"lr":0.01}',
        "tune.best_trial_id": "trial_0001",
        "tune.num_trials": "8",
        "tune.num_terminated": "7",
        "tune.num_errored": "1",
    }
    assert json.loads(values["tune.search_space"]) == SPACE


def test_before_a_result_the_question_is_named_and_no_winner() -> None:
    # The task failed before it returned: what the spec asked, nothing found.
    assert _values(tune_parameters(None, _spec())) == {
        "tune.metric": "loss",
        "tune.mode": "min",
        "tune.search_space": json.dumps(SPACE, sort_keys=True, separators=(",", ":")),
        "tune.num_samples": "4",
    }
    # wait_for_completion=False returns the job and the experiment only: no winner yet.
    left_running = tune_parameters({"job_id": "j", "experiment": "e", "experiment_uri": EXP}, _spec())
    assert not [p for p in left_running if p["key"].startswith("tune.best") or "num_t" in p["key"]]
    # Nothing at all (no spec built): nothing to say.
    assert tune_parameters(None, None) == []


def test_non_finite_values_are_json_safe_strings() -> None:
    result = _result(best_config={"lr": float("nan"), "clip": float("inf")}, best_metrics={"loss": float("-inf")})
    values = _values(tune_parameters(result, _spec()))
    assert values["tune.best_value"] == "-Infinity"
    assert json.loads(values["tune.best_config"]) == {"clip": "Infinity", "lr": "NaN"}
    json.dumps(tune_parameters(result, _spec()), allow_nan=False)


def test_a_missing_best_metric_is_left_out() -> None:
    values = _values(tune_parameters(_result(best_metrics={"accuracy": 0.9}), _spec()))
    assert "tune.best_value" not in values and values["tune.best_config"]


# -- the promote task ------------------------------------------------------------------------------------------------


def test_a_promotion_names_the_decision_the_version_and_what_was_compared() -> None:
    decision = {
        "promoted": True,
        "version": "20260101T000000Z-trial_0001",
        "uri": f"{REGISTRY}/versions/20260101T000000Z-trial_0001/checkpoint",
        "reason": "loss=0.25 beats champion 0.5 (min)",
        "champion": {"version": "old", "value": 0.5, "uri": "s3://user:secret@ml-bucket/x"},
        "metric": "loss",
        "mode": "min",
        "value": 0.25,
    }
    assert _values(promote_parameters(decision, "better_than_champion")) == {
        "promote.gate": "better_than_champion",
        "promote.promoted": "true",
        "promote.reason": "loss=0.25 beats champion 0.5 (min)",
        "promote.version": "20260101T000000Z-trial_0001",
        "promote.metric": "loss",
        "promote.mode": "min",
        "promote.value": "0.25",
        "promote.champion_version": "old",
        "promote.champion_value": "0.5",
    }


def test_a_winner_held_back_names_the_reason_and_no_version() -> None:
    decision = {
        "promoted": False,
        "version": None,
        "reason": "loss=0.25 misses threshold 0.1 (min)",
        "champion": None,
        "metric": "loss",
        "mode": "min",
        "value": 0.25,
    }
    values = _values(promote_parameters(decision, "threshold", 0.1))
    assert values == {
        "promote.gate": "threshold",
        "promote.threshold": "0.1",
        "promote.promoted": "false",
        "promote.reason": "loss=0.25 misses threshold 0.1 (min)",
        "promote.metric": "loss",
        "promote.mode": "min",
        "promote.value": "0.25",
    }
    # Failed before the gate decided: the gate only.
    assert _values(promote_parameters(None, "always")) == {"promote.gate": "always"}


# -- credentials and size --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://user:secret@bucket/x?token=y", "s3://bucket/x"),
        ("https://user:pw@mlflow.example:5000/api?token=x#frag", "https://mlflow.example:5000/api"),
        ("file:///shared/x?token=y", "file:///shared/x"),
        ("gs://bucket/a/b", "gs://bucket/a/b"),
        ("s3://bucket:notaport/x", "<uri>"),
    ],
)
def test_a_uri_keeps_scheme_host_port_and_path(uri: str, expected: str) -> None:
    assert without_credentials(uri) == expected


def test_no_credential_reaches_a_parameter() -> None:
    space = {"data": "s3://user:secret@bucket/train?token=y", "note": "see https://user:pw@wiki.example/p#frag"}
    result = _result(
        best_config={"data": "s3://user:secret@bucket/train?token=y", "s3://u:pw@b/k": 1},
        experiment="gs://user:secret@b/e",
    )
    params = tune_parameters(result, _spec(param_space=space))
    decision = {"promoted": False, "reason": "champion at https://user:secret@mlflow:5000/?token=t", "champion": None}
    params += promote_parameters(decision, "always")
    text = json.dumps(params)
    assert not any(s in text for s in SECRETS), text
    values = _values(params)
    assert json.loads(values["tune.search_space"])["data"] == "s3://bucket/train"
    assert values["promote.reason"] == "champion at https://mlflow:5000/"


def test_a_large_search_space_is_shortened_into_json_that_still_parses() -> None:
    space = {"x": {"grid_search": list(range(5000))}, "lr": {"loguniform": [1e-4, 1e-1]}}
    full = json.dumps(space, sort_keys=True, separators=(",", ":"))
    (param,) = [p for p in tune_parameters(None, _spec(param_space=space)) if p["key"] == "tune.search_space"]
    assert len(full) > MAX_VALUE_CHARS >= len(param["value"])
    shortened = json.loads(param["value"])
    assert shortened["lr"] == {"loguniform": [1e-4, 1e-1]}
    assert shortened["x"]["grid_search"][:3] == [0, 1, 2]
    assert shortened["x"]["grid_search"][-1] == f"... {5000 - 32} more"
    assert hashlib.sha256(full.encode()).hexdigest() in param["description"]


@pytest.mark.parametrize(
    "value",
    [
        {f"key{i:05d}": i for i in range(3000)},  # many keys
        {"s": "x" * 100_000},  # one long string
        [[[[list(range(100))] * 20] * 20] * 4] * 4,  # wide and deep
    ],
)
def test_every_value_fits_the_bound(value: Any) -> None:
    text, note = bounded_json(value)
    assert len(text) <= MAX_VALUE_CHARS and note and "SHA-256" in note
    json.loads(text)


def test_a_value_too_deep_to_shorten_becomes_its_size_and_digest() -> None:
    deep: Any = "leaf"
    for _ in range(300):  # even one 16-character key a level is over the bound
        deep = {"k" * 16: deep}
    text, note = bounded_json(deep)
    assert len(text) <= MAX_VALUE_CHARS and note
    assert set(json.loads(text)) == {"shortened_from_chars", "sha256"}


# -- the operators' method, as the OpenLineage listener calls it ---------------------------------------------------


def test_the_tune_operators_lineage_carries_the_parameters_facet() -> None:
    from types import SimpleNamespace

    op = RayTuneOperator(
        task_id="tune", trainable="p.m:f", storage_path="s3://ml-bucket/experiments", metric="loss", mode="min"
    )
    op.__dict__["hook"] = SimpleNamespace(job_url=lambda job_id: f"http://ray/#/jobs/{job_id}")
    op.spec = _spec()
    before = _facet_json(op.get_openlineage_facets_on_complete(None))
    assert _values(before["parameters"])["tune.metric"] == "loss"
    op._xcom_result(_result(), "j1")  # the one place execute() and execute_complete() return through
    lineage = op.get_openlineage_facets_on_complete(None)
    facet = _facet_json(lineage)
    validate_run_facet(facet)
    assert facet["_producer"] == PRODUCER and facet["_schemaURL"] == EXECUTION_PARAMETERS_SCHEMA_URL
    values = _values(facet["parameters"])
    assert json.loads(values["tune.best_config"]) == {"lr": 0.01, "depth": 4, "bs": 32}
    assert values["tune.best_value"] == "0.25" and values["tune.num_trials"] == "8"
    assert len(lineage.outputs) == 2  # the datasets are still there


def test_the_promote_operators_lineage_carries_the_decision() -> None:
    op = PromoteCheckpointOperator(
        task_id="promote", result=json.dumps(_result()), registry_uri=REGISTRY, gate="threshold", threshold=0.1
    )
    op.returned = {"promoted": False, "version": None, "reason": "loss=0.25 misses threshold 0.1 (min)"}
    facet = _facet_json(op.get_openlineage_facets_on_complete(None))
    validate_run_facet(facet)
    values = _values(facet["parameters"])
    assert values["promote.promoted"] == "false" and values["promote.reason"].startswith("loss=0.25 misses")
    assert values["promote.gate"] == "threshold" and "promote.version" not in values


def test_parameters_that_cannot_be_built_leave_the_datasets_and_the_task_alone(monkeypatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    op = PromoteCheckpointOperator(task_id="promote", result=json.dumps(_result()), registry_uri=REGISTRY)
    op.returned = {"promoted": True, "version": "v1", "uri": f"{REGISTRY}/versions/v1/checkpoint"}
    assert set(op.get_openlineage_facets_on_complete(None).run_facets) == {FACET_KEY}
    monkeypatch.setattr(lineage_parameters, "promote_parameters", broken)
    lineage = op.get_openlineage_facets_on_complete(None)
    assert lineage.run_facets == {} and len(lineage.outputs) == 2
