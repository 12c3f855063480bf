"""``mlflow models serve`` of a registered model, as a deployment runs it: MLflow's own scoring server, started from
a given Python (the local stack's MLflow virtualenv) on 127.0.0.1 and a free port, stopped by its process id (its
workers with it) even when the caller fails. For the demo and the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from airflow_tune.local.ports import free_port, wait_http
from airflow_tune.local.processes import Processes, StackError

#: A cold start imports MLflow, FastAPI and the model's packages, then loads the model: tens of seconds on 2 cores.
SERVE_START_TIMEOUT = 180.0


@contextlib.contextmanager
def served_model(
    python: str | os.PathLike[str], model_uri: str, logs: Path, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """Serve ``model_uri`` (``models:/<name>@champion``, a folder, ``s3://...``) with ``mlflow models serve
    --env-manager local`` run by ``python``; yields the server's URL.

    :param python: a Python with MLflow (and the model's requirements) installed.
    :param model_uri: what to serve.
    :param logs: a folder for the server's log (``mlflow-serve.log``).
    :param env: the server's environment (``MLFLOW_TRACKING_URI``, S3 settings); the caller's by default.
    """
    logs.mkdir(parents=True, exist_ok=True)
    processes = Processes(logs, outlive_owner=False)
    processes.start_reaper()
    try:
        port = free_port()
        args = [str(python), "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
        args += ["-h", "127.0.0.1", "-p", str(port), "-w", "1"]
        environ = dict(env if env is not None else os.environ)
        # MLflow starts `uvicorn` by name: the one beside ``python`` (its virtualenv need not be activated).
        environ["PATH"] = os.pathsep.join([str(Path(python).parent), environ.get("PATH", "")])
        proc = processes.spawn(args, "mlflow-serve.log", environ)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/ping", SERVE_START_TIMEOUT, proc, f"mlflow models serve {model_uri}", ok_below=300)
        except StackError as exc:
            tail = (logs / "mlflow-serve.log").read_text(errors="replace").splitlines()[-15:]
            raise StackError(f"{exc}; its log ends:\n" + "\n".join(tail)) from None
        yield url
    finally:
        processes.stop()


def invocations(url: str, body: Mapping[str, Any], timeout: float = 60.0) -> Any:
    """POST ``body`` (e.g. ``{"inputs": [[...]]}``) to the scoring server's ``/invocations``; its JSON answer."""
    request = urllib.request.Request(
        f"{url}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())
