"""An errored trial's ``error.pkl`` in storage is never unpickled on the driver (issue 40): a writer of storage
replaces it with a pickle after Tune's last upload of the experiment's files, while the driver still has to read the
results back, and the result manifest still reports the errored trial with its error text (from ``error.txt``).

A real Ray job on the local stack: the spec's test-only callback holds the driver at the end of the experiment
(after Tune's final upload, which would overwrite an earlier swap, and before the ResultGrid is built) until the
test has swapped the file."""

from __future__ import annotations

import pickle
import uuid

import pytest

from airflow_tune.common import storage
from tests.integration.test_state_proof import _Marker
from tests.support import engine_jobs as jobs

pytestmark = pytest.mark.timeout(240)


def test_a_swapped_error_pickle_is_never_unpickled_and_the_error_text_is_reported(stack, tmp_path):
    name = jobs.unique_name("error-pkl")
    signals = f"{stack.storage_uri}/signals-{uuid.uuid4().hex[:8]}"
    spec = jobs.base_spec(
        stack,
        name,
        "tune_testkit.functions:failing_for",
        param_space={"x": {"grid_search": [1, 2]}, "fail_x": 1},
        callbacks=[
            {
                "factory": "tune_testkit.callbacks:HoldAtEnd",
                "args": {"ready_uri": f"{signals}/ready.json", "go_uri": f"{signals}/go.json"},
            }
        ],
    )
    job_id = jobs.submit(stack, spec)
    try:
        jobs.wait_until(lambda: storage.exists(f"{signals}/ready.json"), 180, "the experiment's end")
    except TimeoutError:
        raise AssertionError(jobs.logs(stack, job_id)[-5000:]) from None

    folder = f"{spec['storage_path'].rstrip('/')}/{name}"
    pickles = [uri for uri in storage.list_files(folder) if uri.endswith("/error.pkl")]
    assert len(pickles) == 1, pickles  # Tune uploaded the errored trial's error.pkl (and error.txt beside it)
    assert storage.exists(pickles[0][: -len("error.pkl")] + "error.txt")
    marker = tmp_path / "unpickled"
    storage.write_bytes(pickles[0], pickle.dumps(_Marker(str(marker))))
    storage.write_json(f"{signals}/go.json", {})

    final = jobs.wait(stack, job_id, 120)
    logs = jobs.logs(stack, job_id)
    assert final == "SUCCEEDED", logs[-5000:]
    assert not marker.exists(), "the driver unpickled the error.pkl a writer of storage put there"
    manifest = storage.read_json_or_none(jobs.result_uri(spec))
    assert manifest is not None and manifest["num_errored"] == 1 and manifest["num_terminated"] == 1, manifest
    (errored,) = [t for t in manifest["trials"] if t["error"]]
    assert errored["config"]["x"] == 1
    assert errored["error_summary"] == "ValueError: boom: bad x=1", errored
    assert "ValueError: boom: bad x=1" in errored["error"] and "Failure #" not in errored["error"], errored["error"]
    assert f"trial {errored['trial_id']} errored: ValueError: boom: bad x=1" in logs
