"""Mapped code is code (issue 40): a trigger conf that reaches ``pip``, ``runtime_env``, ``working_dir`` or
``py_modules`` through an upstream XCom and ``expand()``/``expand_kwargs()`` fails the mapped task instance before any
Ray job exists, naming the argument; the payload (a package whose build, or a ``sitecustomize`` whose import, creates
a marker file; an S3 endpoint that counts connections) never runs or is never reached. A literal list given to
``expand()`` is the DAG file's, and is submitted."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_tune.trust.code import MappedCodeError
from tests.e2e.helpers import jobs_of_run, load_dag, run_dag

pytestmark = pytest.mark.usefixtures("stack")
FILE = "mapped_code_cases.py"
TOUCH = "import pathlib; pathlib.Path({marker!r}).touch()\n"


def _date() -> datetime:
    return datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _refused(dag_id: str, conf: dict, *arguments: str) -> None:
    """The DAG run fails at its mapped tune task, naming each argument, and no task of the run submitted a job."""
    run = run_dag(load_dag(dag_id, FILE), conf, _date())
    assert run.state == "failed", dag_id
    [error] = run.errors("tune")
    assert isinstance(error, MappedCodeError), error
    for argument in arguments:
        assert f"  - {argument} = " in str(error), str(error)
    assert "Write them in the DAG file" in str(error)
    assert jobs_of_run(dag_id, run.run_id) == []


def _package_that_runs_on_install(root: Path, marker: Path) -> Path:
    """A local package pip would build: its setup.py creates ``marker``."""
    folder = root / "attacker_package"
    folder.mkdir()
    (folder / "setup.py").write_text(TOUCH.format(marker=str(marker)) + "from setuptools import setup\nsetup()\n")
    (folder / "pyproject.toml").write_text('[project]\nname = "attacker-package"\nversion = "1.0"\n')
    return folder


@pytest.fixture
def connection_counter() -> Iterator[tuple[str, list[int]]]:
    """An address on loopback that counts the connections made to it (where a mapped AWS_ENDPOINT_URL points)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[int] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        done.set()
        thread.join(5)
        server.close()


@pytest.mark.timeout(180)
def test_pip_mapped_from_an_xcom_is_refused_before_any_job(tmp_path):
    marker = tmp_path / "pwned-by-pip"
    package = _package_that_runs_on_install(tmp_path, marker)
    _refused("aft_mapped_pip", {"value": [[str(package)]]}, "pip")
    assert not marker.exists()


@pytest.mark.timeout(180)
def test_runtime_env_mapped_from_an_xcom_is_refused_before_any_job(connection_counter):
    endpoint, accepted = connection_counter
    env = {"env_vars": {"AWS_ENDPOINT_URL": endpoint, "MLFLOW_TRACKING_URI": endpoint}}
    _refused("aft_mapped_runtime_env", {"value": [env]}, "runtime_env")
    assert accepted == []


@pytest.mark.timeout(180)
def test_working_dir_and_py_modules_from_expand_kwargs_over_an_xcom_are_refused_before_any_job(tmp_path):
    marker = tmp_path / "pwned-by-working-dir"
    working_dir = tmp_path / "working_dir"
    working_dir.mkdir()
    # Ray puts the working dir on the workers' PYTHONPATH: Python imports sitecustomize at every start.
    (working_dir / "sitecustomize.py").write_text(TOUCH.format(marker=str(marker)))
    package = tmp_path / "attacker_module"
    package.mkdir()
    (package / "__init__.py").write_text(TOUCH.format(marker=str(marker)))
    testkit = str(Path(__file__).resolve().parents[1] / "support" / "tune_testkit")
    row = {"working_dir": str(working_dir), "py_modules": [testkit, str(package)]}
    _refused("aft_mapped_kwargs", {"value": [row]}, "working_dir", "py_modules")
    assert not marker.exists()


@pytest.mark.timeout(180)
def test_pip_mapped_from_a_literal_list_is_the_dag_file_s_and_is_submitted():
    from airflow_tune.hooks.ray import RayHook

    run = run_dag(load_dag("aft_mapped_pip_literal", FILE), None, _date())
    hook = RayHook()
    jobs = jobs_of_run("aft_mapped_pip_literal", run.run_id)
    try:
        assert run.state == "success", run.errors("tune")
        assert sorted(job["metadata"]["airflow_map_index"] for job in jobs) == ["0", "1"]
        infos = {
            job["metadata"]["airflow_map_index"]: hook.get_conn().get_job_info(job["submission_id"]) for job in jobs
        }
        pips = [infos[index]["runtime_env"]["pip"] for index in ("0", "1")]
        assert [p["packages"] if isinstance(p, dict) else p for p in pips] == [["numpy"], ["numpy", "pyarrow"]]
    finally:
        for job in jobs:
            hook.stop_job(job["submission_id"])
