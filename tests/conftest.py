"""Shared fixtures. Airflow reads its config at import, so its home is set before anything imports airflow."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_ROOT = Path(tempfile.mkdtemp(prefix="aft-tests-"))

os.environ["AIRFLOW_HOME"] = str(TEST_ROOT / "stack" / "airflow")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "tests" / "e2e" / "dags")
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.pop("RAY_ADDRESS", None)
os.environ.pop("RAY_API_SERVER_ADDRESS", None)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` in os.environ while the block runs; what was there before comes back after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(TEST_ROOT, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder, so ``-m unit`` / ``-m integration`` / ``-m e2e`` select as expected."""
    for item in items:
        for kind in ("unit", "integration", "e2e", "compat"):
            if f"{os.sep}{kind}{os.sep}" in str(item.fspath):
                item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture(scope="session")
def stack() -> Iterator:
    """One local Ray head + S3 endpoint + Airflow home for the whole session; stopped even when tests fail."""
    from airflow_tune.local import LocalStack

    local = LocalStack(TEST_ROOT / "stack", num_cpus=2, resources={"accel": 2})
    state = local.start()
    try:
        with _environment(state.env()):
            yield state
    finally:
        local.stop()


@pytest.fixture(scope="session")
def s3_client(stack):
    import boto3

    return boto3.client("s3", **{"endpoint_url": stack.s3_endpoint, "region_name": "us-east-1"})


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator:
    """The production shape on this machine: a Ray head offering no CPUs and two worker nodes of 1 CPU each, all run
    by the separate cluster virtualenv, each with its own temp dir, home and ports, and an S3 endpoint of their own.

    Yields the :class:`~airflow_tune.local.LocalStack` (its ``state`` says how to reach it), so a test can kill a
    worker; the environment points Airflow, Ray Jobs and S3 clients at it while the module runs. Module-scoped: the
    cluster lives only while its tests run, and is stopped even when they fail.

    A module that sets ``CLUSTER_MLFLOW = True`` (one that runs the example DAGs' promotion into MLflow) also gets an
    MLflow server in the stack; the others do not pay its start (30-90 s).
    """
    from tests.support.mlflow_server import mlflow_python

    mlflow = mlflow_python() if getattr(request.module, "CLUSTER_MLFLOW", False) else None
    with separate_stack("cluster-", num_cpus=0, workers=2, worker_cpus=1, mlflow_python=mlflow) as local:
        yield local


@contextlib.contextmanager
def separate_stack(prefix: str, **settings) -> Iterator:
    """A stack whose Ray nodes run from the cluster virtualenv or the given ``cluster_python`` (airflow_tune importable
    there only as a job ships it, as on a real cluster), with ``settings`` for :class:`~airflow_tune.local.LocalStack`;
    yields the stack, its environment set, and stops it, checking that nothing of it is left, even when tests fail."""
    from airflow_tune.local import LocalStack
    from tests.support.cluster_venv import cluster_python

    settings.setdefault("cluster_python", cluster_python())
    local = LocalStack(
        Path(tempfile.mkdtemp(prefix=prefix, dir=TEST_ROOT)), airflow_home=os.environ["AIRFLOW_HOME"], **settings
    )
    state = local.start()
    try:
        with _environment(state.env()):
            yield local
    finally:
        _stop_and_check_nothing_is_left(local)


def _stop_and_check_nothing_is_left(local) -> None:
    """Stop a multi-node stack (or one with an MLflow server); its processes (by id) and temp dirs must all be gone."""
    import psutil

    assert local.state is not None
    roots = local.state.pids()
    folders = [local.state.ray_temp_dir, *local.state.worker_temp_dirs]
    started: set[int] = set()
    for pid in roots:
        try:
            started |= {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
        except psutil.NoSuchProcess:
            pass  # a worker a test killed
    local.stop()
    _, alive = psutil.wait_procs([p for p in map(_process, started) if p is not None], timeout=10)
    left = [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after stopping the cluster: {left}"
    assert not [f for f in folders if os.path.exists(f)], "temp dirs left after stopping the cluster"


def _process(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
