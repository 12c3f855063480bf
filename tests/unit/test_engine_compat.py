"""engine/compat.py, pure logic: the differences between the Ray releases the engine runs on, each against a fake of
the behaviour of the releases concerned (the compat tier runs the engine on real 2.43 and 2.50 clusters)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from airflow_tune.engine import compat, progress
from airflow_tune.engine.imports import EngineError
from airflow_tune.spec import ExperimentSpec


def _spec() -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bkt/exp", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, "progress_interval_s": 10})


class _ActorId:
    def hex(self) -> str:
        return "actor-a"


class _Tune:
    """Tune's driver loop as 2.43/2.50 (callbacks get a copy of the result) or 2.60 (the result itself) run it."""

    def __init__(self, copies: bool) -> None:
        self.copies = copies

    def report(self, cb: progress.ProgressCallback, trial: SimpleNamespace, result: dict) -> None:
        cb.on_trial_result(0, [trial], trial, result.copy() if self.copies else result)
        trial.last_result = result


@pytest.mark.parametrize("copies", [True, False], ids=["2.43-2.50-copy", "2.60-in-place"])
@pytest.mark.parametrize("ending", ["complete", "error"])
def test_the_node_id_reaches_the_last_result_whether_callbacks_get_a_copy_or_not(monkeypatch, copies, ending):
    monkeypatch.setattr(progress, "actor_node_id", lambda actor_id: "node-1")
    cb = progress.ProgressCallback(_spec(), out=io.StringIO(), clock=lambda: 0.0)
    monkeypatch.setattr(cb, "write_progress", lambda trials, snap=None: None)
    trial = SimpleNamespace(
        trial_id="t1", status="RUNNING", last_result={}, config={}, path=None,
        temporary_state=SimpleNamespace(ray_actor=SimpleNamespace(_actor_id=_ActorId())),
    )  # fmt: skip
    tune = _Tune(copies)
    tune.report(cb, trial, {"loss": 1.0})
    for lookup in cb._actor_nodes.values():
        lookup.result(timeout=10)
    tune.report(cb, trial, {"loss": 0.5})
    tune.report(cb, trial, {"loss": 0.2, "done": True})
    assert trial.last_result.get(progress.NODE_ID) == (None if copies else "node-1")  # what Tune alone keeps
    if ending == "complete":
        cb.on_trial_complete(0, [trial], trial)
    else:
        trial.temporary_state.ray_actor = None  # Tune stops an errored trial's actor before on_trial_error
        trial.status = "ERROR"
        cb.on_trial_error(0, [trial], trial)
    assert trial.last_result == {"loss": 0.2, "done": True, progress.NODE_ID: "node-1"}


def test_an_argument_the_clusters_class_does_not_take_is_refused_naming_it_and_the_ray_version():
    class OldSearch:  # BayesOptSearch before 2.60 had no repeat_float_precision
        def __init__(self, space=None, metric=None, random_state=42):
            pass

    compat.check_arguments(OldSearch, {"random_state": 1}, "search 'bayesopt'")
    with pytest.raises(EngineError) as caught:
        compat.check_arguments(OldSearch, {"random_state": 1, "repeat_float_precision": 3}, "search 'bayesopt'")
    message = str(caught.value)
    assert "search 'bayesopt': 'repeat_float_precision' not taken by OldSearch of the cluster's Ray" in message
    assert compat.ray_version() in message and "space, metric, random_state" in message
    assert "drop it from the args, or run a newer Ray on the cluster" in message


def test_a_class_taking_any_keyword_checks_its_own():
    class Open:
        def __init__(self, **kwargs):
            pass

    compat.check_arguments(Open, {"anything": 1}, "scheduler.factory")


def test_the_log_base_is_dropped_from_every_log_primitive_and_only_there():
    assert compat.log_domain_args("loguniform", [1e-4, 1e-1, 2]) == [1e-4, 1e-1]
    assert compat.log_domain_args("qloguniform", [1e-4, 1e-1, 1e-4, 10]) == [1e-4, 1e-1, 1e-4]
    assert compat.log_domain_args("lograndint", [1, 100]) == [1, 100]
    assert compat.log_domain_args("qlograndint", [1, 100, 2, 10]) == [1, 100, 2]
    assert compat.log_domain_args("quniform", [0, 1, 0.5]) == [0, 1, 0.5]


def test_tune_internals_that_are_missing_fail_clearly_naming_the_ray_version(monkeypatch):
    with pytest.raises(EngineError, match=rf"restored experiment on Ray {compat.ray_version()}"):
        compat.tuner_run_config(SimpleNamespace())
    run_config = SimpleNamespace(callbacks=[])
    assert compat.tuner_run_config(SimpleNamespace(_local_tuner=SimpleNamespace(_run_config=run_config))) is run_config
    tuner = SimpleNamespace(get_results=lambda: SimpleNamespace())
    assert compat.tuner_trials(tuner) is None
    from ray.tune.execution import class_cache

    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", ("AWS_SECRET_ACCESS_KEY",))
    with pytest.raises(EngineError, match="credentials out of the trials' runtime_env"):
        compat.stop_propagating(("AWS_SECRET_ACCESS_KEY",))


def test_the_propagated_credentials_are_removed(monkeypatch):
    from ray.tune.execution import class_cache

    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", {"AWS_SECRET_ACCESS_KEY", "RAY_CHDIR_TO_TRIAL_DIR"})
    compat.stop_propagating(("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
    assert class_cache.ENV_VARS_TO_PROPAGATE == {"RAY_CHDIR_TO_TRIAL_DIR"}
