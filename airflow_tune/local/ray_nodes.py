"""The local stack's Ray nodes: the head and the worker nodes, each with its own ports, temp dir, log and environment,
all on 127.0.0.1; and what the head's dashboard says about them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from airflow_tune.local.ports import free_port_block, fresh_port, wait_http
from airflow_tune.local.processes import Processes, StackError
from airflow_tune.local.services import s3_endpoint, s3_env

# ``ray start`` for a worker node of a cluster on one host, on 127.0.0.1 like the head. Ray's CLI refuses to add a
# node while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with it at 1 rewrites 127.0.0.1 (the node's and the head's
# address) to the eth0 address, where the head, bound to 127.0.0.1, cannot be reached. So the node runs with the
# variable at 0 (no rewrite) and this shim lets only the CLI's refusal see it at 1. It runs in the cluster's own
# Python and changes nothing there; Ray's own ``cluster_utils.Cluster`` starts its extra nodes on 127.0.0.1 too.
WORKER_NODE_CLI = """\
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


@dataclass
class RayNodes:
    """How a stack's Ray nodes start (see :class:`~airflow_tune.local.stack.LocalStack` for the parameters), as
    processes of ``processes`` on ports none of ``taken`` (the stack's ports so far, which the new ones join)."""

    processes: Processes
    taken: set[int]
    num_cpus: int
    resources: dict[str, float]
    workers: int
    worker_cpus: int
    cluster_python: Path | None
    object_store_mb: int
    #: Ray's token (``RAY_AUTH_MODE=token``, as Ray 2.59+ has by default), or None for a cluster without auth.
    auth_token: str | None = None

    def python(self) -> str:
        """The Python the Ray nodes run: the cluster virtualenv's, or the one whose ``ray`` command is used."""
        if self.cluster_python is not None:
            return str(self.cluster_python)
        return str(Path(self.ray_exe()).parent / "python")

    def ray_exe(self) -> str:
        if self.cluster_python is not None:
            return str(self.cluster_python.parent / "ray")
        exe = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
        if exe is None:
            raise StackError("the 'ray' command was not found next to this Python")
        return exe

    def start(
        self, temp_dir: str, gcs_port: int, dashboard_port: int | None, s3_port: int, *, worker: int | None
    ) -> subprocess.Popen:
        """Start the head (``worker=None``) or worker node ``worker``, each with its own ports, temp dir and log."""
        taken = self.taken
        low, high = free_port_block(taken=taken)
        ports = {
            "--node-manager-port": fresh_port(taken),
            "--object-manager-port": fresh_port(taken),
            "--dashboard-agent-grpc-port": fresh_port(taken),
            "--dashboard-agent-listen-port": fresh_port(taken),
            "--metrics-export-port": fresh_port(taken),
            "--runtime-env-agent-port": fresh_port(taken),
            "--min-worker-port": low,
            "--max-worker-port": high,
        }
        if worker is None:
            args = [self.ray_exe(), "start", "--block", "--node-ip-address=127.0.0.1"]
            assert dashboard_port is not None
            ports = {
                "--port": gcs_port,
                "--dashboard-port": dashboard_port,
                "--ray-client-server-port": fresh_port(taken),
                **ports,
            }
            args += ["--head", "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--num-cpus={self.num_cpus}"]
            if self.resources:
                args.append(f"--resources={json.dumps(self.resources)}")
        else:
            args = [self.python(), "-c", WORKER_NODE_CLI, "start", "--block", "--node-ip-address=127.0.0.1"]
            args += [f"--address=127.0.0.1:{gcs_port}", f"--num-cpus={self.worker_cpus}"]
        args += ["--num-gpus=0", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
        if self.workers or worker is not None:
            args.append(f"--object-store-memory={self.object_store_mb * 1024 * 1024}")
        args += [f"{flag}={value}" for flag, value in ports.items()]
        log_name = "ray.log" if worker is None else f"ray-worker-{worker}.log"
        # A node of the separate cluster starts in its own folder: a job's ``python -m`` puts the working folder on
        # sys.path, and this one (a checkout of airflow-tune, say) must not be importable there.
        cwd = temp_dir if self.cluster_python is not None else None
        return self.processes.spawn(args, log_name, self.env(temp_dir, s3_port), cwd=cwd)

    def env(self, temp_dir: str, s3_port: int) -> dict[str, str]:
        ray_settings = {
            # Only the driver needs S3 settings; jobs inherit the head's environment, as on a real cluster
            # whose nodes carry their own credentials.
            **s3_env(s3_endpoint(s3_port)),
            **ray_auth_env(self.auth_token),
            # 0 keeps every node on 127.0.0.1 (else Ray rewrites it to the eth0 address); see WORKER_NODE_CLI.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # A local stack reports no usage. MLflow's (3.17) also sets and unsets an environment variable from its
            # own thread while a tracking request reads the environment: a request then fails now and then with
            # KeyError('_MLFLOW_TELEMETRY_SESSION_ID').
            "MLFLOW_DISABLE_TELEMETRY": "true",
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


def ray_auth_env(token: str | None) -> dict[str, str]:
    """Ray's auth settings for every node: token mode with the cluster's token, or auth disabled.

    Ray before token auth (2.43 and 2.50 among the supported releases) knows neither variable and ignores the
    clients' ``Authorization`` header: such a cluster runs without auth whatever the stack's ``auth``.
    """
    if token is None:
        return {"RAY_AUTH_MODE": "disabled"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def auth_headers(token: str | None) -> dict[str, str]:
    """What a client of the dashboard sends: ``Authorization: Bearer <token>`` when the cluster has a token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def alive_nodes(dashboard_url: str, timeout: float = 10.0, token: str | None = None) -> dict[str, dict]:
    """The ALIVE nodes of the cluster behind ``dashboard_url``, by node id (the dashboard's state API)."""
    url = f"{dashboard_url}/api/v0/nodes?limit=1000&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE"
    request = urllib.request.Request(url, headers=auth_headers(token))
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        body = json.load(resp)
    rows = body["data"]["result"]["result"]
    return {row["node_id"]: row for row in rows if row.get("state") == "ALIVE"}


def wait_new_node(
    dashboard_url: str,
    known: set[str],
    timeout: float,
    proc: subprocess.Popen | None = None,
    what: str = "Ray head node",
    token: str | None = None,
) -> str:
    """Wait until one ALIVE node not in ``known`` registers with the head; return its node id."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what} exited with code {proc.returncode} before it joined the cluster")
        try:
            new = set(alive_nodes(dashboard_url, token=token)) - known
        except (OSError, ValueError, KeyError) as exc:
            last, new = exc, set()
        if len(new) == 1:
            return new.pop()
        if len(new) > 1:
            raise StackError(f"{what}: more than one new node appeared ({sorted(new)})")
        time.sleep(0.25)
    raise StackError(f"{what} did not join the cluster within {timeout:.0f}s ({last or 'not listed'})")


def wait_jobs_api(
    dashboard_url: str, timeout: float, proc: subprocess.Popen | None = None, token: str | None = None
) -> None:
    """Wait until the dashboard answers, then until its Jobs API lists jobs (the job agent comes up after it) to a
    client with the cluster's token."""
    wait_http(f"{dashboard_url}/api/version", timeout, proc, "Ray dashboard")
    wait_http(f"{dashboard_url}/api/jobs/", timeout, None, "Ray Jobs API", headers=auth_headers(token), ok_below=400)
