"""Airflow side, no services: trigger serialization, template rendering into the spec, no secrets in what the operator
hands on, import hygiene, experiment naming from the run id, and spec errors before any job is submitted."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from airflow.sdk import DAG

import airflow_tune.triggers
from airflow_tune.common.contract import METADATA_EXPERIMENT, METADATA_SPEC_URI, RESULT_KEYS
from airflow_tune.common.spec import experiment_name_for
from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.sensors.tune import RayTuneSensor
from airflow_tune.triggers.tune import RayTuneTrigger
from airflow_tune.utils.waiting import best_reaches
from tests.support.fake_store import dict_stores

TOKEN = "tok-5ecret-0f-the-ray-dashboard"


# -- triggers -----------------------------------------------------------------------------------------------------


def _all_triggers() -> list[type]:
    from airflow.triggers.base import BaseTrigger

    found = []
    for info in pkgutil.iter_modules(airflow_tune.triggers.__path__, "airflow_tune.triggers."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseTrigger) and obj.__module__ == module.__name__:
                found.append(obj)
    return found


TRIGGER_KWARGS: dict[str, list[dict[str, Any]]] = {
    "RayTuneTrigger": [
        {"job_id": "exp-1-abc"},
        {
            "job_id": "dag__task__manual__2024-01-01T00:00:00+00:00-1a2b3c4d-2-ffffff",
            "ray_conn_id": "ray_other",
            "poll_interval": 0.5,
            "deadline": 1_900_000_000.25,
            "max_unreachable_s": 30.0,
            "log_progress": False,
            "experiment_uri": "s3://bucket/experiments/exp",
            "target": 0.125,
            "mode": "max",
            "pending_timeout_s": 600.0,
            "stop_at_deadline": False,
        },
    ]
}


def test_every_trigger_has_kwargs_to_round_trip():
    assert {cls.__name__ for cls in _all_triggers()} == set(TRIGGER_KWARGS)


@pytest.mark.parametrize(
    ("name", "kwargs"), [(name, kw) for name, kws in TRIGGER_KWARGS.items() for kw in kws], ids=lambda v: str(v)[:20]
)
def test_trigger_round_trips_through_serialize_as_the_triggerer_rebuilds_it(name, kwargs):
    from tests.support.airflow_compat import import_string, serde_round_trip

    [cls] = [c for c in _all_triggers() if c.__name__ == name]
    trigger = cls(**kwargs)
    classpath, saved = trigger.serialize()
    # The triggerer stores the kwargs with Airflow's serde and rebuilds the trigger from the class path.
    rebuilt = import_string(classpath)(**serde_round_trip(saved))
    assert type(rebuilt) is cls
    assert rebuilt.serialize() == (classpath, saved)
    for key, value in kwargs.items():
        assert saved[key] == value
    json.dumps(saved)  # plain JSON


def test_trigger_event_carries_everything_execute_complete_needs():
    trigger = RayTuneTrigger(job_id="j", experiment_uri="s3://bkt/e")
    payload = trigger._event("timeout", "stopped").payload
    # dag.test() replaces defer()'s kwargs with {"event": payload}: the payload must be enough on its own.
    assert payload == {"status": "timeout", "job_id": "j", "experiment_uri": "s3://bkt/e", "message": "stopped"}


@pytest.mark.parametrize(
    ("progress", "target", "mode", "reached"),
    [
        ({"mode": "min", "best": {"value": 0.5}}, 1.0, None, True),
        ({"mode": "min", "best": {"value": 1.5}}, 1.0, None, False),
        ({"mode": "max", "best": {"value": 0.9}}, 0.8, None, True),
        ({"mode": "min", "best": {"value": 0.9}}, 0.8, "max", True),
        ({"mode": "min", "best": {"value": float("nan")}}, 1.0, None, False),
        ({"mode": "min", "best": None}, 1.0, None, False),
        (None, 1.0, None, False),
    ],
)
def test_best_reaches(progress, target, mode, reached):
    assert best_reaches(progress, target, mode) is reached


# -- templates render into the spec -------------------------------------------------------------------------------


def _ti(dag_id: str = "d", task_id: str = "tune", map_index: int = -1) -> SimpleNamespace:
    pushed: dict[str, Any] = {}
    return SimpleNamespace(
        dag_id=dag_id,
        task_id=task_id,
        map_index=map_index,
        try_number=1,
        start_date=None,
        pushed=pushed,
        xcom_push=lambda key, value: pushed.__setitem__(key, value),
    )


def _context(dag: DAG, op: Any, params: dict[str, Any], run_id: str = "manual__2024-05-01T10:00:00+00:00") -> dict:
    ti = _ti(dag.dag_id, op.task_id)
    return {"params": params, "ti": ti, "task_instance": ti, "run_id": run_id, "dag": dag, "task": op}


PARAMS = {
    "space": {"lr": {"loguniform": [0.0001, 0.1]}, "depth": {"choice": [2, 4]}, "name": 'it\'s "quoted"'},
    "stop": {"training_iteration": 3},
    "n": 4,
    "scheduler": {"name": "asha", "args": {"grace_period": 1}},
}


def _templated_op(native: bool) -> tuple[DAG, RayTuneOperator]:
    with DAG("render_dag", schedule=None, render_template_as_native_obj=native, params=PARAMS) as dag:
        if native:
            op = RayTuneOperator(
                task_id="tune",
                trainable="pkg.mod:train",
                storage_path="s3://bucket/{{ params.n }}x",
                metric="loss",
                mode="{{ 'min' }}",
                param_space="{{ params.space }}",
                stop="{{ params.stop }}",
                num_samples="{{ params.n }}",
                scheduler="{{ params.scheduler }}",
            )
        else:
            op = RayTuneOperator(
                task_id="tune",
                trainable="pkg.mod:train",
                storage_path="s3://bucket/{{ params.n }}x",
                metric="loss",
                mode="{{ 'min' }}",
                param_space="{{ params.space | tojson }}",
                stop="{{ params.stop | tojson }}",
                num_samples="{{ params.n }}",
                scheduler="{{ params.scheduler | tojson }}",
            )
    return dag, op


@pytest.mark.parametrize("native", [False, True], ids=["tojson", "native"])
def test_templated_json_params_render_into_the_spec(native):
    dag, op = _templated_op(native)
    context = _context(dag, op, PARAMS)
    op.render_template_fields(context)  # type: ignore[arg-type]
    spec = op.build_spec(context)  # type: ignore[arg-type]
    assert spec.param_space == PARAMS["space"]
    assert spec.stop == PARAMS["stop"]
    assert spec.num_samples == 4
    assert spec.mode == "min"
    assert spec.storage_path == "s3://bucket/4x"
    assert spec.to_dict()["scheduler"]["name"] == "asha"


def test_a_template_that_renders_no_json_names_the_field_and_the_fix():
    with DAG("render_bad", schedule=None, params={"space": {"x": {"choice": [1, 2]}}}) as dag:
        op = RayTuneOperator(
            task_id="tune",
            trainable="pkg.mod:train",
            storage_path="s3://bkt/e",
            metric="loss",
            mode="min",
            param_space="space={{ params.space }}",  # neither JSON nor a Python literal
        )
    context = _context(dag, op, {"space": {"x": {"choice": [1, 2]}}})
    op.render_template_fields(context)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"param_space = .space=.*not valid JSON.*tojson.*render_template_as_native_obj"
    ):
        op.build_spec(context)  # type: ignore[arg-type]


# -- experiment naming --------------------------------------------------------------------------------------------


class _NoLogicalDate(dict):
    """A context of a run with no logical date: reading one fails, as ``{{ ds }}`` does in such a run."""

    FORBIDDEN = ("logical_date", "ds", "ds_nodash", "ts", "ts_nodash", "execution_date", "data_interval_start")

    def __getitem__(self, key: str) -> Any:
        if key in self.FORBIDDEN:
            raise KeyError(f"{key} read for a run with no logical date")
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.FORBIDDEN:
            raise KeyError(f"{key} read for a run with no logical date")
        return super().get(key, default)


def test_default_experiment_name_comes_from_the_run_id_and_needs_no_logical_date():
    op = RayTuneOperator(task_id="tune", trainable="p.m:f", storage_path="s3://bkt/e", metric="m", mode="max")
    run_id = "manual__2024-05-01T10:00:00.123456+00:00_AbCdEf"
    context = _NoLogicalDate(ti=_ti("my_dag", "tune"), run_id=run_id)
    spec = op.build_spec(context)  # type: ignore[arg-type]
    assert spec.name == experiment_name_for("my_dag", "tune", run_id, -1)
    assert "AbCdEf" in spec.name
    other = op.build_spec(_NoLogicalDate(ti=_ti("my_dag", "tune"), run_id=run_id + "2"))  # type: ignore[arg-type]
    assert other.name != spec.name
    mapped = op.build_spec(_NoLogicalDate(ti=_ti("my_dag", "tune", 3), run_id=run_id))  # type: ignore[arg-type]
    assert mapped.name == experiment_name_for("my_dag", "tune", run_id, 3) != spec.name


# -- execute with a hook that records instead of calling Ray --------------------------------------------------------


class RecordingHook(RayHook):
    """The real hook's connection handling (endpoint, job URL), with the Jobs API calls recorded instead of made."""

    def __init__(self, ray_conn_id: str) -> None:
        super().__init__(ray_conn_id=ray_conn_id)
        self.submitted: list[dict[str, Any]] = []
        self.calls: list[str] = []

    def find_jobs(self, metadata_filter: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append("find_jobs")
        return []

    def check_ray_version(self) -> str:
        self.calls.append("check_ray_version")
        return "2.60.0"

    def submit_job(self, **kwargs: Any) -> str:  # type: ignore[override]
        self.calls.append("submit_job")
        self.submitted.append(kwargs)
        return str(kwargs["submission_id"])


@pytest.fixture
def token_conn(monkeypatch):
    conn = {"conn_type": "ray", "host": "127.0.0.1", "port": 8265, "password": TOKEN}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_WITH_TOKEN", json.dumps(conn))
    return "ray_with_token"


def _run_execute(op: RayTuneOperator, context: dict) -> tuple[Any, RecordingHook]:
    hook = RecordingHook(op.ray_conn_id)
    op.__dict__["hook"] = hook  # the cached_property
    hook.written = {}  # type: ignore[attr-defined]
    with (
        mock.patch("airflow_tune.common.storage.read_json_or_none", return_value=None),
        mock.patch("airflow_tune.common.storage.read_bytes_or_none", return_value=None),
        mock.patch("airflow_tune.common.storage.exists", return_value=False),
        mock.patch("airflow_tune.common.storage.write_json", side_effect=hook.written.__setitem__),  # type: ignore[attr-defined]
        mock.patch("airflow_tune.trust.disjoint.store_for", dict_stores(hook.written)),  # type: ignore[attr-defined]
        mock.patch(
            "airflow_tune.common.storage.write_bytes",
            side_effect=lambda uri, data: hook.written.__setitem__(uri, json.loads(data)),  # type: ignore[attr-defined]
        ),
    ):
        return op.execute(context), hook  # type: ignore[arg-type]


def test_no_token_in_rendered_fields_xcom_job_metadata_or_runtime_env(token_conn):
    with DAG("token_dag", schedule=None, params=PARAMS) as dag:
        op = RayTuneOperator(
            task_id="submit",
            trainable="pkg.mod:train",
            storage_path="s3://bucket/experiments",
            metric="loss",
            mode="min",
            param_space="{{ params.space | tojson }}",
            runtime_env={"env_vars": {"MY_SETTING": "1"}},
            ray_conn_id=token_conn,
            wait_for_completion=False,
        )
    context = _context(dag, op, PARAMS)
    op.render_template_fields(context)  # type: ignore[arg-type]
    result, hook = _run_execute(op, context)
    assert hook.endpoint.headers["Authorization"] == f"Bearer {TOKEN}"  # the token is in use, in a header only
    [submitted] = hook.submitted
    assert submitted["metadata"][METADATA_EXPERIMENT] == result["experiment"]
    assert submitted["runtime_env"]["env_vars"]["MY_SETTING"] == "1"
    handed_on = {
        "rendered": {name: getattr(op, name) for name in op.template_fields},
        "xcom": result,
        "pushed": context["ti"].pushed,
        "metadata": submitted["metadata"],
        "runtime_env": submitted["runtime_env"],
        "spec": hook.written[submitted["metadata"][METADATA_SPEC_URI]],  # type: ignore[attr-defined]
    }
    text = json.dumps(handed_on, default=str)
    assert TOKEN not in text
    assert set(result) == {"job_id", "experiment", "experiment_uri", "dashboard_url"}
    # The spec travels through storage; the job's entrypoint names where.
    spec_uri, digest = submitted["metadata"][METADATA_SPEC_URI], submitted["metadata"]["airflow_tune_spec_digest"]
    assert submitted["entrypoint"] == f"python -m airflow_tune.engine --spec {spec_uri} --spec-digest {digest}"
    assert handed_on["spec"]["param_space"] == PARAMS["space"]
    assert result["dashboard_url"].startswith("http://127.0.0.1:8265/#/jobs/")


def test_a_bad_spec_argument_fails_execute_naming_the_field_before_any_job_call(token_conn):
    op = RayTuneOperator(
        task_id="tune",
        trainable="p.m:f",
        storage_path="s3://bkt/e",
        metric="loss",
        mode="maximize",
        ray_conn_id=token_conn,
    )
    hook = RecordingHook(token_conn)
    op.__dict__["hook"] = hook
    with pytest.raises(ValueError, match=r"mode = 'maximize'"):
        op.execute({"ti": _ti(), "run_id": "manual__x"})  # type: ignore[arg-type]
    assert hook.calls == [] and hook.submitted == []


@pytest.mark.parametrize(
    ("event", "match"),
    [
        ({"status": "timeout", "job_id": "j", "experiment_uri": "s3://bkt/e", "message": "m"}, "execution_timeout"),
        ({"status": "error", "job_id": "j", "experiment_uri": "s3://bkt/e", "message": "gone"}, "lost track.*gone"),
    ],
)
def test_execute_complete_fails_on_timeout_and_error_events(event, match):
    op = RayTuneOperator(task_id="t", trainable="p.m:f", storage_path="s3://bkt/e", metric="m", mode="min")
    with pytest.raises(RayJobError, match=match):
        op.execute_complete({}, event)  # type: ignore[arg-type]


def test_deadline_follows_execution_timeout_from_the_task_start():
    from datetime import datetime, timezone

    op = RayTuneOperator(
        task_id="t",
        trainable="p.m:f",
        storage_path="s3://bkt/e",
        metric="m",
        mode="min",
        execution_timeout=timedelta(seconds=90),
    )
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    assert op._deadline({"ti": SimpleNamespace(start_date=start)}) == start.timestamp() + 90  # type: ignore[arg-type]
    op.execution_timeout = None
    assert op._deadline({"ti": SimpleNamespace(start_date=start)}) is None  # type: ignore[arg-type]


# -- sensor arguments ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs job_id or experiment_uri"),
        ({"job_id": "j", "target": "abc"}, "target = 'abc': not a number"),
        ({"job_id": "j", "target": 1.0}, "target needs experiment_uri"),
        ({"job_id": "j", "target_mode": "maximize"}, "target_mode"),
    ],
)
def test_sensor_refuses_bad_arguments(kwargs, match):
    sensor = RayTuneSensor(task_id="s", **kwargs)
    with pytest.raises(ValueError, match=match):
        sensor._validate()


def test_sensor_result_has_the_operators_keys():
    sensor = RayTuneSensor(task_id="s", job_id="j", experiment_uri="s3://bkt/e")
    sensor.__dict__["hook"] = SimpleNamespace(job_url=lambda job_id: f"http://ray/#/jobs/{job_id}")
    finished = sensor._shape({key: None for key in RESULT_KEYS})
    early = sensor._early({"metric": "loss", "best": {"trial_id": "t1", "value": 0.5, "config": {"x": 1}}})
    assert set(finished) == set(early) == {*RESULT_KEYS, "finished"}
    assert finished["finished"] is True and early["finished"] is False
    assert early["best_metrics"] == {"loss": 0.5} and early["best_config"] == {"x": 1}


def test_a_sensor_reads_only_experiments_of_its_own_dag():
    with DAG("reader_dag", schedule=None):
        sensor = RayTuneSensor(task_id="s", experiment_uri="s3://bkt/e")
    sensor.__dict__["hook"] = SimpleNamespace(job_url=lambda job_id: f"http://ray/#/jobs/{job_id}")
    own = {"dag_id": "reader_dag", "task_id": "tune", "map_index": -1, "run_id": "r"}
    assert sensor._shape({**{key: None for key in RESULT_KEYS}, "owner": own})["finished"] is True
    other = {**own, "dag_id": "other_dag"}
    for read in (sensor._shape, sensor._early):
        with pytest.raises(RayJobError, match="belongs to DAG 'other_dag', task 'tune'"):
            read({"owner": other, "best": {"config": {"secret": 1}}})
        with pytest.raises(RayJobError, match="no recorded owner"):
            read({"best": {}})


# -- import hygiene -----------------------------------------------------------------------------------------------


def test_importing_the_airflow_side_loads_no_ray_boto3_botocore_pyarrow_or_mlflow(tmp_path):
    code = (
        "import sys, json\n"
        "import airflow_tune.hooks.ray, airflow_tune.operators.tune, airflow_tune.sensors.tune\n"
        "import airflow_tune.triggers.tune, airflow_tune.links.ray\n"
        "import airflow_tune.hooks, airflow_tune.operators, airflow_tune.sensors, airflow_tune.triggers\n"
        "import airflow_tune.links, airflow_tune.hooks.mlflow\n"
        "heavy = {'ray', 'boto3', 'botocore', 'pyarrow', 'mlflow'}\n"
        "print(json.dumps(sorted({m for m in sys.modules if m.split('.')[0] in heavy})))\n"
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# -- the Ray Job link -----------------------------------------------------------------------------------------------


def test_the_job_link_makes_no_xcom_lookup_when_the_try_submitted_no_job(monkeypatch):
    """A task that fails on its arguments ends with the link asked for; it must not look for an XCom that isn't there
    (the SDK logs "XCom not found" as an error)."""
    from airflow.sdk.execution_time.xcom import XCom

    from airflow_tune.links.ray import RayJobLink

    monkeypatch.setattr(XCom, "get_value", mock.Mock(side_effect=AssertionError("XCom read")))
    op = RayTuneOperator(task_id="t", trainable="p.m:f", storage_path="s3://bkt/e", metric="m", mode="min")
    assert RayJobLink().get_link(op, ti_key=mock.Mock()) == ""
    sensor = RayTuneSensor(task_id="s", experiment_uri="s3://bkt/e")
    assert RayJobLink().get_link(sensor, ti_key=mock.Mock()) == ""


def test_the_job_link_is_known_once_persisted():
    from airflow_tune.links.ray import RayJobLink

    op = RayTuneOperator(task_id="t", trainable="p.m:f", storage_path="s3://bkt/e", metric="m", mode="min")
    ti = _ti()
    RayJobLink.persist({"ti": ti, "task": op}, job_url="http://ray/#/jobs/j1")
    assert ti.pushed == {RayJobLink.key: "http://ray/#/jobs/j1"}
    assert RayJobLink().get_link(op, ti_key=mock.Mock()) == "http://ray/#/jobs/j1"
