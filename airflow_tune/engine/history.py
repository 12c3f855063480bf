"""Metric curves for the Experiment view: a Tune callback that writes ``history.json`` beside the experiment.

The file (:data:`airflow_tune.common.contract.HISTORY_FILE`) holds, for a bounded set of trials, the metric against
``training_iteration``: the best ``max_trials`` trials by the experiment's metric and mode, plus the running ones
(at most ``max_trials`` of them, the best first). Each curve keeps at most ``max_points`` points: when a curve
reaches the limit, neighbouring points are merged pairwise (the later point of each pair stays, so every point is
a value the trial really reported) and from then on only every other result is kept; the newest point is always
there. So the file's size does not grow with the number of trials or iterations.

The callback runs in the driver's loop: a result costs an append (and, now and then, one pass over one curve); the
trials it follows are kept in memory only while they can still be shown. The file is rewritten at most every
``spec.progress_interval_s`` seconds and once at the experiment's end, as strict JSON.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from ray import tune

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.contract import HISTORY_FILE, manifest_uri
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine.log_lines import emit

#: Curves written: the best ``MAX_TRIALS`` trials, plus at most ``MAX_TRIALS`` running ones.
MAX_TRIALS = 10
#: Points per curve.
MAX_POINTS = 200
#: Curves of unfinished trials kept in memory (paused ones too, e.g. by HyperBand); beyond it the worst are dropped.
MAX_LIVE = 100
ENDED = ("TERMINATED", "ERROR")


def _number(value: Any) -> float | None:
    """A reported metric as a float (NaN and infinities too); None for anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:  # numpy scalars
            return float(value) if type(value).__module__ == "numpy" else None
        except (TypeError, ValueError):
            return None
    return float(value)


class Curve:
    """One trial's downsampled curve: at most ``max_points`` points ``[iteration, value]``, the newest always kept.

    Results are kept at a stride (1, then 2, 4, ...): when the kept points fill the limit, every other one is dropped
    (neighbours merge into the later one) and the stride doubles. A result reported for an iteration at or before the
    last one (the trial restarted from a checkpoint, or PBT exploited another trial) cuts the curve back first.
    """

    __slots__ = ("trial_id", "status", "config", "trial", "kept", "latest", "stride", "count", "value")

    def __init__(self, trial_id: str, status: str, config: Any, trial: Any = None) -> None:
        self.trial_id = trial_id
        self.status = status
        self.config = config
        self.trial = trial
        self.kept: list[list[float]] = []
        self.latest: list[float] | None = None  # the newest point when it is not in ``kept``
        self.stride = 1
        self.count = 0  # results taken since the stride was last reset
        self.value: float | None = None  # the last reported value (ranks the trial)

    def add(self, iteration: float, value: float, max_points: int) -> None:
        last = self.latest or (self.kept[-1] if self.kept else None)
        if last is not None and iteration <= last[0]:
            self.kept = [p for p in self.kept if p[0] < iteration]
            self.latest = None
            self.count = len(self.kept) * self.stride
        point = [iteration, value]
        # ``count`` is the index of this result; the kept ones are those at multiples of the stride.
        if self.count % self.stride == 0:
            self.kept.append(point)
            self.latest = None
            if len(self.kept) >= max_points:  # merge neighbours: keep the later of each pair
                self.kept = self.kept[::2]
                self.stride *= 2
                if self.kept[-1] is not point:
                    self.latest = point
        else:
            self.latest = point
        self.count += 1
        self.value = value

    def points(self) -> list[list[float]]:
        return [*self.kept, self.latest] if self.latest is not None else list(self.kept)

    def load(self, points: Iterable[Any], max_points: int) -> None:
        """Seed from a curve written by an earlier run of the same experiment (a restore)."""
        for point in points:
            if isinstance(point, (list, tuple)) and len(point) == 2:
                x, y = _number(point[0]), _number(_decode(point[1]))
                if x is not None and y is not None:
                    self.add(x, y, max_points)


def _decode(value: Any) -> Any:
    """The float a strict-JSON file holds as "NaN", "Infinity" or "-Infinity"; other values as they are."""
    return {jsonsafe.NAN: math.nan, jsonsafe.POS_INF: math.inf, jsonsafe.NEG_INF: -math.inf}.get(value, value)


class HistoryCallback(tune.Callback):
    """Keeps downsampled metric curves of the best and the running trials; writes ``history.json``, rate-limited.

    :param spec: the experiment (metric, mode, where it lives, how often to write).
    :param max_trials: best trials written, and at most as many running ones besides.
    :param max_points: points per curve.
    :param clock: seconds, monotonic (tests pass a fake one).
    :param write: how to write the file (``storage.write_json``; tests pass their own).
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        max_trials: int = MAX_TRIALS,
        max_points: int = MAX_POINTS,
        max_live: int = MAX_LIVE,
        clock: Callable[[], float] = time.monotonic,
        write: Callable[[str, Any], None] = storage.write_json,
        out: Any = None,
    ) -> None:
        if max_points < 2:
            raise ValueError("max_points must be at least 2")
        self.metric, self.mode, self.owner = spec.metric, spec.mode, spec.owner
        self.uri = manifest_uri(spec.experiment_uri, HISTORY_FILE)
        self.interval = spec.progress_interval_s
        self.max_trials, self.max_points, self.max_live = max_trials, max_points, max_live
        self.clock, self.write, self.out = clock, write, out
        self.curves: dict[str, Curve] = {}
        self._last_write = -math.inf
        self.writes = 0

    # -- ranking ------------------------------------------------------------------------------------------------
    def _rank(self, curve: Curve) -> tuple[int, float]:
        """Sort key, best first: finite values by the mode, then NaN and missing values."""
        value = curve.value
        if value is None or math.isnan(value):
            return (1, 0.0)
        return (0, value if self.mode == "min" else -value)

    def _status(self, curve: Curve) -> str:
        trial = curve.trial
        status = str(getattr(trial, "status", "") or "") if trial is not None else ""
        return status or curve.status

    # -- Tune hooks -----------------------------------------------------------------------------------------
    def setup(self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any) -> None:
        """A restored experiment keeps the curves its earlier runs wrote."""
        try:
            previous = storage.read_json_or_none(self.uri)
        except Exception:  # best effort: a missing or unreadable file starts the history afresh
            previous = None
        trials = (previous or {}).get("trials") if isinstance(previous, dict) else None
        if not isinstance(trials, dict):
            return
        for trial_id, entry in trials.items():
            if not isinstance(entry, dict):
                continue
            status = str(entry.get("status") or "PENDING")
            # A trial that had not ended is resumed by the restore: it is pending until Tune starts it again.
            curve = Curve(str(trial_id), status if status in ENDED else "PENDING", entry.get("config"))
            curve.load(entry.get("points") or [], self.max_points)
            self.curves[curve.trial_id] = curve

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._curve(trial).status = "RUNNING"
        self._tick()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        curve = self._curve(trial)
        curve.status = "RUNNING"
        value = _number(result.get(self.metric))
        if value is not None:
            x = _number(result.get("training_iteration"))
            curve.add(x if x is not None else float(curve.count + 1), value, self.max_points)
        self._tick()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trial, "TERMINATED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trial, "ERROR")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._tick(force=True)

    # -- bookkeeping ----------------------------------------------------------------------------------------
    def _curve(self, trial: Any) -> Curve:
        trial_id = str(trial.trial_id)
        curve = self.curves.get(trial_id)
        if curve is None:
            curve = Curve(trial_id, "PENDING", jsonsafe.strict(getattr(trial, "config", None) or {}), trial)
            self.curves[trial_id] = curve
            self._evict_live()
        elif curve.trial is None:
            curve.trial = trial  # seeded from an earlier run's file
        return curve

    def _ended(self, trial: Any, status: str) -> None:
        curve = self._curve(trial)
        curve.status = status
        curve.trial = None  # its status is final: hold no reference to Tune's object
        self._evict_ended()
        self._tick()

    def _evict_ended(self) -> None:
        """Keep the curves of the best ``max_trials`` ended trials only: an ended trial's value is final, so one
        outside the best now can come back only if a running trial falls behind it, which the view can live with."""
        ended = [c for c in self.curves.values() if self._status(c) in ENDED]
        if len(ended) > self.max_trials:
            ended.sort(key=self._rank)
            for curve in ended[self.max_trials :]:
                del self.curves[curve.trial_id]

    def _evict_live(self) -> None:
        live = [c for c in self.curves.values() if self._status(c) not in ENDED]
        if len(live) > self.max_live:

            def drop_first(curve: Curve) -> tuple[bool, int, float]:
                flag, value = self._rank(curve)  # paused and pending ones go before running ones, then the worst
                return (self._status(curve) == "RUNNING", -flag, -value)

            live.sort(key=drop_first)
            for curve in live[: len(live) - self.max_live]:
                del self.curves[curve.trial_id]

    # -- the file ------------------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """What ``history.json`` holds now: the best ``max_trials`` curves plus at most ``max_trials`` running ones."""
        ranked = sorted(self.curves.values(), key=self._rank)
        shown = ranked[: self.max_trials]
        chosen = {c.trial_id for c in shown}
        running = [c for c in ranked if c.trial_id not in chosen and self._status(c) == "RUNNING"]
        shown += running[: self.max_trials]
        return {
            "owner": self.owner,
            "metric": self.metric,
            "mode": self.mode,
            "updated_at": time.time(),
            "max_trials": self.max_trials,
            "max_points": self.max_points,
            "trials": {
                c.trial_id: {"status": self._status(c), "config": c.config, "points": c.points()} for c in shown
            },
        }

    def _tick(self, *, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_write < self.interval:
            return
        self._last_write = now
        try:
            self.write(self.uri, self.snapshot())
            self.writes += 1
        except Exception as exc:  # the history is best effort; the experiment must not fail on it
            emit(f"could not write {self.uri}: {exc}", self.out)
