"""A local Ray head and S3 endpoint on 127.0.0.1, for the demo, the tests and trying DAGs by hand.

Everything the stack starts runs in its own process group and is stopped by id; everything it writes stays
under its own folder (the Ray temp dir lives in a short folder under the system temp dir, because Ray's unix
socket paths must stay under 107 characters, and is removed on stop).
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
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_BUCKET = "airflow-tune"
DEFAULT_REGION = "us-east-1"
# Not secrets: the local S3 endpoint accepts any key pair.
LOCAL_ACCESS_KEY = "local-access-key"
LOCAL_SECRET_KEY = "local-secret-key"  # noqa: S105


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


def _free_port_block(size: int = 200, low: int = 20000, high: int = 32000) -> tuple[int, int]:
    """A block of free ports for Ray's workers, below the ephemeral range the other ports come from."""
    for _ in range(50):
        start = random.randrange(low, high - size)
        if all(_port_is_free(p) for p in range(start, start + size, 7)) and _port_is_free(start + size - 1):
            return start, start + size - 1
    raise StackError("no block of free ports found for Ray workers")


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
    :param num_cpus: CPUs the Ray head offers.
    :param bucket: the bucket created on the S3 endpoint.
    :param resources: custom resources the Ray head offers (for tests of custom resource requests).
    :param airflow: also prepare an Airflow home with a migrated sqlite database.
    :param outlive_owner: keep the services running when this process exits (``up`` from the command line); by
        default they are told to stop when their owner dies, however it dies (SIGKILL included).
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
    ) -> None:
        self.root = Path(root).resolve()
        self.outlive_owner = outlive_owner
        self.num_cpus = num_cpus
        self.bucket = bucket
        self.resources = resources or {}
        self.airflow = airflow
        self.state: StackState | None = None
        self._procs: list[subprocess.Popen] = []

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> StackState:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> StackState:
        if self.state is not None:
            return self.state
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        ray_temp_dir = tempfile.mkdtemp(prefix="aft-ray-")
        airflow_home = self.root / "airflow"
        try:
            s3_port = free_port()
            s3_proc = self._start_s3(s3_port)
            gcs_port, dashboard_port = free_port(), free_port()
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
            )
            _wait_http(f"{self.state.s3_endpoint}/", 30, s3_proc, "S3 endpoint")
            self._create_bucket()
            if self.airflow:
                self._prepare_airflow_home(airflow_home)
            _wait_http(f"{self.state.dashboard_url}/api/version", timeout, ray_proc, "Ray dashboard")
            self._wait_ray_jobs_ready(timeout)
            self._write_state()
            return self.state
        except BaseException:
            self.stop()
            raise

    def stop(self) -> list[int]:
        """Stop what this stack started; return the process ids it stopped."""
        stopped: list[int] = []
        for proc in reversed(self._procs):
            stopped += stop_process_tree(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        if self.state is not None:
            shutil.rmtree(self.state.ray_temp_dir, ignore_errors=True)
        state_file = self.root / self.STATE_FILE
        if state_file.exists():
            state_file.unlink()
        self.state = None
        return stopped

    # -- pieces ------------------------------------------------------------------------------------------------
    def _spawn(self, args: list[str], log_name: str, env: dict[str, str]) -> subprocess.Popen:
        log = open(self.root / "logs" / log_name, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=None if self.outlive_owner else _stop_when_parent_dies,
        )
        log.close()
        self._procs.append(proc)
        return proc

    def _start_s3(self, port: int) -> subprocess.Popen:
        exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
        if exe is None:
            raise StackError("moto_server not found: install the 'local' extra (pip install 'airflow-tune[local]')")
        return self._spawn([exe, "-H", "127.0.0.1", "-p", str(port)], "s3.log", dict(os.environ))

    def _start_ray(self, temp_dir: str, gcs_port: int, dashboard_port: int, s3_port: int) -> subprocess.Popen:
        exe = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
        if exe is None:
            raise StackError("the 'ray' command was not found next to this Python")
        low, high = _free_port_block()
        ports = {
            "--port": gcs_port,
            "--dashboard-port": dashboard_port,
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--ray-client-server-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--metrics-export-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--min-worker-port": low,
            "--max-worker-port": high,
        }
        args = [
            exe, "start", "--head", "--block",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ]  # fmt: skip
        if self.resources:
            args.append(f"--resources={json.dumps(self.resources)}")
        args += [f"{flag}={value}" for flag, value in ports.items()]
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")},
            # Only the driver needs S3 settings; jobs inherit the head's environment, as on a real cluster
            # whose nodes carry their own credentials.
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
            "AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "AWS_DEFAULT_REGION": DEFAULT_REGION,
            "AWS_REGION": DEFAULT_REGION,
            "RAY_AUTH_MODE": "disabled",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "TMPDIR": temp_dir,
            # Job entrypoints say "python": on this head that must be the Python Ray runs in, as on a cluster image.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        return self._spawn(args, "ray.log", env)

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
        state_file = self.root / self.STATE_FILE
        state_file.write_text(json.dumps(asdict(self.state), indent=2))


def load_state(root: str | os.PathLike[str]) -> StackState | None:
    state_file = Path(root) / LocalStack.STATE_FILE
    if not state_file.exists():
        return None
    return StackState(**json.loads(state_file.read_text()))


def stop_from_state(root: str | os.PathLike[str]) -> list[int]:
    """Stop a stack started by another process (``up``), by the process ids it recorded."""
    state = load_state(root)
    if state is None:
        return []
    stopped = []
    for pid in (state.ray_pid, state.s3_pid):
        if _alive(pid):
            stopped += stop_process_tree(pid)
    shutil.rmtree(state.ray_temp_dir, ignore_errors=True)
    (Path(root) / LocalStack.STATE_FILE).unlink(missing_ok=True)
    return stopped
