"""A trigger conf never becomes code: what Tune would evaluate is refused at every depth, and import paths that come
from rendering (a Param, a conf, an XCom) are refused unless the DAG file wrote them or the deployment allow-lists them.

Every refusal happens in ``execute`` before any call to the Ray cluster: the hook here fails the test if a Jobs API
method is called.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from airflow.sdk import DAG

from airflow_tune.common.spec import ExperimentSpec, SpecError, code_references
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.trust.code import CodeReferenceError, literal_import_paths

EVAL = {"eval": "__import__('pathlib').Path('/tmp/aft-pwned').touch()"}
PAYLOAD_PATH = "subprocess:getoutput"


class ForbiddenHook(RayHook):
    """The real hook's connection handling; any call to the Jobs API fails the test."""

    def _forbidden(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the Ray cluster was contacted before the spec was refused")

    submit_job = find_jobs = list_jobs = get_job_info = get_job_logs = stop_job = get_conn = _forbidden  # type: ignore


@pytest.fixture(autouse=True)
def ray_conn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({"conn_type": "ray", "host": "127.0.0.1"}))


def _ti() -> SimpleNamespace:
    return SimpleNamespace(
        dag_id="sec", task_id="tune", map_index=-1, try_number=1, start_date=None, xcom_push=lambda **kw: None
    )


def _execute(params: dict[str, Any], native: bool = False, **kwargs: Any) -> RayTuneOperator:
    """Build the operator in a DAG with ``params`` as the run's params, render it as Airflow does, then execute."""
    kwargs = {
        "trainable": "pkg.mod:train",
        "storage_path": "s3://bkt/experiments",
        "metric": "loss",
        "mode": "min",
        **kwargs,
    }
    with DAG("sec", schedule=None, params=params, render_template_as_native_obj=native) as dag:
        op = RayTuneOperator(task_id="tune", **kwargs)
    op.__dict__["hook"] = ForbiddenHook()
    ti = _ti()
    context = {"params": params, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    with mock.patch("airflow_tune.common.storage.read_json_or_none", side_effect=AssertionError("storage read")):
        op.execute(context)  # type: ignore[arg-type]
    return op


# -- forms Ray Tune evaluates ---------------------------------------------------------------------------------------

#: (id, operator arguments as data, the field the refusal must name). Each is tried as a Python value written in the
#: DAG file and as a value rendered from a Param (with and without native rendering).
TUNE_CODE_CASES = [
    ("space-root", {"param_space": {"eval": EVAL["eval"]}}, "param_space = "),
    ("space-value", {"param_space": {"x": EVAL}}, "param_space.x = "),
    ("space-nested", {"param_space": {"model": {"layers": {"width": EVAL}}}}, "param_space.model.layers.width"),
    ("in-list", {"param_space": {"x": [1, [2, EVAL]]}}, "param_space.x[1][1]"),
    ("in-choice", {"param_space": {"x": {"choice": [1, EVAL]}}}, "param_space.x.choice[1]"),
    ("in-choice-nested", {"param_space": {"x": {"choice": [{"a": {"b": EVAL}}]}}}, "param_space.x.choice[0].a.b"),
    ("in-grid", {"param_space": {"x": {"grid_search": [EVAL, 2]}}}, "param_space.x.grid_search[0]"),
    ("in-const", {"param_space": {"x": {"const": {"cmd": EVAL}}}}, "param_space.x.const.cmd"),
    ("points", {"param_space": {"x": {"choice": [1, 2]}}, "points_to_evaluate": [{"x": EVAL}]}, "points_to_evaluate"),
    ("kwargs", {"trainable_kwargs": {"opts": {"cmd": EVAL}}}, "trainable_kwargs.opts.cmd"),
    (
        "pbt-mutations-list",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": [0.1, EVAL]}}}},
        "scheduler.args.hyperparam_mutations.lr[1]",
    ),
    (
        "pbt-mutations-nested",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"opt": {"lr": EVAL}}}}},
        "scheduler.args.hyperparam_mutations.opt.lr",
    ),
    ("scheduler-args", {"scheduler": {"name": "asha", "args": {"max_t": EVAL}}}, "scheduler.args.max_t"),
    ("search-args", {"search": {"name": "random", "args": {"random_state": EVAL}}}, "search.args.random_state"),
    ("stop", {"stop": {"loss": EVAL}}, "stop.loss"),
    ("checkpoint", {"checkpoint": {"score_attribute": EVAL}}, "checkpoint.score_attribute"),
]


@pytest.mark.parametrize(("case", "arguments", "field"), TUNE_CODE_CASES, ids=[c[0] for c in TUNE_CODE_CASES])
@pytest.mark.parametrize("form", ["dag-file", "param-tojson", "param-native"])
def test_every_form_tune_evaluates_is_refused_at_every_depth_before_submission(case, arguments, field, form):
    if form == "dag-file":
        kwargs, params, native = dict(arguments), {}, False
    else:
        params = {name: value for name, value in arguments.items()}
        native = form == "param-native"
        template = "{{ params.%s }}" if native else "{{ params.%s | tojson }}"
        kwargs = {name: template % name for name in arguments}
    with pytest.raises(SpecError) as info:
        _execute(params, native, **kwargs)
    text = str(info.value)
    assert field in text, text
    assert "Ray Tune decodes a mapping with the key 'eval' as code" in text


def test_the_spec_refuses_tune_code_whatever_builds_it():
    base = {"trainable": "m:f", "name": "n", "storage_path": "s3://bkt/x", "metric": "loss", "mode": "min"}
    with pytest.raises(SpecError, match=r"param_space.x.choice\[0\]"):
        ExperimentSpec.from_dict({**base, "param_space": {"x": {"choice": [EVAL]}}})
    # Loaded from JSON, as the engine loads it on the cluster.
    with pytest.raises(SpecError, match=r"trainable_kwargs.a"):
        ExperimentSpec.from_json(json.dumps({**base, "trainable_kwargs": {"a": EVAL}}))


def test_the_engine_refuses_tune_code_again_before_building_anything():
    pytest.importorskip("ray")
    from airflow_tune.engine.build import EngineError, build_domain, refuse_tune_code

    with pytest.raises(EngineError, match=r"param_space.x.choice\[1\]"):
        refuse_tune_code({"param_space": {"x": {"choice": [1, EVAL]}}})
    with pytest.raises(EngineError, match="decodes as code"):
        build_domain({"a": {"b": EVAL}})


# -- import paths from rendering ------------------------------------------------------------------------------------

#: (id, operator arguments where ``{P}`` is the rendered import path, the field the refusal names).
CODE_REFERENCE_CASES = [
    ("trainable", {"trainable": "{P}"}, "trainable = 'subprocess:getoutput'"),
    ("sample-from", {"param_space": {"x": {"sample_from": "{P}"}}}, "param_space.x = 'subprocess:getoutput'"),
    (
        "sample-from-in-choice",
        {"param_space": {"x": {"choice": [{"sample_from": "{P}"}]}}},
        "param_space.x.choice[0]",
    ),
    ("scheduler-factory", {"scheduler": {"factory": "{P}", "args": {"cmd": "id"}}}, "scheduler.factory"),
    ("scheduler-factory-string", {"scheduler": "{P}"}, "scheduler.factory"),
    ("search-factory", {"search": {"factory": "{P}", "args": {"cmd": "id"}}}, "search.factory"),
    (
        "pbt-mutation",
        # Nested: PBT refuses a top-level sample_from mutation (the spec does too), and runs one inside an object.
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"opt": {"lr": {"sample_from": "{P}"}}}}}},
        "scheduler.args.hyperparam_mutations.opt.lr",
    ),
]


def _fill(value: Any, path: str) -> Any:
    return json.loads(json.dumps(value).replace("{P}", path))


@pytest.mark.parametrize(("case", "arguments", "field"), CODE_REFERENCE_CASES, ids=[c[0] for c in CODE_REFERENCE_CASES])
@pytest.mark.parametrize("form", ["whole-param-tojson", "whole-param-native", "path-param-in-dag-structure"])
def test_an_import_path_rendered_from_a_param_is_refused_naming_the_field(case, arguments, field, form):
    params: dict[str, Any]
    if form == "path-param-in-dag-structure":
        # The DAG file writes the structure; only the path comes from the conf.
        params, native = {"p": PAYLOAD_PATH}, False
        kwargs = _fill(arguments, "{{ params.p }}")
    else:
        native = form == "whole-param-native"
        params = _fill(arguments, PAYLOAD_PATH)
        template = "{{ params.%s }}" if native else "{{ params.%s | tojson }}"
        kwargs = {name: template % name for name in arguments}
        if "trainable" in arguments:
            kwargs["trainable"] = "{{ params.trainable }}"
    with pytest.raises(CodeReferenceError) as info:
        _execute(params, native, **kwargs)
    text = str(info.value)
    assert field in text and PAYLOAD_PATH in text, text
    assert "allowed_code_references" in text


def test_an_import_path_pieced_together_around_a_template_is_refused():
    # Literal text on both sides of a template must not read as a literal "os:system".
    with pytest.raises(CodeReferenceError, match="trainable = 'os:system'"):
        _execute({"m": "os"}, trainable="{{ params.m }}:system")
    with pytest.raises(CodeReferenceError, match="os:system"):
        _execute({"a": ":"}, param_space='{"x": {"sample_from": "os{{ params.a }}system"}}')


def test_a_path_written_for_one_argument_does_not_license_another():
    # The DAG file wrote pkg.mod:train as the trainable; a conf may not use it as a scheduler factory.
    with pytest.raises(CodeReferenceError, match=r"scheduler.factory = 'pkg.mod:train'"):
        _execute({"s": "pkg.mod:train"}, scheduler="{{ params.s }}")


LITERAL_CASES = [
    ("trainable", {"trainable": "my_models.train:fn"}),
    ("sample-from", {"param_space": {"x": {"sample_from": "my_models.space:draw"}}}),
    ("factory-dict", {"scheduler": {"factory": "my_models.sched:make", "args": {"n": 1}}}),
    ("factory-string", {"scheduler": "my_models.sched:make", "search": "my_models.search:make"}),
    ("json-string", {"param_space": '{"x": {"sample_from": "my_models.space:draw"}, "y": 1}'}),
    # A template elsewhere in the same argument leaves the literal path literal.
    ("json-string-templated", {"scheduler": '{"factory": "my_models.sched:make", "args": {"n": {{ params.n }}}}'}),
    (
        "pbt-mutation",
        {
            "scheduler": {
                "name": "pbt",
                "args": {"hyperparam_mutations": {"opt": {"lr": {"sample_from": "my_models.m:lr"}}}},
            }
        },
    ),
]


@pytest.mark.parametrize(("case", "arguments"), LITERAL_CASES, ids=[c[0] for c in LITERAL_CASES])
def test_an_import_path_written_in_the_dag_file_is_accepted(case, arguments):
    op = _run_until_submit({"n": 3}, **arguments)
    spec = op.submitted_spec
    refs = {path for _, path in code_references(spec)}
    written = set().union(*(literal_import_paths(value, argument) for argument, value in arguments.items()))
    assert refs >= written and written


class SubmitStopsHook(ForbiddenHook):
    """Lets the operator get as far as its first cluster call, and keeps the spec it built."""

    def find_jobs(self, metadata_filter: dict[str, Any]) -> list[dict[str, Any]]:  # type: ignore[override]
        raise _Reached()


class _Reached(Exception):
    pass


def _run_until_submit(params: dict[str, Any], **kwargs: Any) -> Any:
    """Execute until the first cluster call (past every check); return the operator with ``submitted_spec``."""
    built: dict[str, Any] = {}
    original = RayTuneOperator.build_spec

    def keep(self: RayTuneOperator, context: Any) -> ExperimentSpec:
        spec = original(self, context)
        built["spec"] = spec
        return spec

    kwargs = {"trainable": "pkg.mod:train", "storage_path": "s3://bkt/e", "metric": "loss", "mode": "min", **kwargs}
    with DAG("sec", schedule=None, params=params) as dag:
        op = RayTuneOperator(task_id="tune", **kwargs)
    op.__dict__["hook"] = SubmitStopsHook()
    ti = _ti()
    context = {"params": params, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    with mock.patch.object(RayTuneOperator, "build_spec", keep), pytest.raises(_Reached):
        op.execute(context)  # type: ignore[arg-type]
    op.submitted_spec = built["spec"]  # type: ignore[attr-defined]
    return op


@pytest.mark.parametrize("source", ["airflow-config", "connection-extra"])
@pytest.mark.parametrize("native", [False, True])
def test_a_rendered_import_path_the_deployment_allow_lists_is_accepted(monkeypatch, source, native):
    if source == "airflow-config":
        monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__ALLOWED_CODE_REFERENCES", "other.pkg:x, my_models.*:*")
    else:
        extra = {"allowed_code_references": ["other.pkg:x", "my_models.*:*"]}
        monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({"conn_type": "ray", "host": "h", "extra": extra}))
    template = "{{ params.%s }}"
    op = _run_until_submit(
        {"trainable": "my_models.train:fn", "scheduler": {"factory": "my_models.sched:make"}},
        trainable=template % "trainable",
        scheduler=template % "scheduler" if native else "{{ params.scheduler | tojson }}",
    )
    assert op.submitted_spec.trainable == "my_models.train:fn"
    assert op.submitted_spec.scheduler.factory == "my_models.sched:make"
    # A path outside the patterns is still refused.
    with pytest.raises(CodeReferenceError, match="subprocess:getoutput"):
        _execute({"t": PAYLOAD_PATH}, trainable="{{ params.t }}")


def test_what_chooses_the_code_the_cluster_runs_is_not_templated():
    for name in ("working_dir", "py_modules", "pip", "runtime_env"):
        assert name not in RayTuneOperator.template_fields, name


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"experiment_name": "{{ params.x }}"}, "name = '../../other-team/exp'"),
        ({"storage_path": "s3://bkt/{{ params.x }}"}, "storage_path = 's3://bkt/../../other-team/exp'"),
    ],
)
def test_a_name_or_storage_path_from_a_conf_stays_inside_the_storage_path(kwargs, field):
    with pytest.raises(SpecError) as info:
        _execute({"x": "../../other-team/exp"}, **kwargs)
    assert field in str(info.value)


def test_literal_import_paths_ignore_everything_a_template_renders():
    # Only code positions count (tests/unit/trust/test_code_positions.py): here a factory, a sample_from.
    assert literal_import_paths("pkg.mod:fn") == {"pkg.mod:fn"}
    assert literal_import_paths("{{ params.f }}") == set()
    assert literal_import_paths("pkg.mod:{{ params.f }}") == set()
    assert literal_import_paths('{"factory": "x.y:z", "args": {"b": "{{ params.q }}"}}') == {"x.y:z"}
    assert literal_import_paths('{"factory": "x.{{ params.m }}:z"}') == set()
    assert literal_import_paths({"a": [{"sample_from": "x:y"}, {"b": {"sample_from": "p.q:r"}}], "c": 3}) == {
        "x:y",
        "p.q:r",
    }


def test_arguments_mapped_from_an_xcom_are_data_and_literal_expand_lists_are_code():
    from airflow.sdk import task

    from airflow_tune.trust.code import arguments_mapped_from_data

    names = {"trainable", "param_space", "scheduler", "search"}
    common = {"storage_path": "s3://b/e", "metric": "m", "mode": "min"}
    with DAG("mapped_cases", schedule=None) as dag:

        @task
        def chosen() -> list[str]:
            return ["pkg.mod:fn"]

        RayTuneOperator.partial(task_id="from_xcom", param_space={}, **common).expand(trainable=chosen())
        RayTuneOperator.partial(task_id="from_literal", param_space={}, **common).expand(trainable=["pkg.mod:fn"])

        @task
        def kwargs_list() -> list[dict]:
            return [{"trainable": "pkg.mod:fn", "param_space": {}}]

        RayTuneOperator.partial(task_id="kwargs_from_xcom", search="random", **common).expand_kwargs(kwargs_list())
        plain = RayTuneOperator(task_id="plain", trainable="pkg.mod:fn", param_space={}, **common)

    assert arguments_mapped_from_data(dag.task_dict["from_xcom"], names) == {"trainable"}
    assert arguments_mapped_from_data(dag.task_dict["from_literal"], names) == set()
    from_kwargs_xcom = arguments_mapped_from_data(dag.task_dict["kwargs_from_xcom"], names)
    assert from_kwargs_xcom == {"trainable", "param_space", "scheduler"}  # search was given to partial()
    assert arguments_mapped_from_data(plain, names) == set()
