"""The MLflow registry's pure logic: its URIs, the shared gate with a champion it cannot compare with, the listing
digest, and that importing the operators imports no mlflow (DAG parsing unchanged)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_tune.registries.gates import gate_decision
from airflow_tune.registries.mlflow import parse_model_uri, registered_model_name


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("models:/digits", ("digits", "champion", None)),
        ("models:/digits@champion", ("digits", "champion", None)),
        ("models:/digits@staging", ("digits", "staging", None)),
        ("models:/digits/12", ("digits", None, "12")),
    ],
)
def test_model_uris(uri, expected):
    assert parse_model_uri(uri) == expected


@pytest.mark.parametrize(
    "uri", ["models:/", "models:/@champion", "models:/digits/latest", "models:/a b", "s3://b/m", "models:/x@'y"]
)
def test_bad_model_uris_are_refused(uri):
    with pytest.raises(ValueError):
        parse_model_uri(uri)


@pytest.mark.parametrize("uri", ["models:/digits@champion", "models:/digits/3", "models:/", "models:/it's"])
def test_a_registry_is_a_registered_model_name_only(uri):
    with pytest.raises(ValueError, match="an MLflow registry is models:/<name>"):
        registered_model_name(uri)
    assert registered_model_name("models:/digits") == "digits"


def test_a_champion_that_cannot_be_compared_is_compared_with_nothing_and_the_reason_says_why():
    args = {"metric": "loss", "mode": "min", "threshold": None, "has_champion": True, "champion_value": None}
    ok, reason = gate_decision("better_than_champion", value=0.5, incomparable="champion version 4 is foreign", **args)
    assert ok and reason == "champion version 4 is foreign: compared with nothing; loss=0.5"
    # A winner without a finite value never passes, comparable or not.
    assert not gate_decision("better_than_champion", value=float("nan"), incomparable="x", **args)[0]
    # The threshold gate ignores the champion.
    ok, reason = gate_decision("threshold", value=0.5, incomparable="x", **{**args, "threshold": 0.1})
    assert not ok and reason == "loss=0.5 misses threshold 0.1 (min)"


def test_importing_the_operators_and_checkpoints_imports_no_mlflow():
    code = (
        "import sys\n"
        "import airflow_tune.operators.promote, airflow_tune.operators.tune, airflow_tune.checkpoints\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'boto3', 'ray')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("registry", "words"),
    [
        ("models:/digits@champion", "an MLflow registry is models:/<name>"),
        ("models:/digits/3", "an MLflow registry is models:/<name>"),
        ("models:/", "an MLflow registry is models:/<name>"),
    ],
)
def test_a_bad_mlflow_registry_fails_at_execute_before_the_connection_is_looked_up(registry, words):
    from airflow.sdk import DAG

    from airflow_tune.operators.promote import PromoteCheckpointOperator

    result = {
        "metric": "loss",
        "mode": "min",
        "best_metrics": {"loss": 0.1},
        "experiment_uri": "s3://b/exp",
        "best_checkpoint_uri": "s3://b/exp/t/checkpoint_000001",
    }
    with DAG("aft_unit_mlflow_registry", schedule=None):
        op = PromoteCheckpointOperator(
            task_id="promote", result=result, registry_uri=registry, mlflow_conn_id="no_such_connection"
        )
    with pytest.raises(ValueError, match=words):
        op.execute({})  # type: ignore[arg-type]
