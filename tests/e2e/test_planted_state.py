"""Storage a conf can aim at is not believed (issue 30, finding 2), through Airflow on the local stack: a trigger conf
chooses the team folder under the DAG file's root (``storage_path=".../{{ params.team }}"``), and someone who can write
another team's prefix has planted there, for the experiment this run will have, a ``tuner.pkl`` whose unpickling
leaves a marker (with an experiment state beside it, so Tune would restore it), or a ``result.json`` copied from a
real run and edited to name this one (name, URI, fingerprint, owner: every field a reader checked before). Neither is
believed: the pickle is never loaded (no marker, no Ray job), and the forged result fails the task, naming why."""

from __future__ import annotations

import json
import os
import pickle
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import RESULT_FILE, manifest_uri
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag, run_id_for

pytestmark = pytest.mark.usefixtures("stack")
FILE = "storage_cases.py"
DAG_ID = "aft_storage_team_tail"


class _Marker:
    """Unpickling this leaves a file: proof that someone ran ``pickle.loads`` on it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _date() -> datetime:
    return datetime(2004, 2, 2, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _root() -> str:
    return str(load_dag(DAG_ID, FILE).get_task("tune").storage_path).split("/{{")[0]


@pytest.mark.timeout(240)
def test_a_planted_tuner_pkl_under_a_conf_chosen_folder_is_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    date = _date()
    name = experiment(DAG_ID, run_id_for(date))
    planted = f"{_root()}/team-planted/{name}"
    storage.write_bytes(f"{planted}/tuner.pkl", pickle.dumps(_Marker(str(marker))))
    storage.write_bytes(f"{planted}/experiment_state-2004-02-02_00-00-00.json", b'{"trial_data": []}')

    run = run_dag(load_dag(DAG_ID, FILE), {"team": "team-planted"}, logical_date=date)

    assert run.task_states() == {"tune": "failed"}
    [error] = run.errors("tune")
    assert "Tune state (tuner.pkl) exists" in str(error) and "refusing to restore it" in str(error), error
    assert jobs_of(name) == [], "refused before any Ray job was submitted"
    assert not marker.exists() and not os.path.exists(str(marker))


@pytest.mark.timeout(300)
def test_a_result_copied_from_another_run_and_edited_to_name_this_one_is_not_believed():
    first = run_dag(load_dag(DAG_ID, FILE), {"team": "team-c"}, logical_date=_date())
    assert first.state == "success", first.errors("tune")
    genuine = storage.read_json(manifest_uri(first.xcom("tune")["experiment_uri"], RESULT_FILE))

    date = _date()
    name = experiment(DAG_ID, run_id_for(date))
    target = f"{_root()}/team-d/{name}"
    forged = {
        **genuine,
        "experiment": name,
        "experiment_uri": target,
        "owner": {**genuine["owner"], "run_id": run_id_for(date)},
        "best_config": {"x": 1000, "steps": 2},  # the forger's "winner"
        "best_checkpoint_uri": genuine["best_checkpoint_uri"].replace(genuine["experiment_uri"], target),
    }
    storage.write_bytes(manifest_uri(target, RESULT_FILE), json.dumps(forged).encode())

    second = run_dag(load_dag(DAG_ID, FILE), {"team": "team-d"}, logical_date=date)

    assert second.task_states() == {"tune": "failed"}
    [error] = second.errors("tune")
    assert "is not believed" in str(error) and "ran another experiment" in str(error), error
    assert second.xcom("tune") is None
    assert jobs_of(name) == [], "nothing was submitted for the forged experiment"
