"""An experiment saved before the package's layout moved (0.1: what both sides import went under
``airflow_tune.common``) restores after it: ``tuner.pkl`` and the experiment state name the old module paths.

The old engine is this repository's own tree at the commit before the move (``git archive``), shipped with the job as
the operator ships the installed package; the new one is this tree's. The Ray head runs from the cluster
virtualenv, where airflow_tune is importable only as a job ships it (this suite's own venv has it installed).
"""

from __future__ import annotations

import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_tune.common import storage
from tests.conftest import separate_stack
from tests.integration.test_engine_restore import _assert_resumed, _checkpointing_spec, _hold, _progress_at_interrupt
from tests.support import engine_jobs as jobs

pytestmark = pytest.mark.timeout(300)

#: The last commit of the flat layout (airflow_tune/storage.py, airflow_tune/spec/...).
BEFORE_THE_MOVE = "b7067f6"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head() -> Iterator:
    """A Ray head of the cluster virtualenv and the S3 endpoint; stopped, and nothing of it left, even on failure."""
    with separate_stack("layout-", num_cpus=2, airflow=False) as local:
        yield local.state


def _package_before_the_move(tmp_path: Path) -> str:
    archive = tmp_path / "before.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "-o", str(archive), BEFORE_THE_MOVE, "airflow_tune"],
        check=True,
        capture_output=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "before", filter="data")
    package = tmp_path / "before" / "airflow_tune"
    assert (package / "storage.py").is_file() and (package / "spec" / "experiment.py").is_file()
    return str(package)


def _stop_old_job_while_held(stack, spec: dict, markers: Path, hold: dict, package: str) -> None:
    job_id = jobs.submit(stack, spec, package=package)
    jobs.stop_when(stack, job_id, lambda: _progress_at_interrupt(str(markers))[1].get(2) == hold["step"], "x=2 held")
    Path(hold["file"]).unlink()


def test_an_experiment_saved_before_the_layout_moved_restores_after_it(head, tmp_path):
    stack = head
    """The old engine runs the experiment, is stopped, restores it and is stopped again (a restored run's
    ``tuner.pkl`` holds the engine's callbacks, which name the spec's and storage's classes); the new engine restores
    that and finishes it: no trial that finished runs again, the interrupted one resumes from its checkpoint."""
    old_package = _package_before_the_move(tmp_path)
    markers = tmp_path / "markers"
    markers.mkdir()
    xs = [1, 2, 3]
    first = {**_hold(markers, x=2, step=1), "file": str(markers / "hold-first")}
    second = {**_hold(markers, x=2, step=3), "file": str(markers / "hold-second")}
    for hold in (first, second):
        Path(hold["file"]).write_text("")
    spec = _checkpointing_spec(stack, markers, "layout", xs=xs, steps=8, sleep=0.2)
    spec["param_space"]["hold"] = [first, second]
    _stop_old_job_while_held(stack, spec, markers, first, old_package)
    _stop_old_job_while_held(stack, spec, markers, second, old_package)
    finished, interrupted = _progress_at_interrupt(str(markers))
    assert finished == {1} and interrupted == {2: 3}, (finished, interrupted)

    folder = f"{spec['storage_path'].rstrip('/')}/{spec['name']}"
    pickled = storage.read_bytes(f"{folder}/tuner.pkl")
    old_paths = set(re.findall(rb"airflow_tune\.(?:storage|spec\.\w+|contract|provenance)\b", pickled))
    # Else the test proves nothing: the message shows the module paths the pickle names instead.
    assert old_paths, sorted(set(re.findall(rb"airflow_tune[\w.]*", pickled)))

    logs, manifest = jobs.run_ok(stack, spec)
    assert "[airflow-tune] restored experiment" in logs, logs[-4000:]
    _assert_resumed(manifest, str(markers), finished, interrupted, xs=xs, steps=8)
