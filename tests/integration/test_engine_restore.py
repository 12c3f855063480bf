"""Interrupt and restore, as real Ray jobs: a SIGKILLed driver, a job stopped with SIGINT or SIGTERM, a finished
experiment run again, and a rerun whose search space changed. Marker files count what each trial really ran."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from airflow_tune.common import storage
from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(240)

XS = [0, 1, 2, 3]


def _checkpointing_spec(stack, tmp_path, prefix: str, xs=XS, steps: int = 6, sleep: float = 0.4, **fields) -> dict:
    return jobs.base_spec(
        stack,
        jobs.unique_name(prefix),
        "tune_testkit.functions:checkpointing",
        param_space={
            "x": {"grid_search": xs},
            "steps": steps,
            "best_step": 4,
            "sleep": sleep,
            "marker_dir": str(tmp_path),
        },
        max_concurrent_trials=1,
        **fields,
    )


def _progress_at_interrupt(marker_dir: str) -> tuple[set, dict]:
    """(x of the trials that finished, {x: last step} of the trials that started but did not finish)."""
    markers = read_markers(marker_dir)
    finished = {m["x"] for m in markers if m["event"] == "end"}
    steps: dict = {}
    for m in markers:
        if m["event"] == "step" and m["x"] not in finished:
            steps[m["x"]] = max(steps.get(m["x"], -1), m["step"])
    return finished, steps


def _finished_and_running(marker_dir: str, done: int):
    finished, steps = _progress_at_interrupt(marker_dir)
    return len(finished) >= done and any(step >= 1 for step in steps.values())


def _assert_resumed(manifest: dict, marker_dir: str, finished: set, interrupted: dict, xs=XS, steps=6) -> None:
    """All trials finished once; none that had finished ran again; the interrupted ones resumed from a checkpoint."""
    assert manifest["num_trials"] == len(xs) and manifest["num_terminated"] == len(xs), manifest
    assert sorted(t["config"]["x"] for t in manifest["trials"]) == xs
    assert all(t["metrics"]["training_iteration"] == steps for t in manifest["trials"])
    markers = read_markers(marker_dir)
    for x in xs:
        events = [m["event"] for m in markers if m["x"] == x]
        assert events.count("start") == 1, (x, events)
        assert events.count("end") == 1, (x, events)
        if x in finished:
            assert not [e for e in events if e.startswith("resume")], f"finished trial x={x} ran again: {events}"
    for x, last_step in interrupted.items():
        resumes = [int(m["event"][len("resume") :]) for m in markers if m["x"] == x and m["event"].startswith("resume")]
        assert resumes and all(n > 0 for n in resumes), f"x={x} (at step {last_step}) did not resume: {resumes}"
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    state = jobs.read_checkpoint_state(manifest["best_checkpoint_uri"])
    assert state["x"] == 3 and state["step"] == 4, state  # the best step (4), not the last (5)


def _hold(tmp_path, x: int, step: int) -> dict:
    """Keep trial ``x`` after its ``step`` until the test lets go (by removing the file)."""
    hold = tmp_path / f"hold-x{x}"
    hold.write_text("")
    return {"x": x, "step": step, "file": str(hold)}


def test_sigkilled_driver_then_rerun_restores(stack, tmp_path):
    """What Tune guarantees after a SIGKILL: trials its last experiment snapshot recorded as finished never run
    again, and a trial it recorded running resumes from its last checkpoint. Trial x=2 is held at its step 1 until
    a snapshot has recorded it, so the kill lands at a known point however slow the machine is."""
    hold = _hold(tmp_path, x=2, step=1)
    spec = _checkpointing_spec(stack, tmp_path, "sigkill")
    spec["param_space"]["hold"] = hold
    # Tune snapshots the experiment at most every TUNE_GLOBAL_CHECKPOINT_S (auto: >= 10 s); what happens after the
    # last snapshot is lost when the driver dies. A short period keeps the test short.
    env = {"TUNE_GLOBAL_CHECKPOINT_S": "0.5"}
    job_id = jobs.submit(stack, spec, env=env)
    pid = jobs.driver_pid(stack, job_id)
    jobs.wait_until(lambda: _progress_at_interrupt(str(tmp_path))[1].get(2) == 1, 120, "trial x=2 held at step 1")
    time.sleep(2.0)  # several snapshot periods: the last one records x=0 and x=1 finished, x=2 at its checkpoint 1
    os.kill(pid, signal.SIGKILL)
    assert jobs.wait(stack, job_id, 60) == "FAILED"
    assert jobs.exit_code(stack, job_id) in (-9, 137, None)
    assert storage.read_json_or_none(jobs.result_uri(spec)) is None
    time.sleep(1)  # the killed driver's trial actors go with it
    os.remove(hold["file"])
    finished, interrupted = _progress_at_interrupt(str(tmp_path))
    assert finished == {0, 1} and interrupted == {2: 1}, (finished, interrupted)

    logs, manifest = jobs.run_ok(stack, spec, env=env)
    assert "[airflow-tune] restored experiment" in logs
    _assert_resumed(manifest, str(tmp_path), finished, interrupted)


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGTERM"])
def test_stopped_job_saves_state_and_rerun_resumes(stack, tmp_path, stop_signal):
    """SIGINT reaches Tune directly; SIGTERM (Ray's default stop signal) is forwarded by the engine as SIGUSR1.
    Trial x=2 is held after its step 1, so the stop lands while it runs whatever the machine's speed."""
    xs = [1, 2, 3]
    hold = _hold(tmp_path, x=2, step=1)
    spec = _checkpointing_spec(stack, tmp_path, f"stop-{stop_signal.lower()}", xs=xs, steps=8, sleep=0.2)
    spec["param_space"]["hold"] = hold
    job_id = jobs.submit(stack, spec, env={"RAY_JOB_STOP_SIGNAL": stop_signal})
    jobs.stop_when(stack, job_id, lambda: _progress_at_interrupt(str(tmp_path))[1].get(2) == 1, "trial x=2 at step 1")
    os.remove(hold["file"])
    finished, interrupted = _progress_at_interrupt(str(tmp_path))
    assert finished == {1} and interrupted == {2: 1}, (finished, interrupted)
    logs = jobs.logs(stack, job_id)
    assert "state saved, a rerun resumes" in logs, logs[-4000:]
    assert storage.read_json_or_none(jobs.result_uri(spec)) is None

    logs, manifest = jobs.run_ok(stack, spec)
    assert "[airflow-tune] restored experiment" in logs
    _assert_resumed(manifest, str(tmp_path), finished, interrupted, xs=xs, steps=8)


def test_finished_experiment_rerun_returns_at_once_and_changed_space_is_refused(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("rerun"),
        "tune_testkit.functions:return_dict",
        metric="score",
        mode="max",
        param_space={"x": {"grid_search": [1, 2]}, "marker_dir": str(tmp_path)},
    )
    logs, first = jobs.run_ok(stack, spec, env={"AIRFLOW_TUNE_DEBUG_IMPORTS": "1"})
    assert first["best_config"]["x"] == 2
    assert "[airflow-tune] airflow imported: False" in logs, "the engine must run without importing airflow"
    runs = len(read_markers(str(tmp_path)))
    assert runs == 2

    # At once: the driver returns the stored result without building a Tuner (no trial, no restore).
    logs, again = jobs.run_ok(stack, spec)
    assert "already finished" in logs and "started experiment" not in logs and "restored experiment" not in logs
    assert again == first
    assert len(read_markers(str(tmp_path))) == runs, "no trial ran again"

    changed = {**spec, "param_space": {**spec["param_space"], "x": {"grid_search": [1, 2, 5]}}}
    job_id = jobs.submit(stack, changed)
    assert jobs.wait(stack, job_id, 60) == "FAILED"
    assert jobs.exit_code(stack, job_id) == 2
    text = jobs.logs(stack, job_id)
    assert "already exists in" in text
    assert 'param_space.x: {"grid_search": [1, 2]} -> {"grid_search": [1, 2, 5]}' in text
    assert "give this run another experiment_name" in text
    assert len(read_markers(str(tmp_path))) == runs
    assert storage.read_json(jobs.result_uri(spec)) == first


def test_changed_space_of_an_interrupted_experiment_is_refused(stack, tmp_path):
    spec = _checkpointing_spec(stack, tmp_path, "changed", xs=[1, 3])
    job_id = jobs.submit(stack, spec)
    jobs.stop_when(stack, job_id, lambda: read_markers(str(tmp_path), "step"), "a first step")
    changed = {**spec, "param_space": {**spec["param_space"], "steps": 7}}
    job_id = jobs.submit(stack, changed)
    assert jobs.wait(stack, job_id, 60) == "FAILED"
    assert jobs.exit_code(stack, job_id) == 2
    assert "with another spec (param_space.steps: 6 -> 7)" in jobs.logs(stack, job_id)


def test_a_failed_experiment_is_not_a_result_and_a_rerun_retries_its_errored_trials(stack, tmp_path):
    """All trials erroring fails the job and marks result.json failed; the rerun (an Airflow retry) resumes the
    errored trials instead of handing back the failed manifest."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("fails-once"),
        "tune_testkit.functions:fails_first_run",
        param_space={"x": {"grid_search": [1, 2]}, "marker_dir": str(tmp_path)},
    )
    status, logs, manifest = jobs.run(stack, spec)
    assert status == "FAILED", logs[-2000:]
    assert f"verdict: experiment {spec['name']} failed: all 2 trials errored" in logs
    assert manifest is not None and manifest["status"] == "failed" and manifest["num_errored"] == 2
    assert "transient failure of x=1" in logs

    status, logs, manifest = jobs.run(stack, spec)
    assert status == "SUCCEEDED", logs[-2000:]
    assert "restored experiment" in logs and "already finished" not in logs
    assert manifest is not None and manifest["status"] == "succeeded"
    assert manifest["num_terminated"] == 2 and manifest["num_errored"] == 0
    assert manifest["best_config"]["x"] == 1 and manifest["best_metrics"]["loss"] == 0.0


def test_a_restored_experiment_keeps_its_stoppers_and_runs_the_specs_callbacks(stack, tmp_path):
    """The list form of ``stop`` travels in tuner.pkl (our threshold stopper, combined with Tune's plateau stopper) and
    still stops the resumed trial; the rerun's driver runs the callbacks its spec names (new arguments: a policy, not
    part of the identity), not the first driver's pickled ones. Trial x=3 is held after its step 1, so the stop lands
    while it runs; its loss is 0.1 * |step - 6| + 0.01, at most 0.15 first at step 5 of 8."""
    hold = _hold(tmp_path, x=3, step=1)
    evidence_uri = f"{stack.storage_uri}/evidence-{jobs.unique_name('restore')}.json"
    spec = _checkpointing_spec(
        stack,
        tmp_path,
        "restore-stoppers",
        xs=[3],
        steps=8,
        sleep=0.1,
        stop=[{"metric": "loss", "below": 0.15}, {"name": "trial_plateau", "args": {"std": 0.001}}],
        callbacks=[{"factory": "tune_testkit.callbacks:Evidence", "args": {"uri": evidence_uri, "tag": "first"}}],
    )
    spec["param_space"]["best_step"] = 6
    spec["param_space"]["hold"] = hold
    job_id = jobs.submit(stack, spec)
    jobs.stop_when(stack, job_id, lambda: _progress_at_interrupt(str(tmp_path))[1].get(3) == 1, "x=3 held at step 1")
    os.remove(hold["file"])

    spec["callbacks"][0]["args"]["tag"] = "second"
    logs, manifest = jobs.run_ok(stack, spec)
    assert "[airflow-tune] restored experiment" in logs
    (trial,) = manifest["trials"]
    assert trial["metrics"]["step"] == 5 and trial["metrics"]["loss"] == pytest.approx(0.11), trial["metrics"]
    events = [m["event"] for m in read_markers(str(tmp_path))]
    assert "resume2" in events and "end" not in events, events  # resumed from its checkpoint, stopped at step 5
    evidence = storage.read_json(evidence_uri)
    assert evidence["tag"] == "second", evidence
    assert [round(c["loss"], 2) for c in evidence["completed"]] == [0.11], evidence


def test_the_engine_never_unpickles_tune_state_without_the_submitters_licence(stack, tmp_path):
    """Defence in depth beside the operator's refusal: a job whose entrypoint names no earlier job of the experiment
    (``--restore-after``) finds a tuner.pkl and an experiment state planted in its folder and refuses to restore,
    before Ray or Tune is started; the planted pickle never runs."""
    import pickle

    marker = tmp_path / "unpickled"
    spec = jobs.base_spec(
        stack, jobs.unique_name("planted"), "tune_testkit.functions:return_dict", param_space={"x": 1}
    )
    folder = f"{spec['storage_path']}/{spec['name']}"
    storage.write_bytes(f"{folder}/tuner.pkl", pickle.dumps(_Marker(str(marker))))
    storage.write_bytes(f"{folder}/experiment_state-2004-01-01_00-00-00.json", b'{"trial_data": []}')
    final, logs, result = jobs.run(stack, spec)
    assert final == "FAILED" and result is None, logs[-3000:]
    assert "refusing to unpickle it" in logs and "restored experiment" not in logs, logs[-3000:]
    assert jobs.exit_code(stack, jobs._earlier[spec["name"]]) == 2
    assert not marker.exists()


class _Marker:
    """Unpickling this leaves a file: proof that someone ran ``pickle.loads`` on it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _terminated_in_storage(spec: dict) -> set:
    """The ``x`` of the trials the newest experiment snapshot in storage records as finished (what a restore reads)."""
    experiment = f"{spec['storage_path']}/{spec['name']}"
    snapshots = sorted(
        uri for uri in storage.list_files(experiment) if uri.rsplit("/", 1)[-1].startswith("experiment_state-")
    )
    if not snapshots:
        return set()
    state = json.loads(storage.read_bytes(snapshots[-1]))
    trials = [json.loads(trial_json) for trial_json, _ in state["trial_data"]]
    return {t["config"]["x"] for t in trials if t["status"] == "TERMINATED"}


@pytest.mark.timeout(1800)
def test_a_restore_after_a_driver_kill_at_2000_trials_reruns_no_finished_trial(stack, tmp_path):
    """The engine's faster uploads of the experiment folder keep Tune's guarantee at scale: 2,000 trivial trials one
    at a time, trial x=1000 held at its start until the snapshot in storage records the thousand before it finished;
    the driver is SIGKILLed there, and the rerun runs the other thousand and none of the first."""
    trials, held = 2000, 1000
    hold = _hold(tmp_path, x=held, step=0)
    markers = tmp_path / "markers"
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("restore-2000"),
        "tune_testkit.functions:return_dict",
        metric="score",
        mode="max",
        param_space={"x": {"grid_search": list(range(trials))}, "marker_dir": str(markers), "hold": hold},
        max_concurrent_trials=1,
        reuse_actors=True,
    )
    job_id = jobs.submit(stack, spec)
    pid = jobs.driver_pid(stack, job_id)
    jobs.wait_until(
        lambda: any(m["x"] == held for m in read_markers(str(markers), "start")),
        600,
        f"trial x={held} held at its start",
        interval=1.0,
    )
    finished = jobs.wait_until(
        lambda: (done := _terminated_in_storage(spec)) >= set(range(held)) and done,
        300,
        f"a snapshot in storage recording trials 0-{held - 1} finished",
        interval=1.0,
    )
    os.kill(pid, signal.SIGKILL)
    assert jobs.wait(stack, job_id, 60) == "FAILED"
    time.sleep(1)  # the killed driver's trial actors go with it
    assert finished == set(range(held)), sorted(set(range(trials)) - finished)[:5]
    os.remove(hold["file"])
    before = Counter(m["x"] for m in read_markers(str(markers), "start"))
    assert before[held] == 1 and max(before) == held, max(before)

    logs, manifest = jobs.run_ok(stack, spec, timeout=1200)
    assert "[airflow-tune] restored experiment" in logs
    assert manifest["num_trials"] == manifest["num_terminated"] == trials, manifest["num_trials"]
    starts = Counter(m["x"] for m in read_markers(str(markers), "start"))
    assert set(starts) == set(range(trials))
    rerun = sorted(x for x in finished if starts[x] > 1)
    assert not rerun, f"finished trials ran again after the restore: {rerun[:10]}"
    experiment = f"{spec['storage_path']}/{spec['name']}/"
    results = [
        uri for uri in storage.list_files(experiment) if uri.endswith("/result.json") and "/.airflow_tune/" not in uri
    ]
    assert len(results) == trials, len(results)
