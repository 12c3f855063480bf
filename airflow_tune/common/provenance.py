"""Proof that a file read back from storage is the one this experiment's own job wrote, and that a checkpoint's
bytes are the ones its trial wrote.

Storage is written by whoever holds its credentials, so what the Airflow side believes (``result.json``) needs proof
carried where no storage writer can change it: the engine prints the digest of each manifest it writes as one line
of its Ray job's log (``[airflow-tune] sealed result.json sha256:...``), and the reader fetches that log through the
dashboard, from the job whose metadata (fixed at submission) names this experiment and its owner. The result names
the best checkpoint's content digests (sha256 of each file's bytes), so one sealed line vouches for every byte a
deploy task later loads. Imports neither airflow nor ray: both sides import it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_tune.common.contract import LOG_MARK, engine_lines

SEAL = "sealed "
#: A checkpoint's files in the result manifest: ``{relative path: "sha256:<hex>"}``.
CHECKPOINT_FILES_KEY = "best_checkpoint_files"
#: The digest of that map (see :func:`files_digest`): one value a registry version or an XCom can carry.
CHECKPOINT_DIGEST_KEY = "best_checkpoint_digest"
#: How much of a file is hashed per read.
CHUNK = 8 * 1024 * 1024


def seal_text(name: str, digest: str) -> str:
    """What the engine prints after the mark to vouch for the file ``name`` with the bytes of ``digest``."""
    return f"{SEAL}{name} {digest}"


def seal_line(name: str, digest: str) -> str:
    """The job-log line that vouches for the file ``name`` with the bytes of ``digest``."""
    return LOG_MARK + seal_text(name, digest)


def sealed_digests(logs: str, name: str) -> list[str]:
    """Every digest a job log vouches for under ``name``, oldest first. Only the engine's own lines count
    (:func:`~airflow_tune.common.contract.engine_lines`): Ray prefixes what trials print (``(train pid=...)``), and
    the driver escapes the mark at the start of any other line."""
    return [rest.strip() for rest in engine_lines(logs, f"{SEAL}{name} ")]


def digest_stream(chunks: Iterable[bytes]) -> str:
    hasher = hashlib.sha256()
    for chunk in chunks:
        hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def files_digest(files: Mapping[str, str]) -> str:
    """One digest over a checkpoint's ``{relative path: content digest}``: it changes when any file is added,
    removed, renamed or rewritten."""
    canonical = json.dumps(sorted(files.items()), separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def local_file_digests(root: str) -> dict[str, str]:
    """``{relative path: "sha256:<hex>"}`` of every file below the local folder ``root``."""
    out: dict[str, str] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = _local_digest(path)
    return out


def _local_digest(path: str) -> str:
    with open(path, "rb") as handle:
        return digest_stream(iter(lambda: handle.read(CHUNK), b""))


def differences(expected: Mapping[str, str], found: Mapping[str, str], *, limit: int = 5) -> str:
    """What differs between two file maps, for a refusal: missing, unexpected and changed files (a few of each)."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    changed = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])
    parts = []
    for label, names in (("changed", changed), ("missing", missing), ("not written by the trial", extra)):
        if names:
            shown = ", ".join(repr(n[:200]) for n in names[:limit])
            parts.append(f"{label}: {shown}" + (f" and {len(names) - limit} more" if len(names) > limit else ""))
    return "; ".join(parts) or "no difference"


def verify_files(expected: Any, found: Mapping[str, str], what: str) -> None:
    """Raise ``ValueError`` unless the files ``found`` are exactly the ``expected`` ones, byte for byte."""
    if not isinstance(expected, Mapping) or not expected:
        raise ValueError(f"{what}: no content digests were recorded for it, so its bytes cannot be verified")
    if dict(expected) != dict(found):
        raise ValueError(f"{what}: its files are not the ones the trial wrote ({differences(expected, found)})")


# -- Tune's own state: what a restore unpickles and decodes ---------------------------------------------------------

#: The seal name of a file Tune keeps directly in the experiment folder (``tuner.pkl``, ``experiment_state-*.json``,
#: the searcher's and callbacks' state): ``state/<file name>``.
STATE = "state/"


def state_seal_name(file_name: str) -> str:
    return STATE + file_name


def is_tune_state(file_name: str) -> bool:
    """Whether a file directly in an experiment folder is one a restore must be proven for: every one but dot files
    (Tune's ``.validate_storage_marker``, and the ``.<uuid>-tmp-...`` files of its atomic saves, which it never
    reads back). Tune reads ``tuner.pkl`` and the newest of each ``*-state-<session>`` by name, so a file nobody
    sealed is refused rather than left for Tune to pick."""
    return bool(file_name) and not file_name.startswith(".") and "/" not in file_name


def unproven_state(found: Mapping[str, str], logs: Iterable[str]) -> dict[str, str]:
    """The state files among ``found`` (``{file name: digest}``) whose bytes no log of ``logs`` sealed, with why."""
    sealed: dict[str, set[str]] = {}
    for text in logs:
        for rest in engine_lines(text, SEAL + STATE):
            name, _, digest = rest.strip().rpartition(" ")
            sealed.setdefault(name, set()).add(digest)
    out = {}
    for name, digest in sorted(found.items()):
        if not is_tune_state(name):
            continue
        if name not in sealed:
            out[name] = "no job of this experiment wrote a file of that name"
        elif digest not in sealed[name]:
            out[name] = f"its bytes ({digest}) are none that this experiment's jobs wrote under that name"
    return out


# -- progress: what the job's log says, not what storage holds -----------------------------------------------------

#: The engine's machine-readable progress line (``[airflow-tune] progress {...}``): counts, metric, mode, best.
PROGRESS = "progress "


def logged_progress(logs: str) -> dict[str, Any] | None:
    """The last progress the engine printed in its job log (the same snapshot it writes to ``progress.json``, at the
    same moment), or None before the first. Only the engine's own lines count (see :func:`sealed_digests`)."""
    for rest in reversed(engine_lines(logs, PROGRESS)):
        try:
            parsed = json.loads(rest)
        except ValueError:
            continue
        return parsed if isinstance(parsed, dict) else None
    return None
