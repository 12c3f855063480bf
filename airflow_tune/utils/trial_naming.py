"""Tune's ``trial_name_creator`` and ``trial_dirname_creator`` as RayTuneOperator takes them: code written in the DAG
file, a function or its import path, never templated. A function travels as the trainable does
(:mod:`airflow_tune.utils.shipping`: by import path when the cluster can import it by name, else by value in the
shipped package, under the field's name); the spec carries the import path either way."""

from __future__ import annotations

from typing import Any

from airflow_tune.common.spec import IMPORT_PATH
from airflow_tune.common.spec.trial_output import NAMING_FIELDS
from airflow_tune.utils import shipping


def creators(trial_name_creator: Any, trial_dirname_creator: Any) -> dict[str, Any]:
    """The creators given, by field; raise TypeError naming a value that is neither a function nor an import path."""
    given = {"trial_name_creator": trial_name_creator, "trial_dirname_creator": trial_dirname_creator}
    for field, value in given.items():
        if value is None or callable(value) or (isinstance(value, str) and IMPORT_PATH.match(value)):
            continue
        raise TypeError(
            f"{field} = {value!r}: give a function taking a Trial and returning a str, written in the DAG file, or "
            "its import path 'package.module:function' (importable on the cluster)"
        )
    return {field: value for field, value in given.items() if value is not None}


def literal_paths(given: dict[str, Any]) -> dict[str, set[str]]:
    """The import paths the DAG file wrote for each creator field (every field listed, so a value mapped from an
    XCom through ``expand()`` is seen as data and refused)."""
    return {field: ({given[field]} if isinstance(given.get(field), str) else set()) for field in NAMING_FIELDS}


def creator_codes(given: dict[str, Any]) -> dict[str, shipping.TrainableCode]:
    """How each creator given as a function travels (pickled by value when the cluster cannot import it)."""
    return {
        field: shipping.trainable_code(value, attr=field, what=field)
        for field, value in given.items()
        if not isinstance(value, str)
    }
