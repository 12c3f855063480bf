"""Live trial tracking (a Tune callback); the result manifests built from it are :mod:`.result_manifest`'s.

The callback runs in Tune's driver loop, so a trial's result costs it a clock read: the trial table is printed and
``progress.json`` rewritten at most every ``interval`` seconds, and once more at the experiment's end, never per
trial. Each of those ticks builds a bounded snapshot (counts, the running trials, the top trials) in O(n log k) for n
trials, so an experiment's tracking costs O(n) per interval, not O(n) per trial ended (quadratic). The result is two
files: ``result.json``, bounded (the XCom contract, counts, the top and the errored trials), which the Airflow side
reads, and ``trials.json`` with every trial's row.
"""

from __future__ import annotations

import heapq
import math
import re
import sys
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ray import tune

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.contract import PROGRESS_FILE, manifest_uri
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.common.spec.objectives import objectives_of
from airflow_tune.engine import compat
from airflow_tune.engine.log_lines import emit

TOP_TRIALS = 10
MAX_RUNNING_LISTED = 20
TABLE_ROWS = 12
#: The Ray node a trial's last result came from. Tune reports only ``node_ip`` and ``hostname``, which nodes may
#: share; the callback adds the node id of the trial's actor to its results (:func:`.compat.add_to_result`), so it
#: lives in the trial's last result, the experiment state (it survives a restore) and the manifest.
NODE_ID = "node_id"


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, str, int, float)) or value is None


def jsonable_metrics(result: dict[str, Any] | None, limit: int = 40) -> dict[str, Any]:
    """The scalar metrics of a result, without Tune's bookkeeping that says nothing about the model; non-finite
    numbers as the strings "NaN", "Infinity" and "-Infinity"."""
    if not result:
        return {}
    skip = {"config", "hostname", "node_ip", NODE_ID, "pid", "date", "timestamp", "experiment_tag", "trial_log_path"}
    out: dict[str, Any] = {}
    for key, value in result.items():
        if key in skip or not _scalar(value):
            continue
        if isinstance(value, str) and len(value) > 200:
            continue
        # A diverged metric is kept, written as "NaN"/"Infinity"/"-Infinity" (strict JSON).
        out[key] = jsonsafe.encode_float(value) if isinstance(value, float) else value
        if len(out) >= limit:
            break
    return out


def jsonable(value: Any) -> Any:
    """A strict-JSON copy of a config or metrics: domains and objects become their repr, NaN and infinities the
    strings "NaN", "Infinity" and "-Infinity" (see :mod:`airflow_tune.common.jsonsafe`)."""
    return jsonsafe.strict(value)


class ProgressCallback(tune.Callback):
    """Prints a trial table to the job log and writes ``progress.json`` beside the experiment, both rate-limited."""

    def __init__(
        self, spec: ExperimentSpec, *, out: Any = None, clock: Any = time.monotonic, tracking: Any = None
    ) -> None:
        self.spec = spec
        # MLflow tracking (engine/mlflow_tracking.py), whose summary (error count, the listed trials' runs) goes
        # into progress.json: the task log reports MLflow's errors from there, the Experiment view links the runs.
        self.tracking = tracking
        self.out = out or sys.stdout
        self.clock = clock
        self.interval = spec.progress_interval_s
        self.progress_uri = manifest_uri(spec.experiment_uri, PROGRESS_FILE)
        self._last_print = -math.inf
        self._last_write = -math.inf
        self._trials: list[Any] = []
        # Trials that ended in this run (Tune told us) or had ended before it (a restored experiment). When a run is
        # interrupted, Tune 2.60 marks the trials still running TERMINATED in memory (its cleanup stops them) without
        # on_trial_complete, so a trial's status alone cannot tell an interrupted run from a finished one.
        self._ended: set[str] = set()
        self._ended_before: set[str] | None = None
        # Node ids of trial actors, looked up once per actor in a thread of their own: a state-API call in Tune's
        # driver loop would slow every trial start.
        self._actor_nodes: dict[str, Future[str | None]] = {}
        self._trial_nodes: dict[str, str] = {}  # the node id last seen in each trial's results
        self._lookups: ThreadPoolExecutor | None = None

    # -- Tune hooks -------------------------------------------------------------------------------------------
    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self._ended_before is None:
            self._ended_before = {t.trial_id for t in trials if t.status in ("TERMINATED", "ERROR")}
        self._trials = trials

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._tick(trials)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        node_id = self._node_id_of(trial)
        if node_id:
            self._trial_nodes[trial.trial_id] = node_id
            compat.add_to_result(trial, result, NODE_ID, node_id)
        self._tick(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended.add(trial.trial_id)
        self._stamp_node_id(trial)
        self._tick(trials)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended.add(trial.trial_id)
        self._stamp_node_id(trial)
        self._emit(f"trial {trial.trial_id} errored: {self.error_line(trial)}")
        self._tick(trials)

    def error_line(self, trial: Any) -> str:
        """``Type: message`` of the trial's exception, and where the full text is kept in storage."""
        summary = error_summary(trial_error_text(trial))
        path = getattr(trial, "path", None)
        where = f" (full text: {storage.with_scheme(self.spec.storage_path, path)}/error.txt)" if path else ""
        return summary + where

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for trial in trials:  # trials Tune stopped (a time budget, fail_fast) got no on_trial_complete
            self._stamp_node_id(trial)
        self._tick(trials, force_write=True, force_print=True)

    def unfinished_trials(self, trials: list | None = None) -> list[str]:
        """Ids of the trials Tune stopped (interrupted, a time budget, fail_fast: :mod:`.outcome`) or never ran."""
        trials = self._trials if trials is None else trials
        ended = self._ended | (self._ended_before or set())
        return [t.trial_id for t in trials if t.trial_id not in ended or t.status not in ("TERMINATED", "ERROR")]

    def _stamp_node_id(self, trial: Any) -> None:
        """The node id in an ended trial's last result, where Ray before 2.60 did not keep what on_trial_result
        added (see :func:`.compat.add_to_result`). By then an errored trial has no actor: the id noted earlier."""
        node_id = self._trial_nodes.get(trial.trial_id)
        if node_id:
            compat.add_to_last_result(trial, NODE_ID, node_id)

    def _node_id_of(self, trial: Any) -> str | None:
        """The node id of the actor running ``trial`` once known (asked once per actor, in the background; a
        restarted trial gets a new actor), else None."""
        key = compat.trial_actor_id(trial)
        if key is None:
            return None
        if key not in self._actor_nodes:
            if self._lookups is None:
                self._lookups = ThreadPoolExecutor(max_workers=1, thread_name_prefix="airflow-tune-node-ids")
            self._actor_nodes[key] = self._lookups.submit(actor_node_id, key)
        lookup = self._actor_nodes[key]
        return lookup.result() if lookup.done() else None

    # -- rate-limited outputs ---------------------------------------------------------------------------------
    def _tick(self, trials: list, *, force_write: bool = False, force_print: bool = False) -> None:
        self._trials = trials
        now = self.clock()
        print_due = force_print or now - self._last_print >= self.interval
        write_due = force_write or now - self._last_write >= self.interval
        if not (print_due or write_due):
            return
        # One snapshot serves both outputs.
        snap = progress_snapshot(self.spec, trials)
        if self.tracking is not None:
            listed = [row["trial_id"] for row in (*snap["top"], *snap["running"])]
            snap["mlflow"] = self.tracking.summary(listed)
        if print_due:
            self._last_print = now
            self._emit_table(trials, snap)
        if write_due:
            self._last_write = now
            self.write_progress(trials, snap)

    def write_progress(self, trials: list, snap: dict[str, Any] | None = None) -> None:
        try:
            storage.write_json(self.progress_uri, snap or progress_snapshot(self.spec, trials))
        except Exception as exc:  # progress is best effort; the experiment must not fail on it
            self._emit(f"could not write {self.progress_uri}: {exc}")

    def _emit(self, line: str) -> None:
        emit(line, self.out)

    def _emit_table(self, trials: list, snap: dict[str, Any]) -> None:
        counts = " ".join(f"{k}={v}" for k, v in sorted(snap["counts"].items()))
        best = snap["best"]
        best_text = f" best {self.spec.metric}={best['value']:.6g} ({best['trial_id']})" if best else ""
        lines = [f"{len(trials)} trials: {counts}{best_text}"]
        lines += format_trial_table(trials, self.spec.metric, self.spec.mode, TABLE_ROWS)
        for line in lines:
            self._emit(line)
        # A machine-readable line too, so a watcher of the log stream needs no storage access.
        self._emit("progress " + jsonsafe.dumps({**{k: snap[k] for k in ("counts", "metric", "mode")}, "best": best}))


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: |:$)")


def error_summary(text: str) -> str:
    """The exception's type and message from a traceback's text: its last ``Type: message`` line, not a code line."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if not line.startswith((" ", "\t")) and _EXCEPTION_LINE.match(line) and not line.startswith("File "):
            return line[:300]
    unindented = [line for line in lines if not line.startswith((" ", "\t"))]
    return (unindented or lines or ["unknown error"])[-1][:300]


def actor_node_id(actor_id: str) -> str | None:
    """The id of the node an actor runs on (Ray's state API), or None when Ray cannot say."""
    try:
        from ray.util.state import get_actor

        state = get_actor(actor_id, timeout=5)
    except Exception:  # the node id is informative; tracking must not fail the experiment
        return None
    return getattr(state, "node_id", None) or None


def trial_error_text(trial: Any) -> str:
    """A trial's error text: the copy Tune just wrote on the driver's node, else the one in storage."""
    local = getattr(trial, "error_file", None)
    if local:
        try:
            with open(local, errors="replace") as fh:
                return fh.read()
        except OSError:
            pass
    path = getattr(trial, "path", None)
    fs = getattr(getattr(trial, "storage", None), "storage_filesystem", None)
    if not path or fs is None:
        return ""
    try:
        with fs.open_input_stream(f"{path}/error.txt") as stream:
            return str(stream.read().decode(errors="replace"))
    except Exception:
        return ""


def _metric_of(trial: Any, metric: str) -> float | None:
    value = (getattr(trial, "last_result", None) or {}).get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def format_trial_table(trials: list, metric: str, mode: str, rows: int) -> list[str]:
    def order(t: Any) -> tuple[int, float]:
        value = _metric_of(t, metric)
        if value is None:
            return (1, 0.0)
        return (0, value if mode == "min" else -value)

    shown = heapq.nsmallest(rows, trials, key=order)
    out = [f"  {'trial':<20} {'status':<11} {'iter':>5} {metric:>12}  config"]
    for t in shown:
        value = _metric_of(t, metric)
        it = (t.last_result or {}).get("training_iteration", "")
        config = jsonsafe.dumps(t.config, sort_keys=True)
        if len(config) > 70:
            config = config[:67] + "..."
        shown_value = f"{value:.6g}" if value is not None else "-"
        out.append(f"  {t.trial_id:<20} {t.status:<11} {it!s:>5} {shown_value:>12}  {config}")
    if len(trials) > rows:
        out.append(f"  ... {len(trials) - rows} more")
    return out


def progress_snapshot(spec: ExperimentSpec, trials: list) -> dict[str, Any]:
    counts = Counter(str(t.status) for t in trials)
    sign = 1.0 if spec.mode == "min" else -1.0
    scored: list[tuple[Any, float]] = []
    for t in trials:
        value = _metric_of(t, spec.metric)
        if value is not None:
            scored.append((t, value))
    best_first = heapq.nsmallest(TOP_TRIALS, scored, key=lambda tv: sign * tv[1])
    top = [_trial_brief(t, spec.metric) for t, _ in best_first]
    running = [_trial_brief(t, spec.metric) for t in trials if t.status == "RUNNING"][:MAX_RUNNING_LISTED]
    best = top[0] if top else None
    return {
        "experiment": spec.name,
        "owner": spec.owner,
        "metric": spec.metric,
        "mode": spec.mode,
        "objectives": objectives_of(spec),  # the best above goes by the first
        "updated_at": time.time(),
        "num_trials": len(trials),
        "counts": dict(counts),
        "best": {"trial_id": best["trial_id"], "value": best["value"], "config": best["config"]} if best else None,
        "top": top,
        "running": running,
    }


def _trial_brief(trial: Any, metric: str) -> dict[str, Any]:
    result = trial.last_result or {}
    return {
        "trial_id": trial.trial_id,
        "status": trial.status,
        "iteration": result.get("training_iteration"),
        "value": _metric_of(trial, metric),
        "config": jsonable(trial.config),
    }
