"""No Ray on the Airflow side: the oldest supported Airflow's environment (the provider without its ``ray`` extra, no
Ray installed), against the session's Ray head and S3 endpoint.

One process of that environment (``dag.test()`` on an Airflow home migrated by that Airflow) imports every Airflow-side
module, parses the DAG files, runs an experiment whose trainable lives on the cluster (an import path in a package the
deployment uploaded: a ``gcs://`` URI in ``py_modules``) to a result, and has the code that only Ray can ship (a
trainable pickled by value, a local ``py_modules`` folder, loading a checkpoint) refused before anything is written
or submitted, naming the extra. Ray is never imported in it. The tests below read what it printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.hooks.ray_extra import RAY_EXTRA
from tests.e2e.helpers import experiment, jobs_of, run_id_for
from tests.support.compat_envs import AIRFLOW_RELEASE, REPO_ROOT, airflow_python

pytestmark = pytest.mark.timeout(420)

DAG_FILE = Path(__file__).resolve().parent / "no_ray_dags" / "airflow_side_without_ray.py"
TESTKIT = REPO_ROOT / "tests" / "support" / "tune_testkit"
#: DAG folders parsed without Ray: the e2e DAGs, the compatibility tier's (this test's among them), the examples.
DAG_FOLDERS = [REPO_ROOT / "tests" / "e2e" / "dags", *sorted((REPO_ROOT / "tests" / "compat").glob("*dags"))]
DAG_FOLDERS.append(REPO_ROOT / "dags")

#: Runs in the environment without Ray; prints one ``NO_RAY <json>`` line per step.
SCRIPT = r"""
import importlib, importlib.util, json, pkgutil, sys, time
from datetime import datetime

repo, dag_file, logical_date, folders = sys.argv[1], sys.argv[2], datetime.fromisoformat(sys.argv[3]), sys.argv[4:]
sys.path.insert(0, repo)


def say(step, **data):
    print("NO_RAY " + json.dumps({"step": step, **data}, default=str), flush=True)


say("env", ray_spec=importlib.util.find_spec("ray") is not None, python=sys.version.split()[0])

import airflow
import airflow_tune

started = time.monotonic()
failed = {}
modules = [m.name for m in pkgutil.walk_packages(airflow_tune.__path__, "airflow_tune.")]
for name in modules:
    # The engine is the cluster side; the local stack runs Ray nodes itself (a development tool, not Airflow's);
    # pyfunc_wrapper is the model's side (MLflow's loader runs it where mlflow is installed; a promotion with a
    # model_loader imports it, with the mlflow extra).
    if name.startswith(("airflow_tune.engine", "airflow_tune.local", "airflow_tune.registries.pyfunc_wrapper")):
        continue
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
say("imports", airflow=airflow.__version__, modules=len(modules), failed=failed, seconds=time.monotonic() - started)

from airflow.models.dagbag import DagBag

for folder in folders:
    sys.path.append(folder)  # as Airflow puts its DAGs folder on the path: DAG files import their neighbours
    bag = DagBag(dag_folder=folder, include_examples=False, safe_mode=False)
    say("parse", folder=folder, dags=sorted(bag.dag_ids), errors=bag.import_errors)

from airflow_tune.checkpoints import load_checkpoint
try:
    load_checkpoint("s3://nowhere/experiments/x/trial/checkpoint_000000")
    say("checkpoint", error=None)
except Exception as exc:
    say("checkpoint", error=f"{type(exc).__name__}: {exc}")

from tests.e2e.helpers import run_dag

spec = importlib.util.spec_from_file_location("aft_no_ray_dag", dag_file)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = run_dag(module.no_ray, {}, logical_date)
states = result.task_states()
errors = {t: [f"{type(e).__name__}: {e}" for e in result.errors(t)] for t in states}
say("run", state=result.state, run_id=result.run_id, tasks=states, errors=errors,
    xcom=result.xcom("import_path"), seconds=result.seconds)
say("end", ray_imported="ray" in sys.modules)
"""


def _upload_testkit(stack: Any) -> str:
    """Put the test kit on the cluster as a deployment would, with Ray's own client (this side of the test has Ray):
    the cluster then holds the trainables' package under a ``gcs://`` URI."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(stack.dashboard_url, headers=stack.auth_headers)
    runtime_env: dict[str, Any] = {"py_modules": [str(TESTKIT)]}
    client._upload_py_modules_if_needed(runtime_env)
    [uri] = runtime_env["py_modules"]
    assert uri.startswith("gcs://_ray_pkg_"), uri
    return str(uri)


@pytest.fixture(scope="module")
def no_ray(stack: Any, s3_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The steps the environment without Ray printed, by step name; and what the test wrote."""
    python = airflow_python()
    home = tmp_path_factory.mktemp("airflow-no-ray") / "home"
    prefix = f"no-ray-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **stack.env(),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
        "AIRFLOW_TUNE_STORAGE_URI": f"s3://{stack.bucket}/{prefix}/experiments",
        "AFT_TESTKIT_URI": _upload_testkit(stack),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    started = time.monotonic()
    migrate = subprocess.run(
        [str(python), "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True, timeout=180
    )
    assert migrate.returncode == 0, (migrate.stdout[-3000:], migrate.stderr[-3000:])
    migrated = time.monotonic() - started
    date = datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    run = subprocess.run(
        [str(python), "-c", SCRIPT, str(REPO_ROOT), str(DAG_FILE), date.isoformat(), *map(str, DAG_FOLDERS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
        cwd=home,
    )
    output = run.stdout + run.stderr
    steps: dict[str, Any] = {"parse": []}
    for line in run.stdout.splitlines():
        if line.startswith("NO_RAY "):
            data = json.loads(line[len("NO_RAY ") :])
            name = data.pop("step")
            if name == "parse":
                steps["parse"].append(data)
            else:
                steps[name] = data
    assert run.returncode == 0 and "end" in steps, output[-8000:]
    print(f"Airflow {AIRFLOW_RELEASE} without Ray: db migrate {migrated:.0f}s, run {time.monotonic() - started:.0f}s")
    steps.update(output=output, run_id=run_id_for(date), prefix=prefix)
    yield steps


def test_the_environment_has_no_ray_and_never_imports_it(no_ray: dict[str, Any]) -> None:
    assert no_ray["env"]["ray_spec"] is False, "the environment must have no Ray"
    assert no_ray["imports"]["airflow"] == AIRFLOW_RELEASE
    assert no_ray["end"]["ray_imported"] is False, "something imported Ray on the Airflow side"


def test_every_airflow_side_module_imports_and_the_dag_files_parse_without_ray(no_ray: dict[str, Any]) -> None:
    assert no_ray["imports"]["failed"] == {}
    assert no_ray["imports"]["modules"] > 30, no_ray["imports"]
    assert len(no_ray["parse"]) == len(DAG_FOLDERS)
    for folder in no_ray["parse"]:
        # A file that imports Ray itself (trainables written with ray.tune, or a module importing them) needs Ray
        # where it is parsed (and numpy, which comes with Ray: tests/e2e/dags/code_objects.py), and one that imports
        # MLflow (a model loader written with mlflow.pyfunc) MLflow: the user's import, never the provider's.
        users_imports = ("No module named 'ray'", "No module named 'numpy'", "No module named 'mlflow'")
        for path, error in folder["errors"].items():
            assert error.rstrip().endswith(users_imports), (path, error)
            where = re.findall(r'File "([^"]+)"', error)
            assert where and "airflow_tune" not in where[-1], (path, error)
    parsed = {dag for folder in no_ray["parse"] for dag in folder["dags"]}
    expected = {"aft_no_ray", "aft_retry", "aft_storage_file", "digits_retrain_weekly", "digits_tune_from_ui"}
    assert expected <= parsed, parsed


def test_an_import_path_trainable_on_the_cluster_runs_to_a_result(no_ray: dict[str, Any]) -> None:
    run = no_ray["run"]
    assert run["tasks"]["import_path"] == "success", (run, no_ray["output"][-6000:])
    result = run["xcom"]
    assert result["best_config"] == {"x": 3, "steps": 2}, result
    assert result["num_terminated"] == 2 and result["num_errored"] == 0, result
    assert result["best_checkpoint_uri"].startswith(f"{result['experiment_uri']}/"), result
    [job] = jobs_of(result["experiment"])
    assert job["status"] == "SUCCEEDED", job
    print(f"import-path experiment without Ray on the Airflow side: dag.test() {run['seconds']:.0f}s in all")


@pytest.mark.parametrize(
    ("task_id", "what"),
    [("by_value", "pickling the trainable"), ("local_py_modules", "shipping local code")],
)
def test_code_only_ray_ships_is_refused_before_anything_is_written(no_ray, s3_client, stack, task_id, what) -> None:
    run = no_ray["run"]
    assert run["tasks"][task_id] == "failed", run
    [error] = run["errors"][task_id]
    assert error.startswith("RayExtraMissing: ") and what in error, error
    assert RAY_EXTRA in error and "Nothing was written or submitted" in error, error
    name = experiment("aft_no_ray", no_ray["run_id"], task_id)
    assert jobs_of(name) == [], "a job was submitted"
    listed = s3_client.list_objects_v2(Bucket=stack.bucket, Prefix=f"{no_ray['prefix']}/experiments/{name}")
    assert listed.get("KeyCount", 0) == 0, listed.get("Contents")


def test_loading_a_checkpoint_without_ray_names_the_extra(no_ray: dict[str, Any]) -> None:
    error = no_ray["checkpoint"]["error"]
    assert error is not None and error.startswith("RayExtraMissing: ") and RAY_EXTRA in error, error
