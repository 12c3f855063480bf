"""Trainables given as objects: by import path when the cluster can import them by name, else pickled by value into a
package that travels with the job. The package is loaded here in a fresh Python that cannot import the DAG file."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.utils.shipping import SHIPPED_PACKAGE, shipped_package, trainable_code

DAG_FILE = """
from ray import tune

OFFSET = 10

def helper(x):
    return (x - 3) ** 2 + OFFSET

def train(config):
    return {"loss": helper(config["x"])}

class Stepper(tune.Trainable):
    def setup(self, config):
        self.x = config["x"]

    def step(self):
        return {"loss": helper(self.x)}
"""


@pytest.fixture
def dag_module(tmp_path, monkeypatch):
    """A DAG file loaded the way Airflow loads one: under a generated module name no other process can import."""
    path = tmp_path / "dags" / "my_dag.py"
    path.parent.mkdir()
    path.write_text(DAG_FILE)
    name = "unusual_prefix_0123abcd_my_dag"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def _call_in_fresh_python(package_dir: str, attr: str, expression: str, tmp_path: Path) -> str:
    """Import the shipped package in a new interpreter (no DAG file on its path) and evaluate ``expression``."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(package_dir).parent)!r})
        from {SHIPPED_PACKAGE} import {attr} as trainable
        print({expression})
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_a_function_in_the_dag_file_ships_by_value_with_what_it_uses(dag_module, tmp_path):
    shipment = trainable_code(dag_module.train)
    assert shipment.by_value
    assert shipment.import_path == f"{SHIPPED_PACKAGE}:train"
    assert shipment.source == "unusual_prefix_0123abcd_my_dag:train"
    with shipped_package(shipment) as folder:
        assert _call_in_fresh_python(folder, "train", "trainable({'x': 5})", tmp_path) == "{'loss': 14}"
    assert not Path(folder).exists()  # removed once the job is submitted


def test_a_class_in_the_dag_file_ships_by_value(dag_module, tmp_path):
    shipment = trainable_code(dag_module.Stepper)
    assert shipment.by_value and shipment.import_path == f"{SHIPPED_PACKAGE}:Stepper"
    with shipped_package(shipment) as folder:
        expression = "(issubclass(trainable, __import__('ray').tune.Trainable), trainable.__name__)"
        assert _call_in_fresh_python(folder, "Stepper", expression, tmp_path) == "(True, 'Stepper')"


def test_lambdas_and_closures_ship_by_value(tmp_path):
    scale = 4

    def make() -> Any:
        def closure(config: dict[str, Any]) -> dict[str, Any]:
            return {"loss": config["x"] * scale}

        return closure

    for obj, attr, expected in [
        (lambda config: {"loss": -config["x"]}, "trainable", "{'loss': -2}"),
        (make(), "closure", "{'loss': 8}"),
    ]:
        shipment = trainable_code(obj)
        assert shipment.by_value and shipment.import_path == f"{SHIPPED_PACKAGE}:{attr}"
        with shipped_package(shipment) as folder:
            assert _call_in_fresh_python(folder, attr, "trainable({'x': 2})", tmp_path) == expected


def importable(config: dict[str, Any]) -> None:
    pass


def test_an_object_the_cluster_can_import_by_name_travels_by_import_path():
    shipment = trainable_code(importable)
    assert not shipment.by_value
    assert shipment.import_path == "tests.unit.utils.test_shipping:importable"


def test_an_object_that_cannot_be_pickled_fails_before_submission_with_the_fix():
    lock = threading.Lock()

    def holds_a_lock(config: dict[str, Any]) -> None:
        with lock:
            pass

    with pytest.raises(TypeError, match="cannot be pickled.*py_modules="):
        trainable_code(holds_a_lock)


def test_not_a_callable_is_refused():
    with pytest.raises(TypeError, match="give a function, a tune.Trainable subclass, or an import path"):
        trainable_code(42)


def test_another_python_on_the_cluster_is_named_with_the_fix(dag_module, tmp_path):
    shipment = trainable_code(dag_module.train)
    with shipped_package(shipment) as folder:
        init = Path(folder) / "__init__.py"
        init.write_text(init.read_text().replace(f"PICKLED_ON = {list(sys.version_info[:2])!r}", "PICKLED_ON = [2, 7]"))
        code = f"import sys; sys.path.insert(0, {str(Path(folder).parent)!r}); import {SHIPPED_PACKAGE}"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode != 0
    assert "pickled by value on Python 2.7" in out.stderr and "same Python minor version" in out.stderr
