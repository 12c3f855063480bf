"""Mapped code is code (issue 40): an argument that chooses code or where data goes (``pip``, ``working_dir``,
``py_modules``, ``runtime_env``, ``ship_engine``, ``restore_unproven_state``; the promote task's ``model_loader``,
``model_requirements``, ``registry_dags``) and that ``expand()``/``expand_kwargs()`` maps from an XCom is refused,
naming it; a literal list given to ``expand()`` is the DAG file's. The real-stack tests are in
tests/e2e/test_mapped_code.py."""

from __future__ import annotations

import inspect
import pickle
from typing import Any
from unittest import mock

import pytest
from airflow.sdk import DAG, task

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.trust.code import (
    PROMOTE_CODE_ARGUMENTS,
    TUNE_CODE_ARGUMENTS,
    CodeReferenceError,
    MappedCodeError,
    refuse_mapped_code,
)

FIXED = {"trainable": "pkg.mod:train", "storage_path": "s3://bkt/exps", "metric": "loss", "mode": "min"}
SECRET = "token-that-must-not-show"


@task
def from_xcom(value: Any) -> list[Any]:
    return [value]


def _tune(expand: Any, mapped: dict[str, Any], **partial: Any) -> tuple[Any, RayTuneOperator]:
    """The DAG of one mapped tune task (``expand`` says how) and the operator a run builds from ``mapped``."""
    with DAG("aft_unit_mapped_code", schedule=None) as dag:
        expand(RayTuneOperator.partial(task_id="tune", **FIXED, **partial))
    return dag, dag.task_dict["tune"].unmap(mapped)


def _refusal(dag: Any, op: Any, arguments: Any) -> str | None:
    with (
        mock.patch.object(type(op), "dag", dag),
        mock.patch.object(type(op), "has_dag", lambda _: True),
    ):
        try:
            refuse_mapped_code(op, arguments)
        except MappedCodeError as exc:
            return str(exc)
    return None


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("pip", ["attacker-package==1.0"]),
        ("working_dir", "s3://elsewhere/code.zip"),
        ("py_modules", ["s3://elsewhere/pkg.zip"]),
        ("runtime_env", {"env_vars": {"AWS_ENDPOINT_URL": "http://elsewhere", "MLFLOW_TRACKING_TOKEN": SECRET}}),
        ("ship_engine", False),
        ("restore_unproven_state", True),
    ],
)
def test_a_code_argument_mapped_from_an_xcom_is_refused_and_a_literal_expand_list_is_code(argument, value):
    dag, op = _tune(lambda p: p.expand(**{argument: from_xcom(value)}), {argument: value})
    refused = _refusal(dag, op, TUNE_CODE_ARGUMENTS)
    assert refused is not None and f"  - {argument} = " in refused, refused
    assert "Write them in the DAG file" in refused and SECRET not in refused

    dag, op = _tune(lambda p: p.expand(**{argument: [value]}), {argument: value})
    assert _refusal(dag, op, TUNE_CODE_ARGUMENTS) is None


def test_expand_kwargs_over_an_xcom_refuses_what_it_sets_and_not_what_it_leaves_at_the_default():
    row = {"working_dir": "/tmp/elsewhere", "py_modules": ["/tmp/pkg"], "param_space": {}}
    dag, op = _tune(lambda p: p.expand_kwargs(from_xcom(row)), row)
    refused = _refusal(dag, op, TUNE_CODE_ARGUMENTS)
    assert refused is not None and "refused 2 arguments" in refused
    assert "  - working_dir = '/tmp/elsewhere'" in refused and "  - py_modules = ['/tmp/pkg']" in refused
    assert "pip" not in refused and "ship_engine" not in refused

    # pip, runtime_env, ship_engine... are not in partial(): expand_kwargs maps them, but an XCom that leaves them
    # unset (or at their defaults) chooses nothing.
    row = {"param_space": {"x": 1}, "pip": None, "ship_engine": True, "runtime_env": {}}
    dag, op = _tune(lambda p: p.expand_kwargs(from_xcom(row)), row)
    assert _refusal(dag, op, TUNE_CODE_ARGUMENTS) is None

    # expand_kwargs() over a literal list is the DAG file's.
    rows = [{"pip": ["numpy"], "param_space": {}}]
    dag, op = _tune(lambda p: p.expand_kwargs(rows), rows[0])
    assert _refusal(dag, op, TUNE_CODE_ARGUMENTS) is None


def test_a_subclass_passing_its_arguments_on_keeps_the_defaults_of_the_operator():
    class Team(RayTuneOperator):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    row = {"param_space": {"x": 1}}
    with DAG("aft_unit_mapped_subclass", schedule=None) as dag:
        Team.partial(task_id="tune", **FIXED).expand_kwargs(from_xcom(row))
    op = dag.task_dict["tune"].unmap(row)
    assert _refusal(dag, op, TUNE_CODE_ARGUMENTS) is None  # ship_engine=True is the default, not a choice


def test_a_runtime_env_is_shown_by_its_keys_only_also_as_json():
    env = '{"env_vars": {"AWS_ENDPOINT_URL": "http://elsewhere", "TOKEN": "' + SECRET + '"}}'
    dag, op = _tune(lambda p: p.expand(runtime_env=from_xcom(env)), {"runtime_env": env})
    refused = _refusal(dag, op, TUNE_CODE_ARGUMENTS)
    assert refused is not None
    assert "runtime_env = a dict with keys ['env_vars'], env_vars ['AWS_ENDPOINT_URL', 'TOKEN']" in refused
    assert SECRET not in refused and "http://elsewhere" not in refused


def test_an_operator_outside_a_mapped_task_and_one_without_a_dag_are_not_refused():
    op = RayTuneOperator(task_id="plain", pip=["numpy"], **FIXED)
    with DAG("aft_unit_plain", schedule=None) as dag:
        in_dag = RayTuneOperator(task_id="plain", pip=["numpy"], **FIXED)
    refuse_mapped_code(op, TUNE_CODE_ARGUMENTS)
    assert _refusal(dag, in_dag, TUNE_CODE_ARGUMENTS) is None


@pytest.mark.parametrize(
    ("argument", "value"),
    [("model_loader", "pkg.loaders:load"), ("model_requirements", ["evil==1"]), ("registry_dags", ["other-dag"])],
)
def test_the_promote_task_s_code_arguments_mapped_from_an_xcom_are_refused(argument, value):
    result = {"best_metrics": {"loss": 1}, "metric": "loss", "mode": "min"}
    for source, refused in ((from_xcom(value), True), ([value], False)):
        with DAG("aft_unit_promote_mapped_code", schedule=None) as dag:
            PromoteCheckpointOperator.partial(
                task_id="promote", result=result, registry_uri="s3://bkt/models/m"
            ).expand(**{argument: source})
        op = dag.task_dict["promote"].unmap({argument: value})
        message = _refusal(dag, op, PROMOTE_CODE_ARGUMENTS)
        assert (message is not None and f"  - {argument} = " in message) is refused, message


def test_the_tables_name_arguments_the_operators_take_and_have_no_rule_of_their_own():
    for operator, table in (
        (RayTuneOperator, TUNE_CODE_ARGUMENTS),
        (PromoteCheckpointOperator, PROMOTE_CODE_ARGUMENTS),
    ):
        parameters = inspect.signature(operator.__init__).parameters
        assert set(table) <= set(parameters), operator
        assert not set(table) & set(operator.template_fields), operator


def test_the_refusal_pickles_and_is_an_airflow_exception():
    from airflow.exceptions import AirflowException

    error = MappedCodeError(["pip = ['x']: chooses what the cluster pip-installs"])
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and isinstance(again, AirflowException) and isinstance(again, ValueError)
    assert not isinstance(error, CodeReferenceError)


def test_a_node_pin_mapped_from_an_xcom_is_refused_and_one_in_a_literal_expand_list_is_the_dag_file_s():
    from airflow_tune.common.spec import ExperimentSpec

    pinned = {"cpu": 1, "node:10.0.0.5": 0.01}
    spec = ExperimentSpec.from_dict({**FIXED, "name": "e", "param_space": {}, "resources": pinned})
    for source, refused in ((from_xcom(pinned), True), ([pinned], False)):
        dag, op = _tune(lambda p, s=source: p.expand(resources_per_trial=s), {"resources_per_trial": pinned})
        with (
            mock.patch.object(RayTuneOperator, "dag", dag),
            mock.patch.object(RayTuneOperator, "has_dag", lambda _: True),
        ):
            if refused:
                with pytest.raises(CodeReferenceError, match=r"resources\.node:10\.0\.0\.5|node:10\.0\.0\.5"):
                    op.check_code_references(spec)
            else:
                assert op.check_code_references(spec) == []
