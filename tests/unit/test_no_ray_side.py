"""The Airflow side without Ray: the Jobs client's wire format, the engine package's zip and name, and the refusals of
what needs the 'ray' extra (pure logic; the real head is in tests/integration/test_hook.py, a real Ray-less
environment in tests/compat/test_airflow_side_without_ray.py)."""

from __future__ import annotations

import io
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from airflow_tune.hooks import packages, ray_extra
from airflow_tune.hooks.jobs_client import submit_body
from airflow_tune.hooks.ray_extra import RAY_EXTRA, RayExtraMissing
from airflow_tune.utils import shipping


def test_submit_body_leaves_out_none_values_as_rays_client_does():
    body = submit_body(entrypoint="echo", submission_id="s", runtime_env=None, metadata={"a": "1"})
    assert body == {"entrypoint": "echo", "submission_id": "s", "runtime_env": {}, "metadata": {"a": "1"}}
    body = submit_body(
        entrypoint="echo", submission_id=None, runtime_env={"pip": ["x"]}, metadata=None, entrypoint_num_cpus=0.5
    )
    assert body == {"entrypoint": "echo", "runtime_env": {"pip": ["x"]}, "metadata": {}, "entrypoint_num_cpus": 0.5}


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "mypkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "empty").mkdir()
    (pkg / "__pycache__").mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "mod.py").write_text("Y = 2\n")
    (pkg / "sub" / "stale.pyc").write_bytes(b"\0")
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    return pkg


def test_the_zip_holds_the_folder_itself_with_empty_folders_and_no_bytecode(tmp_path):
    name, data = packages.build_package(_package(tmp_path))
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert sorted(names) == ["mypkg/__init__.py", "mypkg/empty/", "mypkg/sub/mod.py"]
    assert name.startswith("_ray_pkg_") and name.endswith(".zip") and len(name) == len("_ray_pkg_.zip") + 32


def test_the_name_is_the_content_the_same_content_the_same_bytes(tmp_path):
    pkg = _package(tmp_path)
    first = packages.build_package(pkg)
    (pkg / "__pycache__" / "other.pyc").write_bytes(b"1")  # bytecode plays no part
    assert packages.build_package(pkg) == first
    (pkg / "sub" / "mod.py").write_text("Y = 3\n")
    assert packages.build_package(pkg)[0] != first[0]
    (pkg / "sub" / "mod.py").write_text("Y = 2\n")
    (pkg / "sub" / "mod.py").rename(pkg / "sub" / "mod2.py")  # same bytes under another name: another package
    assert packages.build_package(pkg)[0] != first[0]


def test_a_file_is_not_a_package_folder(tmp_path):
    (tmp_path / "f.py").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        packages.build_package(tmp_path / "f.py")


class _Client:
    """Stands in for the dashboard's package endpoints (pure logic: which calls ship_local_paths makes)."""

    address = "http://127.0.0.1:1"
    endpoint = None

    def __init__(self) -> None:
        self.held: dict[str, bytes] = {}
        self.puts = 0

    def package_exists(self, name: str) -> bool:
        return name in self.held

    def upload_package(self, name: str, data: bytes) -> None:
        self.puts += 1
        self.held[name] = data


def test_the_engine_is_uploaded_once_per_content_and_uris_pass_through(tmp_path):
    engine = _package(tmp_path)
    client = _Client()
    env = {"py_modules": [str(engine), "s3://bucket/lib.zip"], "working_dir": "https://example.com/wd.zip"}
    shipped = packages.ship_local_paths(client, env, engine_dir=str(engine), request_timeout=5)  # type: ignore[arg-type]
    again = packages.ship_local_paths(client, env, engine_dir=str(engine), request_timeout=5)  # type: ignore[arg-type]
    assert shipped == again and client.puts == 1
    assert shipped["py_modules"][0] == f"gcs://{next(iter(client.held))}"
    assert shipped["py_modules"][1:] == ["s3://bucket/lib.zip"] and shipped["working_dir"] == env["working_dir"]
    assert env["py_modules"][0] == str(engine)  # the caller's dict is left alone


def test_other_local_code_without_ray_is_refused_naming_the_extra(tmp_path, monkeypatch):
    engine, other = _package(tmp_path / "a"), _package(tmp_path / "b")
    monkeypatch.setattr(packages, "ray_installed", lambda: False)
    client = _Client()
    for env in ({"py_modules": [str(engine), str(other)]}, {"py_modules": [str(engine)], "working_dir": str(other)}):
        with pytest.raises(RayExtraMissing, match=r'pip install "airflow-tune\[ray\]"') as err:
            packages.ship_local_paths(client, env, engine_dir=str(engine), request_timeout=5)  # type: ignore[arg-type]
        assert str(other) in str(err.value)


def test_a_local_requirements_file_without_ray_is_refused_before_submitting(tmp_path, monkeypatch):
    engine = _package(tmp_path)
    monkeypatch.setattr(packages, "ray_installed", lambda: False)
    with pytest.raises(RayExtraMissing, match="pip='requirements.txt'"):
        packages.ship_local_paths(_Client(), {"pip": "requirements.txt"}, engine_dir=str(engine), request_timeout=5)  # type: ignore[arg-type]
    env = {"pip": ["scikit-learn"], "env_vars": {"A": "1"}}
    assert packages.ship_local_paths(_Client(), env, engine_dir=str(engine), request_timeout=5) == env  # type: ignore[arg-type]


def test_with_ray_a_requirements_file_is_read_here_as_rays_client_does(tmp_path):
    engine = _package(tmp_path)
    (tmp_path / "requirements.txt").write_text("scikit-learn\n")
    env = {"pip": str(tmp_path / "requirements.txt")}
    shipped = packages.ship_local_paths(_Client(), env, engine_dir=str(engine), request_timeout=5)  # type: ignore[arg-type]
    assert shipped["pip"]["packages"] == ["scikit-learn"]


def test_what_needs_ray_local_paths_in_any_of_the_three_settings():
    assert ray_extra.needs_ray(None, None, None) == []
    assert ray_extra.needs_ray("s3://b/wd.zip", ["gcs://_ray_pkg_x.zip", "file:///opt/pkg.zip"], {}) == []
    found = ray_extra.needs_ray("./wd", ["pkg"], '{"py_modules": ["/opt/lib"], "working_dir": "/srv/wd"}')
    assert found == [
        "working_dir='./wd'",
        "working_dir='/srv/wd'",
        "py_modules entry '/opt/lib'",
        "py_modules entry 'pkg'",
    ]
    # Requirements files are read on this side by Ray's client; lists of requirements and conda env names are not.
    assert ray_extra.needs_ray(None, None, {"pip": ["x"], "conda": "myenv"}, pip=["y"]) == []
    found = ray_extra.needs_ray(None, None, {"conda": "env.yaml", "uv": "req.txt"}, pip="requirements.txt")
    assert found == ["pip='requirements.txt'", "uv='req.txt'", "conda='env.yaml'"]


def test_refusals_without_ray_name_the_extra_and_say_nothing_was_submitted(monkeypatch):
    monkeypatch.setattr(ray_extra, "ray_installed", lambda: False)
    ray_extra.refuse_without_ray(None, ["s3://b/lib.zip"], None)  # remote code needs no Ray here
    with pytest.raises(RayExtraMissing) as err:
        ray_extra.refuse_without_ray("./dags/wd", None, None)
    assert RAY_EXTRA in str(err.value) and "Nothing was written or submitted" in str(err.value)
    module = types.ModuleType("unusual_prefix_x_dagfile")
    exec("def train(config):\n    return {'loss': 1}\n", module.__dict__)
    module.train.__module__ = module.__name__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(RayExtraMissing, match="pickling the trainable unusual_prefix_x_dagfile:train by value"):
        shipping.trainable_code(module.train)
    assert (
        shipping.trainable_code(shipping.describe).import_path == "airflow_tune.utils.shipping:describe"
    )  # by name: no Ray needed


def test_by_value_loads_between_any_two_supported_releases_and_not_outside():
    for here in ("2.43.0", "2.50.1", "2.60.0"):
        for there in ("2.43.0", "2.50.1", "2.60.0"):
            assert ray_extra.by_value_problem(here, there) is None
    problem = ray_extra.by_value_problem("2.61.0", "2.43.0")
    assert problem and "Ray 2.61.0" in problem and "Ray 2.43.0" in problem
    problem = ray_extra.by_value_problem("2.60.0", "2.40.0")
    assert problem and "2.60.0" in problem and "2.40.0" in problem
    assert RAY_EXTRA in (ray_extra.by_value_problem(None, "2.60.0") or "")


def test_refuse_by_value_names_both_versions(monkeypatch):
    monkeypatch.setattr(ray_extra, "installed_ray_version", lambda: "2.61.1")
    with pytest.raises(Exception, match=r"dag:train is shipped by value.*2\.61\.1.*2\.50\.1.*Nothing was written"):
        ray_extra.refuse_by_value("dag:train", "2.50.1")


def test_the_modules_import_no_ray():
    probe = (
        "import sys; import airflow_tune.hooks.ray_extra, airflow_tune.hooks.packages, airflow_tune.hooks.jobs_client; "
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_by_value_refused_across_python_minors_naming_both_and_the_fix():
    here = "{}.{}".format(*sys.version_info[:2])
    other = f"3.{sys.version_info[1] + 1}.2"
    problem = ray_extra.by_value_problem("2.60.0", "2.60.0", other)
    assert problem and f"Python {here}" in problem and f"Python {other}" in problem
    assert "import path" in problem
    assert ray_extra.by_value_problem("2.60.0", "2.60.0", f"{here}.9") is None
    assert ray_extra.by_value_problem("2.60.0", "2.60.0", None) is None  # not known here: the cluster side refuses


def test_cluster_python_range():
    from airflow_tune.common.versions import python_minor, python_version_problem

    assert python_minor("3.13.1") == (3, 13) and python_minor("x") is None
    for ok in ("3.10.13", "3.11.7", "3.12.1", "3.13.0"):
        assert python_version_problem(ok) is None
    for bad in ("3.9.18", "3.14.0", "2.7.18"):
        problem = python_version_problem(bad)
        assert problem and bad in problem and "3.10 to 3.13" in problem
    assert "not a version number" in (python_version_problem("latest") or "")
