"""MLflow tracking's pure logic: the spec's ``mlflow`` (every refusal, every accepted form of the operator's
``mlflow_tracking``), the engine callback's run bookkeeping against a stand-in client (the real server is in
tests/integration/test_mlflow_tracking.py), the XCom contract and the task-log line about failed calls."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG, Connection

from airflow_tune.common.contract import MLFLOW_RESULT_KEYS, RESULT_KEYS, xcom_result
from airflow_tune.common.spec import IDENTITY_FIELDS, ExperimentSpec, SpecError
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.utils.following import progress_lines

BASE: dict[str, Any] = {
    "trainable": "pkg.mod:train",
    "name": "exp-1",
    "storage_path": "s3://bkt/experiments",
    "metric": "loss",
    "mode": "min",
}
TRACKING = {"tracking_uri": "http://mlflow:5000", "experiment_name": "airflow-tune/d/t"}


def _refused(mlflow: Any, **more: Any) -> str:
    with pytest.raises(SpecError) as caught:
        ExperimentSpec.from_dict({**BASE, "mlflow": mlflow, **more})
    return str(caught.value)


# -- the spec ---------------------------------------------------------------------------------------------------------
def test_the_spec_takes_null_or_the_full_form_and_fills_tags_and_ui_url():
    assert ExperimentSpec.from_dict(BASE).mlflow is None
    assert ExperimentSpec.from_dict({**BASE, "mlflow": None}).mlflow is None
    spec = ExperimentSpec.from_dict({**BASE, "mlflow": {**TRACKING, "tracking_uri": "https://mlflow.example.com/"}})
    assert spec.mlflow == {
        "tracking_uri": "https://mlflow.example.com",
        "experiment_name": "airflow-tune/d/t",
        "tags": {},
        "ui_url": None,
    }
    full = {**TRACKING, "tags": {"team": "ml"}, "ui_url": "https://ui.example.com"}
    assert ExperimentSpec.from_dict({**BASE, "mlflow": full}).mlflow == full
    assert ExperimentSpec.from_json(json.dumps({**BASE, "mlflow": full})).mlflow == full


def test_tracking_is_not_part_of_the_identity():
    """Tracking may be turned on, off or elsewhere between tries of one experiment."""
    assert "mlflow" not in IDENTITY_FIELDS
    plain = ExperimentSpec.from_dict(BASE)
    assert ExperimentSpec.from_dict({**BASE, "mlflow": TRACKING}).fingerprint() == plain.fingerprint()


@pytest.mark.parametrize(
    ("mlflow", "field", "says"),
    [
        ("on", "mlflow", "must be a JSON object or null"),
        ([TRACKING], "mlflow", "must be a JSON object or null"),
        ({**TRACKING, "experiment": "x"}, "mlflow.experiment", "did you mean 'experiment_name'?"),
        ({**TRACKING, "colour": "x"}, "mlflow.colour", "known keys: tracking_uri"),
        ({"experiment_name": "x"}, "mlflow.tracking_uri", "must be an http(s) URL"),
        ({**TRACKING, "tracking_uri": "file:///tmp/mlruns"}, "mlflow.tracking_uri", "is not an http(s) URL"),
        ({**TRACKING, "tracking_uri": "sqlite:///x.db"}, "mlflow.tracking_uri", "is not an http(s) URL"),
        ({**TRACKING, "tracking_uri": "http://"}, "mlflow.tracking_uri", "is not an http(s) URL"),
        ({**TRACKING, "tracking_uri": "http://h:port"}, "mlflow.tracking_uri", "is not a URL"),
        ({**TRACKING, "tracking_uri": "http://u:pw@h"}, "mlflow.tracking_uri", "carries credentials"),
        ({**TRACKING, "tracking_uri": "http://h/?token=x"}, "mlflow.tracking_uri", "no query or fragment"),
        ({**TRACKING, "ui_url": "javascript:alert(1)"}, "mlflow.ui_url", "is not an http(s) URL"),
        ({**TRACKING, "ui_url": "https://u:pw@ui"}, "mlflow.ui_url", "carries credentials"),
        ({**TRACKING, "experiment_name": ""}, "mlflow.experiment_name", "non-empty string"),
        ({**TRACKING, "experiment_name": 3}, "mlflow.experiment_name", "non-empty string"),
        ({**TRACKING, "experiment_name": "x" * 257}, "mlflow.experiment_name", "at most 256"),
        ({**TRACKING, "tags": ["a"]}, "mlflow.tags", "must be a JSON object of strings"),
        ({**TRACKING, "tags": {"n": 1}}, "mlflow.tags.n", "must be a string"),
        ({**TRACKING, "tags": {"": "x"}}, "mlflow.tags.", "non-empty string"),
        ({**TRACKING, "tags": {"k" * 251: "x"}}, "mlflow.tags.", "at most 250"),
        ({**TRACKING, "tags": {"airflow_tune.trial_id": "x"}}, "mlflow.tags.airflow_tune.trial_id", "reserved"),
        ({**TRACKING, "tags": {"mlflow.parentRunId": "x"}}, "mlflow.tags.mlflow.parentRunId", "reserved"),
    ],
)
def test_every_refusal_names_the_field_and_the_fix(mlflow, field, says):
    message = _refused(mlflow)
    line = next(line for line in message.splitlines() if line.strip().startswith(f"- {field}"))
    assert says in line and "; " in line, line


@pytest.mark.parametrize("name", ["api_key", "MLFLOW_TRACKING_TOKEN", "password", "aws_secret", "credentials"])
def test_a_tag_named_like_a_credential_is_refused_without_showing_its_value(name):
    message = _refused({**TRACKING, "tags": {name: "hunter2-value"}})
    assert f"mlflow.tags.{name} = '<not shown>'" in message and "hunter2-value" not in message


def test_a_password_in_the_tracking_uri_is_not_shown():
    assert "hunter2" not in _refused({**TRACKING, "tracking_uri": "https://me:hunter2@mlflow"})


@pytest.mark.parametrize("callback", ["mlflow", "MLflowLoggerCallback", {"name": "mlflow", "args": {}}])
def test_tunes_own_mlflow_logger_beside_tracking_is_refused(callback):
    message = _refused(TRACKING, callbacks=["csv", callback])
    assert "callbacks[1]" in message and "log every trial twice" in message and "drop this callback" in message
    # Either alone is fine.
    ExperimentSpec.from_dict({**BASE, "callbacks": [callback]})
    ExperimentSpec.from_dict({**BASE, "mlflow": TRACKING, "callbacks": ["csv"]})


def test_decoder_keys_in_tags_are_refused_by_the_data_only_check():
    message = _refused({**TRACKING, "tags": {"_type": "CLOUDPICKLE_FALLBACK", "value": "00"}})
    assert "mlflow.tags" in message and "decodes" in message


# -- the operator's mlflow_tracking -------------------------------------------------------------------------------
@pytest.fixture
def mlflow_connection(monkeypatch):
    conn = {"conn_type": "http", "host": "http://mlflow:5000", "login": "login-8f3a", "password": "hunter2"}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    ui = {"conn_type": "http", "host": "http://mlflow:5000", "extra": {"ui_url": "https://mlflow.example.com"}}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_UI", json.dumps(ui))
    assert Connection  # the connections come from the environment, as in a deployment


def _build(value: Any, *, params: dict[str, Any] | None = None, native: bool = False, **kwargs: Any) -> Any:
    params = params or {}
    with DAG("forms", schedule=None, params=params, render_template_as_native_obj=native) as dag:
        op = RayTuneOperator(
            task_id="tune", **{k: v for k, v in BASE.items() if k != "name"}, mlflow_tracking=value, **kwargs
        )
    ti = SimpleNamespace(dag_id="forms", task_id="tune", map_index=-1, try_number=1, start_date=None)
    context = {"params": params, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    return op.build_spec(context)  # type: ignore[arg-type]


SETTINGS = {"experiment_name": "digits", "tags": {"team": "ml"}}
FORMS = [
    ("python-true", True, {}, False),
    ("python-dict", SETTINGS, {}, False),
    ("string-true", "true", {}, False),
    ("string-json", json.dumps(SETTINGS), {}, False),
    ("template-tojson", "{{ params.tracking | tojson }}", {"tracking": SETTINGS}, False),
    ("template-plain", "{{ params.tracking }}", {"tracking": SETTINGS}, False),
    ("template-native", "{{ params.tracking }}", {"tracking": SETTINGS}, True),
    ("template-bool", "{{ params.tracking }}", {"tracking": True}, False),
]


@pytest.mark.parametrize(("form", "value", "params", "native"), FORMS, ids=[f[0] for f in FORMS])
def test_every_form_of_mlflow_tracking_turns_tracking_on(mlflow_connection, form, value, params, native):
    spec = _build(value, params=params, native=native)
    chosen = SETTINGS if "true" not in form and "bool" not in form else {}
    assert spec.mlflow == {
        "tracking_uri": "http://mlflow:5000",
        "experiment_name": chosen.get("experiment_name", "airflow-tune/forms/tune"),
        "tags": chosen.get("tags", {}),
        "ui_url": "http://mlflow:5000",
    }
    assert "hunter2" not in spec.to_json() and "login-8f3a" not in spec.to_json()


@pytest.mark.parametrize("value", [None, False, "", "false", "null", {}])
def test_tracking_is_off_for_every_falsy_form_and_no_connection_is_looked_up(value, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)
    assert _build(value).mlflow is None


def test_the_browser_url_comes_from_the_connections_extra(mlflow_connection):
    spec = _build(True, mlflow_conn_id="mlflow_ui")
    assert spec.mlflow["ui_url"] == "https://mlflow.example.com"


@pytest.mark.parametrize("key", ["tracking_uri", "ui_url"])
def test_a_rendered_server_url_is_refused_set_it_on_the_connection(mlflow_connection, key):
    with pytest.raises(ValueError, match=f"mlflow_tracking sets {key}.*set it on the connection 'mlflow_default'"):
        _build("{{ params.tracking | tojson }}", params={"tracking": {key: "http://elsewhere:5000"}})


def test_a_tracking_value_that_is_no_dict_is_a_type_error(mlflow_connection):
    with pytest.raises(TypeError, match="mlflow_tracking must be True, a dict"):
        _build("[1, 2]")


def test_the_operator_refuses_a_double_logger_and_bad_tags_as_spec_errors(mlflow_connection):
    with pytest.raises(SpecError, match="log every trial twice"):
        _build(True, callbacks=["mlflow"])
    with pytest.raises(SpecError, match="mlflow.tags.token"):
        _build({"tags": {"token": "x"}})


# -- the XCom contract and the task log -------------------------------------------------------------------------------
def test_the_xcom_result_has_mlflow_without_the_run_map():
    assert "mlflow" in RESULT_KEYS
    tracking = {
        "tracking_uri": "http://mlflow:5000",
        "experiment_id": "7",
        "parent_run_id": "p",
        "best_run_id": "b",
        "runs": {f"t{i}": f"r{i}" for i in range(1000)},
        "errors": 0,
    }
    out = xcom_result({"mlflow": tracking}, "job", None)
    assert set(out) == set(RESULT_KEYS)
    assert out["mlflow"] == {k: tracking[k] for k in MLFLOW_RESULT_KEYS}
    assert xcom_result({}, "job", None)["mlflow"] is None
    assert xcom_result({"mlflow": None}, "job", None)["mlflow"] is None


def test_the_task_log_says_how_many_mlflow_calls_failed_and_the_last_error():
    snapshot = {"num_trials": 2, "counts": {"RUNNING": 2}, "metric": "loss"}
    assert not any("MLflow" in line for line in progress_lines({**snapshot, "mlflow": {"errors": 0}}))
    failing = {"errors": 3, "last_error": "ConnectionError: refused", "tracking_uri": "http://mlflow:5000"}
    lines = [line for line in progress_lines({**snapshot, "mlflow": failing}) if "MLflow" in line]
    assert len(lines) == 1
    assert "3 call(s) to http://mlflow:5000 failed, the last: ConnectionError: refused" in lines[0]
    assert "the experiment goes on" in lines[0]


# -- the engine callback, against a stand-in client -------------------------------------------------------------------
class FakeClient:
    """The few MlflowClient calls the callback makes, kept in memory; ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.experiments: dict[str, str] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("Connection refused")

    def get_experiment_by_name(self, name: str) -> Any:
        self._check()
        found = self.experiments.get(name)
        return SimpleNamespace(experiment_id=found, lifecycle_stage="active") if found else None

    def create_experiment(self, name: str) -> str:
        self._check()
        self.experiments[name] = str(len(self.experiments) + 1)
        return self.experiments[name]

    def search_runs(self, experiment_ids: list[str], filter_string: str, **kwargs: Any) -> list[Any]:
        self._check()
        wanted = dict(
            (part.split("` = ")[0].split("`")[1], part.split("` = ")[1].strip("'"))
            for part in filter_string.split(" and ")
        )
        return [
            SimpleNamespace(
                info=SimpleNamespace(run_id=run_id, status=run["status"], start_time=run["start"]),
                data=SimpleNamespace(tags=run["tags"]),
            )
            for run_id, run in self.runs.items()
            if all(run["tags"].get(k) == v for k, v in wanted.items())
        ]

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str]) -> Any:
        self._check()
        run_id = f"run{len(self.runs)}"
        self.runs[run_id] = {"tags": dict(tags), "status": "RUNNING", "start": len(self.runs), "params": {}}
        self.runs[run_id]["metrics"] = []
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id))

    def update_run(self, run_id: str, status: str) -> None:
        self._check()
        self.runs[run_id]["status"] = status

    def set_terminated(self, run_id: str, status: str) -> None:
        self.update_run(run_id, status)

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = ()) -> None:
        self._check()
        self.runs[run_id]["params"].update({p.key: p.value for p in params})
        self.runs[run_id]["metrics"] += [(m.key, m.value, m.step) for m in metrics]

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self._check()
        self.runs[run_id]["tags"][key] = value

    def log_metric(self, run_id: str, key: str, value: float) -> None:
        self._check()
        self.runs[run_id]["metrics"].append((key, value, 0))


def _tracker(client: FakeClient, out: io.StringIO | None = None, clock: Any = None) -> Any:
    from airflow_tune.engine.mlflow_tracking import MLflowTracking

    spec = ExperimentSpec.from_dict(
        {**BASE, "mlflow": {**TRACKING, "tags": {"team": "ml"}}, "owner": _OWNER, "param_space": {"x": 1}}
    )
    kwargs = {"clock": clock} if clock else {}
    tracker = MLflowTracking(spec, client_factory=lambda uri: client, out=out or io.StringIO(), **kwargs)
    tracker.start()
    return tracker


_OWNER = {"dag_id": "d", "task_id": "t", "map_index": -1, "run_id": "manual__1"}


def _trial(trial_id: str, **config: Any) -> Any:
    return SimpleNamespace(trial_id=trial_id, config={"x": 1, "nested": {"lr": 0.1}, **config})


def test_runs_params_metrics_and_statuses_of_finished_errored_and_stopped_trials():
    pytest.importorskip("mlflow")
    client = FakeClient()
    tracker = _tracker(client)
    a, b, c = _trial("a"), _trial("b"), _trial("c")
    for trial in (a, b, c):
        tracker.on_trial_start(0, [], trial)
    tracker.on_trial_result(0, [], a, {"loss": 1.5, "training_iteration": 1, "done": False, "pid": 3, "d": {"e": 2}})
    tracker.on_trial_result(0, [], a, {"loss": float("nan"), "training_iteration": 2, "config": {"x": 1}})
    tracker.on_trial_complete(0, [], a)
    tracker.on_trial_error(0, [], b)
    manifest = {"best_trial_id": "a", "best_metrics": {"loss": 1.5}}
    tracker.finish(unfinished=["c"], interrupted=False, manifest=manifest, failed=False)
    summary = tracker.summary()
    parent = client.runs[summary["parent_run_id"]]
    runs = {t: client.runs[r] for t, r in summary["runs"].items()}
    assert {t: r["status"] for t, r in runs.items()} == {"a": "FINISHED", "b": "FAILED", "c": "KILLED"}
    assert runs["a"]["params"] == {"x": "1", "nested/lr": "0.1"}
    # Numbers only (no bool, NaN, or Tune's bookkeeping), nested ones flattened, at their training_iteration.
    assert sorted(runs["a"]["metrics"]) == [("d/e", 2.0, 1), ("loss", 1.5, 1), ("training_iteration", 1.0, 1)] + [
        ("training_iteration", 2.0, 2)
    ]
    assert runs["a"]["tags"]["team"] == "ml" and runs["a"]["tags"]["mlflow.parentRunId"] == summary["parent_run_id"]
    assert parent["status"] == "FINISHED" and parent["tags"]["airflow_tune.best_run_id"] == summary["best_run_id"]
    assert summary["best_run_id"] == summary["runs"]["a"] and ("best_loss", 1.5, 0) in parent["metrics"]
    assert parent["tags"]["airflow_tune.dag_id"] == "d" and parent["tags"]["airflow_tune.run_id"] == "manual__1"
    assert summary["errors"] == 0


def test_a_second_driver_finds_the_parent_and_trial_runs_and_reopens_a_stopped_trial():
    pytest.importorskip("mlflow")
    client = FakeClient()
    first = _tracker(client)
    for trial in (_trial("a"), _trial("b")):
        first.on_trial_start(0, [], trial)
    first.on_trial_complete(0, [], _trial("a"))
    first.finish(unfinished=["b"], interrupted=True, manifest=None, failed=False)
    runs = first.summary()["runs"]
    assert client.runs[first.parent_run_id]["status"] == "KILLED" and client.runs[runs["b"]]["status"] == "KILLED"

    second = _tracker(client)
    assert second.parent_run_id == first.parent_run_id and second.runs == runs
    assert client.runs[second.parent_run_id]["status"] == "RUNNING"
    second.on_trial_start(0, [], _trial("b"))
    second.on_trial_complete(0, [], _trial("b"))
    second.finish(unfinished=[], interrupted=False, manifest={}, failed=True)
    assert len(client.runs) == 3, "no run created twice"
    assert client.runs[runs["b"]]["status"] == "FINISHED" and client.runs[runs["a"]]["status"] == "FINISHED"
    assert client.runs[second.parent_run_id]["status"] == "FAILED"


def test_a_server_down_at_the_start_fails_naming_it_and_later_failures_are_counted_and_warned_rate_limited():
    pytest.importorskip("mlflow")
    from airflow_tune.engine.imports import EngineError

    client = FakeClient()
    client.down = True
    with pytest.raises(EngineError, match=r"the MLflow tracking server http://mlflow:5000 .*no trial has run"):
        _tracker(client)

    client.down = False
    out = io.StringIO()
    now = [0.0]
    tracker = _tracker(client, out, clock=lambda: now[0])
    client.down = True
    trial = _trial("a")
    tracker.on_trial_start(0, [], trial)
    for i in range(5):
        tracker.on_trial_result(0, [], trial, {"loss": 1.0, "training_iteration": i + 1})
    tracker.flush()
    assert tracker.errors == 6 and "ConnectionError: Connection refused" in str(tracker.last_error)
    warnings = [line for line in out.getvalue().splitlines() if "WARNING MLflow tracking" in line]
    assert len(warnings) == 1, "one warning per WARN_EVERY_S while calls keep failing"
    assert "6 call(s) failed" in out.getvalue()


def test_params_and_metrics_keep_within_mlflows_limits():
    from airflow_tune.engine.mlflow_values import MAX_PARAM_VALUE, metrics_of, params_of

    params = params_of({"ok": "v" * 7000, "k" * 300: 1, "bad key!": 2, "a": {"b": [1, 2]}})
    assert params == {"ok": "v" * MAX_PARAM_VALUE, "a/b": "[1, 2]"}
    assert metrics_of({"loss": 1, "flag": True, "inf": float("inf"), "text": "x", "timestamp": 5}) == {"loss": 1.0}
