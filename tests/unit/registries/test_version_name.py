"""A registry version's name (issue 40): deterministic per checkpoint, and distinct per experiment, so a retry's
"already the champion" shortcut never takes another experiment's checkpoint of the same stamp and trial id for the
champion; and the part size of the promotion's streamed copy."""

from __future__ import annotations

import pytest

from airflow_tune.exceptions import PromotionError
from airflow_tune.registries.s3 import version_name
from airflow_tune.registries.transfer import MAX_PARTS, PART, part_size


def _result(experiment_uri: str, trial: str = "abcde_00000") -> dict:
    return {"finished_at": 1_767_225_600.0, "best_trial_id": trial, "experiment_uri": experiment_uri}


def test_the_same_stamp_and_trial_of_two_experiments_are_two_versions():
    ours = version_name(_result("s3://b/experiments/ours"))
    theirs = version_name(_result("s3://b/experiments/theirs"))
    assert ours != theirs
    assert ours.startswith("20260101T000000Z-abcde_00000-") and len(ours.rsplit("-", 1)[1]) == 12
    assert version_name(_result("s3://b/experiments/ours")) == ours, "a retry finds the same version"
    assert version_name(_result("s3://other/experiments/ours")) != ours, "the experiment's root counts too"


def test_a_result_that_names_no_experiment_or_time_cannot_name_a_version():
    with pytest.raises(PromotionError, match="names no experiment"):
        version_name({"finished_at": 1.0, "best_trial_id": "t"})
    with pytest.raises(PromotionError, match="no finished_at"):
        version_name({"best_trial_id": "t", "experiment_uri": "s3://b/e"})


@pytest.mark.parametrize(
    ("size", "expected"),
    [(0, PART), (PART, PART), (100 * PART, PART), (MAX_PARTS * PART, PART), (MAX_PARTS * PART + 1, PART + 2**20)],
)
def test_a_copy_s_parts_are_bounded_and_fit_s3_s_part_count(size, expected):
    assert part_size(size) == expected
    assert -(-size // part_size(size)) <= MAX_PARTS
