"""The docs tree builds with Sphinx with warnings as errors (``make docs`` does the same), and a broken example
include or cross-reference fails that build: the examples are included from the example DAGs by their
``# [START ...]`` / ``# [END ...]`` markers, so a DAG that loses a marker breaks the docs here, not silently.

The build imports the Airflow side's modules for the API page (airflow, never ray): no cluster, a few seconds.
`make test` runs it, `make check` does not (``-m unit``; tests/unit/test_readme_and_docs.py checks the markers there).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]


def _build(source: Path, out: Path, builder: str = "html") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_the_docs_build_with_warnings_as_errors(tmp_path):
    built = _build(REPO / "docs", tmp_path / "html")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert built.stderr.strip() == ""
    pages = {p.relative_to(tmp_path / "html").as_posix() for p in (tmp_path / "html").rglob("*.html")}
    assert {"index.html", "operators/ray_tune.html", "security.html", "api.html"} <= pages
    # The included example is the DAG's code: its marker comments are not shown, its lines are.
    page = (tmp_path / "html" / "operators" / "ray_tune.html").read_text()
    assert "digits_tuning.trainables:train_mlp" in page and "[START" not in page
    api = (tmp_path / "html" / "api.html").read_text()
    assert "airflow_tune.operators.tune.RayTuneOperator" in api and "storage_path" in api


@pytest.fixture
def docs_copy(tmp_path: Path) -> Path:
    """docs/ and dags/ side by side, as in the checkout, so a test can break one without touching the tree."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copytree(REPO / "dags", tmp_path / "dags", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_dag_that_lost_an_example_marker_fails_the_build(docs_copy):
    dag = docs_copy / "dags" / "digits_retrain_weekly.py"
    dag.write_text(dag.read_text().replace("# [END howto_operator_ray_tune]", "# the end of the tune task"))
    built = _build(docs_copy / "docs", docs_copy / "out", "dummy")
    assert built.returncode != 0
    assert "end-before pattern not found: # [END howto_operator_ray_tune]" in built.stderr


def test_a_broken_reference_fails_the_build(docs_copy):
    page = docs_copy / "docs" / "operators" / "ray_tune.rst"
    page.write_text(page.read_text().replace(":doc:`security model </security>`", ":doc:`security model </securty>`"))
    built = _build(docs_copy / "docs", docs_copy / "out", "dummy")
    assert built.returncode != 0
    assert "ray_tune.rst:" in built.stderr and "unknown document: '/securty'" in built.stderr
