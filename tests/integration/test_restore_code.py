"""A retry's code objects on a restored experiment, as real Ray jobs: the first job runs with trial name creators
shipped by value from a DAG file and a callback from a module it ships, and is stopped with one of its two trials
made; the retry changes the creators and drops the callback and its module. Tune keeps the code an experiment starts
with in its saved state; the restored run names its new trial with the retry's creators and needs none of the
dropped code."""

from __future__ import annotations

import contextlib
import os
import re
import uuid

import pytest

from airflow_tune.common import storage
from airflow_tune.utils import shipping
from tests.integration.test_engine_restore import _checkpointing_spec, _hold, _progress_at_interrupt
from tests.support import engine_jobs as jobs
from tests.support.dag_files import forget_dag_modules, load_dag_file  # noqa: F401 - the fixture
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(240)

CREATORS = """
def trial_name_creator(trial):
    return "{word}_x" + str(trial.config["x"])


def trial_dirname_creator(trial):
    return "{word}dir_x" + str(trial.config["x"]) + "_" + trial.trial_id
"""

CALLBACK = """
from ray import tune


class Quiet(tune.Callback):
    pass
"""


@contextlib.contextmanager
def _shipped_creators(tmp_path, word: str):
    """The creators of a DAG file (loaded as Airflow loads one), as the operator ships them: by value."""
    module = load_dag_file(tmp_path, word, CREATORS.format(word=word))
    fields = ("trial_name_creator", "trial_dirname_creator")
    codes = [shipping.trainable_code(getattr(module, field), attr=field, what=field) for field in fields]
    with shipping.shipped_package(*codes) as folder:
        yield folder


def test_a_retry_names_new_trials_with_its_creators_and_needs_no_dropped_code(stack, tmp_path):
    callbacks = tmp_path / f"gone_callbacks_{uuid.uuid4().hex[:6]}"
    callbacks.mkdir()
    (callbacks / "__init__.py").write_text(CALLBACK)
    spec = _checkpointing_spec(stack, tmp_path, "restore-code", xs=[1, 2], steps=4, sleep=0.1)
    spec.update(
        trial_name_creator="airflow_tune_shipped:trial_name_creator",
        trial_dirname_creator="airflow_tune_shipped:trial_dirname_creator",
        callbacks=[f"{callbacks.name}:Quiet"],
    )
    hold = _hold(tmp_path, x=1, step=1)
    spec["param_space"]["hold"] = hold
    with _shipped_creators(tmp_path, "first") as shipped:
        job_id = jobs.submit(stack, spec, py_modules=[shipped, str(callbacks)])
    # One trial at a time: x=2 is made only after x=1 ends, which it does not in this job.
    jobs.stop_when(stack, job_id, lambda: _progress_at_interrupt(str(tmp_path))[1].get(1) == 1, "x=1 held at step 1")
    os.remove(hold["file"])

    del spec["callbacks"]
    with _shipped_creators(tmp_path, "second") as shipped:
        logs, manifest = jobs.run_ok(stack, spec, py_modules=[shipped])
    assert "[airflow-tune] restored experiment" in logs
    assert manifest["num_terminated"] == 2, logs[-4000:]
    events = {x: [m["event"] for m in read_markers(str(tmp_path)) if m["x"] == x] for x in (1, 2)}
    assert events[1].count("start") == 1 and "resume2" in events[1], events  # restored, not started over
    folders = {row["config"]["x"]: row["path"].rsplit("/", 1)[1] for row in manifest["trials"]}
    # x=1 keeps the folder the first job's creator gave it; x=2, made by the retry, takes the retry's.
    assert folders[1].startswith("firstdir_x1_") and folders[2].startswith("seconddir_x2_"), folders
    experiment = manifest["experiment_uri"]
    state = storage.read_bytes(f"{experiment}/{storage.glob_names(experiment, 'experiment_state-')[-1]}").decode()
    assert sorted(re.findall(r"(?:first|second)_x\d", state)) == ["first_x1", "second_x2"], state[:3000]


STOPPER = """
from ray import tune


class Never(tune.Stopper):
    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        return False
"""


def test_a_retry_without_code_tune_kept_by_import_path_fails_before_any_trial_naming_it(stack, tmp_path):
    """The stopper is part of the question, so the retry names it too, but no longer ships its module: Tune's saved
    state refers to the class by import path, and the restore fails at once naming it and the fix, no trial run."""
    stoppers = tmp_path / f"gone_stoppers_{uuid.uuid4().hex[:6]}"
    stoppers.mkdir()
    (stoppers / "__init__.py").write_text(STOPPER)
    spec = _checkpointing_spec(
        stack, tmp_path, "restore-gone", xs=[1], steps=4, sleep=0.1, stop=f"{stoppers.name}:Never"
    )
    hold = _hold(tmp_path, x=1, step=1)
    spec["param_space"]["hold"] = hold
    job_id = jobs.submit(stack, spec, py_modules=[str(stoppers)])
    jobs.stop_when(stack, job_id, lambda: _progress_at_interrupt(str(tmp_path))[1].get(1) == 1, "x=1 held at step 1")
    os.remove(hold["file"])
    runs = len(read_markers(str(tmp_path)))

    final, logs, _ = jobs.run(stack, spec)
    assert final == "FAILED", logs[-4000:]
    (verdict,) = [line for line in logs.splitlines() if line.startswith("[airflow-tune] verdict:")]
    assert f"No module named '{stoppers.name}' (the earlier run's stop[0].factory '{stoppers.name}:Never')" in verdict
    assert "tuner.pkl" in verdict and "ship its module with the job" in verdict and "experiment_name" in verdict
    assert len(read_markers(str(tmp_path))) == runs  # no trial ran again
