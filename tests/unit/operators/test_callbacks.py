"""The spec's ``callbacks``, pure logic: Tune's loggers by name with JSON arguments checked against static tables
(compared with the installed Ray's signatures), credentials refused without showing them, custom callbacks as code
references under the security rule (DAG file or allow-list), every operator argument form, and the engine's build
(a missing package named, a factory's result checked, a restore running the spec's callbacks)."""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

from airflow_tune.common.spec import ExperimentSpec, SpecError, code_references
from airflow_tune.common.spec.callbacks import CREDENTIAL_ARGS, LOGGERS, WANDB_INIT_ARGS
from airflow_tune.engine import callbacks as engine_callbacks
from airflow_tune.engine import compat
from airflow_tune.engine import tuner as tuner_module
from airflow_tune.engine.imports import EngineError, import_path
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.trust import code
from tests.unit.operators.test_argument_forms import BASE as OPERATOR_BASE
from tests.unit.operators.test_argument_forms import TEMPLATE_FORMS
from tests.unit.operators.test_argument_forms import _spec as operator_spec

BASE = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}
EVIDENCE = "tests.support.tune_testkit.callbacks:Evidence"
MLFLOW = {
    "name": "mlflow",
    "args": {
        "tracking_uri": "http://mlflow:5000",
        "registry_uri": "https://registry.example:5000",
        "experiment_name": "tuning",
        "tags": {"team": "ml", "n": 1},
        "save_artifact": True,
        "log_params_on_trial_end": False,
    },
}
WANDB = {
    "name": "wandb",
    "args": {"project": "p", "group": "g", "excludes": ["time_this_iter_s"], "log_config": True, "entity": "team"},
}


def _spec(**fields: Any) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, **fields})


def _errors(callbacks: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        _spec(callbacks=callbacks)
    return info.value.errors


def test_every_valid_form_is_accepted_and_kept_as_written():
    entries = ["csv", "json", "tensorboard", MLFLOW, WANDB, EVIDENCE, {"factory": EVIDENCE, "args": {"uri": "/tmp/e"}}]
    spec = _spec(callbacks=entries)
    assert spec.callbacks == entries
    assert _spec().callbacks == []
    assert "callbacks" not in spec.identity()  # a policy: a rerun may log elsewhere


REFUSED = [
    ("not-a-list", {"name": "csv"}, "callbacks", ["must be a list"]),
    ("entry-number", [3], "callbacks[0]", ["must be a name, an import path or an object"]),
    ("unknown-key", [{"name": "csv", "arg": {}}], "callbacks[0].arg", ["did you mean 'args'"]),
    ("both", [{"name": "csv", "factory": EVIDENCE}], "callbacks[0]", ["exactly one of name or factory"]),
    ("neither", [{"args": {}}], "callbacks[0]", ["exactly one of name or factory"]),
    ("args-list", [{"name": "mlflow", "args": ["x"]}], "callbacks[0].args", ["must be a JSON object"]),
    ("logger-unknown", ["cvs"], "callbacks[0].name", ["did you mean 'csv'", "import path as factory"]),
    ("twice", ["csv", "csv"], "callbacks[1].name", ["named twice"]),
    ("arg-typo", [{"name": "mlflow", "args": {"experiment": "x"}}], "callbacks[0].args.experiment", ["did you mean"]),
    ("csv-args", [{"name": "csv", "args": {"path": "x"}}], "callbacks[0].args.path", ["CSVLoggerCallback takes no"]),
    ("kind-bool", [{"name": "mlflow", "args": {"save_artifact": "yes"}}], "callbacks[0].args.save_artifact", ["true"]),
    ("kind-tags", [{"name": "mlflow", "args": {"tags": ["a"]}}], "callbacks[0].args.tags", ["string tags"]),
    ("kind-mode", [{"name": "wandb", "args": {"mode": "x"}}], "callbacks[0].args.mode", ['"offline"']),
    ("kind-count", [{"name": "wandb", "args": {"upload_timeout": -1}}], "callbacks[0].args.upload_timeout", [">= 0"]),
    ("factory-path", [{"factory": "not a path"}], "callbacks[0].factory", ["not an import path"]),
    ("factory-object", [{"factory": EVIDENCE, "args": {"o": object()}}], "callbacks[0].args.o", ["not JSON data"]),
    (
        "decoder-key",
        [{"factory": EVIDENCE, "args": {"uri": {"eval": "1"}}}],
        "callbacks[0].args.uri",
        ["decodes a mapping with the key 'eval' as code"],
    ),
]


@pytest.mark.parametrize(("callbacks", "path", "words"), [pytest.param(*r[1:], id=r[0]) for r in REFUSED])
def test_each_bad_callback_is_refused_naming_the_field_and_the_fix(callbacks, path, words):
    errors = _errors(callbacks)
    named = [e for e in errors if e.split(" = ", 1)[0] == path]
    assert named, f"no problem names {path!r}: {errors}"
    assert any(all(w in e for w in words) for e in named), (words, named)


@pytest.mark.parametrize(
    ("entry", "path", "variable"),
    [
        ({"name": "mlflow", "args": {"tracking_token": "s3cr3t-value"}}, "callbacks[0].args.tracking_token", "MLFLOW"),
        ({"name": "wandb", "args": {"api_key": "s3cr3t-value"}}, "callbacks[0].args.api_key", "WANDB_API_KEY"),
        ({"name": "wandb", "args": {"api_key_file": "s3cr3t-value"}}, "callbacks[0].args.api_key_file", "WANDB"),
        ({"factory": EVIDENCE, "args": {"db_password": "s3cr3t-value"}}, "callbacks[0].args.db_password", "secret"),
        ({"factory": EVIDENCE, "args": {"token": "s3cr3t-value"}}, "callbacks[0].args.token", "secret store"),
        (
            {"name": "mlflow", "args": {"tracking_uri": "https://me:s3cr3t-value@mlflow"}},
            "callbacks[0].args.tracking_uri",
            "MLFLOW_TRACKING_PASSWORD",
        ),
    ],
)
def test_a_credential_is_refused_without_being_shown(entry, path, variable):
    errors = _errors([entry])
    named = [e for e in errors if e.split(" = ", 1)[0] == path]
    assert named and variable in named[0], named
    assert "s3cr3t-value" not in "\n".join(errors)


@pytest.mark.parametrize(
    "uri", ["file:///etc/airflow-tune", "/var/lib/mlruns", "sqlite:////tmp/mlflow.db", "s3://models", "mlruns"]
)
@pytest.mark.parametrize("arg", ["tracking_uri", "registry_uri"])
def test_mlflow_takes_a_tracking_servers_url_never_a_store_on_the_cluster(arg, uri):
    errors = _errors([{"name": "mlflow", "args": {arg: uri}}])
    assert [e.split(" = ", 1)[0] for e in errors] == [f"callbacks[0].args.{arg}"], errors
    assert "tracking server" in errors[0] and "factory" in errors[0], errors


def test_every_problem_is_listed_at_once():
    errors = _errors(["cvs", {"name": "wandb", "args": {"api_key": "k", "projectt": "p"}}, {"factory": "x"}])
    assert [e.split(" = ", 1)[0] for e in errors] == [
        "callbacks[0].name",
        "callbacks[1].args.api_key",
        "callbacks[1].args.projectt",
        "callbacks[2].factory",
    ]


# -- the static tables against the installed Ray --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LOGGERS))
def test_the_logger_table_is_the_installed_rays_signature(name):
    path, _, kinds = LOGGERS[name]
    cls = import_path(path, name)
    assert issubclass(cls, tune.Callback)
    params = inspect.signature(cls).parameters
    named = {p for p, v in params.items() if v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)}
    offered = set(kinds) - (set(WANDB_INIT_ARGS) if name == "wandb" else set())
    assert offered | set(CREDENTIAL_ARGS.get(name, {})) == named, f"Ray's {cls.__name__} changed: update LOGGERS"
    if name == "wandb":  # the wandb.init arguments reach it through **kwargs
        assert any(v.kind is v.VAR_KEYWORD for v in params.values())


# -- code references and the security rule ------------------------------------------------------------------------
def test_a_custom_callback_is_a_code_reference():
    spec = _spec(callbacks=["csv", EVIDENCE, {"factory": "pkg.cb:make", "args": {"n": 1}}])
    refs = code_references(spec)
    assert ("callbacks[1].factory", EVIDENCE) in refs and ("callbacks[2].factory", "pkg.cb:make") in refs
    assert not [r for r in refs if r[0] == "callbacks[0].factory"]  # a logger by name is data


@pytest.fixture
def ray_conn(monkeypatch):
    # A refused path makes the operator read the deployment's allow-list, the ray connection's extra included.
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({"conn_type": "ray", "host": "127.0.0.1"}))


@pytest.mark.usefixtures("ray_conn")
def test_a_callback_written_in_the_dag_file_runs_and_one_rendered_from_data_is_refused():
    literal = operator_spec("callbacks", [{"factory": "pkg.cb:Logger", "args": {"n": 1}}])
    assert literal.callbacks == [{"factory": "pkg.cb:Logger", "args": {"n": 1}}]
    assert literal.allow_listed == []
    template, native = TEMPLATE_FORMS["template-tojson"]
    with pytest.raises(code.CodeReferenceError, match=r"callbacks\[0\]\.factory = 'pkg\.cb:Logger'"):
        operator_spec("callbacks", template, params={"value": ["pkg.cb:Logger"]}, native=native)
    # A logger by name is data: rendered from a Param, it runs.
    assert operator_spec("callbacks", template, params={"value": ["csv"]}).callbacks == ["csv"]


@pytest.mark.usefixtures("ray_conn")
def test_an_allow_listed_callback_may_come_from_data(monkeypatch):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__ALLOWED_CODE_REFERENCES", "pkg.*:*")
    template, native = TEMPLATE_FORMS["template-native"]
    spec = operator_spec("callbacks", template, params={"value": ["pkg.cb:Logger"]}, native=native)
    assert spec.callbacks == ["pkg.cb:Logger"] and spec.allow_listed == ["pkg.cb:Logger"]


ENTRIES = ["csv", {"name": "mlflow", "args": {"experiment_name": "x", "tags": {"a": "b"}}}]


@pytest.mark.parametrize("form", ["python", "string", *TEMPLATE_FORMS])
def test_every_argument_form_of_callbacks_and_stop_gives_the_same_spec(form):
    stop = [{"metric": "loss", "below": 0.1}, {"name": "trial_plateau", "args": {"std": 0.01}}]
    for argument, value in (("callbacks", ENTRIES), ("stop", stop)):
        if form == "python":
            spec = operator_spec(argument, value)
        elif form == "string":
            spec = operator_spec(argument, json.dumps(value))
        else:
            template, native = TEMPLATE_FORMS[form]
            spec = operator_spec(argument, template, params={"value": value}, native=native)
        assert getattr(spec, argument) == value, (argument, form)


def test_the_operators_callbacks_argument_is_a_template_field():
    with DAG("forms", schedule=None):
        op = RayTuneOperator(task_id="tune", **OPERATOR_BASE, callbacks=["csv"])
    assert "callbacks" in op.template_fields and op.template_fields_renderers["callbacks"] == "json"


# -- the engine ------------------------------------------------------------------------------------------------------
def test_tunes_loggers_are_built_by_name():
    built = engine_callbacks.build_callbacks(_spec(callbacks=["csv", "json", "tbx"]))
    assert [type(cb) for cb in built] == [CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback]


@pytest.mark.parametrize(("name", "package"), [("mlflow", "mlflow"), ("wandb", "wandb"), ("tbx", "tensorboardX")])
def test_a_logger_whose_package_is_missing_fails_the_setup_naming_it(monkeypatch, name, package):
    real = engine_callbacks.importlib.util.find_spec
    monkeypatch.setattr(
        engine_callbacks.importlib.util, "find_spec", lambda m, *a: None if m == package else real(m, *a)
    )
    with pytest.raises(EngineError, match=rf"callbacks\[0\]: the {name} logger needs the package '{package}'"):
        engine_callbacks.build_callbacks(_spec(callbacks=[name]))


def test_a_custom_callback_is_built_from_its_class_or_factory_with_its_args():
    built = engine_callbacks.build_callbacks(
        _spec(
            callbacks=[
                {"factory": EVIDENCE, "args": {"uri": "/tmp/e.json", "tag": "a"}},
                {"factory": "tests.support.tune_testkit.callbacks:make_evidence", "args": {"uri": "u", "tag": "b"}},
            ]
        )
    )
    assert [(cb.uri, cb.tag) for cb in built] == [("/tmp/e.json", "a"), ("u", "made:b")]


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        ("tests.support.tune_testkit.callbacks:not_a_callback", "gave a dict, not a ray.tune.Callback"),
        ("tests.support.tune_testkit.callbacks:needs_a_missing_package", "needs the package 'airflow_tune_no_such"),
        ("tests.support.no_such_module:Cb", "cannot import module 'tests.support.no_such_module'"),
    ],
)
def test_a_custom_callback_that_cannot_run_fails_the_setup_naming_the_fix(factory, match):
    with pytest.raises(EngineError, match=match):
        engine_callbacks.build_callbacks(_spec(callbacks=[factory]))


def test_an_argument_only_a_newer_ray_names_is_refused_even_behind_kwargs():
    class OlderWandb(tune.Callback):  # 2.43's WandbLoggerCallback: no video_kwargs, but **kwargs for wandb.init
        def __init__(self, project: str | None = None, **kwargs: Any) -> None:
            pass

    compat.check_arguments(OlderWandb, {"video_kwargs": {}}, "callbacks[0]")  # **kwargs: left to the class
    with pytest.raises(EngineError, match=r"'video_kwargs' not taken by OlderWandb .* \(it takes project\)"):
        compat.check_arguments(OlderWandb, {"video_kwargs": {}}, "callbacks[0]", named=True)


def test_a_restored_experiment_runs_the_specs_callbacks_not_the_pickled_ones():
    first = engine_callbacks.build_callbacks(_spec(callbacks=[{"factory": EVIDENCE, "args": {"uri": "old"}}]))
    run_config = SimpleNamespace(callbacks=[object(), *first])  # as tuner.pkl holds them: the engine's and the spec's
    tuner = SimpleNamespace(_local_tuner=SimpleNamespace(_run_config=run_config))
    now = engine_callbacks.build_callbacks(_spec(callbacks=[{"factory": EVIDENCE, "args": {"uri": "new"}}]))
    tuner_module._replace_callbacks(tuner, now)  # type: ignore[arg-type]
    assert run_config.callbacks == now and [cb.uri for cb in run_config.callbacks] == ["new"]
