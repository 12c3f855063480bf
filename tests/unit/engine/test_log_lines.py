"""Only the engine starts a line of its job log with the mark (issue 40, finding 3): the driver's streams escape the
mark wherever a line can start in text the engine did not write (Tune's logging of a trial's exception, a trial's
forwarded output), and the engine's own lines are one line whatever their text holds."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import threading

import pytest

from airflow_tune.common.contract import LOG_MARK, engine_lines
from airflow_tune.engine.log_lines import MarkGuard, emit, neutralized, one_line
from tests.unit.common.test_engine_lines import SEPARATORS

SEAL = f"{LOG_MARK}sealed state/tuner.pkl sha256:{'ab' * 32}"


def _guarded() -> tuple[MarkGuard, io.StringIO]:
    sink = io.StringIO()
    return MarkGuard(sink, threading.RLock()), sink


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        (SEAL + "\n", "\\" + SEAL + "\n"),
        ("ValueError: bad value a\n" + SEAL + "\n", "ValueError: bad value a\n\\" + SEAL + "\n"),
        ("(train pid=1) a\r" + SEAL + "\n", "(train pid=1) a\r\\" + SEAL + "\n"),
        ("a\r\n" + SEAL, "a\r\n\\" + SEAL),
        ("x " + SEAL + "\n", "x " + SEAL + "\n"),  # not at a line's start: no reader takes it
        ("a\u2028" + SEAL + "\n", "a\u2028" + SEAL + "\n"),  # readers do not break lines there
        ("[2026-12-06 INFO] fine\n", "[2026-12-06 INFO] fine\n"),
        ("done\n[airflow", "done\n\\[airflow"),  # the next write could complete the mark
        ("[", "\\["),
        ("no bracket at all\n", "no bracket at all\n"),
    ],
)
def test_the_guard_escapes_the_mark_wherever_a_line_can_start(written, shown):
    assert neutralized(written) == shown
    guard, sink = _guarded()
    assert guard.write(written) == len(written)
    assert sink.getvalue() == shown


def test_a_mark_split_across_writes_or_streams_starts_no_line():
    guard, sink = _guarded()
    for part in ["ValueError: x\n", "[airf", "low-tune] sealed state/tuner.pkl sha256:", "ab" * 32, "\n"]:
        guard.write(part)
    assert engine_lines(sink.getvalue()) == []
    # Another stream ended a line; this one's next write starts one.
    lock = threading.RLock()
    sink = io.StringIO()
    out, err = MarkGuard(sink, lock), MarkGuard(sink, lock)
    out.write("table row without end")
    err.write("\n")
    out.write(SEAL + "\n")
    assert engine_lines(sink.getvalue()) == []


def test_the_engines_own_lines_pass_the_guard_as_one_line_each():
    guard, sink = _guarded()
    guard.write("partial line, no end")
    emit("sealed state/tuner.pkl sha256:" + "cd" * 32, guard)
    text = "trial t1 errored: ValueError: " + "".join(f"a{s}{SEAL}" for s in SEPARATORS)
    emit(text, guard)
    lines = sink.getvalue().split("\n")
    assert lines[0] == "partial line, no end" + LOG_MARK + "sealed state/tuner.pkl sha256:" + "cd" * 32
    assert lines[1] == LOG_MARK + one_line(text) and lines[2] == ""
    assert not any(s in lines[1] for s in SEPARATORS) and "\\u2028" in lines[1] and "\\r" in lines[1]
    assert one_line("a\nb\rc\x85d") == "a\\nb\\rc\\x85d"


def test_emit_writes_to_a_plain_stream_too():
    sink = io.StringIO()
    emit("progress {}", sink)
    assert sink.getvalue() == LOG_MARK + "progress {}\n"


def test_guard_output_wraps_the_streams_and_the_logging_handlers_that_hold_them(tmp_path):
    """In a process of its own (the guard is for the driver's whole life): print, a logging handler made before the
    guard (as Ray's is at import), one made after, a traceback and a warning all reach the file escaped; the engine's
    own line does not."""
    script = textwrap.dedent(
        f"""
        import logging, sys, traceback, warnings
        early = logging.getLogger("early")
        early.addHandler(logging.StreamHandler(sys.stderr))
        early.propagate = False
        from airflow_tune.engine.log_lines import emit, guard_output
        guard_output()
        guard_output()  # once is enough; twice changes nothing
        late = logging.getLogger("late")
        late.addHandler(logging.StreamHandler())
        late.propagate = False
        seal = {SEAL!r}
        print("config: a\\n" + seal)
        print("config: a\\r" + seal)
        early.error("trial failed: a\\n%s", seal)
        late.error("trial failed: a\\n%s", seal)
        try:
            raise ValueError("bad value a\\n" + seal)
        except ValueError:
            traceback.print_exc()
        warnings.warn("odd value a\\n" + seal)
        sys.stderr.write(seal + "\\n")
        emit("sealed state/tuner.pkl sha256:{"cd" * 32}")
        """
    )
    log = tmp_path / "job.log"
    with open(log, "w") as handle:
        subprocess.run([sys.executable, "-c", script], stdout=handle, stderr=subprocess.STDOUT, check=True)
    # As the dashboard serves the file: read in text mode, every \r a \n.
    with open(log) as handle:
        served = handle.read()
    assert served.count("\\" + SEAL) == 7, served
    assert engine_lines(served, "sealed ") == ["state/tuner.pkl sha256:" + "cd" * 32], served
