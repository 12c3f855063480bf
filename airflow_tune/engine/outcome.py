"""How a run of ``Tuner.fit()`` ended: interrupted (a stop signal reached the driver: state saved, a rerun resumes),
or ended by Tune itself (every trial done, the time budget spent, ``fail_fast`` after a trial's error, an
experiment-wide stopper), which ends as plain Tune ends it: a result, failed or not.

Tune stops the live trials in both cases the same way (``_schedule_trial_stop``: TERMINATED, no
``on_trial_complete``), so the trials' statuses cannot tell the two apart; the stop signal is what does.
"""

from __future__ import annotations

import signal
from typing import Any

from ray import tune

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.common.spec.stopping import experiment_stoppers
from airflow_tune.engine import compat


class StopSignals(tune.Callback):
    """Notes the first stop signal (SIGINT, or SIGUSR1 as the engine forwards SIGTERM) that reached Tune's run."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.watched = False

    def setup(self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any) -> None:
        self.watched = compat.watch_stop_signals(self._note)

    def _note(self, signum: int) -> None:
        if self.signal is None:
            self.signal = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else "no signal"


def interrupted(signals: StopSignals, unfinished: list[str]) -> bool:
    """Whether the run was interrupted (exit 130, a rerun resumes) rather than ended by Tune.

    Without the signals watched (an unexpected Ray), trials Tune did not see end mean an interruption, as before:
    a budget's end then resumes instead of finishing, but nothing is ever taken as finished that was not.
    """
    if signals.signal is not None:
        return True
    return bool(unfinished) and not signals.watched


def stop_reason(spec: ExperimentSpec, manifest: dict[str, Any]) -> str:
    """Why Tune stopped trials that were still running or pending when it ended the experiment by itself."""
    if spec.failure.fail_fast and manifest["num_errored"]:
        return "failure.fail_fast after a trial's error"
    ends = [f"time_budget_s={spec.time_budget_s:g} spent"] if spec.time_budget_s is not None else []
    ends += [f"the {name} stopper" for name in experiment_stoppers(spec.stop)]
    return " or ".join(ends) or "a stop criterion of the whole experiment"


def failure_reason(spec: ExperimentSpec, manifest: dict[str, Any]) -> str | None:
    """Why a finished experiment counts as failed (the verdict's text), or None when it succeeded.

    With ``fail_fast``, the first errored trial's own exception comes first, as plain Tune's fit() shows it.
    """
    errored = [t for t in manifest["trials"] if t["error"]]
    if spec.failure.fail_fast and errored:
        first = errored[0]
        where = f"; full text: {first['path']}/error.txt" if first.get("path") else ""
        return (
            f"{first['error_summary']} (trial {first['trial_id']} of experiment {spec.name}; failure.fail_fast=true "
            f"ended the experiment at this error{where})"
        )
    if manifest["num_terminated"] == 0:
        return f"experiment {spec.name} failed: all {manifest['num_errored']} trials errored"
    if manifest["num_errored"] and not spec.failure.tolerate_errored_trials:
        return (
            f"experiment {spec.name} failed: {manifest['num_errored']} trials errored and "
            "failure.tolerate_errored_trials=false"
        )
    if manifest["best_trial_id"] is None:
        return (
            f"experiment {spec.name} failed: no trial reported the metric {spec.metric!r}; check the trainable's "
            "tune.report"
        )
    return None
