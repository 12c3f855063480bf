"""How RayTuneOperator waits for its job: in the worker (a status poll plus ``progress.json`` in the task log) or
deferred to the triggerer, with the task's ``execution_timeout`` as the deadline."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_tune.utils import reconcile

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_tune.common.spec import ExperimentSpec


class JobWaiting:
    """The waiting step of :class:`~airflow_tune.operators.tune.RayTuneOperator` (a mixin: it reads the operator's
    arguments, ``hook`` and ``log``)."""

    # The operator's attributes this step reads.
    ray_conn_id: str
    poll_interval: float
    max_unreachable_s: float
    pending_timeout_s: float | None
    execution_timeout: Any
    hook: Any
    log: Any

    def _trigger(self, context: Context, spec: ExperimentSpec, job_id: str) -> Any:
        from airflow_tune.triggers.tune import RayTuneTrigger

        return RayTuneTrigger(
            job_id=job_id,
            ray_conn_id=self.ray_conn_id,
            poll_interval=self.poll_interval,
            deadline=self._deadline(context),
            experiment_uri=spec.experiment_uri,
            log_interval=spec.progress_interval_s,
            max_unreachable_s=self.max_unreachable_s,
            pending_timeout_s=self.pending_timeout_s,
        )

    def _deadline(self, context: Context) -> float | None:
        if not self.execution_timeout:
            return None
        start = getattr(context["ti"], "start_date", None)
        started = start.timestamp() if start is not None else time.time()
        timeout = self.execution_timeout
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        return started + seconds

    def wait_blocking(self, job_id: str, experiment_uri: str, log_interval: float = 10.0) -> str:
        """Wait in the worker until the job ends (see :func:`~airflow_tune.utils.reconcile.wait_for_job`).

        :param log_interval: read ``progress.json`` at most this often (and once more at the end).
        """
        return reconcile.wait_for_job(
            self.hook,
            job_id,
            experiment_uri,
            poll_interval=self.poll_interval,
            max_unreachable_s=self.max_unreachable_s,
            pending_timeout_s=self.pending_timeout_s,
            log_interval=log_interval,
            log=self.log,
        )
