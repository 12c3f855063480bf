"""Submit an experiment to the engine as the operator does (the spec in storage, the job handed its URI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TESTKIT = Path(__file__).resolve().parent.parent / "tests" / "support" / "tune_testkit"


def submit(state: Any, spec: dict[str, Any]) -> tuple[str, str]:
    """Submit ``spec`` (its ``name`` is the job id) with the engine and the test trainables.

    :return: the job id and the experiment URI.
    """
    from airflow_tune.common import storage
    from airflow_tune.common.contract import JOB_ID_ENV, digest_of, engine_command, job_spec_uri, spec_file_bytes
    from airflow_tune.hooks.ray import RayHook
    from airflow_tune.operators.tune import engine_package_dir

    name = spec["name"]
    experiment_uri = f"{spec['storage_path']}/{name}"
    spec_uri = job_spec_uri(experiment_uri, name, "bench")
    spec_bytes = spec_file_bytes(spec)
    storage.write_bytes(spec_uri, spec_bytes)
    job_id = RayHook().submit_job(
        entrypoint=engine_command(spec_uri, digest_of(spec_bytes)),
        submission_id=name,
        runtime_env={"py_modules": [engine_package_dir(), str(TESTKIT)], "env_vars": {JOB_ID_ENV: name}},
    )
    return job_id, experiment_uri
