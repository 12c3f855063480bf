"""The package as PyPI users get it: the sdist and wheel built from a clean copy of the tree (what git tracks, plus new
files git does not ignore; no venvs, no egg-info, no build folders), both passing ``twine check --strict``, and the
wheel (not editable) installed with ``apache-airflow`` at the constraints' release and no extras into a fresh venv,
where Airflow lists the provider, its ray_tune connection type and its plugin from a fresh AIRFLOW_HOME.

One build and one install for the module (about a minute, most of it the install); `make test` runs it, `make check`
does not (``-m unit``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

import airflow_tune

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
VERSION = airflow_tune.__version__
DIST_INFO = f"airflow_tune-{VERSION}.dist-info"
#: What must never be in the wheel: the project's own trees and state.
NOT_SHIPPED = ("tests/", "dags/", "demo/", "benchmarks/", "docker/", "docs/", ".venv", ".git", "airflow_tune.egg-info")


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        pytest.fail("uv is not installed (the test dependency group brings it: make venv)")
    return found


def _airflow_release() -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.startswith("apache-airflow=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError("constraints.txt pins no apache-airflow")


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args[:4])} ... exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def _clean_copy(dest: Path) -> None:
    """The files git tracks (as they are in the working tree) and the new ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _clean_env(airflow_home: Path) -> dict[str, str]:
    """This process's environment without what points at the checkout or the test session's Airflow."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "UV_", "PYTEST", "RAY_"))
    }
    env.update(AIRFLOW_HOME=str(airflow_home), AIRFLOW__CORE__LOAD_EXAMPLES="False", PYTHONNOUSERSITE="1")
    return env


@dataclass
class Built:
    sdist: Path
    wheel: Path
    venv_python: Path
    env: dict[str, str]
    work: Path
    build_log: str


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    uv = _uv()
    with tempfile.TemporaryDirectory(prefix="aft-packaging-") as tmp:
        work = Path(tmp)
        source, dist, venv = work / "source", work / "dist", work / "venv"
        source.mkdir()
        _clean_copy(source)
        # uv builds the sdist, then the wheel from the unpacked sdist: what the sdist lacks, the wheel lacks too.
        log = _run(
            [uv, "build", "--no-python-downloads", "--python", sys.executable, "--out-dir", str(dist), str(source)],
            cwd=work,
        )
        sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
        assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in dist.iterdir())
        _run([uv, "venv", "-q", "--no-python-downloads", "--python", sys.executable, str(venv)], cwd=work)
        python = venv / "bin" / "python"
        _run(
            [
                *(uv, "pip", "install", "-q", "--python", str(python)),
                *("-c", str(REPO / "constraints.txt")),
                f"apache-airflow=={_airflow_release()}",
                str(wheels[0]),
            ],
            cwd=work,
        )
        (work / "airflow-home").mkdir()
        yield Built(sdists[0], wheels[0], python, _clean_env(work / "airflow-home"), work, log)


def test_twine_check_strict_passes_on_both(built: Built):
    out = _run([sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)], cwd=built.work)
    assert out.count("PASSED") == 2, out


def test_the_sdist_holds_the_license_notice_readme_and_package_data(built: Built):
    assert built.sdist.name == f"airflow_tune-{VERSION}.tar.gz"
    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "NOTICE", "README.md", "pyproject.toml", "PKG-INFO"} <= names
    assert {"airflow_tune/py.typed", "airflow_tune/plugins/static/uPlot.LICENSE"} <= names
    assert not [n for n in names if n.startswith((".venv", ".git/", ".compat", ".stack"))]


def test_the_wheel_holds_the_package_typed_licensed_and_nothing_of_the_project(built: Built):
    assert built.wheel.name == f"airflow_tune-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
    assert {f"{DIST_INFO}/licenses/LICENSE", f"{DIST_INFO}/licenses/NOTICE", "airflow_tune/py.typed"} <= names
    assert {"airflow_tune/plugins/static/experiment.html", "airflow_tune/plugins/static/uPlot.LICENSE"} <= names
    assert "airflow_tune/engine/__main__.py" in names
    assert [n for n in names if n.startswith(NOT_SHIPPED)] == []


INSPECT = r"""
import importlib.metadata as md, importlib.util, json, pathlib, sys
import airflow_tune
dist = md.distribution("airflow-tune")
meta = dist.metadata
package = pathlib.Path(airflow_tune.__file__).parent
print(json.dumps({
    "file": airflow_tune.__file__,
    "prefix": sys.prefix,
    "version": airflow_tune.__version__,
    "metadata_version": dist.version,
    "py_typed": (package / "py.typed").is_file(),
    "dist_files": [str(f) for f in dist.files or []],
    "requires_python": meta["Requires-Python"],
    "license": meta["License-Expression"],
    "license_files": meta.get_all("License-File") or [],
    "classifiers": meta.get_all("Classifier") or [],
    "urls": meta.get_all("Project-URL") or [],
    "extras": meta.get_all("Provides-Extra") or [],
    "requires": meta.get_all("Requires-Dist") or [],
    "direct_url": dist.read_text("direct_url.json"),
    "installed": sorted({(d.metadata["Name"] or "").lower() for d in md.distributions()}),
}))
"""


@pytest.fixture(scope="module")
def installed(built: Built) -> dict[str, Any]:
    return dict(json.loads(_run([str(built.venv_python), "-c", INSPECT], cwd=built.work, env=built.env)))


def test_the_wheel_installs_not_editable_typed_with_its_license_files(built: Built, installed: dict[str, Any]):
    assert Path(installed["file"]).is_relative_to(Path(installed["prefix"]))
    assert "site-packages" in installed["file"]
    assert installed["version"] == installed["metadata_version"] == VERSION
    assert '"editable"' not in (installed["direct_url"] or "")
    assert installed["py_typed"] is True
    assert {f"{DIST_INFO}/licenses/LICENSE", f"{DIST_INFO}/licenses/NOTICE"} <= set(installed["dist_files"])
    assert set(installed["license_files"]) == {"LICENSE", "NOTICE"}


def test_the_metadata_is_what_pypi_shows(installed: dict[str, Any]):
    assert SpecifierSet(installed["requires_python"]) == SpecifierSet(">=3.10,<3.14")
    assert installed["license"] == "Apache-2.0"
    assert {"Framework :: Apache Airflow", "Framework :: Apache Airflow :: Provider", "Typing :: Typed"} <= set(
        installed["classifiers"]
    )
    assert {url.split(",", 1)[0] for url in installed["urls"]} == {"Documentation", "Source", "Issues", "Changelog"}
    assert not {"test", "lint", "browser"} & set(installed["extras"])
    requires = {r.split(";")[0].strip() for r in installed["requires"] if "extra ==" not in r}
    assert not [r for r in requires if r.startswith("pendulum")]


def test_no_extras_means_no_ray_and_no_developer_tools(installed: dict[str, Any]):
    assert {"apache-airflow", "airflow-tune", "boto3", "pyarrow"} <= set(installed["installed"])
    assert not {"ray", "pytest", "ruff", "mypy", "moto", "playwright", "twine"} & set(installed["installed"])


def test_airflow_lists_the_provider(built: Built):
    airflow = str(built.venv_python.parent / "airflow")
    listed = json.loads(_run([airflow, "providers", "list", "--output", "json"], cwd=built.work, env=built.env))
    ours = [p for p in listed if p.get("package_name") == "airflow-tune"]
    assert ours and ours[0]["version"] == VERSION, listed


def test_airflow_registers_the_ray_tune_connection_type_with_its_hook(built: Built):
    airflow = str(built.venv_python.parent / "airflow")
    hooks = json.loads(_run([airflow, "providers", "hooks", "--output", "json"], cwd=built.work, env=built.env))
    ours = [h for h in hooks if h.get("package_name") == "airflow-tune"]
    assert ours == [
        {
            "connection_type": "ray_tune",
            "class": "airflow_tune.hooks.ray.RayHook",
            "conn_id_attribute_name": "ray_conn_id",
            "package_name": "airflow-tune",
            "hook_name": "Ray Tune (airflow-tune)",
        }
    ], hooks


def test_airflow_lists_the_experiment_view_plugin(built: Built):
    airflow = str(built.venv_python.parent / "airflow")
    listed = json.loads(_run([airflow, "plugins", "--output", "json"], cwd=built.work, env=built.env))
    ours = [p for p in listed if p.get("name") == "airflow_tune_experiment_view"]
    assert len(ours) == 1, listed
