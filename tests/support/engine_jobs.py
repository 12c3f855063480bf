"""Run the engine as a real Ray job on the local stack (through the Jobs API), for the integration tests."""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import airflow_tune
from airflow_tune.common import storage
from airflow_tune.common.contract import ENGINE_ENTRYPOINT, JOB_ID_ENV, RESTORE_AFTER, RESTORE_STATE, SPEC_ENV
from airflow_tune.common.provenance import is_tune_state, unproven_state

TESTKIT = str(Path(__file__).resolve().parent / "tune_testkit")
PACKAGE = str(Path(airflow_tune.__file__).resolve().parent)
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def client(stack: Any):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(stack.dashboard_url, headers=stack.auth_headers)


#: The last job this harness submitted for each experiment name: the next job of that experiment may restore what
#: it saved, as the operator licenses a job after one it finds in Ray's job list (``--restore-after``).
_earlier: dict[str, str] = {}
#: Every job of each experiment name, oldest first: their logs prove the Tune state the next one restores.
_all: dict[str, list[str]] = {}


def proven_state(stack: Any, spec: dict[str, Any]) -> dict[str, str]:
    """What the operator passes as ``--restore-state``: the Tune state files in the experiment's folder, each proven
    by a seal in the log of one of its earlier jobs (the harness fails the test when one is not)."""
    folder = f"{spec['storage_path'].rstrip('/')}/{spec['name']}"
    state = {k: v for k, v in storage.file_digests(folder, recursive=False).items() if is_tune_state(k)}
    unproven = unproven_state(state, (logs(stack, job) for job in _all.get(spec["name"], [])))
    assert not unproven, f"Tune state the experiment's own jobs did not seal: {unproven}"
    return state


def submit(
    stack: Any,
    spec: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    job_id: str | None = None,
    restore_state: dict[str, str] | None = None,
    package: str = PACKAGE,
    py_modules: list[str] | None = None,
    metadata: dict[str, str] | None = None,
    engine: str = ENGINE_ENTRYPOINT,
) -> str:
    """Submit the engine for ``spec``; after an earlier job of the experiment, licensed to restore what it saved,
    with ``restore_state`` (default: :func:`proven_state`) as the state it may restore. ``package``: the
    airflow_tune folder the job ships (this tree's by default); ``py_modules``: more folders it ships;
    ``metadata``: the job's (the operator's jobs name their experiment there); ``engine``: the command that runs the
    engine (a test-only wrapper of it, from the testkit)."""
    job_id = job_id or f"tune-{spec['name']}-{uuid.uuid4().hex[:6]}"
    earlier = _earlier.get(spec["name"])
    entrypoint = engine
    if earlier:
        state = proven_state(stack, spec) if restore_state is None else restore_state
        entrypoint += f" {RESTORE_AFTER} {earlier} {RESTORE_STATE} {shlex.quote(json.dumps(state))}"
    _earlier[spec["name"]] = job_id
    _all.setdefault(spec["name"], []).append(job_id)
    _submit_when_an_agent_is_up(
        stack,
        entrypoint=entrypoint,
        submission_id=job_id,
        metadata=metadata,
        runtime_env={
            "py_modules": [package, TESTKIT, *(py_modules or [])],
            "env_vars": {
                SPEC_ENV: json.dumps(spec),
                JOB_ID_ENV: job_id,
                "RAY_JOB_STOP_SIGNAL": "SIGINT",
                "RAY_JOB_STOP_WAIT_TIME_S": "30",
                **(env or {}),
            },
        },
    )
    return job_id


def _submit_when_an_agent_is_up(stack: Any, **job: Any) -> None:
    """A head that just started lists jobs before its job agent takes one ("No available agent", a 500): the hook
    retries that as the dashboard being unavailable; so does the harness, for up to a minute."""
    from airflow_tune.hooks.transport import NO_AGENT_YET

    deadline = time.monotonic() + 60
    while True:
        try:
            client(stack).submit_job(**job)
            return
        except RuntimeError as exc:
            if NO_AGENT_YET not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1)


def status(stack: Any, job_id: str) -> str:
    return str(client(stack).get_job_status(job_id)).split(".")[-1]


def wait(stack: Any, job_id: str, timeout: float = 300) -> str:
    c = client(stack)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = status(stack, job_id)
        if current in TERMINAL:
            return current
        time.sleep(0.3)
    c.stop_job(job_id)
    raise TimeoutError(f"job {job_id} did not finish in {timeout}s; logs:\n{c.get_job_logs(job_id)[-4000:]}")


def stop_when(stack: Any, job_id: str, reached: Callable[[], Any], what: str, timeout: float = 120) -> None:
    """Stop the job once ``reached()`` holds (its log in the failure when it never does) and wait for STOPPED."""
    try:
        wait_until(reached, timeout, what)
    except TimeoutError:
        raise AssertionError(logs(stack, job_id)[-5000:]) from None
    client(stack).stop_job(job_id)
    assert wait(stack, job_id, 60) == "STOPPED"


def logs(stack: Any, job_id: str) -> str:
    return str(client(stack).get_job_logs(job_id))


def exit_code(stack: Any, job_id: str) -> int | None:
    """The driver's exit code, from the job's status message ("... exit code N") or its ``driver_exit_code``."""
    info = client(stack).get_job_info(job_id)
    code = getattr(info, "driver_exit_code", None)
    if code is not None:
        return int(code)
    found = re.search(r"exit code (-?\d+)", info.message or "")
    return int(found.group(1)) if found else None


def driver_pid(stack: Any, job_id: str, timeout: float = 30) -> int:
    """The process id of the job's driver (``python -m airflow_tune.engine``), from the job's driver info."""
    c = client(stack)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = c.get_job_info(job_id)
        driver = getattr(info, "driver_info", None)
        if driver is not None and getattr(driver, "pid", None):
            return int(driver.pid)
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} has no driver after {timeout}s")


def result_uri(spec: dict[str, Any]) -> str:
    return f"{spec['storage_path']}/{spec['name']}/.airflow_tune/result.json"


def run(stack: Any, spec: dict[str, Any], timeout: float = 300, **kwargs: Any) -> tuple[str, str, dict | None]:
    """Submit, wait, and return (status, logs, result manifest or None)."""
    job_id = submit(stack, spec, **kwargs)
    final = wait(stack, job_id, timeout)
    return final, logs(stack, job_id), storage.read_json_or_none(result_uri(spec))


def run_ok(stack: Any, spec: dict[str, Any], timeout: float = 300, **kwargs: Any) -> tuple[str, dict]:
    """Run and insist the job succeeded with a manifest; return (logs, manifest)."""
    final, text, result = run(stack, spec, timeout, **kwargs)
    assert final == "SUCCEEDED", f"job ended {final}; logs:\n{text[-6000:]}"
    assert result is not None, f"no result.json; logs:\n{text[-6000:]}"
    return text, result


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


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


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def checkpoint_dirs(trial_uri: str) -> list[str]:
    """The checkpoint folders of one trial in storage, as URIs, in order."""
    dirs = set()
    for uri in storage.list_files(trial_uri):
        rel = uri[len(trial_uri.rstrip("/")) + 1 :]
        first = rel.split("/", 1)[0]
        if first.startswith("checkpoint_") and "/" in rel:
            dirs.add(f"{trial_uri.rstrip('/')}/{first}")
    return sorted(dirs)


def read_checkpoint_state(uri: str, name: str = "state.json") -> dict:
    """Download the checkpoint at ``uri`` with the product's helper and read its state file."""
    from airflow_tune.checkpoints import download_checkpoint

    with tempfile.TemporaryDirectory(prefix="checkpoint-") as folder:
        download_checkpoint(uri, folder)
        with open(os.path.join(folder, name)) as fh:
            return json.load(fh)


def trial_by_id(manifest: dict, trial_id: str) -> dict:
    for trial in manifest["trials"]:
        if trial["trial_id"] == trial_id:
            return trial
    raise KeyError(f"trial {trial_id} not in manifest {[t['trial_id'] for t in manifest['trials']]}")
