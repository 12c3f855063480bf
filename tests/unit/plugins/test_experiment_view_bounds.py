"""The Experiment view is bounded whatever the experiment's files hold: the reducers fuzzed with hostile shapes (pure
logic), then malformed, oversized and rewritten files through the plugin's real FastAPI app with Airflow's auth.

The documented bound: the data endpoint's response is at most ``MAX_RESPONSE_BYTES`` (1 MiB) of JSON, whatever the
files hold; an ordinary experiment's is tens of KiB (tests/unit/plugins/test_experiment_view.py: 2,000 trials,
61 KiB)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.plugins import experiment_bounds as bounds
from airflow_tune.plugins import experiment_files
from airflow_tune.plugins.experiment_bounds import fit, response_bytes
from airflow_tune.plugins.experiment_files import BadFile, ExperimentFiles
from airflow_tune.plugins.experiment_shape import TaskFacts, build_view, experiment_view
from tests.support.experiment_files import make_experiment, owner_record
from tests.unit.plugins.test_experiment_view import QUERY, api  # noqa: F401 - the app with Airflow's auth, as a fixture

DAG = "retrain"
OWNER = owner_record(DAG)
TRIAL = {"trial_id": "t1", "status": "TERMINATED", "iteration": 3, "value": 0.9, "config": {"lr": 0.1, "o": {"n": 1}}}
PROGRESS = {
    "experiment": "e",
    "owner": OWNER,
    "metric": "acc",
    "mode": "max",
    "updated_at": 2.0,
    "num_trials": 2,
    "counts": {"RUNNING": 1, "TERMINATED": 1},
    "best": {"trial_id": "t1", "value": 0.9, "config": {"lr": 0.1}},
    "top": [TRIAL],
    "running": [{**TRIAL, "trial_id": "t2", "status": "RUNNING"}],
}
RESULT = {
    "experiment": "e",
    "owner": OWNER,
    "metric": "acc",
    "mode": "max",
    "status": "succeeded",
    "finished_at": 1.0,
    "job_id": "j",
    "num_trials": 2,
    "num_terminated": 1,
    "num_errored": 1,
    "best_trial_id": "t1",
    "best_config": {"lr": 0.1},
    "best_metrics": {"acc": 0.9, "training_iteration": 3},
    "best_checkpoint_uri": "s3://b/e/t1/checkpoint_000002",
    "trials": [
        {"trial_id": "t1", "status": "TERMINATED", "config": {"lr": 0.1}, "metrics": {"acc": 0.9}, "error": None},
        {"trial_id": "t2", "status": "ERROR", "config": {"lr": 1}, "metrics": {}, "error_summary": "ValueError: x"},
    ],
}
HISTORY = {
    "owner": OWNER,
    "metric": "acc",
    "mode": "max",
    "trials": {"t1": {"status": "TERMINATED", "config": {"lr": 0.1}, "points": [[1, 0.5], [2, 0.7], [3, 0.9]]}},
}


def _nested(depth: int, container: Callable[[Any], Any]) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = container(value)
    return value


#: Values no file of ours holds: huge, deep, of the wrong type, with characters no page should get.
HOSTILE: list[Callable[[random.Random], Any]] = [
    lambda r: None,
    lambda r: True,
    lambda r: r.randint(-(10**30), 10**30),
    lambda r: 10**400,
    lambda r: r.choice([1e308, -1e308, float("nan"), float("inf"), -0.0]),
    lambda r: "x" * 300_000,
    lambda r: '\ud800\udfff\x00\x1b\u202e"\\' * 20_000,
    lambda r: "🙂" * 100_000,
    lambda r: [],
    lambda r: {},
    lambda r: list(range(50_000)),
    lambda r: [[i, "NaN"] for i in range(20_000)],
    lambda r: {("k" * 3000) + str(i): "v" * 3000 for i in range(300)},
    lambda r: {
        f"t{i}": {"status": "s" * 5000, "config": {"k" * 9000: i}, "points": [[1, i]] * 500} for i in range(300)
    },
    lambda r: [
        {"trial_id": "\ud800" * 9000 + str(i), "status": "RUNNING", "config": {"x" * 900: "y" * 9000}}
        for i in range(400)
    ],
    lambda r: _nested(600, lambda v: [v]),
    lambda r: _nested(600, lambda v: {"a": v}),
]


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a template file (its owner apart: owners are fuzzed on their own)."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        if prefix + (key,) != ("owner",):
            yield from _paths(child, prefix + (key,))


def _mutate(template: Any, rng: random.Random, times: int) -> Any:
    """The template with ``times`` of its values (or itself) replaced by hostile ones, and maybe extra keys."""
    doc = json.loads(json.dumps(template))
    places = list(_paths(template))
    for _ in range(times):
        path, value = rng.choice(places), rng.choice(HOSTILE)(rng)
        if not path:
            return value
        parent = doc
        for key in path[:-1]:
            parent = parent[key] if isinstance(parent, (dict, list)) and _has(parent, key) else None
        if isinstance(parent, (dict, list)) and _has(parent, path[-1]):
            parent[path[-1]] = value
        if rng.random() < 0.3:
            doc["h" * rng.choice([1, 5000])] = value  # an extra key
    return doc


def _has(container: Any, key: Any) -> bool:
    return key in container if isinstance(container, dict) else isinstance(key, int) and key < len(container)


def _reduce(reduce: Callable[[Any], dict[str, Any]], raw: Any) -> dict[str, Any] | None:
    try:
        return reduce(raw)
    except BadFile:
        assert not isinstance(raw, dict)
        return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from _strings(child)
    elif isinstance(value, list):
        for child in value:
            yield from _strings(child)


def _check(view: dict[str, Any]) -> int:
    """The response as the API server would send it: strict JSON, UTF-8, every text cut, under the bound."""
    body = json.dumps(view, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    assert len(body) == response_bytes(view) <= bounds.MAX_RESPONSE_BYTES
    assert max(len(s) for s in _strings(view)) <= 2 * bounds.URI_CHARS
    assert not any(bounds._UNSAFE.search(s.replace("\n", "")) for s in _strings(view))
    assert len(view.get("problems") or []) <= 20
    return len(body)


def test_the_reducers_fuzzed_with_hostile_shapes_stay_typed_and_bounded():
    rng = random.Random(19)
    sizes = []
    for i in range(240):
        progress = _reduce(experiment_files.reduce_progress, _mutate(PROGRESS, rng, 1 + i % 3))
        result = _reduce(experiment_files.reduce_result, _mutate(RESULT, rng, 1 + i % 3) if i % 2 else RESULT)
        history = _reduce(experiment_files.reduce_history, _mutate(HISTORY, rng, 1 + i % 4))
        for reduced in (progress, result, history):
            if reduced is not None:
                assert len(reduced.pop("problems")) <= bounds.MAX_PROBLEMS
                assert len(json.dumps(reduced, allow_nan=False)) < 600_000, "a reduced file must stay small"
        files = ExperimentFiles(progress=progress, result=result, history=history)
        facts = TaskFacts(DAG, "r", "tune", state=rng.choice(["running", "success", "failed"]), is_tune=True)
        facts.experiment_uri = "s3://b/e"
        sizes.append(_check(build_view(facts, files)))
    assert max(sizes) <= bounds.MAX_RESPONSE_BYTES
    print(f"\n240 fuzzed experiments: responses up to {max(sizes) / 1024:.0f} KiB")


def test_hostile_owners_and_facts_are_bounded_too():
    rng = random.Random(7)
    for _ in range(60):
        owner = rng.choice(HOSTILE)(rng)
        doc = {**RESULT, "owner": rng.choice([owner, {**OWNER, rng.choice(list(OWNER)): owner}])}
        files = ExperimentFiles(result=experiment_files.reduce_result(doc))
        text = rng.choice(HOSTILE[5:8])(rng)
        facts = TaskFacts(DAG, text, text, state=text, operator=text, is_tune=True, experiment_uri="s3://b/" + text)
        facts.ray_job_url, facts.promotion = "https://" + text, {"version": owner, "reason": text, "uri": text}
        view = build_view(facts, files)
        _check(view)
        facts.experiment_uri = "s3://b/e"
        _check(build_view(facts, files))


def test_long_config_keys_no_longer_make_a_megabyte_response():
    """The issue's case: 12 long config keys (10,000 characters each) in every trial gave a 4.8 MB response."""
    keys = {f"{'k' * 10_000}{i}": "v" * 10_000 for i in range(12)}
    doc = {**RESULT, "trials": [{**RESULT["trials"][0], "trial_id": f"t{i}", "config": keys} for i in range(20)]}
    view = build_view(
        TaskFacts(DAG, "r", "tune", state="success", is_tune=True, experiment_uri="s3://b/e"),
        ExperimentFiles(result=experiment_files.reduce_result({**doc, "best_config": keys})),
    )
    assert view["state"] == "experiment" and len(view["table"]["columns"]) == 12
    assert all(len(c) <= bounds.KEY_CHARS for c in view["table"]["columns"])
    assert _check(view) < 64 * 1024


def test_every_limit_reached_at_once_stays_under_the_bound():
    """Every text at its limit in 4-byte characters, every count at its cap: under the bound by the limits alone;
    and the last guard (halving rows and curves) holds a smaller bound too."""
    wide = "🙂"
    trials = [
        {
            "trial_id": str(i) + wide * 100,
            "status": wide * 100,
            "config": {wide * 50 + str(k): wide * 200 for k in range(64)},
            "metrics": {"acc": 1.2345678901234567e-300, "training_iteration": 1.2345678901234567e300},
            "error": wide * 1000,
        }
        for i in range(300)
    ]
    result = {**RESULT, "trials": trials, "best_trial_id": wide * 100, "best_config": {wide: wide * 1000}}
    result.update(experiment=wide * 300, metric=wide * 249, best_checkpoint_uri=wide * 2000, job_id=wide * 100)
    points = [[1.2345678901234567e300, -1.2345678901234567e-300]] * 300
    history = {**HISTORY, "trials": {str(i) + wide * 99: {"status": wide, "points": points} for i in range(30)}}
    files = ExperimentFiles(
        result=experiment_files.reduce_result(result),
        history=experiment_files.reduce_history(history),
        problems=["x" * 600] * (3 * bounds.MAX_PROBLEMS + 3),  # each file at its cap, and 3 read errors
    )
    text = wide * 250
    facts = TaskFacts(DAG, text, text, state="success", operator=text, is_tune=True, experiment_uri="s3://b/" + text)
    facts.promotion = {"task_id": text, "version": text, "reason": text, "uri": text}
    unfitted = experiment_view(facts, files)
    assert len(unfitted["table"]["rows"]) == bounds.TABLE_ROWS and len(unfitted["curves"]) == bounds.MAX_CURVES
    view = build_view(facts, files)
    size = _check(view)
    print(f"\nevery limit at once: {response_bytes(unfitted) / 1024:.0f} KiB, sent {size / 1024:.0f} KiB")
    smaller = fit(view, limit=size // 3)
    assert response_bytes(smaller) <= size // 3 and 0 < len(smaller["table"]["rows"]) < bounds.TABLE_ROWS
    assert smaller["problems"][-1].startswith("Rows and curves were cut to keep this page under")


# -- through the app -------------------------------------------------------------------------------------------------
def _view(api: Any, uri: str, **kw: Any) -> dict[str, Any]:  # noqa: F811
    kw = {"state": "success", **kw}
    api.holder["facts"] = TaskFacts(DAG, "r", "tune", is_tune=True, experiment_uri=uri, **kw)
    resp = api.get("/airflow-tune/experiment/data", params=QUERY, headers=api.viewer)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _experiment(tmp_path: Path, name: str) -> tuple[str, Path]:
    make_experiment(str(tmp_path), name, 3, owner=OWNER)
    return f"file://{tmp_path}/{name}", tmp_path / name / ".airflow_tune"


@pytest.mark.parametrize(
    ("progress", "result", "history", "problems"),
    [
        (
            b"not json",
            b"[1, 2]",
            b'"text"',
            ["progress.json is not JSON", "result.json is a list", "history.json is a"],
        ),
        (b'{"owner": ' + json.dumps(OWNER).encode() + b', "counts": [1, 2], "top": "x"}', None, None, ["counts is a"]),
        (b'{"owner": ' + json.dumps(OWNER).encode() + b', "counts": {"RUNNING": "many"}}', None, None, ["counts are"]),
        (
            None,
            b'{"owner": ' + json.dumps(OWNER).encode() + b', "trials": {"t1": 1}, "counts": 3}',
            None,
            ["trials is"],
        ),
        (b"[" * 100_000, None, b"\xff\xfe", ["progress.json is not JSON", "history.json is not JSON"]),
    ],
    ids=["not objects", "counts a list", "counts not numbers", "trials a dict", "too deep, not UTF-8"],
)
def test_malformed_files_are_problem_sentences_never_a_500(api, tmp_path, progress, result, history, problems):  # noqa: F811
    uri, folder = _experiment(tmp_path, "bad")
    for name, data in (("progress.json", progress), ("result.json", result), ("history.json", history)):
        if data is not None:
            (folder / name).write_bytes(data)
    view = _view(api, uri, operator="RayTuneOperator")
    text = " ".join(view.get("problems") or []) + (view.get("message") or "")
    for expected in problems:
        assert expected in text, (expected, view)
    _check(view)


def test_files_over_their_bound_are_not_fetched(api, tmp_path):  # noqa: F811
    uri, folder = _experiment(tmp_path, "huge")
    limit = bounds.MAX_FILE_BYTES["progress.json"]
    with open(folder / "progress.json", "r+b") as fh:
        fh.truncate(limit + 1)  # sparse: a read of it would be 2 MiB of zeros
    os.chmod(folder / "progress.json", 0)  # and a read would fail (unless root): the refusal must come first
    view = _view(api, uri)
    assert view["state"] == "experiment" and view["status"] == "succeeded"  # the result is still shown
    assert "progress.json is 2.0 MiB or more, over the view's limit of 2 MiB" in " ".join(view["problems"])


def test_progress_and_history_are_parsed_again_only_when_their_stamp_changes(api, tmp_path):  # noqa: F811
    uri, folder = _experiment(tmp_path, "cached")
    (folder / "result.json").unlink()
    parses = experiment_files._PROGRESS.parses, experiment_files._HISTORY.parses
    first = _view(api, uri, state="running")
    for _ in range(3):
        assert _view(api, uri, state="running") == first
    assert (experiment_files._PROGRESS.parses, experiment_files._HISTORY.parses) == (parses[0] + 1, parses[1] + 1)
    # Same size, same modification time: the cached form stands (the stamp is what is compared).
    path = folder / "progress.json"
    stat, text = path.stat(), path.read_text()
    path.write_text(text.replace('"num_trials": 3', '"num_trials": 4'))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _view(api, uri, state="running")["num_trials"] == 3
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a new write: read again
    assert _view(api, uri, state="running")["num_trials"] == 4
    assert experiment_files._PROGRESS.parses == parses[0] + 2
