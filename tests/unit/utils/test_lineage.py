"""OpenLineage, no services: dataset naming from URIs, what each operator reports from what it holds after it ran,
no exception into the task, and no OpenLineage import (nor any listener) unless a transport is configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.utils.lineage import dataset_name, named_dataset_uris, promote_dataset_names, tune_dataset_names

EXP = "s3://ml-bucket/experiments/retrain__tune__run1"
CKPT = f"{EXP}/trial_0001/checkpoint_000002"
REGISTRY = "s3://ml-bucket/models/digits"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://ml-bucket/experiments/exp", ("s3://ml-bucket", "experiments/exp")),
        ("s3://ml-bucket/experiments/exp/", ("s3://ml-bucket", "experiments/exp")),
        ("S3://ml-bucket/a", ("s3://ml-bucket", "a")),
        ("s3://ml-bucket", ("s3://ml-bucket", "/")),
        ("s3://ml-bucket/", ("s3://ml-bucket", "/")),
        ("gs://gbucket/x/y", ("gs://gbucket", "x/y")),
        ("gcs://gbucket/x/y", ("gs://gbucket", "x/y")),
        ("file:///shared/experiments/exp", ("file", "/shared/experiments/exp")),
        ("file://nfs-host/shared/exp", ("file://nfs-host", "/shared/exp")),
        ("/shared/experiments/exp/", ("file", "/shared/experiments/exp")),
        ("s3:///no-bucket", None),
        ("https://example.com/models/x", None),
        ("hdfs://namenode/x", None),
        ("relative/path", None),
        ("s3://bucket/{{ params.name }}", None),
        ("s3://bucket/with space", None),
        ("", None),
        (None, None),
        ({"lr": 0.1}, None),
    ],
)
def test_dataset_names_follow_the_openlineage_naming(uri: Any, expected: Any) -> None:
    assert dataset_name(uri) == expected


def _result(**overrides: Any) -> dict[str, Any]:
    return {
        "experiment": "retrain__tune__run1",
        "experiment_uri": EXP,
        "job_id": "j1",
        "metric": "loss",
        "mode": "min",
        "best_trial_id": "trial_0001",
        "best_config": {"x": 3},
        "best_metrics": {"loss": 0.01},
        "best_checkpoint_uri": CKPT,
        "num_trials": 2,
        "num_terminated": 2,
        "num_errored": 0,
        "dashboard_url": None,
        "finished_at": 1.0,
        **overrides,
    }


def test_tune_reads_the_warm_start_registry_and_writes_the_experiment_and_best_checkpoint() -> None:
    inputs, outputs = tune_dataset_names(_result(), REGISTRY)
    assert inputs == [("s3://ml-bucket", "models/digits")]
    assert outputs == [
        ("s3://ml-bucket", "experiments/retrain__tune__run1"),
        ("s3://ml-bucket", "experiments/retrain__tune__run1/trial_0001/checkpoint_000002"),
    ]


def test_tune_without_a_checkpoint_or_a_registry_reports_only_the_experiment() -> None:
    # A config dict warm start (an XCom) is data, not a dataset; a best trial that saved no checkpoint has none.
    inputs, outputs = tune_dataset_names(_result(best_checkpoint_uri=None), {"x": 3})
    assert inputs == []
    assert outputs == [("s3://ml-bucket", "experiments/retrain__tune__run1")]
    # wait_for_completion=False returns the job and the experiment only.
    assert tune_dataset_names({"job_id": "j", "experiment_uri": EXP}, None) == (
        [],
        [("s3://ml-bucket", "experiments/retrain__tune__run1")],
    )


def test_tune_without_a_result_reports_the_folder_a_job_ran_on_or_nothing() -> None:
    assert tune_dataset_names(None, REGISTRY, EXP) == (
        [("s3://ml-bucket", "models/digits")],
        [("s3://ml-bucket", "experiments/retrain__tune__run1")],
    )
    assert tune_dataset_names(None, None, None) == ([], [])


def test_the_datasets_a_spec_names_for_its_trainable_are_inputs() -> None:
    kwargs = {
        "train": "s3://data/digits/train.parquet",
        "extra": {"eval": ["gs://other/eval.csv", "file:///srv/holdout.npz"], "label": "digits"},
        # A plain path may name anything on the cluster's nodes; other schemes have no naming here.
        "cache": "/tmp/cache",
        "site": "https://example.com/data.csv",
        "steps": 3,
    }
    assert named_dataset_uris(kwargs) == [
        "s3://data/digits/train.parquet",
        "gs://other/eval.csv",
        "file:///srv/holdout.npz",
    ]
    inputs, _ = tune_dataset_names(_result(), REGISTRY, named=named_dataset_uris(kwargs))
    assert inputs == [
        ("s3://ml-bucket", "models/digits"),
        ("s3://data", "digits/train.parquet"),
        ("gs://other", "eval.csv"),
        ("file", "/srv/holdout.npz"),
    ]


def test_promote_reads_the_checkpoint_and_writes_the_version_and_registry_only_when_promoted() -> None:
    decision = {"promoted": True, "version": "20260101T000000Z-trial_0001", "uri": "s3://..."}
    inputs, outputs = promote_dataset_names(decision, CKPT, REGISTRY + "/")
    assert inputs == [("s3://ml-bucket", "experiments/retrain__tune__run1/trial_0001/checkpoint_000002")]
    assert outputs == [
        ("s3://ml-bucket", "models/digits/versions/20260101T000000Z-trial_0001"),
        ("s3://ml-bucket", "models/digits"),
    ]
    not_promoted = {"promoted": False, "version": None, "reason": "does not beat champion"}
    assert promote_dataset_names(not_promoted, CKPT, REGISTRY) == (inputs, [])
    # Failed before deciding, or while copying (the version is set only once every object is in place).
    assert promote_dataset_names(None, CKPT, REGISTRY) == (inputs, [])
    assert promote_dataset_names({"promoted": True, "version": None}, CKPT, REGISTRY) == (inputs, [])
    assert promote_dataset_names(None, None, REGISTRY) == ([], [])


def test_an_mlflow_registry_is_named_by_its_model_version_in_the_tracking_servers_namespace() -> None:
    decision = {"promoted": True, "version": "3", "tracking_uri": "http://mlflow:5000", "uri": CKPT}
    inputs, outputs = promote_dataset_names(decision, CKPT, "models:/digits")
    assert inputs == [("s3://ml-bucket", "experiments/retrain__tune__run1/trial_0001/checkpoint_000002")]
    assert outputs == [("http://mlflow:5000", "models:/digits/3"), ("http://mlflow:5000", "models:/digits")]
    assert promote_dataset_names({"promoted": False, "version": None}, CKPT, "models:/digits") == (inputs, [])
    # A warm start from the same model reads the dataset the promotion wrote.
    for warm_start in ("models:/digits", "models:/digits@champion"):
        assert tune_dataset_names(None, warm_start, None, mlflow_namespace="http://mlflow:5000") == (
            [("http://mlflow:5000", "models:/digits")],
            [],
        )


# -- the operators' method, as the OpenLineage listener calls it ---------------------------------------------------


def _names(datasets: list[Any]) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


def test_tune_operator_reports_the_result_it_returned() -> None:
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    op = RayTuneOperator(
        task_id="tune", trainable="p.m:f", storage_path="s3://ml-bucket/experiments", metric="loss", mode="min"
    )
    op.__dict__["hook"] = SimpleNamespace(job_url=lambda job_id: f"http://ray/#/jobs/{job_id}")
    op.warm_start = REGISTRY  # as rendered
    # The spec as execute() built it: its trainable's keyword arguments name a dataset it reads.
    op.spec = ExperimentSpec.from_dict(
        {
            "trainable": "p.m:f",
            "name": "retrain__tune__run1",
            "storage_path": "s3://ml-bucket/experiments",
            "metric": "loss",
            "mode": "min",
            "trainable_kwargs": {"data": "s3://data/digits/train.parquet"},
        }
    )
    # Nothing returned yet (the task failed before a job ran): no output, and no exception.
    before = op.get_openlineage_facets_on_complete(None)
    assert isinstance(before, OperatorLineage)
    assert _names(before.inputs) == [("s3://ml-bucket", "models/digits"), ("s3://data", "digits/train.parquet")]
    assert before.outputs == []
    # _xcom_result is the one place both execute() and execute_complete() (the deferred path) return through.
    returned = op._xcom_result(_result(), "j1")
    lineage = op.get_openlineage_facets_on_complete(None)
    assert all(isinstance(d, Dataset) for d in lineage.inputs + lineage.outputs)
    assert _names(lineage.outputs) == [
        ("s3://ml-bucket", "experiments/retrain__tune__run1"),
        ("s3://ml-bucket", "experiments/retrain__tune__run1/trial_0001/checkpoint_000002"),
    ]
    assert returned["best_checkpoint_uri"] == CKPT


def test_promote_operator_reports_its_decision_and_never_raises() -> None:
    op = PromoteCheckpointOperator(task_id="promote", result=json.dumps(_result()), registry_uri=REGISTRY)
    op.returned = {"promoted": True, "version": "v1", "uri": f"{REGISTRY}/versions/v1/checkpoint"}
    lineage = op.get_openlineage_facets_on_complete(None)
    assert _names(lineage.inputs) == [
        ("s3://ml-bucket", "experiments/retrain__tune__run1/trial_0001/checkpoint_000002")
    ]
    assert _names(lineage.outputs) == [
        ("s3://ml-bucket", "models/digits/versions/v1"),
        ("s3://ml-bucket", "models/digits"),
    ]
    # A result that is not JSON (the task failed on it): an empty lineage, not an exception.
    broken = PromoteCheckpointOperator(task_id="promote2", result="{not json", registry_uri=REGISTRY)
    empty = broken.get_openlineage_facets_on_complete(None)
    assert empty.inputs == [] and empty.outputs == []


# -- nothing of OpenLineage unless it is configured -----------------------------------------------------------------


def _clean_env(tmp_path: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "OPENLINEAGE" not in k}
    return {**env, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}


def test_importing_the_operators_imports_nothing_of_openlineage(tmp_path) -> None:
    # Airflow itself reads the installed provider's get_provider_info (its config section): that is the baseline.
    code = (
        "import sys, json\n"
        "import airflow.sdk\n"
        "before = {m for m in sys.modules if 'openlineage' in m}\n"
        "import airflow_tune.operators.tune, airflow_tune.operators.promote, airflow_tune.utils.lineage\n"
        "after = {m for m in sys.modules if 'openlineage' in m}\n"
        "print(json.dumps([sorted(after - before), sorted(m for m in after if m.startswith('openlineage'))]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(tmp_path), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], []]


def test_without_a_transport_the_openlineage_plugin_registers_no_listener(tmp_path) -> None:
    """The provider is installed for every test, and stays inert in all but the lineage e2e test: with no transport
    configured it is disabled, and its plugin brings no listener, macro or hook lineage reader."""
    code = (
        "import json\n"
        "from airflow.providers.openlineage import conf\n"
        "from airflow.providers.openlineage.plugins.openlineage import OpenLineageProviderPlugin as P\n"
        "print(json.dumps([conf.is_disabled(), len(P.listeners), len(P.macros), "
        "len(getattr(P, 'hook_lineage_readers', []))]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(tmp_path), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, 0, 0, 0]
    transport = {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "console"})}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**_clean_env(tmp_path), **transport},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])[:2] == [False, 1]
