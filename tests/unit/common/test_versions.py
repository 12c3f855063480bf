"""The supported range of the cluster's Ray (airflow_tune.common.versions): pure logic, read as pip reads
>=2.43.0,<2.61."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_tune.common.versions import SUPPORTED_RAY, describe_supported_ray, ray_version_problem


def test_the_range_is_the_one_the_ray_extra_installs():
    assert SUPPORTED_RAY == ("2.43.0", "2.61")
    assert describe_supported_ray() == "Ray 2.43.0 to 2.60.x (>=2.43.0,<2.61)"


@pytest.mark.parametrize(
    "version",
    ["2.43.0", "2.43.1", "2.44.0", "2.50.1", "2.50.0rc1", "2.59.0", "2.60.0", "2.60.9", "2.60.0.post1", " 2.60.0 "],
)
def test_inside_the_range_and_at_its_lower_end(version):
    assert ray_version_problem(version) is None


@pytest.mark.parametrize(
    ("version", "side"),
    [
        ("2.42.1", "older"),
        ("2.43.0rc1", "older"),  # a pre-release of 2.43.0 comes before it
        ("2.43.0.dev0", "older"),
        ("2.40.0", "older"),
        ("1.13.1", "older"),
        ("2.61", "newer"),  # the upper end is excluded
        ("2.61.0", "newer"),
        ("2.61.0rc1", "newer"),  # a pre-release of the excluded release, as pip's <2.61 excludes it
        ("2.61.0.dev0", "newer"),
        ("3.0.0.dev0", "newer"),  # Ray's nightly wheels
        ("3.0.0", "newer"),
    ],
)
def test_outside_both_ends(version, side):
    problem = ray_version_problem(version)
    assert problem == f"Ray {version} is {side} than airflow-tune supports (Ray 2.43.0 to 2.60.x (>=2.43.0,<2.61))"


@pytest.mark.parametrize("version", ["", "junk", "2.60.0-custom+build!x", "v", "None", "2..60"])
def test_garbage_is_a_problem_naming_the_value_and_the_range(version):
    problem = ray_version_problem(version)
    assert problem is not None
    assert repr(version) in problem and "not a version number" in problem and ">=2.43.0,<2.61" in problem


def test_the_module_imports_no_ray():
    code = "import sys, airflow_tune.common.versions; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _engine_import(patch: str) -> subprocess.CompletedProcess:
    """Import the engine package in a fresh interpreter after ``patch`` (what a cluster of another Python or Ray
    would report), as ``python -m airflow_tune.engine`` does first on the cluster. ``packaging`` is imported
    before the patch: it picks its own code by the Python it runs on."""
    code = f"import sys, importlib.metadata as metadata, packaging.version\n{patch}\nimport airflow_tune.engine\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("patch", "named"),
    [
        ("sys.version_info = (3, 9, 18, 'final', 0)", "Python 3.9.18 is outside"),
        ("sys.version_info = (3, 14, 0, 'final', 0)", "Python 3.14.0 is outside"),
        ("metadata.version = lambda name: '2.40.0'", "Ray 2.40.0 is older"),
    ],
)
def test_the_engine_refuses_a_python_or_ray_it_cannot_run_on_at_its_start(patch, named):
    done = _engine_import(patch)
    assert done.returncode != 0
    verdict = [line for line in done.stdout.splitlines() if line.startswith("[airflow-tune] verdict: ")]
    assert verdict and "engine cannot run here" in verdict[0] and named in verdict[0], done.stdout
    assert "ImportError: airflow-tune's engine cannot run here" in done.stderr


def test_the_engine_imports_on_this_python_and_ray():
    done = _engine_import("")
    assert done.returncode == 0 and not done.stdout, (done.stdout, done.stderr)
