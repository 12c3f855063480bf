"""Whose champion a warm start reads is written in the DAG file (issue 30): a registry URI that appears only after
rendering is refused unless it lies under the root the DAG file wrote or a deployment root; a ``models:/`` name only
as written. Pure logic: the check runs before any registry is read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.registries.promote_written import PromotionTargetError


def _op(warm_start: str, rendered: str, roots: tuple[str, ...] = ()) -> RayTuneOperator:
    with DAG("warm_dag", schedule=None):
        op = RayTuneOperator(
            task_id="tune", trainable="m:f", storage_path="s3://b/x", metric="loss", mode="min", warm_start=warm_start
        )
    op.warm_start = rendered  # as rendering leaves it
    op.__dict__["hook"] = SimpleNamespace(allowed_storage_roots=list(roots))
    return op


@pytest.mark.parametrize(
    ("written", "rendered"),
    [
        ("{{ params.registry }}", "s3://other-team/models/theirs"),
        ("s3://ml-bucket/models/{{ params.name }}", "s3://ml-bucket/models-other/x"),
        ("s3://ml-bucket/models/{{ params.name }}", "s3://ml-bucket/models/../secret/x"),
        ("{{ params.registry }}", "models:/another-teams-model@champion"),
        ("models:/digits@{{ params.alias }}", "models:/other@champion"),
    ],
    ids=["whole-conf", "beside-the-root", "dot-dot", "mlflow-name", "mlflow-name-templated"],
)
def test_a_rendered_registry_outside_what_the_dag_file_wrote_is_refused(written, rendered):
    with pytest.raises((PromotionTargetError, ValueError), match="warm_start"):
        _op(written, rendered).check_warm_start_source()


@pytest.mark.parametrize(
    ("written", "rendered", "roots"),
    [
        ("s3://ml-bucket/models/digits", "s3://ml-bucket/models/digits", ()),
        ("s3://ml-bucket/models/{{ params.name }}", "s3://ml-bucket/models/digits", ()),
        ("models:/digits@champion", "models:/digits@champion", ()),
        ("{{ params.registry }}", "s3://shared/models/digits", ("s3://shared/models",)),
    ],
    ids=["literal", "under-the-written-root", "mlflow-literal", "deployment-root"],
)
def test_a_registry_the_dag_file_or_the_deployment_names_is_read(written, rendered, roots):
    _op(written, rendered, roots).check_warm_start_source()
