"""The best Ray Train checkpoint of a trial, from the ``checkpoint_path`` metric TuneReportCallback reports (pure
logic: the Tune result is a stand-in with the attributes the engine reads; storage lookups are a set of URIs)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pandas as pd

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import train_checkpoints
from airflow_tune.engine.train_checkpoints import CHECKPOINT_PATH_KEY, best_uri, ranked_paths

EXP = "bucket/x/e"  # the experiment's folder as Tune reports paths: no scheme


def _spec(mode: str = "min") -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": mode}
    return ExperimentSpec.from_dict(base)


def _result(rows: list[dict[str, Any]], *, history: bool = True) -> Any:
    frame = pd.DataFrame(rows) if history else None
    return SimpleNamespace(metrics=rows[-1] if rows else {}, metrics_dataframe=frame)


def _rows(*losses: float | None, base: str = f"{EXP}/trial_1/train") -> list[dict[str, Any]]:
    return [
        {"loss": loss, "training_iteration": i + 1, CHECKPOINT_PATH_KEY: f"{base}/checkpoint_{i}"}
        for i, loss in enumerate(losses)
    ]


def _best(spec: ExperimentSpec, result: Any, present: set[str] | None = None) -> tuple[str | None, list[str]]:
    said: list[str] = []
    found = best_uri(spec, result, exists=lambda uri: present is None or uri in present, say=said.append)
    return found, said


def test_the_key_is_tune_report_callbacks():
    assert CHECKPOINT_PATH_KEY == "checkpoint_path"


def test_the_best_reported_checkpoint_by_the_metric_with_the_scheme_put_back():
    found, said = _best(_spec("min"), _result(_rows(0.5, 0.1, 0.3)))
    assert found == f"s3://{EXP}/trial_1/train/checkpoint_1" and said == []
    found, _ = _best(_spec("max"), _result(_rows(0.5, 0.1, 0.3)))
    assert found == f"s3://{EXP}/trial_1/train/checkpoint_0"


def test_ranking_skips_rows_without_a_path_or_a_finite_metric_and_prefers_the_newest_of_equals():
    rows = [
        {"loss": 0.2, "checkpoint_path": "a"},
        {"loss": float("nan"), "checkpoint_path": "b"},
        {"loss": 0.1},
        {"loss": 0.1, "checkpoint_path": float("nan")},  # pandas fills a missing path with NaN
        {"loss": True, "checkpoint_path": "c"},
        {"loss": 0.2, "checkpoint_path": "d"},
        {"loss": 0.3, "checkpoint_path": "a"},
    ]
    assert ranked_paths(rows, "loss", "min", CHECKPOINT_PATH_KEY) == ["d", "a"]


def test_a_path_outside_the_experiment_is_refused_with_a_log_line_and_the_best_inside_is_taken():
    outside = _rows(0.01, base="other-bucket/elsewhere")  # best by the metric, but not the experiment's
    inside = _rows(0.5, 0.2)
    rows = [outside[0], *inside]
    found, said = _best(_spec(), _result(rows))
    assert found == f"s3://{EXP}/trial_1/train/checkpoint_1"
    [line] = said
    assert "s3://other-bucket/elsewhere/checkpoint_0" in line and "outside the experiment s3://bucket/x/e" in line


def test_paths_that_escape_or_carry_another_scheme_are_refused():
    for path in (f"{EXP}/../f/ckpt", "s3://bucket/x/e-other/ckpt", "gs://bucket/x/e/ckpt", "/bucket/x/elsewhere"):
        found, said = _best(_spec(), _result([{"loss": 0.1, "checkpoint_path": path}]))
        assert found is None and len(said) == 1, path


def test_a_checkpoint_train_deleted_is_passed_over_for_the_next_best_that_exists():
    rows = _rows(0.1, 0.2, 0.3)
    present = {f"s3://{EXP}/trial_1/train/checkpoint_2", f"s3://{EXP}/trial_1/train/checkpoint_1"}
    found, _ = _best(_spec(), _result(rows), present)
    assert found == f"s3://{EXP}/trial_1/train/checkpoint_1"
    assert _best(_spec(), _result(rows), set())[0] is None


def test_lookups_are_bounded(monkeypatch):
    monkeypatch.setattr(train_checkpoints, "MAX_LOOKUPS", 3)
    asked: list[str] = []

    def exists(uri: str) -> bool:
        asked.append(uri)
        return False

    best_uri(_spec(), _result(_rows(*[0.1 * i for i in range(8)])), exists=exists, say=lambda _: None)
    assert len(asked) == 3


def test_without_a_history_the_last_result_counts_and_without_a_path_there_is_none():
    found, _ = _best(_spec(), _result(_rows(0.4, 0.3), history=False))
    assert found == f"s3://{EXP}/trial_1/train/checkpoint_1"
    assert _best(_spec(), _result([{"loss": 0.1}]))[0] is None
    assert _best(_spec(), _result([]))[0] is None


def test_a_storage_error_leaves_the_checkpoint_unknown_with_a_log_line():
    said: list[str] = []

    def broken(uri: str) -> bool:
        raise OSError("S3 down")

    assert best_uri(_spec(), _result(_rows(0.1)), exists=broken, say=said.append) is None
    assert len(said) == 1 and "S3 down" in said[0]
