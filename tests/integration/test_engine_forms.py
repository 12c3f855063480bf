"""The engine runs each Function API form of a trainable as a real Ray job and writes the right result manifest.

Every test submits ``python -m airflow_tune.engine`` through the Jobs API of the local Ray head, with S3 storage on the
local endpoint, and checks the manifest's best trial against what the objective makes best.
"""

from __future__ import annotations

import pytest

from airflow_tune.common import storage
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)


def assert_best(manifest: dict, metric: str, mode: str) -> dict:
    """The manifest's best trial is the one with the best last value of ``metric``; return that trial."""
    scored = [t for t in manifest["trials"] if metric in t["metrics"]]
    assert scored, manifest
    pick = min if mode == "min" else max
    expected = pick(scored, key=lambda t: t["metrics"][metric])
    assert manifest["best_trial_id"] == expected["trial_id"]
    assert manifest["best_config"] == expected["config"]
    assert manifest["best_metrics"][metric] == expected["metrics"][metric]
    assert manifest["num_terminated"] == manifest["num_trials"] == len(manifest["trials"])
    assert manifest["num_errored"] == 0
    return expected


def assert_no_checkpoints(stack, manifest: dict) -> None:
    assert manifest["best_checkpoint_uri"] is None
    files = storage.list_files(manifest["experiment_uri"])
    assert files, "the experiment wrote nothing to S3"
    assert not [f for f in files if "/checkpoint_" in f]


def test_reports_every_step(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("every-step"),
        "tune_testkit.functions:quadratic",
        param_space={"x": {"grid_search": [1, 3, 4]}, "steps": 4, "marker_dir": str(tmp_path)},
    )
    logs, manifest = jobs.run_ok(stack, spec)
    best = assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    assert manifest["best_metrics"]["loss"] == pytest.approx(0.25)  # (3-3)^2 + 1/4 at the last of 4 steps
    assert all(t["metrics"]["training_iteration"] == 4 for t in manifest["trials"])
    assert best["metrics"]["step"] == 3
    assert len(read_markers(str(tmp_path), "start")) == 3
    assert_no_checkpoints(stack, manifest)
    assert "[airflow-tune] started experiment" in logs
    # The live progress file was written beside the experiment and shows the finished state.
    progress = storage.read_json(f"{manifest['experiment_uri']}/.airflow_tune/progress.json")
    assert progress["counts"] == {"TERMINATED": 3}
    assert progress["best"]["config"]["x"] == 3


def test_reports_only_at_end(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("at-end"),
        "tune_testkit.functions:report_at_end",
        metric="score",
        mode="max",
        param_space={"x": {"grid_search": [0, 2, 5]}, "marker_dir": str(tmp_path)},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "score", "max")
    assert manifest["best_config"]["x"] == 2
    assert manifest["best_metrics"]["score"] == 0
    assert all(t["metrics"]["training_iteration"] == 1 for t in manifest["trials"])
    assert_no_checkpoints(stack, manifest)


def test_returns_a_dict(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("ret-dict"),
        "tune_testkit.functions:return_dict",
        metric="score",
        mode="max",
        param_space={"x": {"grid_search": [1, 2, 4]}, "marker_dir": str(tmp_path)},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "score", "max")
    assert manifest["best_config"]["x"] == 2
    assert manifest["best_metrics"]["extra"] == 1  # the returned dict's other keys are kept as metrics
    assert_no_checkpoints(stack, manifest)


def test_returns_a_number_reports_metric_underscore_metric(stack, tmp_path):
    """Tune 2.60 reports a returned number as the metric ``_metric`` (ray.tune.result.DEFAULT_METRIC)."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("ret-num"),
        "tune_testkit.functions:return_number",
        metric="_metric",
        mode="min",
        param_space={"x": {"grid_search": [-1, 1, 2]}, "marker_dir": str(tmp_path)},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "_metric", "min")
    assert manifest["best_config"]["x"] == 1
    assert manifest["best_metrics"]["_metric"] == 0.0
    assert sorted(t["metrics"]["_metric"] for t in manifest["trials"]) == [0.0, 1.0, 4.0]


def test_returns_a_number_with_another_metric_name_fails_clearly(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("ret-num-bad"),
        "tune_testkit.functions:return_number",
        metric="loss",
        param_space={"x": {"grid_search": [1, 2]}, "marker_dir": str(tmp_path)},
    )
    job_id = jobs.submit(stack, spec)
    assert jobs.wait(stack, job_id, 120) == "FAILED"
    assert jobs.exit_code(stack, job_id) == 2
    text = jobs.logs(stack, job_id)
    assert "has no metric 'loss'" in text and "set the spec's metric to '_metric'" in text, text[-3000:]


def test_grid_search_runs_every_combination_once(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("grid"),
        "tune_testkit.functions:quadratic",
        param_space={
            "x": {"grid_search": [2, 3]},
            "steps": {"grid_search": [1, 3]},
            "marker_dir": str(tmp_path),
        },
        num_samples=1,
    )
    _, manifest = jobs.run_ok(stack, spec)
    combos = sorted((t["config"]["x"], t["config"]["steps"]) for t in manifest["trials"])
    assert combos == [(2, 1), (2, 3), (3, 1), (3, 3)]
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"] == {"x": 3, "steps": 3, "marker_dir": str(tmp_path)}
    assert manifest["best_metrics"]["loss"] == pytest.approx(1 / 3)
    assert len(read_markers(str(tmp_path), "start")) == 4


def test_trainable_kwargs_reach_the_trainable_through_with_parameters(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("kwargs"),
        "tune_testkit.functions:with_kwargs",
        param_space={"x": {"grid_search": [0.0, 2.0, 5.0]}, "marker_dir": str(tmp_path)},
        trainable_kwargs={"offset": 2.0, "data": [1, 2, 3]},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 2.0
    assert manifest["best_metrics"]["loss"] == 3.0  # |2 - offset| + len(data)
    starts = read_markers(str(tmp_path), "start")
    assert len(starts) == 3 and all(m["offset"] == 2.0 and m["data"] == [1, 2, 3] for m in starts)
    # The kwargs travel as Tune object-store parameters, never as part of the trial config.
    assert all("offset" not in t["config"] for t in manifest["trials"])


def test_stop_criteria_and_callbacks_as_data(stack, tmp_path):
    """The list form of ``stop`` as Tune runs it: a ``below`` threshold stops the good trial, Tune's plateau stopper
    (the spec's metric by default) the bad one, combined with a maximum; a custom callback named by import path runs
    in the driver with its JSON arguments, and Tune's CSV logger named alone is the only logger (auto loggers off)."""
    evidence_uri = f"{stack.storage_uri}/evidence-{jobs.unique_name('cb')}.json"
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("stoppers"),
        "tune_testkit.functions:quadratic",
        # loss = (x - 3)^2 + 1 / (step + 1): x=3 falls 1, 0.5, 0.33, 0.25 (<= 0.3 at the 4th result); x=0 stays near
        # 9 and its last 4 values have a std < 0.2 from the 5th result on (at the 4th it is 0.29).
        param_space={"x": {"grid_search": [3, 0]}, "steps": 30, "marker_dir": str(tmp_path)},
        stop=[
            {"metric": "loss", "below": 0.3},
            {"name": "trial_plateau", "args": {"std": 0.2, "num_results": 4, "grace_period": 4}},
            {"name": "maximum_iteration", "args": {"max_iter": 20}},
        ],
        callbacks=["csv", {"factory": "tune_testkit.callbacks:Evidence", "args": {"uri": evidence_uri, "tag": "t"}}],
    )
    _, manifest = jobs.run_ok(stack, spec, env={"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"})
    iters = {t["config"]["x"]: t["metrics"]["training_iteration"] for t in manifest["trials"]}
    assert iters == {3: 4, 0: 5}, iters
    best = assert_best(manifest, "loss", "min")
    assert best["config"]["x"] == 3 and best["metrics"]["loss"] == pytest.approx(0.25)
    assert len(read_markers(str(tmp_path), "end")) == 0  # no trial ran its 30 steps
    evidence = storage.read_json(evidence_uri)
    assert evidence["tag"] == "t" and evidence["set_up"] is True
    assert sorted((c["x"], c["training_iteration"]) for c in evidence["completed"]) == [(0, 5), (3, 4)]
    files = storage.list_files(manifest["experiment_uri"])
    for trial in manifest["trials"]:
        names = {f.rsplit("/", 1)[-1] for f in files if f.startswith(trial["path"].rstrip("/") + "/")}
        assert "progress.csv" in names and "result.json" not in names, (trial["trial_id"], names)


def test_an_experiment_plateau_ends_the_experiment_as_tune_does(stack, tmp_path):
    """Tune's ExperimentPlateauStopper ends the whole experiment: the first trial's 4th result makes the two best
    losses so far 0.25 and 0.33 (std 0.04 <= 0.05), whichever trial it is; one trial at a time, so the other one never
    runs. The run ends as plain Tune's does: a result, not an interruption."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("exp-plateau"),
        "tune_testkit.functions:quadratic",
        param_space={"x": {"grid_search": [3, 10]}, "steps": 30, "marker_dir": str(tmp_path)},
        max_concurrent_trials=1,
        stop=[{"name": "experiment_plateau", "args": {"std": 0.05, "top": 2}}],
    )
    logs, manifest = jobs.run_ok(stack, spec)
    ran = [t for t in manifest["trials"] if t["metrics"]]
    assert [t["metrics"]["training_iteration"] for t in ran] == [4], manifest["trials"]
    assert len(read_markers(str(tmp_path), "start")) == 1
    assert "interrupted" not in logs
