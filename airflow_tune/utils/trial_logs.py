"""Trials' output in the task log: after the job ends, the last lines of the output files the engine uploaded to each
trial's folder (``log_to_file``), for the errored trials, all listed ones, or none (``trial_logs``).

The trials are the rows of the experiment's ``result.json`` (the best and the errored ones, bounded by the engine);
only a row's folder name is taken from it, joined to the experiment's own folder, so nothing outside the experiment is
read. The text is storage data: read from the end, bounded in bytes, lines and trials, shown with control characters
replaced, and never evaluated. It is what the trial printed, nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow_tune.common.contract import RESULT_FILE, join_uri, manifest_uri
from airflow_tune.common.spec.trial_output import log_files

TRIAL_LOGS = ("errored", "all", "none")
#: At most this many trials' output in the task log, each file's last lines, read from its last bytes.
MAX_TRIALS = 10
TAIL_LINES = 30
TAIL_BYTES = 16 * 1024
_FOLDER = re.compile(r"^[^/\\\x00]{1,255}\Z")
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def check_trial_logs(value: Any) -> str:
    """``trial_logs`` as the operator takes it; raise ValueError naming the value and the choices."""
    if value not in TRIAL_LOGS:
        raise ValueError(
            f"trial_logs = {value!r}: not a choice; write 'errored' (the output of errored trials, the default), "
            "'all' (every trial result.json lists, errored first) or 'none'"
        )
    return str(value)


def chosen_trials(rows: Any, which: str) -> list[Mapping[str, Any]]:
    """The result rows whose output to show: errored first, then (for ``"all"``) the others in their order."""
    if which == "none" or not isinstance(rows, list):
        return []
    rows = [r for r in rows if isinstance(r, Mapping)]
    errored = [r for r in rows if r.get("error") or r.get("status") == "ERROR"]
    return errored if which == "errored" else [*errored, *(r for r in rows if r not in errored)]


def trial_folder(experiment_uri: str, row: Mapping[str, Any]) -> str | None:
    """The trial's folder inside the experiment: the last name of the row's ``path`` under ``experiment_uri``."""
    path = row.get("path")
    if not isinstance(path, str):
        return None
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if not _FOLDER.match(name) or name in (".", ".."):
        return None
    return join_uri(experiment_uri, name)


def tail(uri: str, max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> tuple[list[str], bool] | None:
    """The last lines of the file at ``uri`` (read from its last ``max_bytes``), with control characters replaced,
    and whether lines were left out; None when there is no such file."""
    import pyarrow.fs

    from airflow_tune.common import storage

    fs, path = storage.resolve(uri)
    info = fs.get_file_info(path)
    if info.type != pyarrow.fs.FileType.File:
        return None
    size = int(info.size or 0)
    with fs.open_input_file(path) as handle:
        start = max(0, size - max_bytes)
        handle.seek(start)
        data = handle.read(size - start)
    lines = bytes(data).decode("utf-8", errors="replace").splitlines()
    cut = start > 0
    if cut and lines:
        lines = lines[1:]  # begins mid-line
    if len(lines) > max_lines:
        lines, cut = lines[-max_lines:], True
    return [_CONTROL.sub("?", line)[:1000] for line in lines], cut


def log_trial_output(
    experiment_uri: str, log_to_file: Any, which: str, log: Any, result: Mapping[str, Any] | None = None
) -> None:
    """Write the chosen trials' output (their files' last lines) into the task log. Never raises: the task's
    outcome is the job's, whatever storage answers here.

    :param result: the experiment's result as read already (else its ``result.json`` is read for the trial rows).
    """
    files = log_files(log_to_file)
    if which == "none" or files is None:
        return
    from airflow_tune.common import storage

    try:
        if result is None:
            result = storage.read_json_or_none(manifest_uri(experiment_uri, RESULT_FILE))
        rows = chosen_trials(result.get("trials") if isinstance(result, Mapping) else None, which)
        if not rows:
            return
        names = [n for n in dict.fromkeys(files) if n]
        for row in rows[:MAX_TRIALS]:
            _log_trial(experiment_uri, row, names, log)
        if len(rows) > MAX_TRIALS:
            log.info(
                "Output of %d more trials not shown; each trial's files are in its folder under %s",
                len(rows) - MAX_TRIALS,
                experiment_uri,
            )
    except Exception as exc:
        log.warning("Could not read the trials' output from %s: %s", experiment_uri, exc)


def _log_trial(experiment_uri: str, row: Mapping[str, Any], names: list[str], log: Any) -> None:
    folder = trial_folder(experiment_uri, row)
    if folder is None:
        return
    trial, status = str(row.get("trial_id"))[:100], "ERROR" if row.get("error") else str(row.get("status"))[:20]
    for name in names:
        uri = join_uri(folder, name)
        found = tail(uri)
        if found is None:
            # The engine uploads only output files that hold something.
            log.info("Trial %s (%s): no %s output (nothing printed, or no file in %s)", trial, status, name, folder)
            continue
        lines, cut = found
        text = "\n".join(f"  | {line}" for line in lines) or "  (empty)"
        log.info("Trial %s (%s), %s%s at %s:\n%s", trial, status, "last lines of " if cut else "", name, uri, text)
