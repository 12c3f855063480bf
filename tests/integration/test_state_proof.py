"""Tune's saved state is restored only when this experiment's own jobs wrote it, byte for byte (issue 30).

Real Ray jobs on the local stack: an experiment is stopped with its state saved, then files in its own folder are
replaced or added, as anyone who can write that storage prefix could. The submitter's proof
(:func:`airflow_tune.trust.proofs.restore_state_proof`: every state file sealed in the log of one of the experiment's
jobs) refuses them, naming the file; the engine refuses a folder that changed after that proof, before Tune reads
it, so the planted pickle never runs. A legitimate chain of restores (stop, restore, stop, restore) is proven
throughout, the state of each job sealed in its own log."""

from __future__ import annotations

import json
import os
import pickle
import uuid
from types import SimpleNamespace

import pytest

from airflow_tune.common import storage
from airflow_tune.exceptions import ExperimentStorageError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.trust.proofs import restore_state_proof
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(240)


class _Marker:
    """Unpickling this leaves a file: proof that someone ran ``pickle.loads`` on it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _spec(stack, tmp_path, prefix: str) -> dict:
    return jobs.base_spec(
        stack,
        jobs.unique_name(prefix),
        "tune_testkit.functions:checkpointing",
        param_space={
            "x": {"grid_search": [1, 2, 3]},
            "steps": 6,
            "best_step": 4,
            "sleep": 0.2,
            "marker_dir": str(tmp_path),
        },
        max_concurrent_trials=1,
    )


def _holding(spec: dict, tmp_path, *xs: int) -> dict:
    """``spec`` whose trials ``xs`` each wait after their step 1 while a file of theirs exists (see _stopped)."""
    spec["param_space"]["hold"] = [{"x": x, "step": 1, "file": str(tmp_path / f"hold-{x}")} for x in xs]
    for x in xs:
        (tmp_path / f"hold-{x}").write_text("")
    return spec


def _stopped(stack, tmp_path, spec: dict, x: int) -> str:
    """Run ``spec`` until trial ``x`` is held after its step 1, then stop its job (Tune saves its state) and let
    that trial go on in the next job; the job id."""
    hold = tmp_path / f"hold-{x}"
    job_id = jobs.submit(stack, spec)

    def held() -> bool:
        return any(m["x"] == x and m["event"] == "step" and m["step"] >= 1 for m in read_markers(str(tmp_path)))

    jobs.stop_when(stack, job_id, held, f"trial x={x} at step 1")
    os.remove(hold)
    assert "state saved, a rerun resumes" in jobs.logs(stack, job_id)
    return job_id


def _proof(spec: dict, *job_ids: str) -> dict[str, str] | None:
    experiment = SimpleNamespace(experiment_uri=_folder(spec))
    jobs = [{"submission_id": j} for j in job_ids]
    return restore_state_proof(RayHook(), experiment, jobs, job_ids[-1])  # type: ignore[arg-type]


def _folder(spec: dict) -> str:
    return f"{spec['storage_path'].rstrip('/')}/{spec['name']}"


def test_a_pickle_planted_over_tuner_pkl_is_refused_by_the_proof_and_by_the_engine(stack, tmp_path):
    spec = _holding(_spec(stack, tmp_path, "planted-own"), tmp_path, 2)
    first = _stopped(stack, tmp_path, spec, x=2)
    proven = _proof(spec, first)
    assert proven and "tuner.pkl" in proven and any(k.startswith("experiment_state-") for k in proven), proven

    marker = tmp_path / "unpickled"
    storage.write_bytes(f"{_folder(spec)}/tuner.pkl", pickle.dumps(_Marker(str(marker))))
    with pytest.raises(ExperimentStorageError) as refused:
        _proof(spec, first)
    message = str(refused.value)
    assert "tuner.pkl: its bytes" in message and "refusing to restore" in message, message

    # The file changed after the submitter's proof (the proof taken before the planting): the engine reads the folder
    # again just before Tune would, and refuses.
    final, logs, result = jobs.run(stack, spec, restore_state=proven)
    assert final == "FAILED" and result is None, logs[-3000:]
    assert "changed after the submitter proved it (tuner.pkl)" in logs and "restored experiment" not in logs
    assert jobs.exit_code(stack, jobs._earlier[spec["name"]]) == 2
    assert not marker.exists()


def test_a_newer_experiment_state_planted_beside_is_refused_naming_it(stack, tmp_path):
    spec = _holding(_spec(stack, tmp_path, "planted-newer"), tmp_path, 2)
    first = _stopped(stack, tmp_path, spec, x=2)
    planted = "experiment_state-2999-01-01_00-00-00.json"  # the newest by name: the one Tune would restore
    storage.write_bytes(f"{_folder(spec)}/{planted}", b'{"trial_data": [], "runner_data": {}}')
    with pytest.raises(ExperimentStorageError, match=f"{planted}: no job of this experiment wrote a file of that"):
        _proof(spec, first)


def test_a_chain_of_restores_is_proven_by_the_jobs_that_wrote_each_file(stack, tmp_path):
    spec = _holding(_spec(stack, tmp_path, "chain"), tmp_path, 2, 3)
    first = _stopped(stack, tmp_path, spec, x=2)
    second = _stopped(stack, tmp_path, spec, x=3)  # restores the first's state (the harness proves it), then stops
    assert "[airflow-tune] restored experiment" in jobs.logs(stack, second)
    proven = _proof(spec, first, second)
    assert proven is not None
    sessions = sorted(k for k in proven if k.startswith("experiment_state-"))
    assert len(sessions) == 2, proven  # one per job: each sealed in its own job's log
    logs, manifest = jobs.run_ok(stack, spec)
    assert "[airflow-tune] restored experiment" in logs
    assert manifest["num_terminated"] == 3 and manifest["best_config"]["x"] == 3, manifest


def _newest(spec: dict, prefix: str) -> str:
    """The newest state file of ``prefix`` in the experiment's folder (by name, as Tune picks it)."""
    return max(storage.glob_names(_folder(spec), prefix))


@pytest.mark.parametrize("target", ["tuner.pkl", "experiment_state-", "basic-variant-state-"])
def test_a_state_file_changed_after_the_engines_check_is_refused_when_tune_reads_it(stack, tmp_path, target):
    """The engine checks the folder, then a writer of storage replaces a state file before Tune reads it: the one
    ``Tuner.restore`` unpickles (``tuner.pkl``), the experiment state it decodes (a ``CLOUDPICKLE_FALLBACK`` value in
    it is a pickle), or the searcher state Tune downloads and then unpickles. A test-only entrypoint
    (``tune_testkit.state_swap``) makes the swap right after the engine's check. Each read Tune makes is held to the
    proven files, so the job fails naming the file, and the pickle never runs."""
    spec = _holding(_spec(stack, tmp_path, "swapped"), tmp_path, 2)
    _stopped(stack, tmp_path, spec, x=2)
    name = target if target == "tuner.pkl" else _newest(spec, target)
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Marker(str(marker)))
    if target == "experiment_state-":
        payload = json.dumps({"_type": "CLOUDPICKLE_FALLBACK", "value": payload.hex()}).encode()
    source = f"{spec['storage_path'].rstrip('/')}/attacker-{uuid.uuid4().hex[:8]}/{name}"
    storage.write_bytes(source, payload)

    swap = {"source": source, "target": f"{_folder(spec)}/{name}"}
    runs = len(read_markers(str(tmp_path)))
    job_id = jobs.submit(
        stack, spec, engine="python -m tune_testkit.state_swap", env={"TUNE_TESTKIT_SWAP": json.dumps(swap)}
    )
    final = jobs.wait(stack, job_id, 120)
    logs = jobs.logs(stack, job_id)
    assert final == "FAILED", logs[-5000:]
    assert "after the engine's check" in logs, logs[-5000:]  # the swap came after the check, which passed
    assert f"changed after the submitter proved it ({name})" in logs, logs[-5000:]
    assert len(read_markers(str(tmp_path))) == runs, "a trial ran from the refused state"
    assert jobs.exit_code(stack, job_id) == 2
    assert not marker.exists(), f"the driver unpickled the {name} a writer of storage put there"
