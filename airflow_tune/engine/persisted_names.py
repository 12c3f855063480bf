"""The module paths an experiment saved by an earlier airflow-tune may name.

Tune pickles by reference (module and name) what the engine hands it: ``tuner.pkl`` and the experiment state name
classes of the spec and of storage (``airflow_tune.spec.experiment``, ``airflow_tune.storage``, ...). 0.1's layout
moved what both sides import under :mod:`airflow_tune.common`; before a restore unpickles that state, each old path
is registered as the module it became, so an experiment saved before the move restores after it. Only modules the
engine imports anyway are named (the engine's own paths did not move).
"""

from __future__ import annotations

import importlib
import sys

#: Old module path -> the module it is now. The spec's submodules are listed one by one: unpickling looks a name up
#: in ``sys.modules`` whole, and ``airflow_tune.spec`` is now the public face's module, not the package.
MOVED_MODULES = {
    "airflow_tune.contract": "airflow_tune.common.contract",
    "airflow_tune.jsonsafe": "airflow_tune.common.jsonsafe",
    "airflow_tune.provenance": "airflow_tune.common.provenance",
    "airflow_tune.storage": "airflow_tune.common.storage",
    "airflow_tune.versions": "airflow_tune.common.versions",
    **{
        f"airflow_tune.spec.{name}": f"airflow_tune.common.spec.{name}"
        for name in (
            "arguments",
            "callbacks",
            "compatibility",
            "errors",
            "experiment",
            "form_schema",
            "identity",
            "naming",
            "parts",
            "points",
            "resources",
            "space",
            "stopping",
            "tracking",
            "train_workers",
            "trust",
            "tune_objects",
        )
    },
}


def register_moved_modules() -> None:
    """Make every old path in :data:`MOVED_MODULES` resolve to its module, for unpickling saved Tune state."""
    for old, new in MOVED_MODULES.items():
        sys.modules.setdefault(old, importlib.import_module(new))
