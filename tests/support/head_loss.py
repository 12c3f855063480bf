"""Losing the head of a multi-node local stack and recreating it at the same address, as KubeRay recreates a head pod.

Measured with Ray 2.60 (no Redis, so the new GCS keeps no state): the worker nodes' raylets do not rejoin a new head
at the same address. They reconnect, the new GCS (a new cluster id) refuses them, and each raylet exits 27 to 57 s
after the loss ("GCS returned an authentication error. This may happen when GCS is not backed by a DB and
restarted"), whatever ``RAY_gcs_rpc_server_reconnect_timeout_s`` says (15 s changed nothing: the head is back
before it runs out); then ``ray start --block`` exits 1. A worker pod restarts then, and a new node joins: that is
:func:`restart_exited_workers`.

Call them from :func:`lasting_thread`: a node is told to stop when the thread that started it ends
(``PR_SET_PDEATHSIG`` is per thread), so nodes started from a test's short-lived thread die with it.

These reach into :class:`~airflow_tune.local.LocalStack`'s parts (its processes, its nodes, its workers): the
stack's own API knows no head but the first.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_tune.local import LocalStack
from airflow_tune.local.processes import stop_process_tree
from airflow_tune.local.ray_nodes import wait_jobs_api, wait_new_node
from airflow_tune.local.state import write_state

_LASTING: ThreadPoolExecutor | None = None


def lasting_thread() -> ThreadPoolExecutor:
    """One thread that lives as long as the test process: what it starts outlives the test that asked for it."""
    global _LASTING
    if _LASTING is None:
        _LASTING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="head-loss")
    return _LASTING


def kill_head(local: LocalStack) -> list[int]:
    """Lose the head as a machine is lost: SIGKILL its whole process tree (GCS, dashboard, job drivers), by id, and
    delete its temp dir. Return the process ids killed."""
    state = local.state
    assert state is not None
    [head] = [p for p in local._processes.started if p.pid == state.ray_pid]
    killed = stop_process_tree(head.pid, sig=signal.SIGKILL, grace=10)
    try:
        head.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    local._processes.forget(head)
    shutil.rmtree(state.ray_temp_dir, ignore_errors=True)
    return killed


def start_new_head(local: LocalStack, timeout: float = 90.0) -> str:
    """A new head at the lost one's GCS and dashboard ports (its other ports and its temp dir fresh), with the
    stack's settings and token; return its node id once its Jobs API answers."""
    state = local.state
    assert state is not None
    temp_dir = tempfile.mkdtemp(prefix="aft-ray-")
    local._processes.tell_reaper(f"dir {temp_dir}")
    proc = local._nodes.start(temp_dir, state.gcs_port, state.dashboard_port, state.s3_port, worker=None)
    state.ray_pid, state.ray_temp_dir = proc.pid, temp_dir
    wait_jobs_api(state.dashboard_url, timeout, proc, token=local.auth_token)
    state.head_node_id = wait_new_node(state.dashboard_url, set(), timeout, proc, token=local.auth_token)
    write_state(local.root, state)
    return state.head_node_id


def restart_exited_workers(local: LocalStack, timeout: float = 120.0) -> dict[int, float]:
    """Start each worker node again once its old process has exited by itself, as a restarted pod would: a new node
    (new temp dir and node id) with the same settings. Return, by worker index, when its old process was seen gone
    (``time.time()``)."""
    gone: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(gone) < len(local._workers):
        for index, proc in sorted(local._workers.items()):
            if index not in gone and proc.poll() is not None:
                gone[index] = time.time()
                local._processes.forget(proc)  # its pid may be anybody's now: never signalled again
                local.start_worker(index, timeout=timeout)
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker nodes {sorted(set(local._workers) - set(gone))} outlived their head")
        time.sleep(0.25)
    return gone


def saved_trials(experiment_uri: str) -> dict[object, tuple[str, int]]:
    """What the experiment state Tune last saved to storage says of each trial, by ``config["x"]``: its status and
    training iteration (every report of the test trainable carries a checkpoint). Empty before the first save."""
    from airflow_tune.common import storage

    names = storage.glob_names(experiment_uri, "experiment_state-")
    if not names:
        return {}
    saved = storage.read_json(f"{experiment_uri}/{names[-1]}")
    trials: dict[object, tuple[str, int]] = {}
    for state_json, metadata_json in saved["trial_data"]:
        trial, metadata = json.loads(state_json), json.loads(metadata_json)
        iteration = int((metadata.get("last_result") or {}).get("training_iteration") or 0)
        trials[trial["config"]["x"]] = (str(trial["status"]), iteration)
    return trials
