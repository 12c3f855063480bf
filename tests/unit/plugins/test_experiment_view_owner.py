"""Whose experiment the Experiment view shows: only one whose files record an owner of the DAG the user was
authorized for. Files made with the engine's own code in a local ``file://`` storage path; the decision is read back
through :func:`build_view` and, for the refusal, through the plugin's real FastAPI app with Airflow's real auth (the
same refusal through the real API server with per-DAG permissions is in tests/e2e/test_view_ownership.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.plugins.experiment_shape import TaskFacts, build_view
from tests.support.experiment_files import METRIC, make_experiment, owner_record
from tests.unit.plugins.test_experiment_view import QUERY, api  # noqa: F401 - the app with Airflow's auth, as a fixture

DAG_A, DAG_B = "retrain", "other_team"
MARK = "b-secret-value"


def _facts(uri: str, **kw: Any) -> TaskFacts:
    base = {"dag_id": DAG_A, "run_id": "manual__1", "task_id": "tune", "state": "success", "is_tune": True}
    return TaskFacts(**{**base, "experiment_uri": uri, **kw})


def _edit(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _files(tmp_path: Path, name: str) -> Path:
    return tmp_path / name / ".airflow_tune"


def _mark_everything(folder: Path) -> None:
    """Put a marker into every config of every file, so a leak of any of them shows."""

    def mark(value: Any) -> None:
        if isinstance(value, dict):
            for key, child in value.items():
                if key in ("config", "best_config") and isinstance(child, dict):
                    child["marker"] = MARK
                mark(child)
        elif isinstance(value, list):
            for child in value:
                mark(child)

    for path in folder.glob("*.json"):
        _edit(path, mark)


def _foreign(tmp_path: Path, name: str = "theirs", **kw: Any) -> str:
    make_experiment(str(tmp_path), name, 4, iterations=3, owner=owner_record(DAG_B), **kw)
    _mark_everything(_files(tmp_path, name))
    return f"file://{tmp_path}/{name}"


def _assert_nothing_of_theirs(view: dict[str, Any], tmp_path: Path) -> None:
    text = json.dumps(view)
    assert set(view) == {"state", "message", "task", "refresh_s", "experiment", "experiment_uri"}, view
    for value in (MARK, METRIC, "exp_0000", "checkpoint", "theirs-1"):
        assert value not in text, (value, text)


def test_another_dags_experiment_is_refused_naming_it_and_its_owner(tmp_path):
    view = build_view(_facts(_foreign(tmp_path)))
    assert view["state"] == "refused" and view["refresh_s"] is None
    assert view["message"] == (
        "Experiment theirs belongs to DAG 'other_team', task 'tune', not to DAG 'retrain': it is not shown here."
    )
    _assert_nothing_of_theirs(view, tmp_path)
    # While the task runs too (its rendered experiment_name points there): no progress of theirs either.
    live = build_view(_facts(_foreign(tmp_path, "theirs_live", finished=False), state="deferred"))
    assert live["state"] == "refused" and "belongs to DAG 'other_team'" in live["message"]


def test_the_refusal_through_the_app_with_airflows_auth(api, tmp_path):  # noqa: F811
    api.holder["facts"] = _facts(_foreign(tmp_path))
    resp = api.get("/airflow-tune/experiment/data", params=QUERY, headers=api.viewer)
    assert resp.status_code == 200, resp.text
    assert resp.json()["state"] == "refused" and MARK not in resp.text


def test_a_mapped_owner_is_named_with_its_map_index(tmp_path):
    make_experiment(str(tmp_path), "mapped", 2, owner=owner_record(DAG_B, "tune_each", 3))
    view = build_view(_facts(f"file://{tmp_path}/mapped"))
    assert "belongs to DAG 'other_team', task 'tune_each', map index 3," in view["message"]


@pytest.mark.parametrize(
    "owner",
    [None, [DAG_A, "tune"], {"dag_id": DAG_A}, {"dag_id": 7, "task_id": "tune", "map_index": -1, "run_id": None}],
    ids=["missing", "a list", "no task", "dag id not text"],
)
def test_files_with_no_owner_or_a_malformed_one_are_refused(tmp_path, owner):
    make_experiment(str(tmp_path), "old", 3, owner=owner_record(DAG_A))
    for name in ("progress.json", "result.json", "history.json"):
        _edit(_files(tmp_path, "old") / name, lambda d: d.update(owner=owner) if owner else d.pop("owner"))
    view = build_view(_facts(f"file://{tmp_path}/old"))
    assert view["state"] == "refused"
    assert view["message"].startswith("Experiment old is not shown: its progress.json records no owner")
    assert METRIC not in json.dumps(view)


def test_every_file_read_must_agree(tmp_path):
    """progress.json and result.json must each prove the owner; a history.json naming another owner refuses too."""
    make_experiment(str(tmp_path), "mixed", 3, owner=owner_record(DAG_A))
    uri, folder = f"file://{tmp_path}/mixed", _files(tmp_path, "mixed")
    assert build_view(_facts(uri))["state"] == "experiment"
    for name, owner, refused in (
        ("result.json", owner_record(DAG_B), "belongs to DAG 'other_team'"),
        ("result.json", None, "its result.json records no owner"),
        ("progress.json", owner_record(DAG_B), "belongs to DAG 'other_team'"),
        ("history.json", owner_record(DAG_B), "belongs to DAG 'other_team'"),
    ):
        saved = (folder / name).read_text()
        _edit(folder / name, lambda d, o=owner: d.update(owner=o) if o else d.pop("owner"))
        view = build_view(_facts(uri))
        assert view["state"] == "refused" and refused in view["message"], (name, view)
        (folder / name).write_text(saved)


def test_a_history_without_an_owner_is_shown_only_beside_a_file_that_proved_it(tmp_path):
    make_experiment(str(tmp_path), "curves", 3, owner=owner_record(DAG_A))
    folder = _files(tmp_path, "curves")
    _edit(folder / "history.json", lambda d: d.pop("owner", None))
    view = build_view(_facts(f"file://{tmp_path}/curves"))
    assert view["state"] == "experiment" and len(view["curves"]) == 3  # the result proved the owner
    (folder / "result.json").unlink()
    (folder / "progress.json").unlink()
    view = build_view(_facts(f"file://{tmp_path}/curves", state="running"))
    assert view["state"] == "starting" and "curves" not in view  # nothing proved it: not shown
    _edit(folder / "history.json", lambda d: d.update(owner=owner_record(DAG_B)))
    assert build_view(_facts(f"file://{tmp_path}/curves", state="running"))["state"] == "refused"


def test_the_same_dags_other_tasks_and_runs_are_its_readers(tmp_path):
    """Another task of the same DAG (a promote or sensor task, or a templated name pointing at its tune task's
    experiment) sees it, with a note saying whose it is; so does another run of a default-named one."""
    make_experiment(str(tmp_path), "shared", 3, owner=owner_record(DAG_A, "tune", run_id="manual__0"))
    uri = f"file://{tmp_path}/shared"
    view = build_view(_facts(uri, run_id="manual__0"))
    assert view["state"] == "experiment" and view["owner"] == owner_record(DAG_A, "tune", run_id="manual__0")
    assert view["problems"] == []
    other = build_view(_facts(uri, task_id="tune_again"))
    assert other["state"] == "experiment" and other["best"]["trial_id"] == view["best"]["trial_id"]
    assert other["problems"][0] == (
        "This experiment was written by DAG 'retrain', task 'tune', run 'manual__0' of this DAG, not by this task "
        "instance."
    )
