"""RayTuneSensor: wait for a Ray Tune experiment submitted earlier (``RayTuneOperator(wait_for_completion=False)``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_tune.common.contract import (
    METADATA_EXPERIMENT_URI,
    PROGRESS_FILE,
    RESULT_FILE,
    TERMINAL_STATUSES,
    describe_owner,
    manifest_uri,
    owner_differs,
    result_succeeded,
    xcom_mlflow,
    xcom_result,
)
from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.links.ray import RayJobLink
from airflow_tune.trust import proofs
from airflow_tune.trust.submitted import SubmittedJobs
from airflow_tune.utils import reconcile
from airflow_tune.utils.version_compat import AirflowSensorTimeout
from airflow_tune.utils.waiting import best_reaches

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayTuneSensor(BaseSensorOperator):
    """Wait until a Ray Tune experiment finishes (or its best metric reaches a target) and return its result.

    Give ``job_id`` to follow a Ray job, or only ``experiment_uri`` to wait for the experiment's result in storage
    (whoever runs it). Returns the same XCom result as :class:`~airflow_tune.operators.tune.RayTuneOperator`; when
    the target is reached first, the result is the best trial so far, with ``"finished": false``.

    :param job_id: the Ray job's submission id, e.g. ``"{{ ti.xcom_pull('submit')['job_id'] }}"``.
    :param experiment_uri: the experiment's URI, e.g. ``"{{ ti.xcom_pull('submit')['experiment_uri'] }}"``.
    :param target: succeed early once the best value of ``metric`` reaches this.
    :param target_mode: ``min`` (reach ``target`` or below) or ``max`` (``target`` or above); default: the
        experiment's mode.
    :param ray_conn_id: the ``ray`` connection.
    :param deferrable: wait in the triggerer.
    """

    template_fields: Sequence[str] = ("job_id", "experiment_uri", "target")
    operator_extra_links = (RayJobLink(),)

    def __init__(
        self,
        *,
        job_id: str | None = None,
        experiment_uri: str | None = None,
        target: float | str | None = None,
        target_mode: str | None = None,
        ray_conn_id: str = RayHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_id = job_id
        self.experiment_uri = experiment_uri
        self.target = target
        self.target_mode = target_mode
        self.ray_conn_id = ray_conn_id
        self.deferrable = deferrable

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    def _validate(self) -> None:
        if not self.job_id and not self.experiment_uri:
            raise ValueError("RayTuneSensor needs job_id or experiment_uri; pass the submitting task's XCom values")
        if self.target is not None:
            try:
                self.target = float(self.target)
            except (TypeError, ValueError):
                raise ValueError(f"target = {self.target!r}: not a number; give the metric value to wait for") from None
            if not self.experiment_uri:
                raise ValueError("target needs experiment_uri, where the experiment's progress.json is read")
        if self.target_mode not in (None, "min", "max"):
            raise ValueError(f"target_mode = {self.target_mode!r}: say 'min' or 'max'")

    def execute(self, context: Context) -> Any:
        self._validate()
        if self.job_id:
            RayJobLink.persist(context, job_url=self.hook.job_url(self.job_id))
        if self.deferrable and not self.job_id:
            self.log.warning(
                "deferrable=True needs job_id (the trigger follows a Ray job); with only experiment_uri this sensor "
                "pokes storage from a worker every %ss",
                self.poke_interval,
            )
        if self.deferrable and self.job_id:
            if (early := self.poke(context)) and isinstance(early, PokeReturnValue) and early.is_done:
                return early.xcom_value
            from airflow_tune.triggers.tune import RayTuneTrigger

            timeout = timedelta(seconds=float(self.timeout))
            self.defer(
                trigger=RayTuneTrigger(
                    job_id=self.job_id,
                    ray_conn_id=self.ray_conn_id,
                    poll_interval=float(self.poke_interval),
                    experiment_uri=self.experiment_uri,
                    target=self.target,  # type: ignore[arg-type]
                    mode=self.target_mode,
                    # The sensor waits for someone else's job: at its timeout it gives up, it does not stop the job.
                    deadline=time.time() + timeout.total_seconds(),
                    stop_at_deadline=False,
                ),
                method_name="execute_complete",
                timeout=timeout,
            )
        return super().execute(context)

    def poke(self, context: Context) -> PokeReturnValue | bool:
        from airflow_tune.common import storage

        if self.job_id:
            status = str(self.hook.get_job_info(self.job_id).get("status"))
            if status in ("FAILED", "STOPPED"):
                raise RayJobError(self._failure(status))
            if status == "SUCCEEDED":
                return PokeReturnValue(is_done=True, xcom_value=self._result(context))
        elif self.experiment_uri:
            result = storage.read_json_or_none(manifest_uri(self.experiment_uri, RESULT_FILE))
            if result is not None and not result_succeeded(result):
                raise RayJobError(
                    f"experiment {self.experiment_uri} failed: {result.get('num_errored')} trials errored"
                )
            if result is not None:
                return PokeReturnValue(is_done=True, xcom_value=self._result(context))
        if self.target is not None and self.experiment_uri:
            # progress.json is the cheap hint, read every poke; the job's log decides (storage writers can forge it).
            progress = storage.read_json_or_none(manifest_uri(self.experiment_uri, PROGRESS_FILE))
            if best_reaches(progress, self.target, self.target_mode):  # type: ignore[arg-type]
                proven = self._proven_progress(context)
                if best_reaches(proven, self.target, self.target_mode):  # type: ignore[arg-type]
                    return PokeReturnValue(is_done=True, xcom_value=self._early(proven or {}))
                self.log.warning(
                    "%s says the target is reached, but the Ray job's log does not: not believed; waiting",
                    manifest_uri(self.experiment_uri, PROGRESS_FILE),
                )
        return False

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:

        status = event.get("status")
        if status == "SUCCEEDED":
            return self._result(context)
        if status == "TARGET_REACHED":
            proven = self._proven_progress(context)
            if not best_reaches(proven, self.target, self.target_mode):  # type: ignore[arg-type]
                raise RayJobError(
                    f"the trigger saw experiment {self.experiment_uri} reach target {self.target}, but its Ray job's "
                    "log does not say so now: nothing believed; retry the task"
                )
            return self._early(proven or {})
        if status == "timeout":
            raise AirflowSensorTimeout(
                f"RayTuneSensor timed out after {self.timeout}s waiting for Ray job {self.job_id} (the job goes on)"
            )
        if status in TERMINAL_STATUSES:
            raise RayJobError(self._failure(str(status), event.get("message")))
        raise RayJobError(f"lost track of Ray job {self.job_id}: {event.get('message')}")

    def _proven_progress(self, context: Context) -> dict[str, Any] | None:
        return proofs.proven_progress(
            self.hook,
            str(self.experiment_uri),
            self.job_id,
            reader=self._reader(),
            submitted=SubmittedJobs(context, self.log),
        )

    def _result(self, context: Context) -> dict[str, Any]:
        """The experiment's proven result, its job one Airflow recorded the tune task submitting."""
        uri = self.experiment_uri or self._experiment_uri_of_job()
        submitted = SubmittedJobs(context, self.log)
        return self._shape(
            reconcile.read_result(self.hook, uri, self.job_id, submitted=submitted, reader=self._reader())
        )

    def _experiment_uri_of_job(self) -> str:
        info = self.hook.get_job_info(str(self.job_id))
        uri = (info.get("metadata") or {}).get(METADATA_EXPERIMENT_URI)
        if not uri:
            raise ValueError(f"Ray job {self.job_id} was not started by RayTuneOperator; pass experiment_uri")
        return str(uri)

    def _reader(self) -> dict[str, Any] | None:
        return {"dag_id": self.dag_id} if self.has_dag() else None

    def _check_reader(self, manifest: Any) -> None:
        """The sensor reads experiments of its own DAG only (a templated experiment_uri is data): refuse another's."""
        reader = self._reader()
        theirs = manifest.get("owner") if isinstance(manifest, dict) else None
        if owner_differs(theirs, reader, same_dag_only=True):
            raise RayJobError(
                f"experiment {self.experiment_uri or self.job_id} belongs to {describe_owner(theirs)}: a sensor reads "
                f"only the experiments of its own DAG ({self.dag_id!r})"
            )

    def _shape(self, result: dict[str, Any]) -> dict[str, Any]:
        self._check_reader(result)
        job_id = result.get("job_id") or self.job_id
        out = xcom_result(result, self.job_id, self.hook.job_url(job_id) if job_id else None)
        out["finished"] = True
        return out

    def _early(self, progress: dict[str, Any]) -> dict[str, Any]:
        self._check_reader(progress)
        best = progress.get("best") or {}
        counts = progress.get("counts") or {}
        return {
            "experiment": progress.get("experiment"),
            "experiment_uri": self.experiment_uri,
            "job_id": self.job_id or progress.get("job_id"),
            "metric": progress.get("metric"),
            "mode": progress.get("mode"),
            "best_trial_id": best.get("trial_id"),
            "best_config": best.get("config"),
            "best_metrics": {progress.get("metric"): best.get("value")},
            "best_checkpoint_uri": None,
            "best_checkpoint_digest": None,
            "num_trials": progress.get("num_trials"),
            "num_terminated": counts.get("TERMINATED", 0),
            "num_errored": counts.get("ERROR", 0),
            "dashboard_url": self.hook.job_url(self.job_id) if self.job_id else None,
            "finished_at": None,
            "mlflow": xcom_mlflow(progress.get("mlflow")),
            "objectives": progress.get("objectives") or [{k: progress.get(k) for k in ("metric", "mode")}],
            "pareto_front": None,  # computed when the experiment ends
            "pareto_front_size": None,
            "finished": False,
        }

    def _failure(self, status: str, message: str | None = None) -> str:
        return reconcile.job_failure(self.hook, str(self.job_id), status, message)
