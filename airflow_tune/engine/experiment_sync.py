"""The driver's uploads of the experiment folder: only what changed since the last upload, several files at a time.

Tune keeps the experiment's state and every trial's result files (``result.json``, ``progress.csv``, ``params.*``,
TensorBoard events: its loggers run on the driver) in the driver's staging folder, and its background syncer uploads
that folder to storage whenever it snapshots the experiment. Each of those uploads is the whole folder, one file
after another (``_upload_to_fs_path``: pyarrow's ``copy_files`` without threads), so an experiment's syncing grows
with trials x snapshots: at 500 trivial trials it took a third of plain Tune's driver time, and its last upload alone
was half of plain Tune's wall time at 2,000 (see ``docs/benchmarks.rst``).

The engine gives the driver's syncer (:class:`ray.train._internal.storage._FilesystemSyncer`, the same in Ray 2.43
to 2.60) an upload that sends a file only when its size or modification time changed since it was last sent, and
sends :data:`PARALLEL_UPLOADS` files at a time. The files Tune's restore reads (the experiment folder's own files:
``tuner.pkl``, the experiment state, the searcher's) are sent at every upload, changed or not. What reaches storage
is what Tune's upload would have put there: the same files, the same names, nothing deleted (Tune deletes nothing
either), Tune's ``exclude`` patterns honoured; a file that failed is sent again at the next upload, and the upload
raises as Tune's does, so Tune logs it and retries. Trials' own uploads (checkpoints, artifacts) are not changed.

Imports neither airflow nor, at module level, ray or pyarrow.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: Files sent at a time (each a request to storage; they wait on the network, not on the driver's CPU).
PARALLEL_UPLOADS = 16
#: Storage without folders: a file's parent needs no creating.
_OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})
_CHUNK = 8 * 1024 * 1024

#: What each (local folder, destination) pair last sent: ``{relative path: (size, mtime_ns)}``. Kept in the driver
#: process, not on the syncer: Tune pickles the experiment's StorageContext (and its syncer) into every trial.
_SENT: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
_SENT_LOCK = threading.Lock()


def _excluded(relative: str, exclude: Sequence[str]) -> bool:
    """Ray's rule (``_ExcludingLocalFilesystem._should_exclude``): a file whose path relative to the folder matches
    a pattern, ``*`` crossing ``/``."""
    return any(fnmatch.fnmatch(relative, pattern) for pattern in exclude)


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # gone since the listing: Tune's staging files are replaced, never removed mid-run
        return None
    return st.st_size, st.st_mtime_ns


def changed_files(local_path: str, destination: str, exclude: Sequence[str] = ()) -> list[tuple[str, tuple[int, int]]]:
    """The files under ``local_path`` to send to ``destination``, each with the size and time it had when listed:
    those not sent since they last changed, and every file directly in the folder (Tune's state)."""
    with _SENT_LOCK:
        sent = dict(_SENT.get((local_path, destination), {}))
    out = []
    for folder, _, names in os.walk(local_path):
        for name in sorted(names):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, local_path).replace(os.sep, "/")
            if exclude and _excluded(relative, exclude):
                continue
            stat = _stat(path)
            if stat is None:
                continue
            if "/" in relative and sent.get(relative) == stat:
                continue
            out.append((relative, stat))
    return out


def upload_changed(
    local_path: str, fs: Any, fs_path: str, exclude: Sequence[str] | None = None, *, workers: int = PARALLEL_UPLOADS
) -> int:
    """Send the files of the local folder ``local_path`` that changed since the last call for the same pair to
    ``fs_path`` on the pyarrow filesystem ``fs``, ``workers`` at a time; return how many were sent. Raises the first
    failure after every other file was tried (those sent are remembered, the failed one is sent next time)."""
    destination = f"{type(fs).__name__}:{fs_path}"
    todo = changed_files(local_path, destination, exclude or ())
    if not todo:
        return 0
    made_parents: set[str] = set()
    needs_parents = getattr(fs, "type_name", "") not in _OBJECT_STORES
    if needs_parents:
        for relative, _ in todo:
            parent = f"{fs_path}/{relative}".rsplit("/", 1)[0]
            if parent not in made_parents:
                fs.create_dir(parent, recursive=True)
                made_parents.add(parent)

    def send(item: tuple[str, tuple[int, int]]) -> tuple[str, tuple[int, int]] | None:
        relative, listed = item
        local = os.path.join(local_path, relative)
        with open(local, "rb") as source, fs.open_output_stream(f"{fs_path}/{relative}") as target:
            shutil.copyfileobj(source, target, _CHUNK)
        # Changed while it was read (Tune wrote it again): not remembered, so the next upload sends it again.
        return (relative, listed) if _stat(local) == listed else None

    errors: list[BaseException] = []
    sent: list[tuple[str, tuple[int, int]]] = []
    with ThreadPoolExecutor(
        max_workers=max(1, min(workers, len(todo))), thread_name_prefix="airflow-tune-sync"
    ) as pool:
        for future in [pool.submit(send, item) for item in todo]:
            try:
                done = future.result()
            except Exception as exc:  # every file is tried; the first failure is raised below
                errors.append(exc)
                continue
            if done is not None:
                sent.append(done)
    with _SENT_LOCK:
        _SENT.setdefault((local_path, destination), {}).update(sent)
    if errors:
        raise errors[0]
    return len(todo)


def upload_experiment_changes() -> None:
    """Have this driver's Tune upload its experiment folder with :func:`upload_changed` (see the module); a Tune
    without ``_FilesystemSyncer._sync_up_command`` is left with its own upload."""
    from ray.train._internal import storage as ray_storage

    syncer = getattr(ray_storage, "_FilesystemSyncer", None)
    original = getattr(syncer, "_sync_up_command", None)
    # A Tune that uploads some other way keeps its own upload: slower, never different.
    if original is None or getattr(original, "_airflow_tune_changes_only", False):
        return

    def _sync_up_command(self: Any, local_path: str, uri: str, exclude: list[str] | None = None) -> Any:
        if os.path.isfile(local_path):  # one file: Tune's own upload
            return original(self, local_path=local_path, uri=uri, exclude=exclude)
        return upload_changed, {
            "local_path": local_path,
            "fs": self.storage_filesystem,
            "fs_path": uri,
            "exclude": exclude,
        }

    _sync_up_command._airflow_tune_changes_only = True  # type: ignore[attr-defined]
    setattr(syncer, "_sync_up_command", _sync_up_command)  # noqa: B010 - patching a class
