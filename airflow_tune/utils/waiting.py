"""The one decision both waits make at every poll of a Ray job: the blocking wait in the worker
(:func:`airflow_tune.utils.reconcile.wait_for_job`) and the deferred one in the triggerer
(:class:`airflow_tune.triggers.tune.RayTuneTrigger`). Each does its own I/O (blocking, or on the event loop) and
asks :class:`JobWait` what the answer means: keep waiting, read progress, look at the target, stop the job, or end.

Pure logic: no I/O, no Airflow, no Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_tune.common.contract import TERMINAL_STATUSES, pending_too_long

#: How a wait ends without a terminal Ray status (the trigger's event statuses; the blocking wait raises instead).
TIMEOUT, PENDING_TIMEOUT, ERROR = "timeout", "pending_timeout", "error"


@dataclass(frozen=True)
class Step:
    """What one poll decided.

    :param end: the wait ends with this status (a Ray terminal status, :data:`TIMEOUT`, :data:`PENDING_TIMEOUT` or
        :data:`ERROR`), or None to go on.
    :param message: why, for the task's failure.
    :param stop_job: stop the job (with SIGINT: Tune saves its state) before ending.
    :param log_progress: read the experiment's progress into the task log now.
    :param check_target: ask whether the sensor's target is reached (only while the job runs).
    """

    end: str | None = None
    message: str | None = None
    stop_job: bool = False
    log_progress: bool = False
    check_target: bool = False


class JobWait:
    """The state of one wait for a Ray job, and what each poll's answer means.

    :param job_id: the Ray job's submission id.
    :param max_unreachable_s: how long the dashboard may not answer, counted from its last answer (or the start).
    :param pending_timeout_s: stop a job PENDING longer than this (None: never).
    :param log_interval: read progress at most this often while the job runs, and once when it ends; None: never.
    :param deadline: a wall-clock time (``time.time()``) after which the wait gives up; None: none.
    :param stop_at_deadline: stop the job at the deadline (the operator's ``execution_timeout``).
    :param target: the sensor's target; checked at every answer while the job runs.
    """

    def __init__(
        self,
        job_id: str,
        *,
        max_unreachable_s: float,
        pending_timeout_s: float | None,
        log_interval: float | None,
        deadline: float | None = None,
        stop_at_deadline: bool = False,
        target: float | None = None,
        monotonic: Callable[[], float] | None = None,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.job_id = job_id
        self.max_unreachable_s = max_unreachable_s
        self.pending_timeout_s = pending_timeout_s
        self.log_interval = log_interval
        self.deadline = deadline
        self.stop_at_deadline = stop_at_deadline
        self.target = target
        # Looked up at each call, not bound here: tests drive ``time`` itself.
        self._monotonic = monotonic or (lambda: time.monotonic())
        self._wall = wall or (lambda: time.time())
        self._answered_at = self._monotonic()
        self._progress_at = -math.inf

    def before_poll(self) -> Step:
        """Whether the deadline has passed (then the wait ends, stopping the job when told to)."""
        if self.deadline is not None and self._wall() >= self.deadline:
            message = "stopped the job with SIGINT" if self.stop_at_deadline else "gave up"
            return Step(end=TIMEOUT, message=message, stop_job=self.stop_at_deadline)
        return Step()

    def unreachable(self, exc: BaseException) -> Step:
        """The dashboard did not answer: wait on, until it has not answered for ``max_unreachable_s``."""
        waited = self._monotonic() - self._answered_at
        if waited >= self.max_unreachable_s:
            unreachable = f"the Ray dashboard was unreachable for {waited:.0f}s"
            return Step(end=ERROR, message=f"{unreachable} while waiting for job {self.job_id}: {exc}")
        return Step()

    def unreachable_for(self) -> float:
        return self._monotonic() - self._answered_at

    def answered(self, info: Mapping[str, Any] | None) -> Step:
        """The dashboard answered with the job's info (None: it has no such job)."""
        self._answered_at = self._monotonic()
        if info is None:
            return Step(end=ERROR, message="job not found")
        stuck = pending_too_long({**info, "submission_id": self.job_id}, self.pending_timeout_s, self._wall())
        if stuck:
            return Step(end=PENDING_TIMEOUT, message=stuck, stop_job=True)
        status = str(info.get("status"))
        terminal = status in TERMINAL_STATUSES
        log_progress = self.log_interval is not None and (
            terminal or self._monotonic() - self._progress_at >= self.log_interval
        )
        if log_progress:
            self._progress_at = self._monotonic()
        if terminal:
            return Step(end=status, message=info.get("message"), log_progress=log_progress)
        return Step(log_progress=log_progress, check_target=self.target is not None)

    def next_check_in(self, poll_interval: float, *, on_change: bool) -> float:
        """Seconds until the next look. A wait woken by status changes (``on_change``: the trigger's shared poll)
        sleeps until progress, the target, the deadline or a pending job want a look, at most a minute; a plain
        poll looks every ``poll_interval``."""
        if not on_change:
            return poll_interval
        waits = [60.0]
        if self.log_interval is not None:
            waits.append(self._progress_at + self.log_interval - self._monotonic())
        if self.target is not None or self.pending_timeout_s is not None:
            waits.append(poll_interval)
        if self.deadline is not None:
            waits.append(self.deadline - self._wall())
        return max(0.0, min(waits))


def best_reaches(progress: Mapping[str, Any] | None, target: float | None, mode: str | None) -> bool:
    """Whether the best value so far in a progress record reaches ``target`` (at or below for min, above for max)."""
    if not progress or target is None or not progress.get("best"):
        return False
    value = progress["best"].get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return False
    mode = mode or progress.get("mode")
    return value <= target if mode == "min" else value >= target
