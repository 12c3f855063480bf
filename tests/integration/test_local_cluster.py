"""The local stack's multi-node option, with an MLflow server, leaves nothing behind when its owner dies, however it
dies (SIGKILL here).

The rest of its life is tested where it is used, in tests/e2e/test_cluster.py: nodes apart (own temp dir, home, working
folder, environment), a worker lost by process id and replaced, and nothing left after stop (the ``cluster``
fixture checks it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

from airflow_tune.local.stack import stop_process_tree
from tests.support.cluster_venv import cluster_python
from tests.support.mlflow_server import mlflow_python
from tests.support.processes import alive, tree


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:200]
    except psutil.NoSuchProcess:
        return "(gone)"


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.3)
    return alive(pids)


def test_every_node_and_the_mlflow_server_stop_when_the_stacks_owner_is_killed(tmp_path):
    """``mlflow server`` runs uvicorn as a child: both stop with the nodes when the stack's owner dies by SIGKILL (the
    CLI is told by the kernel and forwards it to uvicorn; the stack's reaper stops whatever of the trees is left)."""
    python = cluster_python()
    script = (
        "import json, time\n"
        "from airflow_tune.local import LocalStack\n"
        f"state = LocalStack({str(tmp_path / 'c')!r}, num_cpus=0, workers=2, cluster_python={str(python)!r},"
        f" airflow=False, mlflow_python={str(mlflow_python())!r}).start()\n"
        "print(json.dumps([state.mlflow_pid, state.ray_pid, state.s3_pid, *state.worker_pids, state.ray_temp_dir,"
        " *state.worker_temp_dirs]), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    started: set[int] = set()
    temp_dirs: list[str] = []
    try:
        assert owner.stdout is not None
        mlflow_pid, *pids, ray_temp_dir, w0, w1 = json.loads(owner.stdout.readline())
        temp_dirs = [ray_temp_dir, w0, w1]
        server = tree(mlflow_pid)
        assert len(server) >= 2, "the MLflow CLI and its uvicorn worker"
        started = set(server)
        for pid in pids:
            started |= tree(pid)
        assert len(started) > 10
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        left = _wait_gone(started, 60)
        assert alive(server) == set(), "the MLflow server or its worker outlived the stack's owner"
        assert left == set(), [(pid, _cmdline(pid)) for pid in left]
        deadline = time.monotonic() + 10
        while any(os.path.exists(d) for d in temp_dirs) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [d for d in temp_dirs if os.path.exists(d)], "the nodes' temp dirs are removed too"
    finally:
        for pid in alive(started):
            stop_process_tree(pid, grace=2)
        if owner.poll() is None:
            owner.kill()
        for folder in temp_dirs:  # when the test failed before the reaper removed them
            shutil.rmtree(folder, ignore_errors=True)
