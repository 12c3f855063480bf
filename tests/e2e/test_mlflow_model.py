"""The winner as an MLflow Model (issue 34): PromoteCheckpointOperator with ``model_loader`` registers a version that
MLflow's own clients load and serve, on the local stack (the session's Ray head and S3 endpoint, a real MLflow server
beside them, ``mlflow models serve`` from the stack's MLflow virtualenv): ``mlflow.pyfunc.load_model("models:/<name>
@champion").predict(...)`` and ``/invocations`` answer the checkpoint's model's predictions. The model's files are
bound to what the trial and the promotion wrote: ``download_model`` verifies them and refuses a changed loader or
checkpoint. A checkpoint that is an MLflow Model already is registered as it is; the S3 registry's version folder is
an MLflow Model too.

The checkpoint is a real scikit-learn model trained here on the digits (half a second), sealed by a real Ray job
(``sealed_result``) as the engine's would be; the promotions run with ``dag.test()`` from a DAG file whose loader
function travels by value.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.exceptions import PromotionError
from tests.e2e.dags.mlflow_model_cases import BY_PATH_REGISTRY, PYFUNC_REGISTRY, PYFUNC_S3_REGISTRY, TWO_REGISTRIES
from tests.e2e.helpers import load_dag, run_dag
from tests.e2e.test_registry_mlflow import _objects, champion, promote_op, tag_map, versions
from tests.integration.test_promote import put_checkpoint, run, tune_result
from tests.support.mlflow_server import MlflowRest, mlflow_beside, mlflow_python
from tests.support.sealed import sealed_result

FILE = "mlflow_model_cases.py"


@pytest.fixture(scope="module")
def mlflow_url(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_beside(stack, tmp_path_factory.mktemp("mlflow-model")) as url:
        yield url


@pytest.fixture
def rest(mlflow_url: str) -> MlflowRest:
    return MlflowRest(mlflow_url)


@pytest.fixture
def s3(stack: Any) -> Any:
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=stack.s3_endpoint, region_name="us-east-1")


@pytest.fixture(scope="module")
def digits() -> tuple[Any, Any, Any]:
    """A small classifier of the digits and rows to predict."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    data = load_digits()
    x, y = data.data / 16.0, data.target
    return LogisticRegression(max_iter=300).fit(x[:1200], y[:1200]), x[1200:1210], y[1200:1210]


def _date() -> datetime:
    return datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=uuid.uuid4().int % 10**8)


def _promote(dag_id: str, s3: Any, model: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    weights = pickle.dumps({"model": model})
    source = put_checkpoint(s3, {"model.pkl": weights})
    result = sealed_result({**tune_result(source, 0.1), "mlflow": None}, dag_id, run_id=None)
    outcome = run_dag(load_dag(dag_id, FILE), {"result": result}, logical_date=_date())
    assert outcome.state == "success", (outcome.task_states(), outcome.errors("promote"))
    return outcome, outcome.xcom("promote"), result


@pytest.mark.timeout(420)
def test_a_promoted_version_is_an_mlflow_model_that_mlflow_loads_and_serves(rest, s3, digits, tmp_path):
    import mlflow.pyfunc

    from airflow_tune.checkpoints import download_checkpoint, download_model
    from airflow_tune.local.serving import invocations, served_model

    model, rows, _ = digits
    expected = [int(p) for p in model.predict(rows)]
    _, decision, result = _promote("aft_pyfunc_mlflow", s3, model)
    name = PYFUNC_REGISTRY.removeprefix("models:/")
    assert decision["promoted"] is True and decision["mlflow_model"] == "pyfunc", decision
    folder = decision["mlflow_model_uri"]
    assert folder == f"s3://airflow-tune/mlflow-models/{name}/versions/{decision['version_name']}", folder
    version = next(v for v in versions(rest, name) if v["version"] == decision["version"])
    tags = tag_map(version)
    assert version["source"] == folder == tags["airflow_tune.model_uri"], "the version's source is the MLflow Model"
    assert tags["airflow_tune.checkpoint_uri"] == result["best_checkpoint_uri"]
    assert champion(rest, name) == decision["version"]

    # The folder: MLmodel with a python_function flavor, the loader, the environment, the input example, and the
    # checkpoint's bytes as the artifact "checkpoint".
    files = _objects(s3, folder)
    assert files["checkpoint/model.pkl"] == _objects(s3, result["best_checkpoint_uri"])["model.pkl"]
    assert {"MLmodel", "python_model.pkl", "requirements.txt", "python_env.yaml", "input_example.json"} <= set(files)
    mlmodel = files["MLmodel"].decode()
    assert "python_function:" in mlmodel and "path: checkpoint" in mlmodel and "signature:" in mlmodel, mlmodel
    assert b"scikit-learn" in files["requirements.txt"] and b"mlflow==" in files["requirements.txt"]

    # MLflow's own client, from the registry alias.
    loaded = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    assert [int(p) for p in loaded.predict(rows)] == expected
    assert loaded.metadata.get_input_schema() is not None

    # MLflow's own scoring server, from its own virtualenv (no airflow-tune there), answering /invocations.
    env = {**os.environ, "MLFLOW_TRACKING_URI": rest.url}
    with served_model(mlflow_python(), f"models:/{name}@champion", tmp_path / "serve", env) as url:
        answer = invocations(url, {"inputs": rows.tolist()})
    assert [int(p) for p in answer["predictions"]] == expected, answer

    # Our helpers verify: the model's files as written, the checkpoint as its trial wrote it.
    verified = download_model(f"models:/{name}@champion", str(tmp_path / "verified"))
    assert [int(p) for p in mlflow.pyfunc.load_model(verified).predict(rows)] == expected
    with open(download_checkpoint(f"models:/{name}@champion") + "/model.pkl", "rb") as fh:
        assert fh.read() == files["checkpoint/model.pkl"]
    bucket, _, prefix = folder.removeprefix("s3://").partition("/")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/python_model.pkl", Body=b"not the loader the promotion wrote")
    with pytest.raises(PromotionError, match="not the ones its trial and its promotion wrote"):
        download_model(f"models:/{name}@champion", str(tmp_path / "forged"))
    s3.put_object(Bucket=bucket, Key=f"{prefix}/python_model.pkl", Body=files["python_model.pkl"])
    s3.put_object(Bucket=bucket, Key=f"{prefix}/checkpoint/model.pkl", Body=pickle.dumps({"model": None}))
    with pytest.raises(PromotionError, match="storage was changed"):
        download_model(f"models:/{name}@champion", str(tmp_path / "forged2"))
    with pytest.raises(PromotionError, match="storage was changed"):
        download_checkpoint(f"models:/{name}@champion")


LOADER_PACKAGE = {
    "__init__.py": "",
    "loaders.py": (
        "import os\n\nfrom aft_loader_pkg.sub.unpickle import read\n\n\n"
        "def load_classifier(checkpoint_dir):\n    return read(os.path.join(checkpoint_dir, 'model.pkl'))['model']\n"
    ),
    "sub/__init__.py": "",
    "sub/unpickle.py": (
        "import pickle\n\n\ndef read(path):\n    with open(path, 'rb') as fh:\n        return pickle.load(fh)\n"
    ),
    ".env": "AWS_SECRET_ACCESS_KEY=fake-secret-that-must-stay-home\n",
    "notes.txt": "private notes that must stay home\n",
}
LOAD_AND_PREDICT = """
import json, sys
import mlflow.pyfunc, numpy as np
model = mlflow.pyfunc.load_model(sys.argv[1])
import aft_loader_pkg.loaders
print(json.dumps({"module": aft_loader_pkg.loaders.__file__,
                  "predictions": [int(p) for p in model.predict(np.asarray(json.loads(sys.argv[2])))]}))
"""


@pytest.mark.timeout(300)
def test_a_loader_by_import_path_carries_only_its_package_s_modules_and_loads(rest, s3, digits, tmp_path, monkeypatch):
    """The loader's package holds a ``.env`` with a (fake) secret and notes: the model's ``code/`` has its Python
    modules only, and the promoted model still loads and predicts in MLflow's own environment (where the package
    is not installed: it comes from ``code/``)."""
    import json
    import subprocess

    from airflow_tune.checkpoints import download_model

    model, rows, _ = digits
    expected = [int(p) for p in model.predict(rows)]
    home = tmp_path / "worker"
    for rel, text in LOADER_PACKAGE.items():
        (home / "aft_loader_pkg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / "aft_loader_pkg" / rel).write_text(text)
    monkeypatch.syspath_prepend(str(home))  # the Airflow worker has the package

    _, decision, _ = _promote("aft_pyfunc_by_path", s3, model)
    assert decision["promoted"] is True and decision["mlflow_model"] == "pyfunc", decision
    files = _objects(s3, decision["mlflow_model_uri"])
    code = sorted(rel for rel in files if rel.startswith("code/"))
    assert code == [
        "code/aft_loader_pkg/__init__.py",
        "code/aft_loader_pkg/loaders.py",
        "code/aft_loader_pkg/sub/__init__.py",
        "code/aft_loader_pkg/sub/unpickle.py",
    ], code
    assert not any(b"fake-secret" in body or b"private notes" in body for body in files.values())

    name = BY_PATH_REGISTRY.removeprefix("models:/")
    verified = download_model(f"models:/{name}@champion", str(tmp_path / "verified"))
    env = {**os.environ, "MLFLOW_TRACKING_URI": rest.url}
    env.pop("PYTHONPATH", None)
    for source in (verified, f"models:/{name}@champion"):
        answer = subprocess.run(
            [mlflow_python(), "-c", LOAD_AND_PREDICT, source, json.dumps(rows.tolist())],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=180,
        )
        assert answer.returncode == 0, answer.stderr[-3000:]
        loaded = json.loads(answer.stdout.strip().splitlines()[-1])
        assert loaded["predictions"] == expected
        assert f"{os.sep}code{os.sep}aft_loader_pkg{os.sep}" in loaded["module"], loaded


@pytest.mark.timeout(300)
def test_the_s3_registry_s_version_folder_is_an_mlflow_model(s3, digits, tmp_path, stack):
    import mlflow.pyfunc

    from airflow_tune.checkpoints import download_model
    from airflow_tune.registries.s3 import read_champion

    model, rows, _ = digits
    expected = [int(p) for p in model.predict(rows)]
    _, decision, _ = _promote("aft_pyfunc_s3", s3, model)
    assert decision["promoted"] is True and decision["mlflow_model_uri"], decision
    pointer = read_champion(PYFUNC_S3_REGISTRY, s3)
    assert pointer is not None and pointer["mlflow_model_uri"] == f"{PYFUNC_S3_REGISTRY}/versions/{decision['version']}"
    files = _objects(s3, pointer["mlflow_model_uri"])
    assert {"MLmodel", "python_model.pkl", "checkpoint/model.pkl", "model.json"} <= set(files)
    # MLflow loads the version's folder straight from S3 ...
    assert [int(p) for p in mlflow.pyfunc.load_model(pointer["mlflow_model_uri"]).predict(rows)] == expected
    # ... and download_model proves and verifies the champion's.
    folder = download_model(PYFUNC_S3_REGISTRY, str(tmp_path / "m"))
    assert not Path(folder, "model.json").exists()
    assert [int(p) for p in mlflow.pyfunc.load_model(folder).predict(rows)] == expected


@pytest.mark.timeout(240)
def test_a_checkpoint_that_is_an_mlflow_model_is_registered_as_it_is_and_a_bare_one_is_said_so(
    rest, s3, digits, tmp_path
):
    import mlflow.pyfunc
    import mlflow.sklearn

    model, rows, _ = digits
    saved = tmp_path / "saved"
    mlflow.sklearn.save_model(model, str(saved), serialization_format="cloudpickle", pip_requirements=["scikit-learn"])
    files = {str(p.relative_to(saved)): p.read_bytes() for p in saved.rglob("*") if p.is_file()}
    source = put_checkpoint(s3, files)
    name = f"aft-it-{uuid.uuid4().hex[:10]}"
    out, _ = run(promote_op(f"models:/{name}", {**tune_result(source, 0.2), "mlflow": None}))
    assert out["promoted"] is True and out["mlflow_model"] == "checkpoint", out
    [version] = versions(rest, name)
    assert (
        version["source"]
        == out["uri"]
        == f"s3://airflow-tune/mlflow-models/{name}/versions/{out['version_name']}/checkpoint"
    )
    assert _objects(s3, version["source"]) == files, "registered as it is: the version's copy of it is the source"
    loaded = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    assert [int(p) for p in loaded.predict(rows)] == [int(p) for p in model.predict(rows)]

    bare = put_checkpoint(s3, {"model.pkl": pickle.dumps({"model": model})})
    op = promote_op(f"models:/{name}-bare", {**tune_result(bare, 0.2), "mlflow": None})
    said: list[str] = []
    op.log.warning = lambda msg, *args, **kwargs: said.append(msg % args)  # type: ignore[method-assign]
    out, _ = run(op)
    assert out["promoted"] is True and out["mlflow_model"] is None
    assert any("bare Tune checkpoint: MLflow's clients" in s and "cannot load it" in s for s in said), said


@pytest.mark.timeout(420)
def test_one_experiment_promoted_into_two_mlflow_registries_gets_two_folders_outside_the_experiment(
    rest, s3, digits, tmp_path
):
    """Each registered model and version has a folder of its own, written by the promote task outside the experiment
    the Ray nodes write: the second promotion does not overwrite the first's files, so both versions verify and
    load (issue 40; on main both wrote ``<experiment>/.airflow_tune/models/<version name>``)."""
    import mlflow.pyfunc

    from airflow_tune.checkpoints import download_model, load_model

    model, rows, _ = digits
    expected = [int(p) for p in model.predict(rows)]
    source = put_checkpoint(s3, {"model.pkl": pickle.dumps({"model": model})})
    result = sealed_result({**tune_result(source, 0.1), "mlflow": None}, "aft_pyfunc_two_registries", run_id=None)
    outcome = run_dag(load_dag("aft_pyfunc_two_registries", FILE), {"result": result}, logical_date=_date())
    assert outcome.state == "success", (outcome.task_states(), outcome.errors("promote_a"), outcome.errors("promote_b"))

    # Both versions verify and load after both promotions, by version number and by alias.
    for task_id, registry in zip(("promote_a", "promote_b"), TWO_REGISTRIES, strict=True):
        verified = download_model(outcome.xcom(task_id)["model_uri"], str(tmp_path / task_id))
        assert [int(p) for p in mlflow.pyfunc.load_model(verified).predict(rows)] == expected
        assert [int(p) for p in load_model(f"{registry}@champion").predict(rows)] == expected
    folders = []
    for task_id, registry in zip(("promote_a", "promote_b"), TWO_REGISTRIES, strict=True):
        decision = outcome.xcom(task_id)
        assert decision["promoted"] is True and decision["mlflow_model"] == "pyfunc", decision
        folder = decision["mlflow_model_uri"]
        name = registry.removeprefix("models:/")
        assert folder == f"s3://airflow-tune/mlflow-models/{name}/versions/{decision['version_name']}", folder
        assert not folder.startswith(result["experiment_uri"] + "/"), "never under the experiment's folder"
        folders.append(folder)
    assert folders[0] != folders[1]
    # The experiment's folder holds no model file of either.
    written = _objects(s3, result["experiment_uri"])
    assert not [k for k in written if k.endswith(("MLmodel", "python_model.pkl", "requirements.txt"))], sorted(written)
