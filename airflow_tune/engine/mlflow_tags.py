"""The tags of the engine's MLflow runs (:mod:`~airflow_tune.engine.mlflow_tracking` writes them): how its runs are
found again, and whose a parent run is.

A parent run is found by its experiment's name, which another task can set too: it is adopted only when its owner tags
are the spec's owner, compared as :func:`~airflow_tune.common.contract.owner_differs` compares the owner recorded beside
an experiment (the DAG, task and map index; the DAG run too when the recorded owner names one). A parent run without
owner tags was not written by this version, and is refused as another owner's is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_tune.common.contract import describe_owner, owner_differs
from airflow_tune.common.spec import ExperimentSpec

TAG_EXPERIMENT = "airflow_tune.experiment"
TAG_ROLE = "airflow_tune.role"
TAG_TRIAL = "airflow_tune.trial_id"
TAG_PARENT = "mlflow.parentRunId"
#: The owner's keys (``ExperimentSpec.owner``) as parent run tags.
OWNER_TAGS = {key: f"airflow_tune.{key}" for key in ("dag_id", "task_id", "map_index", "run_id")}


def parent_tags(spec: ExperimentSpec) -> dict[str, str]:
    """A new parent run's tags: the spec's own tags, then ours (the experiment, its metric and mode, its owner)."""
    assert spec.mlflow is not None
    return {
        **spec.mlflow.get("tags", {}),
        TAG_EXPERIMENT: spec.name,
        TAG_ROLE: "parent",
        "airflow_tune.experiment_uri": spec.experiment_uri,
        "airflow_tune.metric": spec.metric,
        "airflow_tune.mode": spec.mode,
        **owner_tags(spec.owner),
    }


def owner_tags(owner: Mapping[str, Any] | None) -> dict[str, str]:
    """The owner as tags: DAG, task and map index always, the DAG run only when the owner has one."""
    if owner is None:
        return {}
    return {tag: str(owner[key]) for key, tag in OWNER_TAGS.items() if owner.get(key) is not None}


def recorded_owner(tags: Mapping[str, str]) -> dict[str, Any] | None:
    """The owner a parent run's tags record, or None when they record none. A run tagged before the map index was
    (dag_id, task_id, run_id only) counts as an unmapped task's: a task is mapped or not, so this adopts no other
    task instance's run, and a mapped instance refuses it."""
    if OWNER_TAGS["dag_id"] not in tags and OWNER_TAGS["task_id"] not in tags:
        return None
    owner: dict[str, Any] = {key: tags.get(tag) for key, tag in OWNER_TAGS.items()}
    if owner["map_index"] is None:
        owner["map_index"] = "-1"
    return owner


def foreign_parent(run: Any, spec: ExperimentSpec) -> str | None:
    """Why ``run`` (a parent run found by the spec's experiment name) is not this spec's owner's to adopt, or None.

    Names the MLflow experiment, the run and its owner as :func:`~airflow_tune.common.contract.describe_owner` shows it
    (never another value of that run), and the fix; one line, as it becomes the job's verdict.
    """
    assert spec.mlflow is not None
    recorded = recorded_owner(run.data.tags or {})
    if not owner_differs(recorded, spec.owner):
        return None
    return (
        f"the MLflow experiment {spec.mlflow['experiment_name']!r} already holds parent run {run.info.run_id} of "
        f"experiment {spec.name!r}, which belongs to {describe_owner(recorded)}, not to this task: give this task "
        "its own experiment_name (or leave it unset) or its own mlflow_tracking experiment_name; nothing was "
        "written to that run and no trial has run"
    )
