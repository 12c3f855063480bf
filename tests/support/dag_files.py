"""A DAG file loaded as Airflow loads one: under a generated module name (``unusual_prefix_...``), which no other
process can import by name; and those modules forgotten after each test."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest


def load_dag_file(tmp_path: Path, folder: str, source: str) -> ModuleType:
    """``source`` written to ``<tmp_path>/<folder>/my_dag.py`` and loaded as Airflow loads a DAG file."""
    path = tmp_path / folder / "my_dag.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    name = f"unusual_prefix_{folder}_my_dag"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def forget_dag_modules() -> Iterator[None]:
    """Use in a test module (``from tests.support.dag_files import forget_dag_modules``): the DAG-file modules a
    test loaded leave ``sys.modules`` after it."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("unusual_prefix_"):
            del sys.modules[name]
