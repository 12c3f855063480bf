"""The local stack's multi-node option: nodes apart (own temp dir, home and ports, the cluster virtualenv's Python),
a worker lost and replaced by process id, and nothing left behind when the stack stops or its owner dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

from airflow_tune.local import LocalStack
from airflow_tune.local.stack import stop_process_tree
from tests.support.cluster_venv import cluster_python


def _tree(pid: int) -> set[int]:
    return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:200]
    except psutil.NoSuchProcess:
        return "(gone)"


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.3)
    return _alive(pids)


def test_nodes_apart_a_worker_lost_and_replaced_and_every_process_stopped(tmp_path):
    python = cluster_python()
    local = LocalStack(tmp_path / "c", num_cpus=0, workers=2, worker_cpus=1, cluster_python=python, airflow=False)
    with local as state:
        nodes = local.alive_nodes()
        assert set(nodes) == {state.head_node_id, *state.worker_node_ids}
        trees = {pid: _tree(pid) for pid in [state.ray_pid, *state.worker_pids]}
        temp_dirs = [state.ray_temp_dir, *state.worker_temp_dirs]
        assert len(set(temp_dirs)) == 3 and all(len(d) < 40 for d in temp_dirs)
        for pid, temp_dir in zip([state.ray_pid, *state.worker_pids], temp_dirs, strict=True):
            procs = [psutil.Process(p) for p in trees[pid]]
            assert procs[0].cwd() == temp_dir  # not this checkout: `python -m` puts the working folder on sys.path
            raylets = [p for p in procs if p.name() == "raylet"]
            assert len(raylets) == 1 and temp_dir in " ".join(raylets[0].cmdline())
            # The node's processes (the raylet starts its workers) have the cluster's environment, none of this one.
            for proc in (psutil.Process(pid), raylets[0]):
                env = proc.environ()
                assert env["HOME"] == f"{temp_dir}/home" and env["TMPDIR"] == temp_dir
                assert env["PATH"].split(os.pathsep)[0] == str(python.parent)
                assert not [k for k in env if k.startswith(("AIRFLOW", "PYTHON", "PYTEST"))], sorted(env)
        assert state.head_node_id and len(state.worker_node_ids) == 2

        # Lose worker 1: its processes only, by id; its temp dir goes with it.
        lost = set(local.kill_worker(1))
        assert trees[state.worker_pids[1]] <= lost
        assert _wait_gone(lost, 10) == set()
        assert not os.path.exists(temp_dirs[2])
        assert (
            _alive(trees[state.ray_pid] | trees[state.worker_pids[0]])
            == trees[state.ray_pid] | trees[state.worker_pids[0]]
        )
        # The head sees the node die (its health checks fail; Ray takes some seconds), then a new node replaces it.
        old_node = state.worker_node_ids[1]
        deadline = time.monotonic() + 90
        while old_node in local.alive_nodes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert old_node not in local.alive_nodes()
        new_node = local.start_worker(1)
        assert new_node != old_node and state.worker_node_ids[1] == new_node
        assert set(local.alive_nodes()) == {state.head_node_id, state.worker_node_ids[0], new_node}
        assert json.loads((tmp_path / "c" / "stack.json").read_text())["worker_node_ids"][1] == new_node
        started = set().union(*trees.values()) - lost | _tree(state.worker_pids[1])
        all_temp_dirs = [state.ray_temp_dir, *state.worker_temp_dirs]
    assert _wait_gone(started, 10) == set()
    assert not any(os.path.exists(d) for d in all_temp_dirs)
    assert not (tmp_path / "c" / "stack.json").exists()


def test_every_node_stops_when_the_stacks_owner_is_killed(tmp_path):
    python = cluster_python()
    script = (
        "import json, time\n"
        "from airflow_tune.local import LocalStack\n"
        f"state = LocalStack({str(tmp_path / 'c')!r}, num_cpus=0, workers=2, cluster_python={str(python)!r},"
        " airflow=False).start()\n"
        "print(json.dumps([state.ray_pid, state.s3_pid, *state.worker_pids, state.ray_temp_dir,"
        " *state.worker_temp_dirs]), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    started: set[int] = set()
    temp_dirs: list[str] = []
    try:
        assert owner.stdout is not None
        *pids, ray_temp_dir, w0, w1 = json.loads(owner.stdout.readline())
        temp_dirs = [ray_temp_dir, w0, w1]
        for pid in pids:
            started |= _tree(pid)
        assert len(started) > 10
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        left = _wait_gone(started, 60)
        assert left == set(), [(pid, _cmdline(pid)) for pid in left]
        deadline = time.monotonic() + 10
        while any(os.path.exists(d) for d in temp_dirs) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [d for d in temp_dirs if os.path.exists(d)], "the nodes' temp dirs are removed too"
    finally:
        for pid in _alive(started):
            stop_process_tree(pid, grace=2)
        if owner.poll() is None:
            owner.kill()
        for folder in temp_dirs:  # when the test failed before the reaper removed them
            shutil.rmtree(folder, ignore_errors=True)
