"""The README (the PyPI page) and the docs tree agree with what the tests run, checked without building the docs
(tests/packaging/test_docs.py builds them with warnings as errors):

- the README's DAG snippet is the example DAG's code, line for line (a README cannot include a file);
- its links into the repository name files that exist;
- its supported-versions table is the docs' one;
- every ``literalinclude`` of an example DAG names markers that the file holds once each, in order.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
#: Where README links into the repository point (pyproject's Source URL, at the main branch).
REPO_URL = "https://github.com/airflow-tune/airflow-tune/blob/main/"
#: The example DAG the README's snippet is taken from.
README_DAG = REPO / "dags" / "digits_retrain_weekly.py"


def _section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else None]


def test_the_readme_dag_snippet_is_the_example_dag_line_for_line():
    """Each line of the README's python block (but the ``...`` that mark cuts) is a line of the DAG file, in order,
    with its indentation: a changed DAG fails this until the README shows it."""
    section = _section(README, "A DAG")
    assert f"`{README_DAG.relative_to(REPO)}`" in section
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet, "no python block under 'A DAG'"
    lines = [line for line in snippet.group(1).splitlines() if line.strip() and line.strip() != "..."]
    assert len(lines) > 20
    dag_lines = README_DAG.read_text().splitlines()
    position = 0
    for line in lines:
        try:
            position = dag_lines.index(line, position) + 1
        except ValueError:
            raise AssertionError(f"README line not in {README_DAG.name} (after line {position}): {line!r}") from None


def test_the_readme_links_into_the_repository_name_files_that_exist():
    links = re.findall(r"\]\((https://github\.com/airflow-tune/airflow-tune/blob/main/[^)\s#]+)", README)
    assert any("/docs/" in link for link in links)
    missing = [link for link in links if not (REPO / link.removeprefix(REPO_URL)).is_file()]
    assert missing == []
    # Every docs page a reader can reach from the index is linked from the README's list, or from the pages it links.
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.rst")}
    linked = {link.removeprefix(REPO_URL + "docs/") for link in links if "/docs/" in link}
    assert {"installation.rst", "security.rst", "supported-versions.rst", "api.rst"} <= linked <= pages


def _markdown_table(markdown: str) -> list[list[str]]:
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows]
    return [row for row in cells if not all(re.fullmatch(r":?-+:?", c) for c in row)]


def _rst_list_table(rst: str) -> list[list[str]]:
    table = rst[rst.index(".. list-table::") :]
    rows: list[list[str]] = []
    for line in table.splitlines()[1:]:
        if line.startswith("   * - ") or line == "   * -":
            rows.append([line[len("   * - ") :].strip()])
        elif line.startswith("     - "):
            rows[-1].append(line[len("     - ") :].strip())
        elif rows and line and not line.startswith(" "):
            break
    return rows


def test_the_readme_supported_versions_table_is_the_docs_one():
    readme = _markdown_table(_section(README, "Supported versions"))
    docs = _rst_list_table((DOCS / "supported-versions.rst").read_text())
    as_rst = [[re.sub(r"`([^`]+)`", r"``\1``", cell) for cell in row] for row in readme]
    assert len(readme) == 5 and as_rst == docs


def test_every_example_included_in_the_docs_has_its_markers():
    includes = 0
    for page in DOCS.rglob("*.rst"):
        text = page.read_text()
        for block in re.finditer(r"\.\. literalinclude:: (\S+)\n((?:   :.*\n)+)", text):
            target = (page.parent / block.group(1)).resolve()
            assert target.is_file(), (page.name, block.group(1))
            options = dict(re.findall(r"   :([\w-]+): ?(.*)", block.group(2)))
            start, end = options.get("start-after"), options.get("end-before")
            assert start and end, f"{page.name}: include {block.group(1)} without markers"
            assert start.startswith("# [START ") and end == start.replace("[START ", "[END ", 1)
            source = target.read_text()
            assert source.count(start) == 1 and source.count(end) == 1, (target.name, start)
            assert source.index(start) < source.index(end), (target.name, start)
            if target.is_relative_to(REPO / "dags"):
                includes += 1
    assert includes >= 6
