"""The promotion registers only bytes it read and proved (issue 40), after a real experiment on the real stack (Ray
head, S3 endpoint, MLflow server): a best checkpoint changed in storage after the experiment ended (one file
overwritten with a pickle, or one file added) is refused by every promote task, naming the file, and nothing is
registered: no ``champion.json`` or version folder in the S3 registry, no MLflow version, alias or version folder.
No code of the planted pickle runs anywhere: its marker file never appears."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.exceptions import PromotionError
from tests.e2e.dags.promote_proof_cases import MLFLOW_MODEL_REGISTRY, MLFLOW_REGISTRY, S3_REGISTRY
from tests.e2e.helpers import load_dag, run_dag
from tests.e2e.test_registry_mlflow import champion, versions
from tests.support.mlflow_server import MlflowRest, mlflow_beside

FILE = "promote_proof_cases.py"
PROMOTES = ("promote_s3", "promote_mlflow", "promote_model")


@pytest.fixture(scope="module")
def mlflow_url(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_beside(stack, tmp_path_factory.mktemp("mlflow-proof")) as url:
        yield url


def _keys(s3: Any, uri: str) -> list[str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    return sorted(obj["Key"][len(prefix) + 1 :] for obj in listed)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("tamper", "refusal"),
    [
        ("overwrite", r"changed in storage after its trial wrote it: the bytes of 'state.json'"),
        ("add", r"holds other files than its trial wrote \(not written by the trial: 'loader.pkl'\)"),
    ],
)
def test_a_checkpoint_changed_after_the_experiment_ended_is_refused_by_every_promotion(
    mlflow_url, s3_client, tmp_path, tamper, refusal
):
    marker = tmp_path / "attacker-ran"
    date = datetime(2003, 3, 3, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    run = run_dag(load_dag("aft_promote_proof", FILE), {"tamper": tamper, "marker": str(marker)}, logical_date=date)

    states = run.task_states()
    assert states["tune"] == "success" and states["tamper"] == "success", (states, run.errors("tune"))
    for task_id in PROMOTES:
        assert states[task_id] == "failed", (task_id, states)
        [error] = run.errors(task_id)
        assert isinstance(error, PromotionError) and re.search(refusal, str(error)), (task_id, error)
    result = run.xcom("tune")
    assert str(result["best_checkpoint_uri"]) in str(run.errors("promote_s3")[0])

    # Nothing registered anywhere: no pointer, version or alias, and no version folder left behind.
    assert "champion.json" not in _keys(s3_client, S3_REGISTRY)
    assert not [k for k in _keys(s3_client, S3_REGISTRY) if k.startswith("versions/")]
    rest = MlflowRest(mlflow_url)
    for registry in (MLFLOW_REGISTRY, MLFLOW_MODEL_REGISTRY):
        name = registry.removeprefix("models:/")
        assert versions(rest, name) == [] and champion(rest, name) is None, name
        assert _keys(s3_client, f"s3://airflow-tune/mlflow-models/{name}") == [], name
    assert not marker.exists(), "the planted pickle ran"
