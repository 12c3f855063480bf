"""Several experiments in a row shipping the same ``working_dir`` on Ray 2.43.0 (the oldest supported) and 2.50.1,
each on a head and a worker node on this host. On these releases a worker node ignores its ``--temp-dir`` and shares
the head's session folder, so one folder holds the unpacked package for both nodes, and the worker node's runtime env
agent, meeting the package for the first time (the job's eager install when the driver connects), deletes it and
unpacks it again under the driver that runs in it. Before the engine moved its driver into a copy of its own
(:func:`airflow_tune.engine.compat.leave_working_dir_package`), the first of the experiments failed after all its
trials had finished (``FileNotFoundError`` from ``os.getcwd()`` in Tune's ``ExperimentAnalysis``), or at its start
when the driver imported the trainable while the package was being unpacked again (``ModuleNotFoundError``).

The experiments are engine jobs submitted as the operator submits them (the engine as ``py_modules``, the trainable
and a driver-side callback in the ``working_dir``), without Airflow: the failure is the cluster's alone. The test
checks that the package was replaced while one of its jobs ran, so a pass shows the condition met and survived.
Measured on 2 cores, quiet: the two nodes start in 5 s, an experiment takes 6 s, a release about 30 s in all."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import ENGINE_ENTRYPOINT, JOB_ID_ENV, SPEC_ENV
from tests.support import engine_jobs
from tests.support.compat_envs import RAY_RELEASES, ray_cluster_python
from tests.support.compat_stack import compat_stack

EXPERIMENTS = 3

#: The trainable, and a callback that runs in the driver when the trials are done (after the package was replaced):
#: it says where the driver works, reads a file of the working_dir by a relative path and imports another of its
#: modules only then. All of it only the ``working_dir`` brings to the cluster.
PROBE = """
import os

import ray
from ray import tune


def train(config):
    for step in range(2):
        tune.report({"loss": float((config["x"] - 3) ** 2) + 1.0 / (step + 1), "ray_version": ray.__version__})


class DriverProbe(tune.Callback):
    def on_experiment_end(self, trials, **info):
        import shared_wd_late

        with open("probe_data.txt") as fh:
            data = fh.read().strip()
        print(f"driver-probe cwd={os.getcwd()} data={data} late={shared_wd_late.VALUE}", flush=True)
"""


@pytest.fixture(scope="module")
def working_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="aft-shared-wd-"))
    (folder / "shared_wd_probe.py").write_text(textwrap.dedent(PROBE))
    (folder / "shared_wd_late.py").write_text("VALUE = 'imported late'\n")
    (folder / "probe_data.txt").write_text("read by a relative path\n")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module", params=RAY_RELEASES)
def two_nodes(request) -> Iterator[tuple[str, object]]:
    """A head offering no CPUs (the drivers run there) and one worker node (the trials) on this host, of Ray
    ``release``; the environment points Ray Jobs and S3 clients at them."""
    release = request.param
    options = {"num_cpus": 0, "workers": 1, "worker_cpus": 2, "cluster_python": ray_cluster_python(release)}
    stack = compat_stack(f"Ray {release} head and worker node", f"aft-shared-wd-{release}-", airflow=False, **options)
    with stack as (state, _):
        yield release, state


def submit(state, spec: dict, working_dir: Path) -> str:
    """The engine as the operator submits it: the engine package as ``py_modules``, the user's ``working_dir``."""
    job_id = f"shared-wd-{spec['name']}-{uuid.uuid4().hex[:6]}"
    engine_jobs.client(state).submit_job(
        entrypoint=ENGINE_ENTRYPOINT,
        submission_id=job_id,
        runtime_env={
            "working_dir": str(working_dir),
            "py_modules": [engine_jobs.PACKAGE],
            "env_vars": {SPEC_ENV: json.dumps(spec), JOB_ID_ENV: job_id, "RAY_JOB_STOP_SIGNAL": "SIGINT"},
        },
    )
    return job_id


def replacements(state, ray_job_ids: set[str]) -> list[str]:
    """The lines in which a runtime env agent deleted an unpacked ``working_dir`` package to unpack it again, for
    one of ``ray_job_ids`` (an agent writes a job's setup to ``runtime_env_setup-<its Ray job id>.log``; on these
    releases every node of this host writes to the head's session folder)."""
    logs = Path(state.ray_temp_dir) / "session_latest" / "logs"
    found = []
    for log in sorted(logs.glob("runtime_env_setup-*.log")):
        if log.stem.removeprefix("runtime_env_setup-") in ray_job_ids:
            text = log.read_text(errors="replace")
            found += [line for line in text.splitlines() if re.search(r"Removing \S*/working_dir_files/", line)]
    return found


@pytest.mark.timeout(240)
def test_experiments_in_a_row_sharing_a_working_dir_all_finish(two_nodes, working_dir):
    release, state = two_nodes
    client = engine_jobs.client(state)
    outcomes, ray_job_ids = [], set()
    for index in range(EXPERIMENTS):
        spec = engine_jobs.base_spec(
            state, engine_jobs.unique_name(f"shared-wd-{index}"), "shared_wd_probe:train",
            param_space={"x": {"grid_search": [1, 3]}}, callbacks=["shared_wd_probe:DriverProbe"],
        )  # fmt: skip
        started = time.monotonic()
        job_id = submit(state, spec, working_dir)
        final = engine_jobs.wait(state, job_id, timeout=120)
        ray_job_ids.add(client.get_job_info(job_id).job_id or "")
        result = storage.read_json_or_none(engine_jobs.result_uri(spec))
        outcomes.append((job_id, final, result, engine_jobs.logs(state, job_id)))
        print(f"Ray {release}: experiment {index + 1}/{EXPERIMENTS} {final} in {time.monotonic() - started:.1f}s")
    # The condition was met: an agent deleted the package and unpacked it again while one of these experiments ran.
    replaced = replacements(state, ray_job_ids)
    print(f"Ray {release}: the working_dir package was replaced {len(replaced)} time(s) during the experiments")
    failed = {job: logs[-3000:] for job, final, _, logs in outcomes if final != "SUCCEEDED"}
    assert not failed, f"experiments failed on Ray {release} (package replaced: {replaced}): {failed}"
    for job_id, _, result, logs in outcomes:
        assert result is not None and result["status"] == "succeeded", (job_id, result)
        assert result["num_trials"] == 2 and result["num_errored"] == 0, (job_id, result)
        assert result["best_metrics"]["ray_version"] == release, (job_id, result["best_metrics"])
        # The driver, at the experiment's end, worked outside Ray's package folder and still found the working_dir's
        # files and modules.
        probe = re.search(r"driver-probe cwd=(\S+) data=read by a relative path late=imported late", logs)
        assert probe and "/working_dir_files/" not in probe.group(1), (job_id, logs[-3000:])
    assert replaced, (
        f"no working_dir package was unpacked again during the experiments on Ray {release}: the test no longer "
        "meets the condition it is about (see the module docstring)"
    )
