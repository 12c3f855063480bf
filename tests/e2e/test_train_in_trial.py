"""Ray Train inside a trial, on the real stack (Ray head of 2 CPUs, S3, ``dag.test()``): the example DAG
``dags/ray_train_in_trial.py`` tunes a function trainable that runs a two-worker ``DataParallelTrainer`` with Tune's
``TuneReportCallback``. Its Train checkpoint is the XCom's best checkpoint, promoted and downloaded downstream; Train
workers the cluster cannot hold (declared in ``resources_per_trial.train_workers``) fail the task naming them."""

from __future__ import annotations

import importlib
import json
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import RESULT_KEYS, TRIALS_FILE, manifest_uri
from airflow_tune.registries.s3 import read_champion
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("stack")


def _unique_date() -> datetime:
    return datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


@pytest.fixture
def example_dag(monkeypatch):
    """The example DAG, from the example DAGs folder as a second DAG bundle (dag.test() serializes from a bundle)."""
    bundle = "airflow.dag_processing.bundles.local.LocalDagBundle"
    bundles = [
        {"name": "dags-folder", "classpath": bundle, "kwargs": {}},
        {"name": "examples", "classpath": bundle, "kwargs": {"path": str(REPO / "dags")}},
    ]
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
    monkeypatch.syspath_prepend(str(REPO / "dags"))
    for name in [m for m in sys.modules if m.split(".")[0] in ("ray_train_in_trial", "train_in_trial")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("ray_train_in_trial").dag


@pytest.mark.timeout(240)
def test_the_best_train_checkpoint_is_the_trials_checkpoint_promoted_and_downloaded(example_dag):
    from train_in_trial.trainables import shard

    # No logical date, as the UI makes runs (the example's start_date is after the tests' unique dates).
    run = run_dag(example_dag, logical_date=None)
    assert run.state == "success", (run.task_states(), run.errors("tune"), run.errors("promote"))
    result = run.xcom("tune")
    assert set(result) == set(RESULT_KEYS)
    assert (result["num_trials"], result["num_terminated"], result["num_errored"]) == (2, 2, 0)
    # Rank 0's metrics reached Tune from a Train run of two workers.
    assert result["best_metrics"]["world_size"] == 2

    # The best checkpoint is the best trial's Train checkpoint: in the Train run kept in that trial's own folder.
    uri = result["best_checkpoint_uri"]
    rows = {
        row["trial_id"]: row for row in storage.read_json(manifest_uri(result["experiment_uri"], TRIALS_FILE))["trials"]
    }
    best_trial = rows[result["best_trial_id"]]
    assert uri.startswith(f"{best_trial['path']}/train/checkpoint_"), (uri, best_trial["path"])
    assert uri.startswith(result["experiment_uri"] + "/")

    # Promoted from there, and the downstream task downloaded its files.
    decision = run.xcom("promote")
    assert decision["promoted"] is True, decision
    assert read_champion(decision["uri"].rsplit("/versions/", 1)[0])["source_checkpoint_uri"] == uri
    loaded = run.xcom("load_model")
    assert "model.json" in loaded["files"] and loaded["version"] == decision["version"]
    model = loaded["model"]
    # The checkpoint is the one the best result reported: the best trial's learning rate, and the loss its model
    # gives on rank 0's shard is the best loss Tune recorded.
    assert model["lr"] == result["best_config"]["lr"]
    x, y = shard(0, 2)
    loss = float((((model["w"] * x + model["b"]) - y) ** 2).mean())
    assert loss == pytest.approx(result["best_metrics"]["loss"], rel=1e-9)
    print(f"train in trial: {run.seconds:.1f}s for the DAG (2 trials x 2 Train workers x 2 epochs)")


@pytest.mark.timeout(120)
def test_train_workers_the_cluster_cannot_hold_fail_the_task_naming_them():
    run = run_dag(load_dag("aft_train_workers_too_many", "train_cases.py"), logical_date=_unique_date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    first = str(error).splitlines()[0]
    name = experiment("aft_train_workers_too_many", run.run_id)
    assert first.startswith(f"experiment {name} failed: InfeasibleResourcesError: trial "), str(error)[:2000]
    assert "and its 2 Train workers {'CPU': 1.0} each (PACK" in first and "'CPU': 2.0" in first, first
    [job] = jobs_of(name)
    assert job["status"] == "FAILED"
