"""The cluster's S3 credentials never reach Ray's logs: Ray Tune 2.60 copies the driver's AWS_* into each trial's
runtime_env, and Ray's runtime-env agent logs every runtime_env it creates, for anyone with the dashboard's log
viewer."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_tune.local.stack import LOCAL_SECRET_KEY
from tests.support.engine_jobs import base_spec, run_ok, unique_name

pytestmark = pytest.mark.usefixtures("stack")


def _sizes(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _written_since(before: dict[Path, int], folder: Path) -> dict[Path, bytes]:
    out = {}
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        with open(path, "rb") as fh:
            fh.seek(before.get(path, 0))
            out[path] = fh.read()
    return out


@pytest.mark.timeout(240)
def test_trials_runtime_env_and_every_ray_log_hold_no_secret_key(stack):
    logs = Path(stack.ray_temp_dir) / "session_latest" / "logs"
    before = _sizes(logs)
    spec = base_spec(
        stack,
        unique_name("no-secrets"),
        "tune_testkit.functions:checkpointing",
        param_space={"x": {"grid_search": [1, 3]}, "steps": 2},
    )
    _, result = run_ok(stack, spec)
    assert result["num_terminated"] == 2  # the trials reached S3 with their node's own credentials
    written = _written_since(before, logs)
    agent = b"".join(text for path, text in written.items() if path.name.startswith("runtime_env_agent"))
    # The agent did log the runtime envs it created for this experiment's trials (so this looks in the right place).
    assert b"Creating runtime env" in agent and spec["name"].encode() in agent
    leaked = [str(path) for path, text in written.items() if LOCAL_SECRET_KEY.encode() in text]
    assert leaked == []
