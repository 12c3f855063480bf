"""Every argument form the operator's docstring and the README show, rendered by Airflow as a task run renders it.

Each spec argument is tried as the Python value, as the plain string where the docstring offers one, and as a rendered
template: JSON through ``| tojson``, the Python literal ``{{ params.x }}`` renders, and a native value with
``render_template_as_native_obj=True``. Each form must give the same spec field.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator

SPACE = {"lr": {"loguniform": [0.0001, 0.1]}, "depth": {"choice": [2, 4]}, "epochs": 3}
BASE = {
    "trainable": "pkg.mod:train",
    "storage_path": "s3://bkt/experiments",
    "metric": "loss",
    "mode": "min",
    "param_space": SPACE,
}


def _spec_field(spec: Any, field: str) -> Any:
    data = spec.to_dict()
    for part in field.split("."):
        data = data[part]
    return data


#: (argument, Python value, the spec field it fills, the expected value there, plain string forms the docstring offers)
ARGUMENTS: list[tuple[str, Any, str, Any, list[str]]] = [
    ("storage_path", "s3://bkt/other", "storage_path", "s3://bkt/other", []),
    ("metric", "val_accuracy", "metric", "val_accuracy", []),
    ("mode", "max", "mode", "max", []),
    ("param_space", SPACE, "param_space", SPACE, [json.dumps(SPACE)]),
    ("num_samples", 8, "num_samples", 8, ["8"]),
    ("max_concurrent_trials", 2, "max_concurrent_trials", 2, ["2"]),
    ("reuse_actors", True, "reuse_actors", True, ["true", "True"]),
    ("time_budget_s", 600.5, "time_budget_s", 600.5, ["600.5"]),
    ("stop", {"training_iteration": 10}, "stop", {"training_iteration": 10}, ['{"training_iteration": 10}']),
    ("stop", {"done": True}, "stop", {"done": True}, ['{"done": true}']),
    ("scheduler", "asha", "scheduler.name", "asha", ["asha"]),
    (
        "scheduler",
        {"name": "asha", "args": {"max_t": 20, "grace_period": 2}},
        "scheduler.args",
        {"max_t": 20, "grace_period": 2},
        ['{"name": "asha", "args": {"max_t": 20, "grace_period": 2}}'],
    ),
    ("scheduler", {"factory": "pkg.sched:make"}, "scheduler.factory", "pkg.sched:make", ["pkg.sched:make"]),
    ("search", "optuna", "search.name", "optuna", ["optuna"]),
    (
        "search",
        {"name": "optuna", "args": {"seed": 1}, "max_concurrent": 2},
        "search.max_concurrent",
        2,
        ['{"name": "optuna", "args": {"seed": 1}, "max_concurrent": 2}'],
    ),
    ("search", {"factory": "pkg.search:make"}, "search.factory", "pkg.search:make", ["pkg.search:make"]),
    (
        "points_to_evaluate",
        [{"lr": 0.01, "depth": 2}],
        "points_to_evaluate",
        [{"lr": 0.01, "depth": 2}],
        ['[{"lr": 0.01, "depth": 2}]'],
    ),
    (
        "resources_per_trial",
        {"cpu": 2, "gpu": 1, "memory": 1024, "accel": 1},
        "resources.per_trial",
        {"cpu": 2, "gpu": 1, "memory": 1024, "accel": 1},
        ['{"cpu": 2, "gpu": 1, "memory": 1024, "accel": 1}'],
    ),
    (
        "resources_per_trial",
        [{"CPU": 1}, {"CPU": 1, "accel": 1}],
        "resources.bundles",
        [{"CPU": 1}, {"CPU": 1, "accel": 1}],
        ['[{"CPU": 1}, {"CPU": 1, "accel": 1}]'],
    ),
    (
        "checkpoint",
        {"num_to_keep": 2, "frequency": 1, "at_end": True},
        "checkpoint",
        {"num_to_keep": 2, "frequency": 1, "at_end": True, "score_attribute": None, "score_order": None},
        ['{"num_to_keep": 2, "frequency": 1, "at_end": true}'],
    ),
    (
        "failure",
        {"max_failures": 1, "fail_fast": False, "tolerate_errored_trials": True},
        "failure",
        {"max_failures": 1, "fail_fast": False, "tolerate_errored_trials": True},
        ['{"max_failures": 1, "fail_fast": false, "tolerate_errored_trials": true}'],
    ),
    ("trainable_kwargs", {"data": "digits", "n": 3}, "trainable_kwargs", {"data": "digits", "n": 3}, []),
    ("errored_trials", "restart", "errored_trials", "restart", []),
    ("best_scope", "all", "best_scope", "all", []),
    ("progress_interval_s", 2.0, "progress_interval_s", 2.0, ["2.0"]),
    ("infeasible_wait_s", 600, "infeasible_wait_s", 600, ["600"]),
    ("experiment_name", "my-experiment", "name", "my-experiment", []),
]

TEMPLATE_FORMS = {
    # A string template renders a string: JSON with | tojson, or the Python literal of the value.
    "template-tojson": ("{{ params.value | tojson }}", False),
    "template-plain": ("{{ params.value }}", False),
    # The DAG renders native Python values.
    "template-native": ("{{ params.value }}", True),
}


def _ti() -> SimpleNamespace:
    return SimpleNamespace(dag_id="forms", task_id="tune", map_index=-1, try_number=1, start_date=None)


def _spec(argument: str, value: Any, *, params: dict[str, Any] | None = None, native: bool = False) -> Any:
    params = params or {}
    with DAG("forms", schedule=None, params=params, render_template_as_native_obj=native) as dag:
        op = RayTuneOperator(task_id="tune", **{**BASE, argument: value})
    ti = _ti()
    context = {"params": params, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    return op.build_spec(context)  # type: ignore[arg-type]


def _cases() -> list[Any]:
    cases = []
    for argument, value, field, expected, strings in ARGUMENTS:
        key = f"{argument}={json.dumps(value)[:30]}"
        cases.append(pytest.param(argument, "python", value, field, expected, id=f"{key}-python"))
        for i, text in enumerate(strings):
            cases.append(pytest.param(argument, "string", text, field, expected, id=f"{key}-string{i}"))
        if isinstance(value, dict) and "factory" in value:
            # A factory path rendered from a Param is code from data: refused (tests/unit/trust/test_security.py).
            continue
        for form in TEMPLATE_FORMS:
            cases.append(pytest.param(argument, form, value, field, expected, id=f"{key}-{form}"))
    return cases


@pytest.mark.parametrize(("argument", "form", "value", "field", "expected"), _cases())
def test_every_documented_argument_form_gives_the_same_spec(argument, form, value, field, expected, monkeypatch):
    if argument == "storage_path" and form in TEMPLATE_FORMS:
        # A storage path rendered whole lies under a deployment root (tests/unit/trust/test_storage_roots.py).
        monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__ALLOWED_STORAGE_ROOTS", "s3://bkt/other")
    if form in TEMPLATE_FORMS:
        template, native = TEMPLATE_FORMS[form]
        spec = _spec(argument, template, params={"value": value}, native=native)
    else:
        spec = _spec(argument, value)
    assert _spec_field(spec, field) == expected


@pytest.mark.parametrize("form", ["python", "template-tojson", "template-plain", "template-native"])
def test_a_warm_start_config_dict_becomes_the_first_point(form):
    seed = {"lr": 0.05, "depth": 4, "unrelated": 1}
    if form == "python":
        spec = _spec_with(warm_start=seed)
    else:
        template, native = TEMPLATE_FORMS[form]
        spec = _spec_with(warm_start=template, params={"value": seed}, native=native)
    assert spec.points_to_evaluate == [{"lr": 0.05, "depth": 4}]


def _spec_with(params: dict[str, Any] | None = None, native: bool = False, **kwargs: Any) -> Any:
    params = params or {}
    with DAG("forms", schedule=None, params=params, render_template_as_native_obj=native) as dag:
        op = RayTuneOperator(task_id="tune", **{**BASE, **kwargs})
    ti = _ti()
    context = {"params": params, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    return op.build_spec(context)  # type: ignore[arg-type]


def _module_trainable(config: dict[str, Any]) -> dict[str, float]:
    return {"loss": config["x"]}


@pytest.mark.parametrize(
    ("trainable", "path"),
    [
        ("pkg.mod:train", "pkg.mod:train"),
        (_module_trainable, "tests.unit.operators.test_argument_forms:_module_trainable"),
    ],
    ids=["import-path", "importable-object"],
)
def test_a_trainable_is_an_import_path_or_an_object(trainable, path):
    assert _spec("trainable", trainable).trainable == path


def test_a_trainable_object_never_sits_in_a_template_field():
    # Airflow calls any callable found in a template field with context= and jinja_env= while rendering.
    with DAG("forms", schedule=None):
        op = RayTuneOperator(task_id="tune", **{**BASE, "trainable": _module_trainable})
    for name in op.template_fields:
        assert not callable(getattr(op, name)), name
    assert op.trainable == "tests.unit.operators.test_argument_forms:_module_trainable"


def test_runtime_env_arguments_are_python_values_written_in_the_dag_file():
    with DAG("forms", schedule=None):
        op = RayTuneOperator(
            task_id="tune",
            **BASE,
            working_dir="/opt/code",
            py_modules=["/opt/lib/my_models"],
            pip=["scikit-learn"],
            runtime_env={"env_vars": {"MY_SETTING": "1"}},
            ship_engine=False,
        )
    spec = _spec("metric", "loss")
    env = op.build_runtime_env(spec, "job-1")
    assert env["working_dir"] == "/opt/code"
    assert env["py_modules"] == ["/opt/lib/my_models"]
    assert env["pip"] == ["scikit-learn"]
    assert env["env_vars"]["MY_SETTING"] == "1"


@pytest.mark.parametrize(
    ("argument", "text", "match"),
    [
        ("num_samples", "eight", "num_samples = 'eight': not valid JSON"),
        ("param_space", "lr=0.1", "param_space = 'lr=0.1': not valid JSON"),
        ("stop", "{'a': {1, 2}}", "stop: set values cannot be part of a spec"),
    ],
)
def test_a_string_that_is_no_value_names_the_argument_and_the_fix(argument, text, match):
    with pytest.raises(ValueError, match=match):
        _spec(argument, text)
