"""An experiment's files as the engine writes them (progress.json, history.json, result.json), made with the engine's
own code (``progress_snapshot``, ``HistoryCallback``, ``build_result_manifest``) from fake trials, for the tests of
the Experiment view. Writes to any storage URI (a local path or ``s3://``). The owner the files record is the
spec's, as the operator sets it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from airflow_tune.common import storage
from airflow_tune.common.contract import PROGRESS_FILE, RESULT_FILE, manifest_uri
from airflow_tune.common.spec import ExperimentSpec

METRIC = "val_accuracy"


def owner_record(dag_id: str, task_id: str = "tune", map_index: int = -1, run_id: str | None = None) -> dict[str, Any]:
    """An experiment's owner as the operator records it (``run_id`` only for default-named experiments)."""
    return {"dag_id": dag_id, "task_id": task_id, "map_index": map_index, "run_id": run_id}


def score(i: int, n: int) -> float:
    """Trial i's final accuracy: distinct values, not in trial order (the best is i = 0)."""
    return round(0.99 - ((i * 7919) % n) / (2 * n), 6)


@dataclass
class Made:
    spec: ExperimentSpec
    trials: list[Any]
    best_id: str
    errored: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _grid(spec: ExperimentSpec, trials: list[Any]) -> Any:
    """Just enough of Tune's ResultGrid for ``build_result_manifest``."""
    results = []
    for t in trials:
        errored = t.status == "ERROR"
        results.append(
            SimpleNamespace(
                error=RuntimeError(f"Traceback ...\nValueError: trial {t.trial_id} diverged") if errored else None,
                metrics={**t.last_result, "trial_id": t.trial_id},
                config=t.config,
                path=f"{spec.experiment_uri.split('://', 1)[-1]}/{t.trial_id}",
                checkpoint=None,
            )
        )
    finished = [r for r in results if r.error is None and isinstance(r.metrics.get(METRIC), float)]

    class Grid:
        def __iter__(self):
            return iter(results)

        def get_best_result(self, metric: str, mode: str, scope: str = "last") -> Any:
            if not finished:
                raise RuntimeError("no result")
            best = max(finished, key=lambda r: r.metrics[metric] if mode == "max" else -r.metrics[metric])
            checkpoint = SimpleNamespace(path=f"{best.path}/checkpoint_000002")
            return SimpleNamespace(
                metrics=best.metrics,
                config=best.config,
                checkpoint=checkpoint,
                get_best_checkpoint=lambda metric, mode: checkpoint,
            )

    return Grid()


def make_experiment(
    storage_path: str,
    name: str,
    n_trials: int,
    *,
    iterations: int = 5,
    running: int = 0,
    errored: int = 0,
    finished: bool = True,
    failed: bool = False,
    config_keys: int = 3,
    owner: dict[str, Any] | None,
) -> Made:
    """Write an experiment's files under ``storage_path/name``.

    :param running: how many trials are still running (their curves are unfinished); with ``finished`` false only.
    :param errored: how many trials errored (the last ones).
    :param failed: the result manifest says the experiment failed (as the engine does when every trial errored).
    :param owner: the task instance the files say the experiment belongs to (:func:`owner_record`); None writes
        files with no owner, as versions before the owner was recorded did.
    """
    from airflow_tune.engine.history import HistoryCallback
    from airflow_tune.engine.progress import progress_snapshot
    from airflow_tune.engine.result_manifest import build_result_manifest

    spec = ExperimentSpec.from_dict(
        {
            "trainable": "m:f",
            "name": name,
            "storage_path": storage_path,
            "metric": METRIC,
            "mode": "max",
            "num_samples": n_trials,
            "progress_interval_s": 10,
            "owner": owner,
        }
    )
    clock = _Clock()
    history = HistoryCallback(spec, clock=clock)
    trials = []
    for i in range(n_trials):
        config = {"lr": round(10 ** -(1 + (i % 4)), 6), "depth": [2, 4, 8][i % 3], "opt": {"name": "sgd", "m": 0.9}}
        config.update({f"extra_{k}": k * i for k in range(max(0, config_keys - 3))})
        trials.append(SimpleNamespace(trial_id=f"exp_{i:05d}", status="PENDING", config=config, last_result={}))
    errored_ids = [t.trial_id for t in trials[n_trials - errored :]] if errored else []
    running_ids = [t.trial_id for t in trials[n_trials - errored - running : n_trials - errored]] if running else []
    for i, t in enumerate(trials):
        t.status = "RUNNING"
        history.on_trial_start(0, trials, t)
        steps = iterations if t.trial_id not in running_ids else max(1, iterations // 2)
        for step in range(1, steps + 1):
            value = score(i, n_trials) - 0.3 * (iterations - step) / iterations
            if t.trial_id in errored_ids and step == steps:
                value = math.nan
            t.last_result = {METRIC: value, "training_iteration": step, "time_total_s": 0.1 * step}
            history.on_trial_result(0, trials, t, t.last_result)
            clock.now += 0.01
        if t.trial_id in running_ids:
            continue
        t.status = "ERROR" if t.trial_id in errored_ids else "TERMINATED"
        (history.on_trial_error if t.status == "ERROR" else history.on_trial_complete)(0, trials, t)
    history.on_experiment_end(trials)  # writes history.json
    storage.write_json(manifest_uri(spec.experiment_uri, PROGRESS_FILE), progress_snapshot(spec, trials))
    best_id = max(
        (t for t in trials if t.status != "ERROR"), key=lambda t: t.last_result[METRIC], default=trials[0]
    ).trial_id
    if finished:
        time.sleep(0.01)  # the result comes after the last progress
        manifest = build_result_manifest(spec, _grid(spec, trials), job_id=f"{name}-1")
        manifest["status"] = "failed" if failed else "succeeded"
        storage.write_json(manifest_uri(spec.experiment_uri, RESULT_FILE), manifest)
    return Made(spec=spec, trials=trials, best_id=best_id, errored=errored_ids, running=running_ids)
