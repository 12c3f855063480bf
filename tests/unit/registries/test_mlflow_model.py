"""The MLflow Model a promotion builds (issue 34), its parts that are pure logic: what ``model_loader`` accepts at
parse time (code written in the DAG file, nothing imported), the model folder's files and digests, and which
registry versions the deploy helpers believe to be one of ours."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from airflow_tune.common.provenance import files_digest
from airflow_tune.exceptions import PromotionError
from airflow_tune.registries import mlflow_model


def load(checkpoint_dir):  # a loader function
    return checkpoint_dir


def test_a_loader_is_a_python_model_subclass_a_function_or_an_import_path():
    import mlflow.pyfunc

    class Model(mlflow.pyfunc.PythonModel):
        pass

    assert mlflow_model.loader_spec(None) is None
    assert mlflow_model.loader_spec(Model).value is Model
    assert mlflow_model.loader_spec(load).source == f"{__name__}:load"
    assert mlflow_model.loader_spec("pkg.mod:Model").source == "pkg.mod:Model"


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("{{ params.loader }}", ValueError, "not a template field"),
        ("pkg.mod:{{ x }}", ValueError, "not a template field"),
        ("os.system", ValueError, "import path"),
        (object(), TypeError, "give a mlflow.pyfunc.PythonModel subclass"),
        (dict, TypeError, "must subclass mlflow.pyfunc.PythonModel"),
        (42, TypeError, "int object"),
    ],
)
def test_a_loader_that_is_not_code_written_in_the_dag_file_is_refused_at_parse(value, error, words):
    with pytest.raises(error, match=words):
        mlflow_model.loader_spec(value)


def test_the_operator_checks_its_model_arguments_when_built():
    from airflow_tune.operators.promote import PromoteCheckpointOperator

    def build(**kwargs):
        return PromoteCheckpointOperator(task_id="p", result={}, registry_uri="models:/m", **kwargs)

    assert build(model_loader=load).loader.value is load
    with pytest.raises(ValueError, match="give one"):
        build(model_input_example=[[1.0]])
    with pytest.raises(TypeError, match="model_requirements"):
        build(model_loader=load, model_requirements="scikit-learn")
    with pytest.raises(TypeError, match="model_signature"):
        build(model_loader=load, model_signature="inputs")
    with pytest.raises(ValueError, match="not a template field"):
        build(model_loader="{{ params.loader }}")


def test_building_the_operator_with_a_loader_imports_no_mlflow():
    code = (
        "import sys\n"
        "from airflow_tune.operators.promote import PromoteCheckpointOperator\n"
        "PromoteCheckpointOperator(task_id='p', result={}, registry_uri='models:/m', model_loader='pkg.mod:Model',"
        " model_input_example=[[0.0] * 4], model_requirements=['scikit-learn'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'ray', 'boto3', 'cloudpickle')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_the_model_folder_s_files_are_the_written_ones_and_the_checkpoint_s_under_checkpoint():
    written = {"MLmodel": "sha256:a", "python_model.pkl": "sha256:b"}
    checkpoint = {"model.pkl": "sha256:c", "sub/x.bin": "sha256:d"}
    files = mlflow_model.model_files(written, checkpoint)
    assert files == {**written, "checkpoint/model.pkl": "sha256:c", "checkpoint/sub/x.bin": "sha256:d"}
    assert mlflow_model.checkpoint_part(files) == checkpoint
    assert mlflow_model.model_digest(files) == files_digest(files) != files_digest(checkpoint)
    assert mlflow_model.holds_mlflow_model({"MLmodel": "x", "model.pkl": "y"})
    assert not mlflow_model.holds_mlflow_model({"sub/MLmodel": "x"}) and not mlflow_model.holds_mlflow_model(None)


def test_a_list_of_rows_of_numbers_is_a_2d_array_example_and_anything_else_is_as_given():
    import numpy as np

    example = mlflow_model.example_value([[0, 1.5], [2, 3]])
    assert isinstance(example, np.ndarray) and example.shape == (2, 2) and example.dtype == float
    records = [{"a": 1.0}]
    assert mlflow_model.example_value(records) is records
    assert mlflow_model.example_value([[True, False]]) == [[True, False]]


def _version(source: str, **tags: str) -> SimpleNamespace:
    return SimpleNamespace(version="3", source=source, tags={f"airflow_tune.{k}": v for k, v in tags.items()})


OWN = "s3://b/mlflow-models/m/versions/v1"


@pytest.mark.parametrize(
    ("source", "tags"),
    [
        # an MLflow Model folder anywhere but where a promotion into this registered model writes it
        (
            "s3://b/elsewhere/m",
            {"model": "pyfunc", "model_uri": "s3://b/elsewhere/m", "model_digest": "sha256:x", "version": "v1"},
        ),
        # where promotions wrote it before: inside the experiment's folder, which the cluster can write
        (
            "s3://b/exp/.airflow_tune/models/v1",
            {
                "model": "pyfunc",
                "model_uri": "s3://b/exp/.airflow_tune/models/v1",
                "model_digest": "sha256:x",
                "version": "v1",
            },
        ),
        # another registered model's folder for the same version
        (
            "s3://b/mlflow-models/other/versions/v1",
            {
                "model": "pyfunc",
                "model_uri": "s3://b/mlflow-models/other/versions/v1",
                "model_digest": "sha256:x",
                "version": "v1",
            },
        ),
        # the right folder, without the digest of its files
        (OWN, {"model": "pyfunc", "model_uri": OWN, "version": "v1"}),
        # a bare checkpoint registered from the experiment itself (not a copy the promotion proved)
        ("s3://b/exp/t/checkpoint_1", {"version": "v1"}),
        # a source that is neither the copy nor a model of ours
        ("s3://b/exp/other", {"model": "checkpoint", "version": "v1"}),
    ],
)
def test_a_version_whose_files_are_not_where_its_promotion_writes_them_is_refused_before_any_read(source, tags):
    from airflow_tune.registries.mlflow import proven_version

    tags = {"checkpoint_uri": "s3://b/exp/t/checkpoint_1", "checkpoint_digest": "sha256:c", **tags}
    version = _version(source, experiment_uri="s3://b/exp", **tags)
    registry = SimpleNamespace(name="m")
    with pytest.raises(PromotionError, match="refusing to load it"):
        proven_version(registry, version, "ray_default", "models:/m@champion")  # type: ignore[arg-type]


def test_each_registered_model_and_version_has_a_folder_of_its_own_outside_the_experiment():
    from airflow_tune.registries.mlflow import version_folder_uri

    checkpoint = "s3://b/exp/trial_0/checkpoint_000001"
    first = version_folder_uri(checkpoint, "digits", "20260101T000000Z-t1-0123456789ab")
    assert first == "s3://b/mlflow-models/digits/versions/20260101T000000Z-t1-0123456789ab"
    assert version_folder_uri(checkpoint, "digits-canary", "20260101T000000Z-t1-0123456789ab") != first
    assert not first.startswith("s3://b/exp/")
    for name, version in (("..", "v"), ("m", ".."), ("m", "a/b")):
        with pytest.raises(PromotionError, match="not a name a folder can have"):
            version_folder_uri(checkpoint, name, version)


def test_only_the_loader_package_s_python_modules_travel_in_code(tmp_path):
    package = tmp_path / "loader_pkg"
    for rel, text in {
        "__init__.py": "",
        "loaders.py": "def load(d): ...\n",
        "sub/__init__.py": "",
        "sub/helpers.py": "X = 1\n",
        ".env": "AWS_SECRET_ACCESS_KEY=fake\n",
        "notes.txt": "private\n",
        "config.yaml": "a: 1\n",
        ".git/config": "[core]\n",
        ".hidden/mod.py": "",
        "__pycache__/loaders.cpython-311.pyc": "",
        "sub/.secret.py": "",
    }.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    outside = tmp_path / "outside.py"
    outside.write_text("SECRET = 1\n")
    (package / "linked.py").symlink_to(outside)
    (package / "linked_dir").symlink_to(tmp_path / "loader_pkg" / "sub")

    copied = mlflow_model.copy_modules(str(package), str(tmp_path / "code" / "loader_pkg"))
    expected = ["__init__.py", "loaders.py", "sub/__init__.py", "sub/helpers.py"]
    assert sorted(copied) == expected
    dest = tmp_path / "code" / "loader_pkg"
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert found == sorted([*expected, "sub"])
