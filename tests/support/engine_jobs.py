"""Run the engine as a real Ray job on the local stack (through the Jobs API), for the integration tests."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import airflow_tune
from airflow_tune import storage

TESTKIT = str(Path(__file__).resolve().parent / "tune_testkit")
PACKAGE = str(Path(airflow_tune.__file__).resolve().parent)
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def client(stack: Any):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(stack.dashboard_url)


def submit(stack: Any, spec: dict[str, Any], *, env: dict[str, str] | None = None, job_id: str | None = None) -> str:
    job_id = job_id or f"tune-{spec['name']}-{uuid.uuid4().hex[:6]}"
    client(stack).submit_job(
        entrypoint="python -m airflow_tune.engine",
        submission_id=job_id,
        runtime_env={
            "py_modules": [PACKAGE, TESTKIT],
            "env_vars": {
                "AIRFLOW_TUNE_SPEC": json.dumps(spec),
                "AIRFLOW_TUNE_JOB_ID": job_id,
                "RAY_JOB_STOP_SIGNAL": "SIGINT",
                "RAY_JOB_STOP_WAIT_TIME_S": "30",
                **(env or {}),
            },
        },
    )
    return job_id


def wait(stack: Any, job_id: str, timeout: float = 300) -> str:
    c = client(stack)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(c.get_job_status(job_id))
        status = status.split(".")[-1]
        if status in TERMINAL:
            return status
        time.sleep(0.5)
    c.stop_job(job_id)
    raise TimeoutError(f"job {job_id} did not finish in {timeout}s; logs:\n{c.get_job_logs(job_id)[-4000:]}")


def run(stack: Any, spec: dict[str, Any], timeout: float = 300, **kwargs: Any) -> tuple[str, str, dict | None]:
    """Submit, wait, and return (status, logs, result manifest or None)."""
    job_id = submit(stack, spec, **kwargs)
    status = wait(stack, job_id, timeout)
    logs = client(stack).get_job_logs(job_id)
    result = storage.read_json_or_none(f"{spec['storage_path']}/{spec['name']}/.airflow_tune/result.json")
    return status, logs, result


def base_spec(stack: Any, name: str, trainable: str, **fields: Any) -> dict[str, Any]:
    return {
        "trainable": trainable,
        "name": name,
        "storage_path": stack.storage_uri,
        "metric": "loss",
        "mode": "min",
        "progress_interval_s": 1.0,
        **fields,
    }
