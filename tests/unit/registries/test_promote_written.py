"""Registries and gates are code positions (issue 30): ``registry_uri`` and ``gate`` as the DAG file wrote them, a
rendered ``s3://`` registry only under the root the DAG file wrote or the deployment allows (the storage roots'
rules), a rendered ``models:/`` name never, and ``gate`` no longer a template field; ``threshold`` stays a value.
Every refusal happens at execute before any connection, registry or S3 call (the real-stack tests are in
tests/integration/test_registry_targets.py and tests/e2e/test_registry_owner_dags.py)."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from airflow.sdk import DAG, task

from airflow_tune.common.spec.naming import StorageURIError
from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.registries.promote_written import PromotionTargetError, Written, check_gate, check_registry

ROOTS_ENV = "AIRFLOW__AIRFLOW_TUNE__ALLOWED_STORAGE_ROOTS"
TEAM_ROOT = "s3://ml-bucket/models/team-a/{{ params.model }}"


def never() -> Any:
    raise AssertionError("the deployment's roots were read")


# -- what the DAG file wrote ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("registry_uri", "registries", "root"),
    [
        ("s3://ml-bucket/models/digits", {"s3://ml-bucket/models/digits"}, "s3://ml-bucket/models/digits"),
        ("s3://ml-bucket/models/{{ params.model }}", set(), "s3://ml-bucket/models"),
        ("s3://ml-bucket/models/team-{{ params.team }}", set(), "s3://ml-bucket/models"),
        ("{{ params.registry }}", set(), None),
        ("s3://{{ params.bucket }}/models", set(), None),
        ("models:/digits", {"models:/digits"}, None),
        ("models:/{{ params.model }}", set(), None),
    ],
)
def test_the_written_registry_and_root_are_taken_before_rendering(registry_uri, registries, root):
    written = Written.of(registry_uri, "always")
    assert written.registries == registries and written.registry_root == root and written.gates == {"always"}


# -- the registry --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argument", "rendered"),
    [
        ("s3://ml-bucket/models/digits", "s3://ml-bucket/models/digits"),
        ("models:/digits", "models:/digits"),
        (TEAM_ROOT, "s3://ml-bucket/models/team-a/digits"),
        (TEAM_ROOT, "s3://ml-bucket/models/team-a/digits/v2"),
    ],
)
def test_a_written_registry_or_one_under_its_written_root_is_accepted_without_the_deployment(argument, rendered):
    check_registry(rendered, Written.of(argument, "always"), never)


@pytest.mark.parametrize(
    ("argument", "rendered", "words"),
    [
        ("{{ params.registry }}", "s3://ml-bucket/models/team-b/digits", "the DAG file wrote no root"),
        (TEAM_ROOT, "s3://ml-bucket/models/team-b/digits", "the DAG file's root is 's3://ml-bucket/models/team-a'"),
        (TEAM_ROOT, "s3://ml-bucket/models/team-aX/digits", "the DAG file's root is"),  # segment by segment
        (TEAM_ROOT, "s3://other-bucket/models/team-a/digits", "the DAG file's root is"),
        ("s3://{{ params.bucket }}/models", "s3://other-bucket/models", "the DAG file wrote no root"),
    ],
)
def test_a_rendered_s3_registry_under_no_root_is_refused_naming_the_field_the_value_and_the_fix(
    argument, rendered, words
):
    with pytest.raises(PromotionTargetError) as info:
        check_registry(rendered, Written.of(argument, "always"), ())
    message = str(info.value)
    assert message.startswith(f"registry_uri = {rendered!r}: the DAG file did not write this registry"), message
    assert words in message and "the deployment allows 0 roots" in message
    assert "[airflow_tune] allowed_storage_roots" in message and "{{ params.model }}" in message  # the fix
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args  # it crosses a process intact


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("../team-b/digits", "'..'"),
        ("x?endpoint_override=evil.example:9000", "query string"),
        ("%2e%2e/team-b", "percent-escape"),
        ("a//b", "empty segment"),
    ],
)
def test_a_templated_tail_that_is_not_plain_is_refused_naming_registry_uri(model, words):
    rendered = f"s3://ml-bucket/models/team-a/{model}"
    with pytest.raises(StorageURIError) as info:
        check_registry(rendered, Written.of(TEAM_ROOT, "always"), never)
    assert str(info.value).startswith(f"registry_uri = {rendered!r}") and words in str(info.value)


@pytest.mark.parametrize(
    "argument",
    ["models:/{{ params.model }}", "{{ params.registry }}", "models:/digits-{{ params.team }}"],
)
def test_a_rendered_mlflow_registry_is_refused_whatever_the_deployment_allows(argument):
    with pytest.raises(PromotionTargetError) as info:
        check_registry("models:/team-b-model", Written.of(argument, "always"), never)
    message = str(info.value)
    assert message.startswith("registry_uri = 'models:/team-b-model': the DAG file did not write this MLflow")
    assert 'registry_uri="models:/digits"' in message


def test_the_deployment_s_storage_roots_admit_a_rendered_s3_registry_read_only_when_needed():
    written = Written.of("{{ params.registry }}", "always")
    check_registry("s3://shared/models/team-b/m", written, ["s3://other/x", "s3://shared/models"])
    with pytest.raises(PromotionTargetError, match="the deployment allows 1 root\\)"):
        check_registry("s3://shared/modelsX/m", written, ["s3://shared/models"])


# -- the gate ------------------------------------------------------------------------------------------------------
def test_a_gate_is_accepted_only_as_the_dag_file_wrote_it():
    check_gate("threshold", Written.of("models:/m", "threshold"))
    with pytest.raises(PromotionTargetError) as info:
        check_gate("{{ params.gate }}", Written.of("models:/m", "{{ params.gate }}"))
    assert str(info.value).startswith("gate = '{{ params.gate }}': gate is not a template field")
    assert 'threshold="{{ params.threshold }}"' in str(info.value)
    with pytest.raises(PromotionTargetError, match="gate = 'always': the DAG file did not write this gate"):
        check_gate("always", Written.of("models:/m", "threshold"))


# -- the operator, rendered by Airflow ----------------------------------------------------------------------------
RESULT = {
    "metric": "loss",
    "mode": "min",
    "best_metrics": {"loss": 0.1},
    "experiment_uri": "s3://ml-bucket/exp",
    "best_checkpoint_uri": "s3://ml-bucket/exp/t/checkpoint_000001",
}


@pytest.fixture(autouse=True)
def ray_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ray connection, with no storage roots: read only for the deployment's roots (a lookup is no call to it)."""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_UNIT", json.dumps({"conn_type": "ray", "host": "127.0.0.1"}))


def _rendered(params: dict[str, Any], **kwargs: Any) -> PromoteCheckpointOperator:
    """The operator of a DAG with ``params``, its template fields rendered by Airflow as a run with that conf would
    render them; the MLflow connection does not exist, so a lookup fails the test."""
    with DAG("aft_unit_promote_targets", schedule=None, params=params) as dag:
        op = PromoteCheckpointOperator(
            task_id="promote",
            result=RESULT,
            ray_conn_id="ray_unit",
            mlflow_conn_id="no_such_mlflow",
            **kwargs,
        )
    ti = SimpleNamespace(dag_id=dag.dag_id, task_id="promote", map_index=-1, try_number=1, start_date=None)
    context = {"params": params, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    return op


def _execute_refused(op: PromoteCheckpointOperator) -> str:
    """execute() refuses before anything is read: no result re-read, no S3 client, no registry."""
    calls = mock.MagicMock(side_effect=AssertionError("called"))
    with (
        mock.patch.object(PromoteCheckpointOperator, "proven_result", calls),
        mock.patch.object(PromoteCheckpointOperator, "s3_client", calls),
        mock.patch.object(PromoteCheckpointOperator, "mlflow_hook", calls),
        pytest.raises(ValueError) as info,
    ):
        op.execute({})  # type: ignore[arg-type]
    assert not calls.called
    return str(info.value)


def test_gate_is_no_longer_a_template_field_and_threshold_still_is():
    assert "gate" not in PromoteCheckpointOperator.template_fields
    assert {"registry_uri", "threshold"} <= set(PromoteCheckpointOperator.template_fields)
    op = _rendered(
        {"gate": "always", "threshold": "0.25"},
        registry_uri="s3://ml-bucket/models/digits",
        gate="threshold",
        threshold="{{ params.threshold }}",
    )
    assert op.gate == "threshold" and op._inputs()[1] == 0.25
    op = _rendered({"gate": "always"}, registry_uri="s3://ml-bucket/models/digits", gate="{{ params.gate }}")
    assert op.gate == "{{ params.gate }}"  # not rendered
    assert _execute_refused(op).startswith("gate = '{{ params.gate }}': gate is not a template field")


def test_a_conf_naming_another_team_s_registry_is_refused_at_execute_before_anything_is_read():
    op = _rendered({"registry": "s3://ml-bucket/models/team-b/digits"}, registry_uri="{{ params.registry }}")
    assert op.registry_uri == "s3://ml-bucket/models/team-b/digits"
    assert _execute_refused(op).startswith("registry_uri = 's3://ml-bucket/models/team-b/digits': the DAG file did")
    op = _rendered({"model": "../team-b/digits"}, registry_uri=TEAM_ROOT)
    assert "registry_uri = 's3://ml-bucket/models/team-a/../team-b/digits'" in _execute_refused(op)
    op = _rendered({"registry": "models:/team-b"}, registry_uri="{{ params.registry }}")
    assert _execute_refused(op).startswith("registry_uri = 'models:/team-b': the DAG file did not write")


def test_a_fully_rendered_s3_registry_is_admitted_by_the_deployment_s_storage_roots(monkeypatch):
    op = _rendered({"registry": "s3://shared/models/m"}, registry_uri="{{ params.registry }}")
    monkeypatch.setenv(ROOTS_ENV, "s3://elsewhere/x")
    conn = {"conn_type": "ray", "host": "127.0.0.1", "extra": {"allowed_storage_roots": ["s3://shared/models"]}}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_UNIT", json.dumps(conn))
    from airflow_tune.registries.promote_written import check_task

    check_task(op)  # the ray connection's extra admits it
    monkeypatch.setenv("AIRFLOW_CONN_RAY_UNIT", "not a connection")
    monkeypatch.setenv(ROOTS_ENV, "s3://shared/models")
    check_task(op)  # so does Airflow's config, without the connection
    monkeypatch.setenv(ROOTS_ENV, "s3://shared/other")
    monkeypatch.setenv("AIRFLOW_CONN_RAY_UNIT", json.dumps({"conn_type": "ray", "host": "127.0.0.1"}))
    assert "lies under no root (the DAG file wrote no root; the deployment allows 1 root)" in _execute_refused(op)


def _mapped(source: Any, argument: str, value: str) -> tuple[Any, Any]:
    """The DAG of one promote task mapped over ``argument``, and the operator a run builds from its mapped value."""
    fixed = {"registry_uri": "s3://ml-bucket/models/digits", "gate": "always"}
    fixed.pop(argument)
    with DAG("aft_unit_promote_mapped", schedule=None) as dag:
        PromoteCheckpointOperator.partial(task_id="promote", result=RESULT, ray_conn_id="ray_unit", **fixed).expand(
            **{argument: source}
        )
    return dag, dag.task_dict["promote"].unmap({argument: value})


@pytest.mark.parametrize(("argument", "value"), [("registry_uri", "s3://ml-bucket/models/team-b"), ("gate", "always")])
def test_a_registry_or_gate_mapped_from_an_xcom_is_data_and_a_literal_expand_list_is_code(argument, value):
    from airflow_tune.registries.promote_written import check_task

    @task
    def chosen() -> list[str]:
        return [value]

    for source, refused in ((chosen, True), (lambda: [value], False)):
        dag, op = _mapped(source(), argument, value)
        with (
            mock.patch.object(PromoteCheckpointOperator, "dag", dag),
            mock.patch.object(PromoteCheckpointOperator, "has_dag", lambda _: True),
        ):
            if refused:
                with pytest.raises(PromotionTargetError, match=f"^{argument} = '{value}': "):
                    check_task(op)
            else:
                check_task(op)
