"""A local Ray head and S3 endpoint on 127.0.0.1, for the demo, the tests and trying DAGs by hand.

Everything the stack starts runs in its own process group and is stopped by id; everything it writes stays
under its own folder (the Ray temp dir lives in a short folder under the system temp dir, because Ray's unix
socket paths must stay under 107 characters, and is removed on stop).

With ``workers=N`` it mirrors the production shape instead (docker/docker-compose.yaml): a Ray head that offers no
CPUs and N worker nodes joined with ``ray start --address``, each with its own temp dir, home folder and ports, all
run by the Python of a separate cluster virtualenv (``cluster_python``: Ray and the examples' packages; no Airflow,
no airflow-tune, no moto) with an environment that holds nothing of this one but the S3 settings. The Airflow side
reaches that cluster only through the dashboard URL and S3.

:class:`LocalStack` composes the parts: ``processes`` (spawning, stopping by id, the reaper), ``ports``,
``ray_nodes`` (the head and the worker nodes), ``services`` (the S3 endpoint, the Airflow home) and ``state`` (the
state file that ``python -m airflow_tune.local`` works from).

With ``mlflow_python`` the stack also runs an MLflow tracking server (``mlflow server``, from a virtualenv of its
own) on 127.0.0.1: its SQLite store under the stack's folder, its artifacts on the stack's S3 endpoint, its URL in
the state (``mlflow_url``), in the clients' environment (``MLFLOW_TRACKING_URI``) and in the Airflow connection
``mlflow_default``. Only stacks that ask for it start it: it takes seconds to start, and most tests do not use it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from airflow_tune.local.ports import free_port, fresh_port, wait_http
from airflow_tune.local.processes import Processes, StackError, process_started_at, stop_process_tree
from airflow_tune.local.ray_nodes import RayNodes, alive_nodes, wait_jobs_api, wait_new_node
from airflow_tune.local.services import (
    DEFAULT_BUCKET,
    DEFAULT_REGION,
    LOCAL_ACCESS_KEY,
    LOCAL_SECRET_KEY,
    create_bucket,
    prepare_airflow_home,
    start_mlflow,
    start_s3,
)
from airflow_tune.local.state import (
    STATE_FILE,
    StackState,
    is_recorded_process,
    load_state,
    stop_from_state,
    write_state,
)

log = logging.getLogger(__name__)

#: Seconds the MLflow server may take to answer: it imports MLflow twice (the CLI, then its uvicorn worker) and
#: creates its database's tables: 24 to 32 s on this project's 2-core machine beside another test run, 88 s inside a
#: full test run.
MLFLOW_START_TIMEOUT = 240.0

# The names this module has always offered, wherever they live now.
__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_REGION",
    "LOCAL_ACCESS_KEY",
    "LOCAL_SECRET_KEY",
    "LocalStack",
    "StackError",
    "StackState",
    "alive_nodes",
    "free_port",
    "is_recorded_process",
    "load_state",
    "process_started_at",
    "stop_from_state",
    "stop_process_tree",
]


class LocalStack:
    """Start and stop a Ray head, an S3 endpoint with one bucket, and an Airflow home (and an MLflow tracking server,
    when asked), all under ``root``.

    :param root: folder for the stack's state, logs and Airflow home; created if missing.
    :param num_cpus: CPUs the Ray head offers (give 0 with ``workers``, so that no trial runs on the head).
    :param bucket: the bucket created on the S3 endpoint.
    :param resources: custom resources the Ray head offers (for tests of custom resource requests).
    :param airflow: also prepare an Airflow home with a migrated sqlite database.
    :param outlive_owner: keep the services running when this process exits (``up`` from the command line); by
        default they are told to stop when their owner dies, however it dies (SIGKILL included).
    :param workers: Ray worker nodes joined to the head, each a node of its own (own temp dir, home and ports).
    :param worker_cpus: CPUs each worker node offers.
    :param cluster_python: the Python of a separate cluster virtualenv that every Ray node runs (its ``ray``
        command sits beside it). The nodes then get a clean environment: that virtualenv's ``bin`` on PATH, a home
        folder each, the S3 settings and Ray's, and nothing else of this process's environment.
    :param object_store_mb: cap on each worker node's (and, with workers, the head's) object store, in MiB.
    :param airflow_home: the Airflow home to prepare (default ``root/airflow``).
    :param auth: Ray's token auth, on by default as in Ray 2.59+: every node runs with ``RAY_AUTH_MODE=token`` and a
        token of this stack's own (``state.auth_token``), which clients send as ``Authorization: Bearer``; the
        ``ray_default`` connection carries it as its password. ``False`` starts a cluster without auth.
    :param mlflow_python: the Python of the MLflow server's own virtualenv (``make mlflow-venv``; its ``mlflow``
        command sits beside it): the stack then also runs a tracking server, started and stopped with the rest.
    """

    STATE_FILE = STATE_FILE

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        num_cpus: int = 2,
        bucket: str = DEFAULT_BUCKET,
        resources: dict[str, float] | None = None,
        airflow: bool = True,
        outlive_owner: bool = False,
        workers: int = 0,
        worker_cpus: int = 1,
        cluster_python: str | os.PathLike[str] | None = None,
        object_store_mb: int = 256,
        airflow_home: str | os.PathLike[str] | None = None,
        auth: bool = True,
        mlflow_python: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.outlive_owner = outlive_owner
        self.num_cpus = num_cpus
        self.bucket = bucket
        self.resources = resources or {}
        self.airflow = airflow
        self.workers = workers
        self.worker_cpus = worker_cpus
        self.cluster_python = Path(cluster_python).absolute() if cluster_python else None
        self.object_store_mb = object_store_mb
        self.airflow_home = Path(airflow_home).resolve() if airflow_home else self.root / "airflow"
        self.mlflow_python = Path(mlflow_python).absolute() if mlflow_python else None
        self.state: StackState | None = None
        # Token auth on, as Ray 2.59+ has by default: a token of this stack's own, for every node and client.
        self.auth_token = secrets.token_hex(24) if auth else None
        self._processes = Processes(self.root / "logs", outlive_owner=outlive_owner)
        self._ports: set[int] = set()
        self._nodes = RayNodes(
            processes=self._processes,
            taken=self._ports,
            num_cpus=num_cpus,
            resources=self.resources,
            workers=workers,
            worker_cpus=worker_cpus,
            cluster_python=self.cluster_python,
            object_store_mb=object_store_mb,
            auth_token=self.auth_token,
        )
        self._workers: dict[int, subprocess.Popen] = {}

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> StackState:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> StackState:
        if self.state is not None:
            return self.state
        if self.cluster_python is not None and not os.access(self._nodes.ray_exe(), os.X_OK):
            raise StackError(
                f"no 'ray' command beside the cluster Python {self.cluster_python}: build the cluster virtualenv "
                "first (make cluster-venv)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        ray_temp_dir = tempfile.mkdtemp(prefix="aft-ray-")
        airflow_home = self.airflow_home
        try:
            # The reaper also watches the MLflow server's tree: `mlflow server` runs uvicorn as a child, and only the
            # CLI is told of its owner's death. MLflow 3.17 forwards that SIGTERM to it; the reaper stops the tree
            # (SIGKILL after 10 s) whatever a release or a stuck worker does.
            if (self.workers or self.mlflow_python) and not self.outlive_owner:
                self._processes.start_reaper()
            self._processes.tell_reaper(f"dir {ray_temp_dir}")
            s3_port = fresh_port(self._ports)
            s3_proc = start_s3(self._processes, s3_port)
            gcs_port, dashboard_port = fresh_port(self._ports), fresh_port(self._ports)
            ray_proc = self._nodes.start(ray_temp_dir, gcs_port, dashboard_port, s3_port, worker=None)
            self.state = StackState(
                root=str(self.root),
                ray_temp_dir=ray_temp_dir,
                ray_pid=ray_proc.pid,
                s3_pid=s3_proc.pid,
                gcs_port=gcs_port,
                dashboard_port=dashboard_port,
                s3_port=s3_port,
                bucket=self.bucket,
                airflow_home=str(airflow_home),
                cluster_python=str(self.cluster_python) if self.cluster_python else None,
                auth_token=self.auth_token,
            )
            wait_http(f"{self.state.s3_endpoint}/", 30, s3_proc, "S3 endpoint")
            create_bucket(self.state.s3_endpoint, self.bucket)
            mlflow_proc = None
            if self.mlflow_python is not None:
                # Started now and waited for last: it comes up while Ray does.
                self.state.mlflow_port = fresh_port(self._ports)
                mlflow_proc = start_mlflow(
                    self._processes,
                    self.mlflow_python,
                    self.state.mlflow_port,
                    self.root / "mlflow",
                    self.state.s3_endpoint,
                    self.bucket,
                )
                self.state.mlflow_pid = mlflow_proc.pid
            if self.airflow:
                prepare_airflow_home(airflow_home, self.state.airflow_env())
            self._head_serving(ray_proc, timeout)
            if self.workers:
                self.state.head_node_id = wait_new_node(self.state.dashboard_url, set(), timeout, token=self.auth_token)
                for index in range(self.workers):
                    self.start_worker(index, timeout=timeout)
            if mlflow_proc is not None:
                wait = max(timeout, MLFLOW_START_TIMEOUT)
                wait_http(f"{self.state.mlflow_url}/health", wait, mlflow_proc, "MLflow server", ok_below=400)
            write_state(self.root, self.state)
            return self.state
        except BaseException:
            self.stop()
            raise

    def _head_serving(self, ray_proc: subprocess.Popen, timeout: float) -> None:
        """Wait for the head's Jobs API. A head whose ``ray start`` gave up on its dashboard (Ray before 2.60 waits
        20 s for it, which a loaded machine can exceed) is started once more, on fresh ports."""
        state = self.state
        assert state is not None
        try:
            wait_jobs_api(state.dashboard_url, timeout, ray_proc, token=self.auth_token)
            return
        except StackError as exc:
            if ray_proc.poll() is None:
                raise
            log.warning("The Ray head did not start (%s); starting it once more", exc)
        shutil.rmtree(state.ray_temp_dir, ignore_errors=True)
        os.makedirs(state.ray_temp_dir)
        state.gcs_port, state.dashboard_port = fresh_port(self._ports), fresh_port(self._ports)
        ports = (state.gcs_port, state.dashboard_port, state.s3_port)
        ray_proc = self._nodes.start(state.ray_temp_dir, *ports, worker=None)
        state.ray_pid = ray_proc.pid
        wait_jobs_api(state.dashboard_url, timeout, ray_proc, token=self.auth_token)

    def stop(self) -> list[int]:
        """Stop what this stack started; return the process ids it stopped."""
        # Workers first, then the head and the S3 endpoint: a worker whose head is gone waits for it.
        stopped = self._processes.stop(first=list(self._workers.values()))
        self._workers.clear()
        if self.state is not None:
            for folder in [self.state.ray_temp_dir, *self.state.worker_temp_dirs]:
                shutil.rmtree(folder, ignore_errors=True)
        state_file = self.root / self.STATE_FILE
        if state_file.exists():
            state_file.unlink()
        self.state = None
        return stopped

    # -- worker nodes ------------------------------------------------------------------------------------------
    def start_worker(self, index: int, timeout: float = 90.0) -> str:
        """Start worker node ``index`` (again, after :meth:`kill_worker`) and return its Ray node id once it is alive.

        :param index: the worker's place in ``state.worker_*`` lists; ``len(state.worker_pids)`` adds a worker.
        """
        state = self.state
        if state is None:
            raise StackError("the stack is not started")
        if index in self._workers and self._workers[index].poll() is None:
            raise StackError(f"worker {index} is running")
        if index > len(state.worker_pids):
            raise StackError(f"no worker {index - 1} yet: add workers in order")
        known = set(state.worker_node_ids) | ({state.head_node_id} if state.head_node_id else set())
        temp_dir = tempfile.mkdtemp(prefix=f"aft-w{index}-")
        self._processes.tell_reaper(f"dir {temp_dir}")
        proc = self._nodes.start(temp_dir, state.gcs_port, None, state.s3_port, worker=index)
        self._workers[index] = proc
        if index == len(state.worker_pids):
            state.worker_pids.append(proc.pid)
            state.worker_temp_dirs.append(temp_dir)
            state.worker_node_ids.append("")
        else:
            shutil.rmtree(state.worker_temp_dirs[index], ignore_errors=True)
            state.worker_pids[index] = proc.pid
            state.worker_temp_dirs[index] = temp_dir
        node_id = wait_new_node(state.dashboard_url, known, timeout, proc, f"Ray worker node {index}", self.auth_token)
        state.worker_node_ids[index] = node_id
        write_state(self.root, state)
        return node_id

    def kill_worker(self, index: int) -> list[int]:
        """Lose worker node ``index`` as a machine is lost: SIGKILL every process of it, by id, and delete its temp dir
        (so nothing it wrote locally can reach another node). Return the process ids killed."""
        state = self.state
        proc = self._workers.pop(index, None)
        if state is None or proc is None:
            raise StackError(f"no worker {index} runs")
        killed = stop_process_tree(proc.pid, sig=signal.SIGKILL, grace=10)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._processes.forget(proc)
        shutil.rmtree(state.worker_temp_dirs[index], ignore_errors=True)
        write_state(self.root, state)
        return killed

    def alive_nodes(self) -> dict[str, dict]:
        """The cluster's ALIVE nodes, by node id, as the dashboard's state API lists them."""
        assert self.state is not None
        return alive_nodes(self.state.dashboard_url, token=self.auth_token)
