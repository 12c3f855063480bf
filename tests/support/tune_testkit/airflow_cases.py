"""Trainables for the Airflow-side e2e tests (shipped to the cluster with py_modules).

Each writes marker files into ``config["marker_dir"]`` (a local folder: the test cluster is this machine), so a test
can count how often a trial started, resumed and finished across tries of an Airflow task.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from ray import tune

from .markers import mark


def _per_x(config: dict, key: str, default: float) -> float:
    """``config[key]`` is a number, or a JSON object keyed by ``str(x)`` (so trials of one grid can differ)."""
    value = config.get(key, default)
    if isinstance(value, dict):
        value = value.get(str(config.get("x")), value.get("default", default))
    return float(value)


def _start_or_resume(config: dict) -> int:
    """The step to run next: 0 (marked ``start``), or the one after the trial's checkpoint (marked ``resume``)."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        mark(config, "start")
        return 0
    with checkpoint.as_directory() as folder:
        with open(os.path.join(folder, "state.json")) as fh:
            start = json.load(fh)["step"] + 1
    mark(config, "resume", step=start)
    return start


def stepper(config: dict) -> None:
    """Reports ``steps`` times, ``sleep`` seconds apart, with a checkpoint each step; resumes from its checkpoint.

    The loss falls with each step and is lowest for x=3, so the best trial and its last checkpoint are predictable.
    """
    start = _start_or_resume(config)
    steps = int(_per_x(config, "steps", 3))
    sleep = _per_x(config, "sleep", 0.0)
    for step in range(start, steps):
        time.sleep(sleep)
        loss = (config["x"] - 3) ** 2 + 1.0 / (step + 1)
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as fh:
                json.dump({"step": step, "x": config["x"], "loss": loss}, fh)
            tune.report({"loss": loss, "step": step}, checkpoint=tune.Checkpoint.from_directory(folder))
        mark(config, "step", step=step)
        _gate(config, step)
    mark(config, "end")


def _gate(config: dict, step: int) -> None:
    """With ``gate = {"step": n, "file": path}``: every trial waits after its step n while the file exists, so a test
    can act mid-experiment (all trials checkpointed, all with steps to go) however fast the machine is."""
    gate = config.get("gate") or {}
    if gate.get("step") == step:
        while os.path.exists(gate["file"]):
            time.sleep(0.1)


def boom(config: dict) -> None:
    """Fails at once, with an error message the task's failure must name."""
    mark(config, "start")
    raise ValueError(f"boom: bad x={config.get('x')}")


def crashy(config: dict) -> None:
    """``stepper`` that crashes at about 30% of its steps (a fixed pseudo-random set per trial, each step at most
    once, at most 3 per trial), so ``failure={"max_failures": 3}`` always brings every trial to its end."""
    import hashlib

    start = _start_or_resume(config)
    steps = int(config.get("steps", 8))
    crash_steps = [
        s for s in range(1, steps) if int(hashlib.sha256(f"{config['x']}-{s}".encode()).hexdigest(), 16) % 10 < 3
    ][:3]
    crashed = {m["step"] for m in _markers(config, "crash")}
    for step in range(start, steps):
        if step in crash_steps and step not in crashed:
            mark(config, "crash", step=step)
            raise RuntimeError(f"crash on purpose at step {step} of x={config['x']}")
        time.sleep(float(config.get("sleep", 0.0)))
        loss = (config["x"] - 3) ** 2 + 1.0 / (step + 1)
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as fh:
                json.dump({"step": step, "x": config["x"], "loss": loss}, fh)
            tune.report({"loss": loss, "step": step}, checkpoint=tune.Checkpoint.from_directory(folder))
        mark(config, "step", step=step)
    mark(config, "end")


def _markers(config: dict, event: str) -> list[dict]:
    from .markers import read_markers

    return [m for m in read_markers(config["marker_dir"], event) if m.get("x") == config["x"]]


def mint_then_fail(config: dict) -> None:
    """From inside a trial, with the access Ray gives every trial (the Jobs API at the cluster's dashboard), submit
    a live job carrying this experiment's own metadata under the id the task's next try would submit, then fail: the
    retry must not take that job for its own."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get
    from ray.job_submission import JobSubmissionClient

    name = tune.get_context().get_experiment_name()
    dashboard = _internal_kv_get("webui:url", namespace=ray_constants.KV_NAMESPACE_DASHBOARD).decode()
    client = JobSubmissionClient(f"http://{dashboard}")
    [driver] = [
        job
        for job in client.list_jobs()
        if (job.metadata or {}).get("airflow_tune_experiment") == name
        and str(job.status) in ("RUNNING", "JobStatus.RUNNING")
    ]
    client.submit_job(
        entrypoint="python -c 'import time; time.sleep(90)'",
        submission_id=f"{driver.submission_id.rsplit('-', 1)[0]}-2",
        metadata=dict(driver.metadata or {}),
    )
    raise RuntimeError("this trial minted a job with its experiment's metadata")
