"""Tune's own state, vouched for in the job log as it is written and checked before it is restored.

A restore unpickles ``tuner.pkl`` and decodes the newest ``experiment_state-*.json`` and searcher and callback state
(cloudpickle inside), so those files are code. Storage is written by whoever holds its credentials; the job log is
not. So the engine prints ``[airflow-tune] sealed state/<file> sha256:...`` for every version of those files before
Tune uploads it, and a later job of the experiment restores only when every state file in the experiment folder is
one that a job of this experiment sealed: the Airflow side reads the earlier jobs' logs through the dashboard, checks
the folder and names what it checked in the entrypoint (``--restore-state``); the engine checks the same files again
just before ``Tuner.restore`` reads them (see :mod:`airflow_tune.common.provenance`).

Where Tune writes them (the same code in every supported release, 2.43 to 2.60):

- ``tuner.pkl``: ``TunerInternal.__init__`` writes ``pickle.dumps(self.__getstate__())`` straight to storage, the
  module's one ``pickle.dumps`` of data it keeps. The engine gives that module a ``pickle`` whose ``dumps`` seals the
  bytes it returns, before they are written.
- The rest: ``_ExperimentCheckpointManager.sync_up_experiment_state(save_fn)`` has ``save_fn`` write them into the
  driver's staging folder, then uploads that folder. The engine seals the folder's files after ``save_fn`` and before
  the upload, so every version storage can hold was sealed first (a kill between the two leaves the version before).

Tune reads the state again after the engine's check (``Tuner.restore`` reads ``tuner.pkl`` and the newest experiment
state, ``TuneController.resume`` reads that state once more and downloads the rest), so a check of the folder alone
would leave a window between check and use. A :class:`ProvenState` is therefore also held to every one of those
reads (:mod:`.compat_state` says where they are): the bytes Tune decodes are the bytes the submitter proved.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from airflow_tune.common import storage
from airflow_tune.common.contract import digest_of
from airflow_tune.common.provenance import is_tune_state, seal_text, state_seal_name
from airflow_tune.engine.imports import EngineError
from airflow_tune.engine.log_lines import emit


class StateSealer:
    """Prints a seal for each new version of a state file (one line per change, not per save)."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()

    def seal(self, name: str, data: bytes) -> None:
        digest = digest_of(data)
        with self._lock:
            if self._last.get(name) == digest:
                return
            self._last[name] = digest
        emit(seal_text(state_seal_name(name), digest))

    def seal_folder(self, folder: str) -> None:
        """Seal every state file directly in the local ``folder`` (Tune's driver staging folder)."""
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(folder, name)
            if is_tune_state(name) and os.path.isfile(path):
                with open(path, "rb") as handle:
                    self.seal(name, handle.read())


class _SealingPickle:
    """Stands in for the pickler module of ``ray.tune.impl.tuner_internal`` (``ray.cloudpickle``, imported there as
    ``pickle``): its ``dumps`` seals the bytes of ``tuner.pkl``."""

    def __init__(self, module: Any, sealer: StateSealer) -> None:
        self._module = module
        self._sealer = sealer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def dumps(self, obj: Any, *args: Any, **kwargs: Any) -> bytes:
        data = bytes(self._module.dumps(obj, *args, **kwargs))
        # The same module pickles a trainable only to test that it can (its bytes are never written): a Tuner's own
        # state is the one object of that module's class.
        if type(obj) is dict and "_run_config" in obj and "__trainable_name" in obj:
            self._sealer.seal("tuner.pkl", data)
        return data


def seal_tune_state(sealer: StateSealer) -> None:
    """Have Tune's writes of its state sealed by ``sealer`` (see the module's docstring), for this driver process."""
    from ray.tune.execution import experiment_state
    from ray.tune.impl import tuner_internal

    if not hasattr(tuner_internal, "pickle") or not hasattr(
        experiment_state._ExperimentCheckpointManager, "sync_up_experiment_state"
    ):
        raise EngineError("this Ray Tune writes its state where the engine cannot seal it; see engine/state_seals.py")
    manager = experiment_state._ExperimentCheckpointManager
    original = manager.sync_up_experiment_state
    if getattr(original, "_airflow_tune_sealed", False):
        return
    setattr(tuner_internal, "pickle", _SealingPickle(tuner_internal.pickle, sealer))  # noqa: B010 - a module

    def sync_up_experiment_state(self: Any, save_fn: Any, *args: Any, **kwargs: Any) -> Any:
        def save_then_seal() -> None:
            save_fn()
            sealer.seal_folder(self._storage.experiment_driver_staging_path)

        return original(self, save_then_seal, *args, **kwargs)

    sync_up_experiment_state._airflow_tune_sealed = True  # type: ignore[attr-defined]
    setattr(manager, "sync_up_experiment_state", sync_up_experiment_state)  # noqa: B010 - patching a class


def parse_restore_state(text: str | None) -> dict[str, str] | None:
    """The entrypoint's ``--restore-state``: ``{file name: digest}`` of the state files the submitter proved."""
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()):
        raise EngineError(f"--restore-state must be a JSON object of file names to digests, got {text[:200]!r}")
    return parsed


def check_restore_state(experiment_uri: str, proven: Mapping[str, str] | None) -> None:
    """Raise unless the state files in the experiment folder are exactly the ``proven`` ones, byte for byte: read
    again here, before Tune reads them, so a file changed after the submitter's check is not restored (and what Tune
    then reads is held to the same files: :class:`ProvenState`)."""
    found = {k: v for k, v in storage.file_digests(experiment_uri, recursive=False).items() if is_tune_state(k)}
    if proven is None:
        raise EngineError(
            f"Tune state exists at {experiment_uri}, but the submitter proved none of it (no --restore-state): "
            "refusing to restore it, since restoring unpickles it"
        )
    if found != dict(proven):
        raise _changed(experiment_uri, sorted(k for k in set(found) | set(proven) if found.get(k) != proven.get(k)))


def _changed(experiment_uri: str, names: list[str]) -> EngineError:
    return EngineError(
        f"the Tune state at {experiment_uri} changed after the submitter proved it ({', '.join(names[:5])}): "
        "refusing to restore it, since restoring unpickles it; something other than this experiment's jobs "
        "writes that folder"
    )


#: The name of each snapshot of the experiment's state (``TuneController.CKPT_FILE_TMPL``, every supported release).
EXPERIMENT_STATE = "experiment_state-"


class ProvenState:
    """The state files the submitter proved, ``{file name: digest}``, held to every read of them Tune's restore makes.

    :meth:`check` raises unless the bytes Tune is about to decode are proven ones; a refusal is also kept in
    :attr:`refusal`, because Tune swallows errors in one of those reads (the restored Tuner's ``ExperimentAnalysis``).
    """

    def __init__(self, experiment_uri: str, proven: Mapping[str, str]) -> None:
        self.experiment_uri = experiment_uri
        self.proven = dict(proven)
        self.refusal: EngineError | None = None

    def check(self, data: bytes | str, name: str | None = None) -> None:
        """Raise unless ``data`` is the proven file ``name``; with no name, one proven snapshot of the experiment's
        state (Tune picks the newest by name from a listing, and any proven one holds no code but this
        experiment's). Text is checked as its UTF-8 bytes (a decoder given the file's decoded text)."""
        digest = digest_of(data.encode() if isinstance(data, str) else bytes(data))
        if name is not None:
            if self.proven.get(name) == digest:
                return
        elif any(k.startswith(EXPERIMENT_STATE) and v == digest for k, v in self.proven.items()):
            return
        self.refusal = _changed(self.experiment_uri, [name] if name else self._changed_snapshots())
        raise self.refusal

    def check_folder(self, folder: str) -> None:
        """Check every state file Tune downloaded directly into the local ``folder`` (its driver staging folder), by
        name: the copies it is about to unpickle."""
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if is_tune_state(name) and os.path.isfile(path):
                with open(path, "rb") as handle:
                    self.check(handle.read(), name)

    def raise_refusal(self) -> None:
        """Raise the refusal of a read whose error Tune swallowed, if any."""
        if self.refusal is not None:
            raise self.refusal

    def _changed_snapshots(self) -> list[str]:
        """The experiment-state files that now differ from the proven ones, to name in the refusal."""
        try:
            found = storage.file_digests(self.experiment_uri, recursive=False)
        except Exception:  # only to name the files: the refusal stands whatever the listing does
            found = {}
        names = sorted(
            k
            for k in set(found) | set(self.proven)
            if k.startswith(EXPERIMENT_STATE) and found.get(k) != self.proven.get(k)
        )
        return names or [f"the {EXPERIMENT_STATE}*.json Tune read"]
