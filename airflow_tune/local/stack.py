"""A local Ray head and S3 endpoint on 127.0.0.1, for the demo, the tests and trying DAGs by hand.

Everything the stack starts runs in its own process group and is stopped by id; everything it writes stays
under its own folder (the Ray temp dir lives in a short folder under the system temp dir, because Ray's unix
socket paths must stay under 107 characters, and is removed on stop).

With ``workers=N`` it mirrors the production shape instead (docker/docker-compose.yaml): a Ray head that offers no
CPUs and N worker nodes joined with ``ray start --address``, each with its own temp dir, home folder and ports, all
run by the Python of a separate cluster virtualenv (``cluster_python``: Ray and the examples' packages; no Airflow,
no airflow-tune, no moto) with an environment that holds nothing of this one but the S3 settings. The Airflow side
reaches that cluster only through the dashboard URL and S3.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_BUCKET = "airflow-tune"
DEFAULT_REGION = "us-east-1"
# Not secrets: the local S3 endpoint accepts any key pair.
LOCAL_ACCESS_KEY = "local-access-key"
LOCAL_SECRET_KEY = "local-secret-key"  # noqa: S105

# ``ray start`` for a worker node of a cluster on one host, on 127.0.0.1 like the head. Ray's CLI refuses to add a
# node while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with it at 1 rewrites 127.0.0.1 (the node's and the head's
# address) to the eth0 address, where the head, bound to 127.0.0.1, cannot be reached. So the node runs with the
# variable at 0 (no rewrite) and this shim lets only the CLI's refusal see it at 1. It runs in the cluster's own
# Python and changes nothing there; Ray's own ``cluster_utils.Cluster`` starts its extra nodes on 127.0.0.1 too.
_WORKER_NODE_CLI = """\
import sys, types
import ray._private.ray_constants as constants
import ray.scripts.scripts as scripts
seen_by_cli = types.ModuleType(constants.__name__)
seen_by_cli.__dict__.update(vars(constants))
seen_by_cli.ENABLE_RAY_CLUSTER = True
scripts.ray_constants = seen_by_cli
sys.argv[0] = "ray"
sys.exit(scripts.main())
"""


class StackError(RuntimeError):
    """The local stack could not start or stop as asked."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port_block(
    size: int = 200, low: int = 20000, high: int = 32000, taken: set[int] | None = None
) -> tuple[int, int]:
    """A block of free ports for Ray's workers, below the ephemeral range the other ports come from.

    :param taken: ports already handed out (to another node's block): the new block avoids them.
    """
    taken = taken if taken is not None else set()
    for _ in range(50):
        start = random.randrange(low, high - size)
        block = range(start, start + size)
        if taken.intersection(block):
            continue
        if all(_port_is_free(p) for p in range(start, start + size, 7)) and _port_is_free(start + size - 1):
            taken.update(block)
            return start, start + size - 1
    raise StackError("no block of free ports found for Ray workers")


def _fresh_port(taken: set[int]) -> int:
    """A free port not handed out before by this stack (the OS may offer a port again until it is bound)."""
    for _ in range(100):
        port = free_port()
        if port not in taken:
            taken.add(port)
            return port
    raise StackError("no free port found")


def _wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what or url} exited with code {proc.returncode} before it served")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:  # any HTTP answer means it serves
            if exc.code < 500:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    raise StackError(f"{what or url} did not answer at {url} within {timeout:.0f}s: {last}")


def _stop_when_parent_dies() -> None:
    """Runs in the child before exec: the kernel sends it SIGTERM when the process that started it dies.

    ``ray start --block`` answers SIGTERM by stopping every Ray process it started, so a test run or demo killed
    with SIGKILL (or a CI time-out) leaves no Ray head behind.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_process_tree(pid: int, sig: int = signal.SIGTERM, grace: float = 10.0) -> list[int]:
    """Stop the process group led by ``pid`` and every descendant it spawned; return the ids that were stopped.

    Descendants are collected before the first signal: processes that start their own session (Ray job
    drivers do) leave the group, and would be reparented away from us once their parent exits.
    """
    pids = {pid, *_descendants(pid)}
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for other in pids - {pid}:
        try:
            os.kill(other, sig)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids |= set(_descendants(pid))
        if not any(_alive(p) for p in pids):
            break
        time.sleep(0.2)
    pids |= set(_descendants(pid))
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return sorted(pids)


def reap_when_owner_dies(poll_interval: float = 1.0) -> None:
    """The body of a stack's reaper process (multi-node stacks): stop every process of the stack's Ray nodes when the
    stack's owner dies.

    The owner writes the process id of each node it starts to the reaper's stdin (``dir <path>`` for each node's temp
    dir), and ``exit`` when it stops the nodes itself. End of input without ``exit`` means the owner died, however it
    died: the reaper then stops each node's whole process tree, as known from its last look (every ``poll_interval``
    seconds) and as found now, and removes the temp dirs. A node's own
    teardown cannot be relied on then: a worker node whose head is stopping at the same moment hangs in it, and its
    agents outlive it, blocked on reporting to the head that is gone.
    """
    import threading

    import psutil

    roots: set[int] = set()
    folders: list[str] = []
    seen: dict[int, float] = {}  # pid -> create time, so a reused pid is never signalled
    lock = threading.Lock()
    done = threading.Event()
    reap = threading.Event()

    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "exit":
                done.set()
                return
            with lock:
                if line.startswith("dir "):
                    folders.append(line[4:].rstrip("\n"))
                else:
                    roots.add(int(line))
        reap.set()
        done.set()

    def look() -> None:
        with lock:
            for root in list(roots):
                for pid in (root, *_descendants(root)):
                    try:
                        seen.setdefault(pid, psutil.Process(pid).create_time())
                    except psutil.NoSuchProcess:
                        pass

    threading.Thread(target=read, daemon=True).start()
    while not done.wait(poll_interval):
        look()
    if not reap.is_set():
        return
    look()
    procs = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class StackState:
    """What a running stack is: enough to reach it and to stop it from another process."""

    root: str
    ray_temp_dir: str
    ray_pid: int
    s3_pid: int
    gcs_port: int
    dashboard_port: int
    s3_port: int
    bucket: str
    airflow_home: str
    #: The multi-node shape (``workers=N``): worker node processes, temp dirs and Ray node ids, by worker index.
    worker_pids: list[int] = field(default_factory=list)
    worker_temp_dirs: list[str] = field(default_factory=list)
    worker_node_ids: list[str] = field(default_factory=list)
    head_node_id: str | None = None
    #: The Python every Ray node runs (the cluster virtualenv's), or None when Ray runs in this environment.
    cluster_python: str | None = None
    #: When each recorded process started (``psutil``'s create time, by pid), so ``down`` stops a recorded pid only
    #: while it is still the process the stack started: after a reboot the same pid may be anybody's.
    started_at: dict[str, float] = field(default_factory=dict)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def storage_uri(self) -> str:
        return f"s3://{self.bucket}/experiments"

    def s3_env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "AWS_DEFAULT_REGION": DEFAULT_REGION,
            "AWS_REGION": DEFAULT_REGION,
        }

    def airflow_env(self) -> dict[str, str]:
        conn = {"conn_type": "ray", "host": "127.0.0.1", "port": self.dashboard_port, "schema": "http"}
        return {
            "AIRFLOW_HOME": self.airflow_home,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW_CONN_RAY_DEFAULT": json.dumps(conn),
        }

    def env(self) -> dict[str, str]:
        """Environment for clients of the stack: Ray Jobs, S3 and Airflow."""
        return {
            **self.s3_env(),
            **self.airflow_env(),
            "RAY_AUTH_MODE": "disabled",
            "AIRFLOW_TUNE_DASHBOARD_URL": self.dashboard_url,
            "AIRFLOW_TUNE_STORAGE_URI": self.storage_uri,
        }


class LocalStack:
    """Start and stop a Ray head, an S3 endpoint with one bucket, and an Airflow home, all under ``root``.

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
    """

    STATE_FILE = "stack.json"

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
        self.state: StackState | None = None
        self._procs: list[subprocess.Popen] = []
        self._workers: dict[int, subprocess.Popen] = {}
        self._ports: set[int] = set()
        self._reaper: subprocess.Popen | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> StackState:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> StackState:
        if self.state is not None:
            return self.state
        if self.cluster_python is not None and not os.access(self._ray_exe(), os.X_OK):
            raise StackError(
                f"no 'ray' command beside the cluster Python {self.cluster_python}: build the cluster virtualenv "
                "first (make cluster-venv)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        ray_temp_dir = tempfile.mkdtemp(prefix="aft-ray-")
        airflow_home = self.airflow_home
        try:
            if self.workers and not self.outlive_owner:
                self._start_reaper()
            self._tell_reaper(f"dir {ray_temp_dir}")
            s3_port = _fresh_port(self._ports)
            s3_proc = self._start_s3(s3_port)
            gcs_port, dashboard_port = _fresh_port(self._ports), _fresh_port(self._ports)
            ray_proc = self._start_ray(ray_temp_dir, gcs_port, dashboard_port, s3_port)
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
            )
            _wait_http(f"{self.state.s3_endpoint}/", 30, s3_proc, "S3 endpoint")
            self._create_bucket()
            if self.airflow:
                self._prepare_airflow_home(airflow_home)
            _wait_http(f"{self.state.dashboard_url}/api/version", timeout, ray_proc, "Ray dashboard")
            self._wait_ray_jobs_ready(timeout)
            if self.workers:
                self.state.head_node_id = self._wait_nodes(set(), timeout)
                for index in range(self.workers):
                    self.start_worker(index, timeout=timeout)
            self._write_state()
            return self.state
        except BaseException:
            self.stop()
            raise

    def stop(self) -> list[int]:
        """Stop what this stack started; return the process ids it stopped."""
        stopped: list[int] = []
        # Workers first, then the head and the S3 endpoint: a worker whose head is gone waits for it.
        procs = [p for p in reversed(self._procs) if p in self._workers.values()]
        procs += [p for p in reversed(self._procs) if p not in procs]
        for proc in procs:
            stopped += stop_process_tree(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        self._workers.clear()
        if self._reaper is not None:
            try:
                assert self._reaper.stdin is not None
                self._reaper.stdin.write("exit\n")
                self._reaper.stdin.close()
                self._reaper.wait(timeout=10)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self._reaper.kill()
            self._reaper = None
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
        self._tell_reaper(f"dir {temp_dir}")
        proc = self._start_ray_node(temp_dir, state.gcs_port, None, state.s3_port, worker=index)
        self._workers[index] = proc
        if index == len(state.worker_pids):
            state.worker_pids.append(proc.pid)
            state.worker_temp_dirs.append(temp_dir)
            state.worker_node_ids.append("")
        else:
            shutil.rmtree(state.worker_temp_dirs[index], ignore_errors=True)
            state.worker_pids[index] = proc.pid
            state.worker_temp_dirs[index] = temp_dir
        node_id = self._wait_nodes(known, timeout, proc, f"Ray worker node {index}")
        state.worker_node_ids[index] = node_id
        self._write_state()
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
        self._procs.remove(proc)
        shutil.rmtree(state.worker_temp_dirs[index], ignore_errors=True)
        self._write_state()
        return killed

    def alive_nodes(self) -> dict[str, dict]:
        """The cluster's ALIVE nodes, by node id, as the dashboard's state API lists them."""
        assert self.state is not None
        return alive_nodes(self.state.dashboard_url)

    def _wait_nodes(
        self, known: set[str], timeout: float, proc: subprocess.Popen | None = None, what: str = "Ray head node"
    ) -> str:
        """Wait until one ALIVE node not in ``known`` registers with the head; return its node id."""
        assert self.state is not None
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise StackError(f"{what} exited with code {proc.returncode} before it joined the cluster")
            try:
                new = set(self.alive_nodes()) - known
            except (OSError, ValueError, KeyError) as exc:
                last, new = exc, set()
            if len(new) == 1:
                return new.pop()
            if len(new) > 1:
                raise StackError(f"{what}: more than one new node appeared ({sorted(new)})")
            time.sleep(0.25)
        raise StackError(f"{what} did not join the cluster within {timeout:.0f}s ({last or 'not listed'})")

    # -- pieces ------------------------------------------------------------------------------------------------
    def _spawn(self, args: list[str], log_name: str, env: dict[str, str], cwd: str | None = None) -> subprocess.Popen:
        log = open(self.root / "logs" / log_name, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=None if self.outlive_owner else _stop_when_parent_dies,
        )
        log.close()
        self._procs.append(proc)
        self._tell_reaper(str(proc.pid))
        return proc

    def _tell_reaper(self, line: str) -> None:
        if self._reaper is not None and self._reaper.stdin is not None:
            self._reaper.stdin.write(f"{line}\n")
            self._reaper.stdin.flush()

    def _start_reaper(self) -> None:
        """A process that stops every Ray node of this stack if this process dies (see reap_when_owner_dies)."""
        log = open(self.root / "logs" / "reaper.log", "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self._reaper = subprocess.Popen(
            [sys.executable, "-c", "from airflow_tune.local.stack import reap_when_owner_dies; reap_when_owner_dies()"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        log.close()

    def _start_s3(self, port: int) -> subprocess.Popen:
        exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
        if exe is None:
            raise StackError("moto_server not found: install the 'local' extra (pip install 'airflow-tune[local]')")
        return self._spawn([exe, "-H", "127.0.0.1", "-p", str(port)], "s3.log", dict(os.environ))

    def _python(self) -> str:
        """The Python the Ray nodes run: the cluster virtualenv's, or the one whose ``ray`` command is used."""
        if self.cluster_python is not None:
            return str(self.cluster_python)
        return str(Path(self._ray_exe()).parent / "python")

    def _ray_exe(self) -> str:
        if self.cluster_python is not None:
            return str(self.cluster_python.parent / "ray")
        exe = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
        if exe is None:
            raise StackError("the 'ray' command was not found next to this Python")
        return exe

    def _start_ray(self, temp_dir: str, gcs_port: int, dashboard_port: int, s3_port: int) -> subprocess.Popen:
        return self._start_ray_node(temp_dir, gcs_port, dashboard_port, s3_port, worker=None)

    def _start_ray_node(
        self, temp_dir: str, gcs_port: int, dashboard_port: int | None, s3_port: int, *, worker: int | None
    ) -> subprocess.Popen:
        """The head (``worker=None``) or worker node ``worker``, each with its own ports, temp dir and log."""
        low, high = _free_port_block(taken=self._ports)
        ports = {
            "--node-manager-port": _fresh_port(self._ports),
            "--object-manager-port": _fresh_port(self._ports),
            "--dashboard-agent-grpc-port": _fresh_port(self._ports),
            "--dashboard-agent-listen-port": _fresh_port(self._ports),
            "--metrics-export-port": _fresh_port(self._ports),
            "--runtime-env-agent-port": _fresh_port(self._ports),
            "--min-worker-port": low,
            "--max-worker-port": high,
        }
        if worker is None:
            args = [self._ray_exe(), "start", "--block", "--node-ip-address=127.0.0.1"]
            assert dashboard_port is not None
            ports = {
                "--port": gcs_port,
                "--dashboard-port": dashboard_port,
                "--ray-client-server-port": _fresh_port(self._ports),
                **ports,
            }
            args += ["--head", "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--num-cpus={self.num_cpus}"]
            if self.resources:
                args.append(f"--resources={json.dumps(self.resources)}")
        else:
            args = [self._python(), "-c", _WORKER_NODE_CLI, "start", "--block", "--node-ip-address=127.0.0.1"]
            args += [f"--address=127.0.0.1:{gcs_port}", f"--num-cpus={self.worker_cpus}"]
        args += ["--num-gpus=0", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
        if self.workers or worker is not None:
            args.append(f"--object-store-memory={self.object_store_mb * 1024 * 1024}")
        args += [f"{flag}={value}" for flag, value in ports.items()]
        log_name = "ray.log" if worker is None else f"ray-worker-{worker}.log"
        # A node of the separate cluster starts in its own folder: a job's ``python -m`` puts the working folder on
        # sys.path, and this one (a checkout of airflow-tune, say) must not be importable there.
        cwd = temp_dir if self.cluster_python is not None else None
        return self._spawn(args, log_name, self._ray_env(temp_dir, s3_port), cwd=cwd)

    def _ray_env(self, temp_dir: str, s3_port: int) -> dict[str, str]:
        ray_settings = {
            # Only the driver needs S3 settings; jobs inherit the head's environment, as on a real cluster
            # whose nodes carry their own credentials.
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
            "AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "AWS_DEFAULT_REGION": DEFAULT_REGION,
            "AWS_REGION": DEFAULT_REGION,
            "RAY_AUTH_MODE": "disabled",
            # 0 keeps every node on 127.0.0.1 (else Ray rewrites it to the eth0 address); see _WORKER_NODE_CLI.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "TMPDIR": temp_dir,
        }
        if self.workers:
            # A stopped node shuts down at once. Ray 2.60 first drains it through the head, which may be stopping at
            # the same time (its owner died): the drain then waits out its timeout and leaves the node's agents
            # running without their raylet.
            ray_settings["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
        if self.cluster_python is None:
            return {
                **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")},
                **ray_settings,
                # Job entrypoints say "python": on this head that must be the Python Ray runs in, as on a cluster
                # image.
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            }
        # A node of the separate cluster: nothing of this environment but what a cluster image would hold too.
        home = Path(temp_dir) / "home"
        home.mkdir(exist_ok=True)
        venv_bin = self.cluster_python.parent
        return {
            **ray_settings,
            "PATH": os.pathsep.join([str(venv_bin), "/usr/local/bin", "/usr/bin", "/bin"]),
            "VIRTUAL_ENV": str(venv_bin.parent),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }

    def _create_bucket(self) -> None:
        import boto3

        assert self.state is not None
        s3 = boto3.client(
            "s3",
            endpoint_url=self.state.s3_endpoint,
            aws_access_key_id=LOCAL_ACCESS_KEY,
            aws_secret_access_key=LOCAL_SECRET_KEY,
            region_name=DEFAULT_REGION,
        )
        s3.create_bucket(Bucket=self.bucket)

    def _wait_ray_jobs_ready(self, timeout: float) -> None:
        """The dashboard answers before its job agent does; wait until the Jobs API lists jobs."""
        assert self.state is not None
        _wait_http(f"{self.state.dashboard_url}/api/jobs/", timeout, None, "Ray Jobs API")

    def _prepare_airflow_home(self, airflow_home: Path) -> None:
        airflow_home.mkdir(parents=True, exist_ok=True)
        assert self.state is not None
        env = {**os.environ, **self.state.airflow_env()}
        exe = shutil.which("airflow", path=str(Path(sys.executable).parent)) or "airflow"
        marker = airflow_home / ".migrated"
        if marker.exists():
            return
        result = subprocess.run(
            [exe, "db", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            start_new_session=True,
        )
        if result.returncode != 0:
            raise StackError(f"airflow db migrate failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        marker.touch()

    def _write_state(self) -> None:
        assert self.state is not None
        pids = (self.state.ray_pid, self.state.s3_pid, *self.state.worker_pids)
        self.state.started_at = {str(pid): t for pid in pids if (t := process_started_at(pid)) is not None}
        state_file = self.root / self.STATE_FILE
        state_file.write_text(json.dumps(asdict(self.state), indent=2))


def alive_nodes(dashboard_url: str, timeout: float = 10.0) -> dict[str, dict]:
    """The ALIVE nodes of the cluster behind ``dashboard_url``, by node id (the dashboard's state API)."""
    url = f"{dashboard_url}/api/v0/nodes?limit=1000&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = json.load(resp)
    rows = body["data"]["result"]["result"]
    return {row["node_id"]: row for row in rows if row.get("state") == "ALIVE"}


def load_state(root: str | os.PathLike[str]) -> StackState | None:
    state_file = Path(root) / LocalStack.STATE_FILE
    if not state_file.exists():
        return None
    return StackState(**json.loads(state_file.read_text()))


def process_started_at(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def is_recorded_process(state: StackState, pid: int) -> bool:
    """Whether ``pid`` is still the process the stack recorded: alive, and started when it was recorded as started.

    A state file without start times (written before they were kept) is trusted as before.
    """
    if not _alive(pid):
        return False
    recorded = state.started_at.get(str(pid))
    if recorded is None:
        return not state.started_at
    now = process_started_at(pid)
    return now is not None and abs(now - recorded) < 1.0


def stop_from_state(root: str | os.PathLike[str]) -> list[int]:
    """Stop a stack started by another process (``up``), by the process ids it recorded, each only while it is still
    the process that was started (a stale state file, e.g. after a reboot, must not stop anybody else's process)."""
    state = load_state(root)
    if state is None:
        return []
    stopped = []
    for pid in (*state.worker_pids, state.ray_pid, state.s3_pid):
        if is_recorded_process(state, pid):
            stopped += stop_process_tree(pid)
        elif _alive(pid):
            print(f"pid {pid} is not the process the stack started (it started at another time): left alone")
    for folder in (state.ray_temp_dir, *state.worker_temp_dirs):
        shutil.rmtree(folder, ignore_errors=True)
    (Path(root) / LocalStack.STATE_FILE).unlink(missing_ok=True)
    return stopped
