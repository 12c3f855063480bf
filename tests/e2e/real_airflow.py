"""The real Airflow processes (scheduler, triggerer, dag processor, API server) in an Airflow home of their own,
bound to 127.0.0.1, and a small client of the public REST API (``/api/v2``) that logs in like the UI does.

Each process runs in its own process group and is stopped by that group's id (and every descendant collected
before the signal); nothing here looks processes up by name.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from airflow_tune.local.stack import free_port, stop_process_tree

COMPONENTS = ("api-server", "dag-processor", "scheduler", "triggerer")
USERNAME = "e2e-admin"
# Variables of the test process that must not reach the Airflow processes.
_DROPPED_ENV = ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW_CONFIG", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")


class AirflowError(RuntimeError):
    """The Airflow processes did not start or answer as expected."""


def _airflow_exe() -> str:
    return shutil.which("airflow", path=str(Path(sys.executable).parent)) or "airflow"


class RealAirflow:
    """Start ``airflow db migrate`` then the four long-running components; stop them all by process group.

    :param home: the AIRFLOW_HOME to create (config, sqlite database, logs, passwords file).
    :param dags_folder: the DAGs folder the dag processor parses.
    :param env: extra environment (the stack's: Ray connection, S3 settings, ...).
    :param parallelism: the LocalExecutor's task slots.
    :param airflow: the ``airflow`` executable to run (another environment's, e.g. an older Airflow); by default
        the one beside this Python.
    """

    def __init__(
        self, home: Path, dags_folder: Path, env: dict[str, str], parallelism: int = 4, airflow: str | None = None
    ) -> None:
        self.airflow = airflow or _airflow_exe()
        self.home = Path(home)
        self.dags_folder = Path(dags_folder)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.password = secrets.token_urlsafe(12)
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids_seen: set[int] = set()
        self.timings: dict[str, float] = {}
        self.env = self._environment(env, parallelism)

    # -- configuration -----------------------------------------------------------------------------------------
    def _environment(self, extra: dict[str, str], parallelism: int) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in _DROPPED_ENV and not k.startswith(("PYTEST_", "AIRFLOW__", "AIRFLOW_CONN_"))
        }
        passwords = self.home / "passwords.json"
        return {
            **base,
            **extra,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            # The simple auth manager with one known admin: the test logs in through /auth/token like a user.
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            # One secret for every component that signs or checks JWTs (scheduler -> workers -> execution API).
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # Parse a new file at once and an unchanged one seldom (no test changes a DAG file while Airflow runs, and
            # reparsing every file every 10 s is CPU the suite's other tests wait for); schedule promptly.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__CAPACITY": "10",  # 3.3 renamed default_capacity (a DeprecationWarning otherwise)
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        }

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "component-logs").mkdir(exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({USERNAME: self.password}))
        started = time.monotonic()
        result = subprocess.run(
            [self.airflow, "db", "migrate"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            start_new_session=True,
        )
        if result.returncode != 0:
            raise AirflowError(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        self.timings["db migrate"] = time.monotonic() - started
        for name in COMPONENTS:
            args = [self.airflow, name]
            if name == "api-server":
                args += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
            elif name in ("scheduler", "triggerer"):
                # Their log servers bind every interface on fixed ports (8793, 8794): they would clash with any
                # other Airflow on the machine, and are not needed: the API server reads the log files directly.
                args.append("--skip-serve-logs")
            self.procs[name] = self._spawn(name, args)
        self.wait_healthy(timeout)
        self.timings["healthy"] = time.monotonic() - started

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.component_log(name), "ab")  # noqa: SIM115 - owned by the child for its lifetime
        try:
            return subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=str(self.home),
                start_new_session=True,
            )
        finally:
            log.close()

    def component_log(self, name: str) -> Path:
        return self.home / "component-logs" / f"{name}.log"

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AirflowError(f"airflow {name} exited with code {proc.returncode}\n{self.tail(name, 60)}")

    def wait_healthy(self, timeout: float) -> dict[str, Any]:
        """Wait until /api/v2/monitor/health reports the database, scheduler, triggerer and dag processor healthy."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                resp = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
                last = resp.json() if resp.status_code == 200 else resp.text
                if resp.status_code == 200 and all(
                    (last.get(part) or {}).get("status") == "healthy"
                    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
                ):
                    return last
            except (httpx.HTTPError, ValueError) as exc:
                last = exc
            time.sleep(1)
        raise AirflowError(f"Airflow not healthy within {timeout:.0f}s: {last}")

    def track(self) -> None:
        """Remember every process the components have started so far (checked once they are stopped)."""
        import psutil

        for proc in self.procs.values():
            self.pids_seen.add(proc.pid)
            try:
                self.pids_seen |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> list[int]:
        """Stop every component by its process group and descendants; return the pids still alive (should be none)."""
        import psutil

        self.track()

        def stop_one(name: str) -> None:
            proc = self.procs.get(name)
            if proc is None:
                return
            started = time.monotonic()
            self.pids_seen.update(stop_process_tree(proc.pid, grace=15.0))
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.timings[f"stop {name}"] = time.monotonic() - started

        # The API server last: tasks still running report their end through it. The other three stop side by
        # side (each may wait for its children: the triggerer's supervisor, the executor's workers).
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(stop_one, ("scheduler", "triggerer", "dag-processor")))
        stop_one("api-server")
        left = []
        for pid in sorted(self.pids_seen):
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        return left

    # -- diagnostics -------------------------------------------------------------------------------------------
    def tail(self, name: str, lines: int = 80) -> str:
        path = self.component_log(name)
        if not path.exists():
            return f"--- {name}: no log"
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- tail of {path}\n" + "\n".join(text)

    def task_log_files(self) -> list[Path]:
        logs = self.home / "logs"
        return sorted(p for p in logs.rglob("*.log*") if "dag_id=" in str(p)) if logs.exists() else []

    def diagnostics(self, lines: int = 60) -> str:
        parts = [self.tail(name, lines) for name in ("scheduler", "triggerer", "dag-processor", "api-server")]
        for path in self.task_log_files():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- tail of task log {path.relative_to(self.home)}\n" + "\n".join(text))
        return "\n".join(parts)


class ApiClient:
    """The public REST API with a JWT from the simple auth manager's ``POST /auth/token``."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base_url = base_url
        resp = httpx.post(f"{base_url}/auth/token", json={"username": username, "password": password}, timeout=30)
        if resp.status_code not in (200, 201):
            raise AirflowError(f"login failed: HTTP {resp.status_code} {resp.text[:500]}")
        token = resp.json()["access_token"]
        self.http = httpx.Client(
            base_url=f"{base_url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, path, **kwargs)

    def get_json(self, path: str, **kwargs: Any) -> Any:
        resp = self.http.get(path, **kwargs)
        if resp.status_code != 200:
            raise AirflowError(f"GET {path}: HTTP {resp.status_code} {resp.text[:1000]}")
        return resp.json()

    def unpause(self, dag_id: str) -> dict[str, Any]:
        resp = self.http.patch(f"/dags/{dag_id}", params={"update_mask": "is_paused"}, json={"is_paused": False})
        if resp.status_code != 200:
            raise AirflowError(f"unpause {dag_id}: HTTP {resp.status_code} {resp.text[:1000]}")
        return resp.json()

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> httpx.Response:
        """What the UI's trigger form posts: no logical date, the form's values as conf."""
        return self.http.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.get_json(f"/dags/{dag_id}/dagRuns/{run_id}")

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.get_json(f"/dags/{dag_id}/dagRuns")["dag_runs"])

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return self.get_json(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        data = self.get_json(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in data["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[Any]:
        data = self.get_json(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )
        return list(data.get("content") or [])

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> dict[str, Any]:
        return self.get_json(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}")

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self.get_json("/importErrors")["import_errors"])


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
