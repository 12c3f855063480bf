"""RayTuneTrigger: wait in the triggerer for a Ray Tune job, logging its trial progress, without blocking the loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_tune.common.contract import PROGRESS_FILE, manifest_uri
from airflow_tune.common.provenance import logged_progress
from airflow_tune.exceptions import RayJobNotFoundError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.utils.following import ProgressFollower
from airflow_tune.utils.version_compat import AIRFLOW_V_3_3_PLUS
from airflow_tune.utils.waiting import JobWait, best_reaches


class RayTuneTrigger(BaseTrigger):
    """Fire one event when a Ray Tune job ends, its deadline passes, a target metric is reached, or the dashboard
    stays unreachable for too long.

    Status comes from one shared ``GET /api/jobs/`` every 0.5 s for all triggers watching the same cluster, and a
    trigger wakes only when its job's status changes; the experiment's ``progress.json`` (in storage, not the
    dashboard) is turned into task-log lines at most every ``log_interval``, printed only when they change.

    :param job_id: the Ray job's submission id.
    :param ray_conn_id: the ``ray`` connection.
    :param poll_interval: seconds between checks of ``target``, and between retries while the dashboard is
        unreachable.
    :param deadline: a UNIX time after which the job is stopped (SIGINT, state saved) and a ``timeout`` event fires;
        how the operator's ``execution_timeout`` is honoured while deferred.
    :param max_unreachable_s: how long the dashboard may stay unreachable before an ``error`` event fires.
    :param log_progress: print the experiment's progress into the task log (needs ``experiment_uri``).
    :param log_interval: read ``progress.json`` at most this often (and once more at the end).
    :param experiment_uri: the experiment's URI, passed on in the event (and where ``progress.json`` is read for
        ``target``).
    :param target: fire ``TARGET_REACHED`` once the experiment's best value reaches this (by ``mode``).
    :param mode: ``min`` or ``max`` for ``target``; by default the experiment's mode.
    :param pending_timeout_s: stop the job and fire ``pending_timeout`` when it is still PENDING this long after its
        submission.
    :param stop_at_deadline: stop the job at the deadline (the operator's own job); False for a sensor, which only
        stops waiting.

    A task marked failed or cleared while deferred stops its job (SIGINT, state saved). Airflow 3.3 calls
    :meth:`on_kill` for that, and only for that. Airflow 3.1 and 3.2 only cancel :meth:`run`, as they do when the
    triggerer stops or hands the trigger to another triggerer; there, as the google and databricks providers do
    (``safe_to_cancel``), the trigger asks the Task SDK for its task instance's state on ``CancelledError`` and
    stops the job only when the task is no longer deferred. When that answer cannot be had (the API server is
    unreachable), the job is left running; a deferral timeout would read as a kill there (the operator sets none:
    its ``deadline`` is the trigger's own). On every version, a task killed while no triggerer runs its trigger
    leaves the job running.
    """

    def __init__(
        self,
        *,
        job_id: str,
        ray_conn_id: str = RayHook.default_conn_name,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        max_unreachable_s: float = 120.0,
        log_progress: bool = True,
        log_interval: float = 10.0,
        experiment_uri: str | None = None,
        target: float | None = None,
        mode: str | None = None,
        pending_timeout_s: float | None = None,
        stop_at_deadline: bool = True,
    ) -> None:
        super().__init__()
        self.job_id = job_id
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.max_unreachable_s = max_unreachable_s
        self.log_progress = log_progress
        self.log_interval = log_interval
        self.experiment_uri = experiment_uri
        self.target = target
        self.mode = mode
        self.pending_timeout_s = pending_timeout_s
        self.stop_at_deadline = stop_at_deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "ray_conn_id": self.ray_conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "max_unreachable_s": self.max_unreachable_s,
                "log_progress": self.log_progress,
                "log_interval": self.log_interval,
                "experiment_uri": self.experiment_uri,
                "target": self.target,
                "mode": self.mode,
                "pending_timeout_s": self.pending_timeout_s,
                "stop_at_deadline": self.stop_at_deadline,
            },
        )

    def _hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        follower = ProgressFollower(self.experiment_uri) if self.log_progress and self.experiment_uri else None
        try:
            # One HTTP session for the whole wait; the job's status comes from its dashboard's one shared poll.
            async with hook.async_session(), hook.watch_job(self.job_id) as watch:
                async for event in self._follow(hook, watch, follower):
                    yield event
                    return
        except asyncio.CancelledError:
            if not AIRFLOW_V_3_3_PLUS:  # 3.3 calls on_kill for a user's action, and for nothing else
                await _uninterrupted(self._stop_if_killed())
            raise

    async def _follow(
        self, hook: RayHook, watch: Any, follower: ProgressFollower | None
    ) -> AsyncIterator[TriggerEvent]:
        wait = JobWait(
            self.job_id,
            max_unreachable_s=self.max_unreachable_s,
            pending_timeout_s=self.pending_timeout_s,
            log_interval=self.log_interval if follower is not None else None,
            deadline=self.deadline,
            stop_at_deadline=self.stop_at_deadline,
            target=self.target,
        )
        while True:
            step = wait.before_poll()
            if step.end is None:
                try:
                    info = await watch.status()
                    if info is None:  # submitted after the shared list was fetched: ask for it alone
                        info = await self._job_alone(hook)
                except Exception as exc:
                    self.log.warning("Ray dashboard unreachable for %.0fs: %s", wait.unreachable_for(), exc)
                    step = wait.unreachable(exc)
                    if step.end is None:
                        await asyncio.sleep(self.poll_interval)
                        continue
                else:
                    step = wait.answered(info)
            if step.log_progress and follower is not None:
                await self._log_progress(follower)
            if step.stop_job:
                await self._stop(hook)
            if step.end is not None:
                yield self._event(step.end, step.message)
                return
            if step.check_target and await self._target_reached(hook):
                yield self._event("TARGET_REACHED")
                return
            await watch.changed(timeout=wait.next_check_in(self.poll_interval, on_change=True))

    async def _job_alone(self, hook: RayHook) -> dict[str, Any] | None:
        try:
            return await hook.async_get_job_info(self.job_id)
        except RayJobNotFoundError:
            return None

    def _event(self, status: str, message: str | None = None) -> TriggerEvent:
        return TriggerEvent(
            {"status": status, "job_id": self.job_id, "experiment_uri": self.experiment_uri, "message": message}
        )

    async def _log_progress(self, follower: ProgressFollower) -> None:
        try:
            lines = await asyncio.to_thread(follower.poll)
        except Exception as exc:  # progress is best effort
            self.log.debug("Could not read the experiment's progress: %s", exc)
            return
        for line in lines:
            self.log.info("%s", line)

    async def _target_reached(self, hook: RayHook) -> bool:
        """``progress.json`` is the cheap hint read every check; the job's log decides (storage can be forged)."""
        if not self.experiment_uri:
            return False
        progress = await asyncio.to_thread(_read_progress, self.experiment_uri)
        if not best_reaches(progress, self.target, self.mode):
            return False
        if best_reaches(logged_progress(await hook.async_get_job_logs(self.job_id)), self.target, self.mode):
            return True
        self.log.warning("progress.json says the target is reached, but Ray job %s's log does not", self.job_id)
        return False

    async def _stop(self, hook: RayHook) -> None:
        try:
            # The connection is read here, on the loop: from a plain thread the Task SDK's sync lookup opens a loop
            # of its own, and its message then interleaves with the trigger runner's (before 3.3 the triggerer
            # stops its runner: "Response read out of order").
            await hook.aget_endpoint()
            await asyncio.to_thread(hook.stop_job, self.job_id)
        except Exception as exc:
            self.log.warning("Could not stop Ray job %s: %s", self.job_id, exc)

    async def on_kill(self) -> None:
        """The task was marked failed or cleared while deferred: stop the job so Tune saves its state."""
        self.log.info("Task killed while deferred: stopping Ray job %s with SIGINT", self.job_id)
        await self._stop(self._hook())

    async def _stop_if_killed(self) -> None:
        """Before Airflow 3.3: stop the job when the cancelled trigger's task is no longer deferred (see above)."""
        try:
            state = await self._task_state()
        except Exception as exc:
            self.log.warning(
                "Trigger cancelled; the task's state is unknown (%r): leaving job %s running", exc, self.job_id
            )
            return
        if state == "deferred":
            self.log.info("Trigger cancelled while its task is still deferred: leaving Ray job %s running", self.job_id)
            return
        self.log.info("Task is %s while deferred: stopping Ray job %s with SIGINT", state, self.job_id)
        await self._stop(self._hook())

    async def _task_state(self) -> str | None:
        """This trigger's task instance's state, from the Task SDK (the triggerer's link to the API server)."""
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        ti = getattr(self, "task_instance", None)
        if ti is None:
            raise LookupError("the trigger runs for no task instance")
        # Asked on this loop, under the trigger runner's own lock (``asend``): the sync path (get_task_states through
        # sync_to_async) can interleave with the runner's own messages and 3.1 then stops its trigger runner
        # ("Response read out of order"). Never abandoned with a timeout, for the same reason.
        response = await task_runner.SUPERVISOR_COMMS.asend(
            GetTaskStates(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index)
        )
        if not isinstance(response, TaskStatesResult):
            raise LookupError(f"the supervisor answered {type(response).__name__}")
        states = response.task_states
        key = ti.task_id if ti.map_index is None or ti.map_index < 0 else f"{ti.task_id}_{ti.map_index}"
        return states[ti.run_id][key]


#: The after-cancel work still running (strong references: the loop keeps only weak ones to its tasks).
_AFTER_CANCEL: set[asyncio.Future[None]] = set()


async def _uninterrupted(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end even if the caller is cancelled again.

    3.1 and 3.2 cancel a removed trigger again at every triggerer loop until it ends: a second cancel must interrupt
    neither the state lookup (a question abandoned mid-way breaks the trigger runner's link to its supervisor) nor
    the stop.
    """
    task = asyncio.ensure_future(work)
    _AFTER_CANCEL.add(task)
    task.add_done_callback(_AFTER_CANCEL.discard)
    await asyncio.shield(task)


def _read_progress(experiment_uri: str) -> dict[str, Any] | None:
    from airflow_tune.common import storage

    return storage.read_json_or_none(manifest_uri(experiment_uri, PROGRESS_FILE))
