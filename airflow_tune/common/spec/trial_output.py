"""A trial's output, files and names: Tune's ``RunConfig(log_to_file=...)``, ``SyncConfig(sync_artifacts=...)`` and
``TuneConfig(trial_name_creator=..., trial_dirname_creator=...)`` as spec fields.

- ``log_to_file``: Tune's forms: ``true`` (``stdout`` and ``stderr`` files), one file name (both streams in it), or a
  ``[stdout, stderr]`` pair (either may be null). On by default, where Tune's default is off: the engine uploads the
  files to the trial's folder in storage when the trial stops, so the Airflow task can show them.
- ``sync_artifacts``: Tune's: every file the trial writes in its working directory is synced to its trial folder.
- ``trial_name_creator`` / ``trial_dirname_creator``: import paths of functions taking a Trial and returning a
  string: code (written in the DAG file, or allow-listed), as the trainable.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_tune.common.spec.errors import Errors
from airflow_tune.common.spec.space import IMPORT_PATH

#: The fields of this module, with their defaults.
TRIAL_OUTPUT_DEFAULTS: dict[str, Any] = {
    "log_to_file": True,
    "sync_artifacts": False,
    "trial_name_creator": None,
    "trial_dirname_creator": None,
}
#: The fields holding code (import paths the cluster imports).
NAMING_FIELDS = ("trial_name_creator", "trial_dirname_creator")
#: Tune's names for ``log_to_file=True``.
DEFAULT_LOG_FILES = ("stdout", "stderr")
#: A plain file name in the trial's folder: no folder, no hidden file, nothing Tune writes there itself.
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\Z")
_TUNE_FILES = frozenset({"result.json", "params.json", "params.pkl", "progress.csv", "error.txt", "error.pkl"})


def log_files(value: Any) -> tuple[str | None, str | None] | None:
    """The (stdout, stderr) file names ``log_to_file`` gives, as Tune reads it, or None when it is off."""
    if not value:
        return None
    if value is True:
        return DEFAULT_LOG_FILES
    if isinstance(value, str):
        return (value, value)
    stdout, stderr = value
    return (stdout, stderr)


def check_trial_output(kw: dict[str, Any], errors: Errors) -> None:
    """Check ``log_to_file``, ``sync_artifacts`` and the two name creators as given in ``kw``."""
    value = kw.get("log_to_file", True)
    names: list[Any] = []
    if isinstance(value, str):
        names = [value]
    elif isinstance(value, list) and len(value) == 2:
        names = [n for n in value if n is not None]
    elif not isinstance(value, bool):
        errors.add(
            "log_to_file",
            value,
            "must be true, false, a file name or a [stdout, stderr] pair of file names",
            'write true (files "stdout" and "stderr"), "output.log" (both streams in one file) or '
            '["out.log", "err.log"]',
        )
    for name in names:
        if not isinstance(name, str) or not _FILE_NAME.match(name) or name in _TUNE_FILES:
            errors.add(
                "log_to_file",
                value,
                f"{name!r} is not a plain file name for the trial's folder",
                "give a name such as \"stdout\" or \"train.log\" (letters, digits, '.', '_' and '-'; no folder; none "
                f"of Tune's own files: {', '.join(sorted(_TUNE_FILES))})",
            )
    if not isinstance(kw.get("sync_artifacts", False), bool):
        errors.add("sync_artifacts", kw["sync_artifacts"], "must be true or false", "write true or false")
    for field in NAMING_FIELDS:
        path = kw.get(field)
        if path is not None and (not isinstance(path, str) or not IMPORT_PATH.match(path)):
            errors.add(
                field,
                path,
                "not an import path",
                'pass the function itself in the DAG file, or "package.module:function" importable on the cluster',
            )
