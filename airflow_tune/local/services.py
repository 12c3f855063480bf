"""The local stack's services beside Ray: the S3 endpoint (moto's server) with its bucket, the MLflow tracking server
(when the stack asks for one), and the Airflow home with its migrated database and the ``ray_default`` (and
``mlflow_default``) connection."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from airflow_tune.local.processes import Processes, StackError

DEFAULT_BUCKET = "airflow-tune"
DEFAULT_REGION = "us-east-1"
# Not secrets: the local S3 endpoint accepts any key pair.
LOCAL_ACCESS_KEY = "local-access-key"
LOCAL_SECRET_KEY = "local-secret-key"  # noqa: S105


# -- S3 ----------------------------------------------------------------------------------------------------------------
def s3_endpoint(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def s3_env(endpoint: str) -> dict[str, str]:
    """The S3 settings that point boto3 and pyarrow at ``endpoint`` with the local key pair."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
        "AWS_DEFAULT_REGION": DEFAULT_REGION,
        "AWS_REGION": DEFAULT_REGION,
    }


def start_s3(processes: Processes, port: int) -> subprocess.Popen:
    """Start moto's S3 server on 127.0.0.1:``port`` (state in memory only)."""
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if exe is None:
        raise StackError("moto_server not found: install the 'local' extra (pip install 'airflow-tune[local]')")
    return processes.spawn([exe, "-H", "127.0.0.1", "-p", str(port)], "s3.log", dict(os.environ))


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
        region_name=DEFAULT_REGION,
    )
    s3.create_bucket(Bucket=bucket)


# -- MLflow ------------------------------------------------------------------------------------------------------------
#: Where the tracking server keeps run artifacts: under this prefix of the stack's bucket.
MLFLOW_ARTIFACTS_PREFIX = "mlflow"


def mlflow_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def mlflow_server_args(mlflow_exe: str, port: int, folder: Path, bucket: str) -> list[str]:
    """``mlflow server`` on 127.0.0.1:``port``: its SQLite backend store in ``folder``, artifacts proxied to
    ``s3://<bucket>/mlflow``, one worker (the stack's clients are few)."""
    return [
        mlflow_exe,
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination",
        f"s3://{bucket}/{MLFLOW_ARTIFACTS_PREFIX}",
    ]


def mlflow_server_env(mlflow_python: Path, folder: Path, endpoint: str) -> dict[str, str]:
    """The server's whole environment: its virtualenv's ``bin`` on PATH, a home in ``folder``, the S3 settings (the
    server writes the artifacts) and nothing else of this process's environment."""
    venv_bin = mlflow_python.parent
    return {
        **s3_env(endpoint),
        # MLflow's S3 artifact store reads its endpoint from here.
        "MLFLOW_S3_ENDPOINT_URL": endpoint,
        # The server's job runner (GenAI evaluation jobs) is one process more, and nothing here submits jobs.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "PATH": os.pathsep.join([str(venv_bin), "/usr/local/bin", "/usr/bin", "/bin"]),
        "VIRTUAL_ENV": str(venv_bin.parent),
        "HOME": str(folder),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def start_mlflow(
    processes: Processes, mlflow_python: Path, port: int, folder: Path, endpoint: str, bucket: str
) -> subprocess.Popen:
    """Start an MLflow tracking server with the ``mlflow`` command beside ``mlflow_python`` (a virtualenv of its own:
    the server's pins are not Airflow's), keeping its store in ``folder`` and its artifacts on the S3 ``endpoint``."""
    exe = mlflow_python.parent / "mlflow"
    if not os.access(exe, os.X_OK):
        raise StackError(
            f"no 'mlflow' command beside {mlflow_python}: build the MLflow server's virtualenv first (make mlflow-venv)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    args = mlflow_server_args(str(exe), port, folder, bucket)
    return processes.spawn(args, "mlflow.log", mlflow_server_env(mlflow_python, folder, endpoint), cwd=str(folder))


def mlflow_connection(url: str) -> dict[str, object]:
    """The ``mlflow_default`` connection: type ``http`` with the tracking URI as its host, as the MLflow provider for
    Airflow (airflow-provider-mlflow) reads it (``host`` becomes MLFLOW_TRACKING_URI; ``login`` ``token`` with a
    ``password`` becomes MLFLOW_TRACKING_TOKEN), and as Airflow's HttpHook takes a host with its scheme."""
    return {"conn_type": "http", "host": url}


# -- Airflow -----------------------------------------------------------------------------------------------------------
def airflow_env(
    airflow_home: str, dashboard_port: int, ray_token: str | None = None, mlflow: str | None = None
) -> dict[str, str]:
    """An Airflow home of its own, no example DAGs, the ``ray_default`` connection to the local dashboard (with Ray's
    token as its password when the cluster has one), and ``mlflow_default`` to the ``mlflow`` tracking server's URL
    when the stack runs one."""
    conn: dict[str, object] = {"conn_type": "ray_tune", "host": "127.0.0.1", "port": dashboard_port, "schema": "http"}
    if ray_token:
        conn["password"] = ray_token
    env = {
        "AIRFLOW_HOME": airflow_home,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_RAY_DEFAULT": json.dumps(conn),
    }
    if mlflow:
        env["AIRFLOW_CONN_MLFLOW_DEFAULT"] = json.dumps(mlflow_connection(mlflow))
    return env


def prepare_airflow_home(airflow_home: Path, env: dict[str, str]) -> None:
    """Create ``airflow_home`` and migrate its sqlite database once (``.migrated`` marks it done)."""
    airflow_home.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("airflow", path=str(Path(sys.executable).parent)) or "airflow"
    marker = airflow_home / ".migrated"
    if marker.exists():
        return
    result = subprocess.run(
        [exe, "db", "migrate"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    if result.returncode != 0:
        raise StackError(f"airflow db migrate failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    marker.touch()
