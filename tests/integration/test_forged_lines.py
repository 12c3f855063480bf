"""Lines are lines (issue 40, finding 3): a value a trial prints or raises with cannot make a line of its Ray job's log
that the Airflow side reads as the engine's.

Real Ray jobs on the local stack. A conf's string parameter carries, after a ``\\r`` or a ``\\u2028``, the seal of a
``tuner.pkl`` that someone will plant (its unpickling leaves a marker), the seal of a ``result.json`` they will write,
and a progress line whose best value meets any sensor's target; the trial prints it. Ray prefixes the printed line
(``(printing pid=...)``), but the dashboard serves a ``\\r`` as a line break, and ``str.splitlines()`` broke at the
``\\u2028``. In another run the trial raises with a value that carries ``\\n`` and the seal: Tune's driver logs the
exception, unprefixed. None of it is believed: the restore's proof refuses the planted ``tuner.pkl`` naming it, the
written result is not believed, the sensor's target is not met, and no pickle runs."""

from __future__ import annotations

import json
import pickle
import time
from types import SimpleNamespace

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import (
    LOG_MARK,
    METADATA_EXPERIMENT,
    METADATA_EXPERIMENT_URI,
    RESULT_FILE,
    digest_of,
    manifest_uri,
)
from airflow_tune.common.provenance import seal_line
from airflow_tune.exceptions import ExperimentStorageError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.trust.proofs import proven_progress, proven_result, restore_state_proof
from airflow_tune.utils.waiting import best_reaches
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(240)
TARGET = -1000.0  # loss at or below: no trial of these reaches it


class _Marker:
    """Unpickling this leaves a file: proof that someone ran ``pickle.loads`` on it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _folder(spec: dict) -> str:
    return f"{spec['storage_path'].rstrip('/')}/{spec['name']}"


def _forgeries(spec: dict, job_id: str, tmp_path) -> SimpleNamespace:
    """The planted pickle, the written result and the lines that would vouch for them."""
    pickled = pickle.dumps(_Marker(str(tmp_path / "unpickled")))
    result = json.dumps({"experiment": spec["name"], "experiment_uri": _folder(spec), "job_id": job_id}).encode()
    progress = {"counts": {"TERMINATED": 1}, "metric": "loss", "mode": "min", "best": {"trial_id": "x", "value": -1e9}}
    lines = [
        seal_line("state/tuner.pkl", digest_of(pickled)),
        seal_line(RESULT_FILE, digest_of(result)),
        f"{LOG_MARK}progress {json.dumps(progress)}",
    ]
    return SimpleNamespace(pickled=pickled, result=result, lines=lines, marker=tmp_path / "unpickled")


def _spec(stack, tmp_path, prefix: str, **config) -> dict:
    return jobs.base_spec(
        stack,
        jobs.unique_name(prefix),
        "tune_testkit.functions:printing",
        param_space={"x": 1, "marker_dir": str(tmp_path), **config},
        progress_interval_s=3600.0,  # the engine's progress lines: its first, and its last at the end
    )


def _submit(stack, spec: dict, job_id: str) -> None:
    """Submit as the operator does: the job's metadata names the experiment."""
    metadata = {METADATA_EXPERIMENT: spec["name"], METADATA_EXPERIMENT_URI: _folder(spec)}
    jobs.submit(stack, spec, job_id=job_id, metadata=metadata)


def _refused(spec: dict, job_id: str, forged: SimpleNamespace) -> None:
    """Plant the pickle and write the result as someone who can write the experiment's storage would; neither is
    believed on the strength of the job's log."""
    hook = RayHook()
    storage.write_bytes(f"{_folder(spec)}/tuner.pkl", forged.pickled)
    storage.write_bytes(manifest_uri(_folder(spec), RESULT_FILE), forged.result)
    experiment = SimpleNamespace(experiment_uri=_folder(spec))
    with pytest.raises(ExperimentStorageError) as refused:
        restore_state_proof(hook, experiment, [{"submission_id": job_id}], job_id)  # type: ignore[arg-type]
    assert "tuner.pkl: its bytes" in str(refused.value) and "refusing to restore" in str(refused.value)
    with pytest.raises(ExperimentStorageError, match=f"is not believed: its bytes are not the ones Ray job {job_id}"):
        proven_result(hook, _folder(spec), forged.result, owner=None, submitted=None)
    assert not forged.marker.exists()


@pytest.mark.parametrize("separator", ["\r", "\u2028"], ids=["CR", "LS"])
def test_a_seal_or_progress_line_forged_in_a_printed_conf_value_is_not_believed(stack, tmp_path, separator):
    hold = tmp_path / "hold"
    hold.write_text("")
    job_id = f"forged-lines-{time.monotonic_ns()}"
    spec = _spec(stack, tmp_path, "forged-print", note="", hold={"x": 1, "step": 0, "file": str(hold)})
    forged = _forgeries(spec, job_id, tmp_path)
    spec["param_space"]["note"] = "a" + "".join(separator + line for line in forged.lines)
    _submit(stack, spec, job_id)

    def printed_and_held() -> bool:
        return bool(read_markers(str(tmp_path), "step")) and forged.lines[-1] in jobs.logs(stack, job_id)

    try:
        jobs.wait_until(printed_and_held, 120, "the trial printing its note")
        # While the trial runs, a sensor's poke judges its target on the job's log.
        progress = proven_progress(RayHook(), _folder(spec), job_id, reader=None, submitted=None)
    finally:
        if jobs.status(stack, job_id) not in jobs.TERMINAL:
            jobs.client(stack).stop_job(job_id)
        final = jobs.wait(stack, job_id, 60)
        hold.unlink()
    assert not best_reaches(progress, TARGET, "min"), progress
    assert progress is not None and (progress["best"] or {}).get("trial_id") != "x", progress
    logs = jobs.logs(stack, job_id)
    # The dashboard serves a \r as a line break: the driver escaped the mark after it.
    printed = "\n\\" if separator == "\r" else separator
    assert f"note: a{printed}{forged.lines[0]}" in logs, logs[-3000:]
    assert final == "STOPPED" and "state saved, a rerun resumes" in logs, logs[-3000:]
    _refused(spec, job_id, forged)


def test_a_seal_forged_in_an_exception_a_trial_raises_with_a_conf_value_is_not_believed(stack, tmp_path):
    job_id = f"forged-raise-{time.monotonic_ns()}"
    spec = _spec(stack, tmp_path, "forged-raise", note="", raise_note=True)
    forged = _forgeries(spec, job_id, tmp_path)
    spec["param_space"]["note"] = "a" + "".join("\n" + line for line in forged.lines)
    _submit(stack, spec, job_id)
    jobs.wait(stack, job_id)
    _refused(spec, job_id, forged)
    logs = jobs.logs(stack, job_id)
    # Tune's driver logged the trial's exception with the value's lines unprefixed: each is escaped.
    assert f"ValueError: bad note: a\n\\{forged.lines[0]}" in logs, logs[-6000:]
    assert f"\n{forged.lines[0]}" not in logs
