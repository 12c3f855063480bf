"""OpenLineage events go to whoever reads the lineage backend: a dataset named from a URI never carries its userinfo,
port, query or fragment (``s3://user:secret@bucket/x?token=y`` is namespace ``s3://bucket``, name ``x``), whether the
URI came from ``trainable_kwargs``, a registry, a result or the MLflow tracking server's URI. Pure logic."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.utils.lineage import dataset_name, named_dataset_uris, promote_dataset_names, tune_dataset_names

SECRETS = ("user", "secret", "token", "frag", "9000", "pw")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://user:secret@bucket/x?token=y", ("s3://bucket", "x")),
        ("s3://user@bucket/x", ("s3://bucket", "x")),
        ("s3://bucket:9000/data/x.parquet", ("s3://bucket", "data/x.parquet")),
        ("s3://bucket/x#frag", ("s3://bucket", "x")),
        ("gs://user:secret@gbucket/y?token=z", ("gs://gbucket", "y")),
        ("gcs://user:secret@gbucket:9000/y", ("gs://gbucket", "y")),
        ("file://user:pw@nfs-host:9000/shared/x?token=y#frag", ("file://nfs-host", "/shared/x")),
        ("file:///shared/x?token=y", ("file", "/shared/x")),
        ("s3://user:secret@/x", None),  # userinfo and no bucket: nothing to name
    ],
)
def test_a_dataset_name_keeps_scheme_host_and_path_only(uri: str, expected: Any) -> None:
    name = dataset_name(uri)
    assert name == expected
    if name is not None:
        assert not any(s in part for s in SECRETS for part in name), name


def test_trainable_kwargs_with_credentials_in_their_uris_name_datasets_without_them() -> None:
    kwargs = {"train": "s3://user:secret@data/digits/train.parquet?token=y", "eval": ["gs://u:pw@other/e.csv#frag"]}
    inputs, _ = tune_dataset_names(None, None, named=named_dataset_uris(kwargs))
    assert inputs == [("s3://data", "digits/train.parquet"), ("gs://other", "e.csv")]


def test_a_registry_and_a_tracking_server_are_named_without_credentials() -> None:
    decision = {"promoted": True, "version": "3", "tracking_uri": "https://u:pw@mlflow.example:5000/?token=x#frag"}
    _, outputs = promote_dataset_names(decision, None, "models:/digits")
    assert outputs == [
        ("https://mlflow.example:5000", "models:/digits/3"),
        ("https://mlflow.example:5000", "models:/digits"),
    ]
    inputs, _ = tune_dataset_names(None, "models:/digits", mlflow_namespace="http://u:pw@mlflow:5000?token=x")
    assert inputs == [("http://mlflow:5000", "models:/digits")]
    _, outputs = promote_dataset_names({"promoted": True, "version": "v1"}, None, "s3://u:pw@reg/models/d?token=x")
    assert outputs == [("s3://reg", "models/d/versions/v1"), ("s3://reg", "models/d")]


def test_the_tune_operators_lineage_carries_no_credential_of_its_trainable_kwargs() -> None:
    op = RayTuneOperator(task_id="tune", trainable="p.m:f", storage_path="s3://bkt/e", metric="loss", mode="min")
    op.spec = ExperimentSpec.from_dict(
        {
            "trainable": "p.m:f",
            "name": "e",
            "storage_path": "s3://bkt/e",
            "metric": "loss",
            "mode": "min",
            "trainable_kwargs": {"data": "s3://user:secret@data/train.parquet?token=y"},
        }
    )
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("s3://data", "train.parquet")]
