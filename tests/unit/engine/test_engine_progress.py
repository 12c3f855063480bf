"""progress.py, pure logic: bounded snapshots, rate limiting with a fake clock, interrupted-run detection."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import progress, result_manifest


def _spec(**fields) -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "/tmp/aft-x", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, "progress_interval_s": 10, **fields})


def _trial(i: int, status: str = "TERMINATED", loss: float | None = None) -> SimpleNamespace:
    result = {"training_iteration": 3, "loss": loss if loss is not None else float(i)}
    config = {"lr": 0.001 * i, "layers": [64, 64, 32], "name": f"model-{i}", "notes": "x" * 100}
    return SimpleNamespace(trial_id=f"t_{i:05d}", status=status, last_result=result, config=config)


def test_snapshot_of_5000_trials_stays_small():
    statuses = ["TERMINATED", "RUNNING", "PENDING", "ERROR"]
    trials = [_trial(i, statuses[i % 4], loss=(i * 7919) % 5000 / 10) for i in range(5000)]
    snap = progress.progress_snapshot(_spec(), trials)
    text = json.dumps(snap)
    assert len(text.encode()) < 64 * 1024
    assert snap["num_trials"] == 5000
    assert snap["counts"] == {"TERMINATED": 1250, "RUNNING": 1250, "PENDING": 1250, "ERROR": 1250}
    assert len(snap["top"]) == progress.TOP_TRIALS and len(snap["running"]) == progress.MAX_RUNNING_LISTED
    assert snap["best"]["value"] == 0.0 and snap["best"]["trial_id"] == "t_00000"
    assert [t["value"] for t in snap["top"]] == sorted(t["value"] for t in snap["top"])


def test_snapshot_best_follows_mode_and_skips_missing_or_nan_metrics():
    trials = [_trial(1, loss=5.0), _trial(2, loss=9.0), _trial(3), _trial(4)]
    trials[2].last_result = {"training_iteration": 1}
    trials[3].last_result["loss"] = float("nan")
    assert progress.progress_snapshot(_spec(mode="max"), trials)["best"]["trial_id"] == "t_00002"
    assert progress.progress_snapshot(_spec(mode="min"), trials)["best"]["trial_id"] == "t_00001"
    assert progress.progress_snapshot(_spec(), [])["best"] is None


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _callback(clock: _Clock) -> tuple[progress.ProgressCallback, list]:
    out = io.StringIO()
    cb = progress.ProgressCallback(_spec(), out=out, clock=clock)
    written: list = []
    cb.write_progress = lambda trials, snap=None: written.append(len(trials))  # type: ignore[method-assign]
    return cb, written


def test_callback_rate_limits_every_output_and_writes_once_more_at_the_end():
    clock = _Clock()
    cb, written = _callback(clock)
    trials = [_trial(i, "RUNNING") for i in range(3)]
    cb.on_trial_result(0, trials, trials[0], {})
    assert len(written) == 1  # the first result writes at once
    for _ in range(100):
        clock.now += 0.05  # 5 s of results, 20 per second
        cb.on_trial_result(0, trials, trials[0], {})
    assert len(written) == 1
    clock.now += 5.1
    cb.on_trial_result(0, trials, trials[0], {})
    assert len(written) == 2
    # Trial ends are rate-limited too: a write per end made tracking quadratic in the number of trials.
    cb.on_trial_complete(0, trials, trials[1])
    cb.on_trial_error(0, trials, trials[2])
    assert len(written) == 2
    tables = cb.out.getvalue().count("3 trials:")
    assert tables == 2  # printed at most once per interval
    cb.on_experiment_end(trials)
    assert len(written) == 3 and cb.out.getvalue().count("3 trials:") == 3


def test_progress_line_is_machine_readable():
    cb, _ = _callback(_Clock())
    trials = [_trial(1, "RUNNING", loss=2.0)]
    cb.on_trial_result(0, trials, trials[0], {})
    line = [ln for ln in cb.out.getvalue().splitlines() if ln.startswith("[airflow-tune] progress ")][0]
    data = json.loads(line[len("[airflow-tune] progress ") :])
    best = {"trial_id": "t_00001", "value": 2.0, "config": trials[0].config}
    assert data == {"counts": {"RUNNING": 1}, "metric": "loss", "mode": "min", "best": best}


def test_unfinished_trials_tells_an_interrupted_run_from_a_finished_one():
    cb, _ = _callback(_Clock())
    # A restored run: t0 had finished before; t1 ends now; t2 was running when Tune was interrupted, and Tune's
    # cleanup marked it TERMINATED without telling callbacks; t3 never started.
    trials = [_trial(0), _trial(1, "RUNNING"), _trial(2, "RUNNING"), _trial(3, "PENDING")]
    cb.on_step_begin(0, trials)
    trials[1].status = "TERMINATED"
    cb.on_trial_complete(1, trials, trials[1])
    trials[2].status = "TERMINATED"
    cb.on_experiment_end(trials)
    assert cb.unfinished_trials() == ["t_00002", "t_00003"]
    trials[2].status = "ERROR"
    cb.on_trial_error(2, trials, trials[2])
    trials[3].status = "TERMINATED"
    cb.on_trial_complete(2, trials, trials[3])
    assert cb.unfinished_trials() == []


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (
            {"loss": 1.0, "config": {"a": 1}, "pid": 5, "nan": float("nan"), "s": "ok", "d": {"x": 1}},
            {"loss": 1.0, "nan": "NaN", "s": "ok"},
        ),
        (None, {}),
    ],
)
def test_jsonable_metrics(metrics, expected):
    assert progress.jsonable_metrics(metrics) == expected


def test_engine_never_imports_airflow():
    """The engine runs on a plain Ray cluster: importing it (and the modules it uses) must not import airflow."""
    code = (
        "import sys\n"
        "import airflow_tune.engine.__main__, airflow_tune.engine.build, airflow_tune.engine.progress\n"
        "import airflow_tune.common.storage, airflow_tune.checkpoints, airflow_tune.common.spec\n"
        "import airflow_tune.common.jsonsafe\n"
        "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "print('AIRFLOW_MODULES', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "AIRFLOW_MODULES []" in out.stdout, out.stdout + out.stderr


RAY_TASK_ERROR = """Failure # 1 (occurred at 2026-12-02_23-10-01)
ray::ImplicitFunc.train() (pid=4242, ip=127.0.0.1, actor_id=abc, repr=train)
  File "/ray/tune/trainable/trainable.py", line 331, in train
    raise skipped from exception_cause(skipped)
  File "/ray/tune/trainable/function_trainable.py", line 45, in _trainable_func
    output = fn()
             ^^^^
  File "/tmp/ray/session/runtime_resources/tune_testkit/airflow_cases.py", line 57, in boom
    raise RuntimeError(f"boom: bad x={config['x']}")
RuntimeError: boom: bad x=1
"""


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        (RAY_TASK_ERROR, "RuntimeError: boom: bad x=1"),
        (RAY_TASK_ERROR + "\n\n", "RuntimeError: boom: bad x=1"),
        (RAY_TASK_ERROR.replace("RuntimeError: boom: bad x=1\n", "ValueError:\n"), "ValueError:"),
        ("Traceback (most recent call last):\n  File 'x', line 1\n    output = fn()\nKeyError: 'lr'", "KeyError: 'lr'"),
        ("ray.exceptions.RayActorError: The actor died unexpectedly", "ray.exceptions.RayActorError: The actor died"),
        ("just words", "just words"),
        ("", "unknown error"),
    ],
)
def test_error_summary_is_the_exception_not_a_code_line(text, summary):
    assert progress.error_summary(text).startswith(summary)


def test_two_thousand_trials_make_a_bounded_result_and_a_full_trials_file():
    spec = _spec()
    rows = [
        {
            "trial_id": f"t_{i:05d}",
            "status": "ERROR" if i % 50 == 0 else "TERMINATED",
            "config": {"x": i, "name": "a fairly long config value " * 3},
            "metrics": {"loss": float(i % 997), "training_iteration": 10, "time_total_s": 1.5},
            "error": "ValueError: boom" if i % 50 == 0 else None,
            "error_summary": "ValueError: boom" if i % 50 == 0 else None,
            "path": f"s3://bkt/exp/trial_{i}",
        }
        for i in range(2000)
    ]
    manifest = {"experiment": "e", "num_trials": 2000, "trials": rows}
    result = result_manifest.bounded_result(spec, manifest)
    assert result["trials_listed"] == len(result["trials"]) == 40
    best = [r for r in result["trials"] if r["error"] is None]
    assert [r["metrics"]["loss"] for r in best[:3]] == [0.0, 0.0, 1.0]  # the best first, by the spec's mode (min)
    assert result["trials_uri"].endswith("/.airflow_tune/trials.json")
    full, bounded = len(json.dumps(manifest)), len(json.dumps(result))
    print(f"2,000 trials: trials.json {full / 1024:.0f} KB, result.json {bounded / 1024:.1f} KB")
    assert bounded < 32 * 1024 < full
