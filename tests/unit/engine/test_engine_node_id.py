"""progress.py, pure logic: each trial's result carries the node id of the actor that ran it (asked of Ray once per
actor), and the result manifest's trial rows carry it; Ray's own lookup is replaced by a fake here (the multi-node
e2e tests read it from a real cluster)."""

from __future__ import annotations

import io
from types import SimpleNamespace

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import progress, result_manifest


def _spec() -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bkt/exp", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, "progress_interval_s": 10})


class _ActorId:
    def __init__(self, hex_id: str) -> None:
        self._hex = hex_id

    def hex(self) -> str:
        return self._hex


def _trial(trial_id: str, actor: str | None) -> SimpleNamespace:
    handle = SimpleNamespace(_actor_id=_ActorId(actor)) if actor else None
    return SimpleNamespace(
        trial_id=trial_id,
        status="RUNNING",
        last_result={},
        config={"x": 1},
        temporary_state=SimpleNamespace(ray_actor=handle),
    )


def _lookups_done(cb: progress.ProgressCallback) -> None:
    for lookup in cb._actor_nodes.values():
        lookup.result(timeout=10)


def test_each_result_gets_the_node_of_its_actor_asked_once_per_actor(monkeypatch):
    """The lookup runs in a thread of its own (never in Tune's driver loop): results carry the node id once it is
    known, which for a real trial is from its second report on."""
    asked: list[str] = []
    nodes = {"actor-a": "node-1", "actor-b": "node-2", "actor-c": "node-2"}
    monkeypatch.setattr(progress, "actor_node_id", lambda actor_id: asked.append(actor_id) or nodes.get(actor_id))
    cb = progress.ProgressCallback(_spec(), out=io.StringIO(), clock=lambda: 0.0)
    monkeypatch.setattr(cb, "write_progress", lambda trials, snap=None: None)
    first, moved, unplaced = _trial("t1", "actor-a"), _trial("t2", "actor-b"), _trial("t3", None)
    for trial in (first, moved, unplaced):
        cb.on_trial_result(0, [first, moved, unplaced], trial, {"loss": 1.0})
    _lookups_done(cb)
    results = []
    for trial in (first, first, moved, unplaced):
        result = {"loss": 1.0}
        cb.on_trial_result(0, [first, moved, unplaced], trial, result)
        results.append(result)
    assert [r.get("node_id") for r in results] == ["node-1", "node-1", "node-2", None]
    assert asked == ["actor-a", "actor-b"]
    # A restarted trial runs in a new actor, maybe on another node: asked again.
    first.temporary_state.ray_actor = SimpleNamespace(_actor_id=_ActorId("actor-c"))
    cb.on_trial_result(0, [first], first, {"loss": 0.6})
    _lookups_done(cb)
    again = {"loss": 0.5}
    cb.on_trial_result(0, [first], first, again)
    assert again["node_id"] == "node-2" and asked == ["actor-a", "actor-b", "actor-c"]
    # A trainable that reports its own node_id keeps it.
    own = {"loss": 0.1, "node_id": "mine"}
    cb.on_trial_result(0, [first], first, own)
    assert own["node_id"] == "mine"


def test_a_failing_lookup_gives_no_node_id_and_does_not_raise(monkeypatch):
    import ray.util.state

    def broken(*args, **kwargs):
        raise ConnectionError("state API down")

    monkeypatch.setattr(ray.util.state, "get_actor", broken)
    assert progress.actor_node_id("deadbeef") is None


def test_the_manifest_rows_carry_the_node_id_but_the_metrics_do_not():
    result = SimpleNamespace(
        error=None,
        config={"x": 1},
        metrics={"loss": 0.5, "trial_id": "t1", "node_id": "node-1", "node_ip": "127.0.0.1"},
        path="bkt/exp/t1",
        checkpoint=None,
    )

    class Grid(list):
        def get_best_result(self, metric, mode, scope):
            return self[0]

    best = result
    best.get_best_checkpoint = lambda metric, mode: None  # type: ignore[attr-defined]
    manifest = result_manifest.build_result_manifest(_spec(), Grid([result]), job_id="j")
    [row] = manifest["trials"]
    assert row["node_id"] == "node-1" and row["path"] == "s3://bkt/exp/t1"
    assert "node_id" not in row["metrics"] and "node_id" not in manifest["best_metrics"]
