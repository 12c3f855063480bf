"""The local stack's services beside Ray: the S3 endpoint (moto's server) with its bucket, and the Airflow home with
its migrated database and the ``ray_default`` connection."""

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


# -- Airflow -----------------------------------------------------------------------------------------------------------
def airflow_env(airflow_home: str, dashboard_port: int, ray_token: str | None = None) -> dict[str, str]:
    """An Airflow home of its own, no example DAGs, and the ``ray_default`` connection to the local dashboard (with
    Ray's token as its password when the cluster has one)."""
    conn: dict[str, object] = {"conn_type": "ray", "host": "127.0.0.1", "port": dashboard_port, "schema": "http"}
    if ray_token:
        conn["password"] = ray_token
    return {
        "AIRFLOW_HOME": airflow_home,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_RAY_DEFAULT": json.dumps(conn),
    }


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
