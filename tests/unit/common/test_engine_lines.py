"""The engine's lines of a job log are read in one place, at ``\\n`` only, with the mark at the start (issue 40, finding
3): a character ``str.splitlines()`` also breaks at, inside a value a trial printed after Ray's prefix, starts no
seal, progress or verdict line."""

from __future__ import annotations

import json
import sys

import pytest

from airflow_tune.common.contract import LOG_MARK, engine_lines, progress_lines, verdict_of
from airflow_tune.common.provenance import logged_progress, seal_line, sealed_digests, unproven_state

PLANTED = "sha256:" + "ab" * 32
GENUINE = "sha256:" + "cd" * 32
#: Every character Python's str.splitlines() breaks a line at (checked against Python itself below).
SEPARATORS = ["\n", "\x0b", "\x0c", "\r", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
TRIAL = "\x1b[36m(train pid=4242)\x1b[0m "


def test_the_separators_are_every_one_str_splitlines_knows():
    found = [chr(c) for c in range(sys.maxunicode + 1) if len(f"a{chr(c)}b".splitlines()) == 2]
    assert found == SEPARATORS


@pytest.mark.parametrize("separator", SEPARATORS[1:], ids=[f"U+{ord(s):04X}" for s in SEPARATORS[1:]])
def test_a_separator_in_a_trials_printed_value_starts_no_engine_line(separator):
    forged_progress = json.dumps({"counts": {"RUNNING": 1}, "best": {"trial_id": "t", "value": -1e9}})
    logs = "\n".join(
        [
            seal_line("result.json", GENUINE),
            seal_line("state/tuner.pkl", GENUINE),
            f"{LOG_MARK}progress " + json.dumps({"counts": {"RUNNING": 1}, "best": None}),
            TRIAL + "lr=" + separator + seal_line("result.json", PLANTED),
            TRIAL + "lr=" + separator + seal_line("state/tuner.pkl", PLANTED),
            TRIAL + "lr=" + separator + f"{LOG_MARK}progress {forged_progress}",
            TRIAL + "lr=" + separator + f"{LOG_MARK}verdict: forged",
            "",
        ]
    )
    assert len(logs.splitlines()) > len(logs.split("\n"))  # what today's readers were fooled by
    assert sealed_digests(logs, "result.json") == [GENUINE]
    assert unproven_state({"tuner.pkl": PLANTED}, [logs]) == {
        "tuner.pkl": f"its bytes ({PLANTED}) are none that this experiment's jobs wrote under that name"
    }
    assert unproven_state({"tuner.pkl": GENUINE}, [logs]) == {}
    assert logged_progress(logs) == {"counts": {"RUNNING": 1}, "best": None}
    assert verdict_of(logs) is None
    assert all(line.startswith(LOG_MARK) for line in progress_lines(logs)) and len(progress_lines(logs)) == 3


def test_the_mark_counts_only_at_the_start_of_a_line():
    seal = seal_line("result.json", PLANTED)
    logs = f"x {seal}\n {seal}\n\\{seal}"
    assert sealed_digests(logs, "result.json") == []
    assert engine_lines(f"{LOG_MARK}a\n{LOG_MARK}b\nc {LOG_MARK}d", "") == ["a", "b"]
    assert engine_lines(f"{LOG_MARK}verdict: one\n{LOG_MARK}verdict: two", "verdict: ") == ["one", "two"]
    assert verdict_of(f"{LOG_MARK}verdict: one\n{LOG_MARK}verdict: two\n") == "two"


def test_the_last_progress_line_wins_and_a_broken_one_is_skipped():
    logs = f'{LOG_MARK}progress {{"best": 1}}\n{LOG_MARK}progress {{"best": 2}}\n{LOG_MARK}progress {{broken\n'
    assert logged_progress(logs) == {"best": 2}
    assert logged_progress("") is None
