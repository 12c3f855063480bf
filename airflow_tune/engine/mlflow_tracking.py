"""Each trial as an MLflow run, under one parent run per experiment (the spec's ``mlflow``).

- **Parent run**: found by the tags ``airflow_tune.experiment=<name>`` and ``airflow_tune.role=parent`` in the MLflow
  experiment ``spec.mlflow["experiment_name"]``, else created (run name: the experiment's name; tags: the owner's
  dag_id, task_id, map_index and run_id, and the spec's tags; see :mod:`~airflow_tune.engine.mlflow_tags`). One found
  is adopted only when its owner tags are the spec's owner, else the job fails at the start, before any trial and
  before anything is written to it. At the end it gets the best trial's metric and run id and ends FINISHED, or
  FAILED when the experiment failed, or KILLED when the driver was stopped.
- **Trial runs**: one per trial, found by ``airflow_tune.trial_id`` under the parent (``mlflow.parentRunId``), else
  created with the flattened config as params. Every numeric metric the trial reports is logged at
  ``step=training_iteration``; the run ends FINISHED, FAILED (errored) or KILLED (stopped by Tune or a stop signal).

A restored experiment finds its runs by these tags (Tune's own ``MLflowLoggerCallback`` keeps no state across a
restore and would start new runs), so its trials continue their runs and none is created twice.

Failures: at the engine's start the server must answer (the experiment and parent run are looked up there), else
the job fails before any trial with a message naming the server (:meth:`MLflowTracking.start`): tracking was asked
for, and the Airflow side's preflight passed, so the cluster cannot reach the server or is refused by it, a setup
error every later run would repeat. Once the experiment runs, a failing MLflow call never fails it: it is counted,
its error kept, and logged as a warning in the job log at most every :data:`WARN_EVERY_S` seconds; the count and the
last error reach ``progress.json`` and the result manifest, and so the task log.

MLflow's calls run on one thread of their own, in order, so a slow or dead server does not stall Tune's driver loop.
The cluster authenticates with its own environment (``MLFLOW_TRACKING_TOKEN``, ...), never with the spec.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ray import tune

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine.imports import EngineError
from airflow_tune.engine.log_lines import emit
from airflow_tune.engine.mlflow_tags import TAG_EXPERIMENT, TAG_PARENT, TAG_ROLE, TAG_TRIAL, foreign_parent, parent_tags
from airflow_tune.engine.mlflow_values import (
    METRICS_PER_BATCH,
    PARAMS_PER_BATCH,
    metrics_of,
    params_of,
    quoted,
)

#: One failing call may not hold the driver for MLflow's defaults (120 s timeout, 7 retries with backoff): these are
#: set in the driver's own environment unless the cluster sets them.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
#: A warning in the job log at most this often while calls keep failing.
WARN_EVERY_S = 30.0
#: How long the end of the experiment waits for the calls still queued.
FLUSH_TIMEOUT_S = 120.0


class MLflowTracking(tune.Callback):
    """Logs each trial as an MLflow run under the experiment's parent run; never fails the experiment once started.

    :param spec: the experiment's spec; its ``mlflow`` is set.
    :param client_factory: builds the ``MlflowClient`` from the tracking URI (tests give another).
    :param out: where job-log lines go.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        client_factory: Callable[[str], Any] | None = None,
        out: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert spec.mlflow is not None
        self.spec = spec
        self.settings = spec.mlflow
        self.tracking_uri: str = spec.mlflow["tracking_uri"]
        self.client_factory = client_factory
        self.out = out or sys.stdout
        self.clock = clock
        self.client: Any = None
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.best_run_id: str | None = None
        self.runs: dict[str, str] = {}  # trial id -> run id
        self._statuses: dict[str, str] = {}  # run id -> status as last set or found
        self._created: set[str] = set()  # trials whose run creation is queued (driver thread)
        self.errors = 0
        self.last_error: str | None = None
        self._last_warning = -math.inf
        self._lock = threading.Lock()
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Tune pickles the RunConfig's callbacks into tuner.pkl; the client, thread and lock do not pickle, and a
        # restore replaces the callbacks anyway (engine/build.py): an unstarted tracker stands in.
        return (type(self), (self.spec,))

    # -- start (in the driver, before any trial) ------------------------------------------------------------------
    def start(self) -> None:
        """Find or create the MLflow experiment and the parent run, and the runs of trials an earlier driver logged.

        :raises EngineError: naming the server, when it does not answer or refuses; naming the parent run and its
            owner, when another owner's run holds the experiment's name: no trial has run yet.
        """
        for name, value in CLIENT_ENV.items():
            os.environ.setdefault(name, value)
        try:
            self.client = self._new_client()
            self.experiment_id = self._experiment_id()
            self.parent_run_id = self._parent_run()
            self._load_trial_runs()
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(
                f"the MLflow tracking server {self.tracking_uri} (the spec's mlflow.tracking_uri) cannot be used from "
                f"the cluster: {type(exc).__name__}: {_brief(exc)}. The Airflow side reached it, so check "
                "the cluster's network path to it and its credentials in the cluster's environment "
                "(MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD); no trial has run"
            ) from exc
        self._worker = threading.Thread(target=self._work, name="airflow-tune-mlflow", daemon=True)
        self._worker.start()
        self._say(
            f"MLflow tracking: experiment {self.settings['experiment_name']!r} ({self.experiment_id}), parent run "
            f"{self.parent_run_id}, {len(self.runs)} trial run(s) found at {self.tracking_uri}"
        )

    def _new_client(self) -> Any:
        if self.client_factory is not None:
            return self.client_factory(self.tracking_uri)
        try:
            from mlflow import MlflowClient
        except ImportError:
            raise EngineError(
                "the spec's mlflow tracking needs the MLflow client on the cluster: add mlflow-skinny to the cluster "
                "image (or to the operator's pip=[...])"
            ) from None
        return MlflowClient(tracking_uri=self.tracking_uri)

    def _experiment_id(self) -> str:
        name = self.settings["experiment_name"]
        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                return str(self.client.create_experiment(name))
            except Exception:  # another driver created it at the same moment
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        if getattr(found, "lifecycle_stage", "active") != "active":
            raise EngineError(
                f"the MLflow experiment {name!r} on {self.tracking_uri} is deleted: restore it in MLflow, or track "
                "into another experiment_name"
            )
        return str(found.experiment_id)

    def _search(self, filter_string: str) -> list[Any]:
        runs: list[Any] = []
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id], filter_string=filter_string, max_results=1000, page_token=token
            )
            runs.extend(page)
            token = getattr(page, "token", None)
            if not token:
                return runs

    def _parent_run(self) -> str:
        found = self._search(f"tags.`{TAG_EXPERIMENT}` = {quoted(self.spec.name)} and tags.`{TAG_ROLE}` = 'parent'")
        if found:
            # The first, should two drivers have raced: the experiment's name is its first writer's, as its storage is.
            run = min(found, key=lambda r: (r.info.start_time or 0, str(r.info.run_id)))
            refusal = foreign_parent(run, self.spec)
            if refusal:
                raise EngineError(refusal)
            if run.info.status != "RUNNING":
                self.client.update_run(run.info.run_id, status="RUNNING")
            return str(run.info.run_id)
        run = self.client.create_run(self.experiment_id, run_name=self.spec.name, tags=parent_tags(self.spec))
        return str(run.info.run_id)

    def _load_trial_runs(self) -> None:
        for run in self._search(f"tags.`{TAG_PARENT}` = {quoted(str(self.parent_run_id))}"):
            trial_id = run.data.tags.get(TAG_TRIAL)
            if trial_id and trial_id not in self.runs:
                self.runs[trial_id] = run.info.run_id
                self._statuses[run.info.run_id] = run.info.status

    # -- Tune hooks (driver loop: only queue work) ----------------------------------------------------------------
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._open(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self._open(trial)
        step = result.get("training_iteration")
        metrics = metrics_of(result)
        if metrics:
            stamp = int(time.time() * 1000)
            self._submit(lambda: self._log_metrics(trial.trial_id, metrics, int(step or 0), stamp))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._open(trial)
        self._submit(lambda: self._end(trial.trial_id, "FINISHED"))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._open(trial)
        self._submit(lambda: self._end(trial.trial_id, "FAILED"))

    def _open(self, trial: Any) -> None:
        """Queue finding or creating the trial's run (once per trial and driver); reopen a run an earlier driver
        ended KILLED when the trial runs again."""
        if trial.trial_id in self._created:
            return
        self._created.add(trial.trial_id)
        config = dict(getattr(trial, "config", None) or {})
        self._submit(lambda: self._ensure_run(trial.trial_id, config))

    # -- the end (driver, after fit) ------------------------------------------------------------------------------
    def finish(
        self, *, unfinished: list[str], interrupted: bool, manifest: Mapping[str, Any] | None, failed: bool
    ) -> None:
        """End the runs of trials Tune stopped (KILLED) and the parent run (with the best trial's metric and run id
        when there is a result), then wait for every queued call.

        :param unfinished: ids of trials Tune stopped without ending them (a stop signal, a time budget).
        :param interrupted: the driver was stopped; a rerun continues these runs (they are reopened).
        :param manifest: the result manifest, or None when interrupted.
        :param failed: the experiment failed.
        """
        for trial_id in unfinished:
            if trial_id in self._created:
                self._submit(lambda trial_id=trial_id: self._end(trial_id, "KILLED"))  # type: ignore[misc]
        best_trial = (manifest or {}).get("best_trial_id")
        best_metrics = (manifest or {}).get("best_metrics") or {}
        self._submit(lambda: self._end_parent(best_trial, best_metrics, interrupted, failed))
        self.flush()

    def abandon(self) -> None:
        """The driver failed with an exception: the parent run ends FAILED, as far as the server lets it."""
        self._submit(lambda: self._end_parent(None, {}, False, True))
        self.flush()

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Wait until the queued calls are done (at most ``timeout``; those left are counted as errors)."""
        if self._worker is None:
            return
        self._queue.put(None)
        self._worker.join(timeout)
        if self._worker.is_alive():
            left = self._queue.qsize()
            self._failed(f"{left} MLflow call(s) still queued after {timeout:.0f}s", count=max(left, 1))
        self._worker = None
        if self.errors:
            self._say(
                f"MLflow tracking: {self.errors} call(s) failed, the last: {self.last_error}; the experiment went on "
                "(its runs in MLflow may miss what those calls carried)"
            )

    # -- facts for the manifests ------------------------------------------------------------------------------
    def summary(self, trial_ids: list[str] | None = None) -> dict[str, Any]:
        """``{tracking_uri, ui_url, experiment_name, experiment_id, parent_run_id, best_run_id, runs, errors,
        last_error}``; ``runs`` only of ``trial_ids`` when given (to keep a file bounded)."""
        with self._lock:
            runs = dict(self.runs)
            errors, last_error = self.errors, self.last_error
        if trial_ids is not None:
            runs = {t: runs[t] for t in trial_ids if t in runs}
        return {
            "tracking_uri": self.tracking_uri,
            "ui_url": self.settings.get("ui_url"),
            "experiment_name": self.settings["experiment_name"],
            "experiment_id": self.experiment_id,
            "parent_run_id": self.parent_run_id,
            "best_run_id": self.best_run_id,
            "runs": runs,
            "errors": errors,
            "last_error": last_error,
        }

    # -- the worker thread ----------------------------------------------------------------------------------------
    def _submit(self, call: Callable[[], Any]) -> None:
        if self._worker is not None:
            self._queue.put(call)

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            try:
                call()
            except Exception as exc:  # tracking never fails the experiment once it runs
                self._failed(f"{type(exc).__name__}: {_brief(exc)}")

    def _ensure_run(self, trial_id: str, config: dict[str, Any]) -> str:
        with self._lock:
            run_id = self.runs.get(trial_id)
        if run_id is not None:
            if self._statuses.get(run_id) not in (None, "RUNNING"):
                self.client.update_run(run_id, status="RUNNING")  # a rerun continues the trial in its run
                self._statuses[run_id] = "RUNNING"
            return run_id
        found = self._search(
            f"tags.`{TAG_PARENT}` = {quoted(str(self.parent_run_id))} and tags.`{TAG_TRIAL}` = {quoted(trial_id)}"
        )
        if found:
            run_id = str(found[0].info.run_id)
        else:
            tags = {
                **self.settings.get("tags", {}),
                TAG_PARENT: str(self.parent_run_id),
                TAG_EXPERIMENT: self.spec.name,
                TAG_ROLE: "trial",
                TAG_TRIAL: trial_id,
            }
            run = self.client.create_run(self.experiment_id, run_name=trial_id, tags=tags)
            run_id = str(run.info.run_id)
            self._log_params(run_id, params_of(config))
        with self._lock:
            self.runs[trial_id] = run_id
        self._statuses[run_id] = "RUNNING"
        return run_id

    def _run_id(self, trial_id: str) -> str:
        with self._lock:
            run_id = self.runs.get(trial_id)
        # A creation that failed earlier (the server was down) is tried again here, without the config.
        return run_id if run_id is not None else self._ensure_run(trial_id, {})

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[i : i + PARAMS_PER_BATCH])

    def _log_metrics(self, trial_id: str, metrics: dict[str, float], step: int, stamp: int) -> None:
        from mlflow.entities import Metric

        run_id = self._run_id(trial_id)
        items = [Metric(k, v, stamp, step) for k, v in metrics.items()]
        for i in range(0, len(items), METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=items[i : i + METRICS_PER_BATCH])

    def _end(self, trial_id: str, status: str) -> None:
        run_id = self._run_id(trial_id)
        self.client.set_terminated(run_id, status=status)
        self._statuses[run_id] = status

    def _end_parent(self, best_trial: Any, best_metrics: Mapping[str, Any], interrupted: bool, failed: bool) -> None:
        parent = str(self.parent_run_id)
        with self._lock:
            best_run = self.runs.get(str(best_trial)) if best_trial else None
        if best_trial:
            self.client.set_tag(parent, "airflow_tune.best_trial_id", str(best_trial))
        if best_run:
            self.best_run_id = best_run
            self.client.set_tag(parent, "airflow_tune.best_run_id", best_run)
        value = best_metrics.get(self.spec.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            self.client.log_metric(parent, f"best_{self.spec.metric}", float(value))
        status = "KILLED" if interrupted else "FAILED" if failed else "FINISHED"
        self.client.set_terminated(parent, status=status)

    # -- errors and the log ---------------------------------------------------------------------------------------
    def _failed(self, text: str, count: int = 1) -> None:
        with self._lock:
            self.errors += count
            self.last_error = text[:500]
            errors = self.errors
        now = self.clock()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            self._say(
                f"WARNING MLflow tracking: a call to {self.tracking_uri} failed ({errors} so far): {text[:500]}; the "
                "experiment goes on"
            )

    def _say(self, line: str) -> None:
        emit(line, self.out)


def _brief(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
