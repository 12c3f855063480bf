"""A trial's output, files and names on the cluster: the spec's ``log_to_file``, ``sync_artifacts`` and trial name
creators on Tune's configs, and each trial's output files uploaded to its folder in storage when it stops.

Tune writes ``log_to_file``'s files in the trial's working directory on the trial's node and uploads them only with
``sync_artifacts``, which uploads every other file there too (a dataset a trial downloads into its working directory,
for one). So the trainable runs as a subclass whose ``stop`` (and ``reset``, when actors are reused) uploads the two
output files alone, after Tune closed them: an errored trial's output included, since Tune stops its actor too.
The Trainable's attributes read here (``_storage``, ``_logdir``, ``_stdout_file``, ``_stdout_fp`` and their stderr
twins; the StorageContext's ``trial_fs_path`` and ``storage_filesystem``) are the same in Ray 2.43 to 2.60.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

from ray import tune

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.common.spec.trial_output import NAMING_FIELDS
from airflow_tune.engine.imports import import_path, resolve_allow_listed
from airflow_tune.engine.trial_creators import load_creators


def apply_trial_output(run_config: Any, tune_config: Any, spec: ExperimentSpec) -> None:
    """The spec's ``log_to_file`` and ``sync_artifacts`` on ``run_config``, its name creators on ``tune_config``
    (new or restored: a restored experiment's new trials take the current spec's, see :mod:`.trial_creators`)."""
    log_to_file = spec.log_to_file
    run_config.log_to_file = tuple(log_to_file) if isinstance(log_to_file, list) else log_to_file
    sync = run_config.sync_config or tune.SyncConfig()
    sync.sync_artifacts = spec.sync_artifacts
    run_config.sync_config = sync
    given = load_creators({field: _creator(spec, field) for field in NAMING_FIELDS})
    tune_config.trial_name_creator = given["trial_name_creator"]
    tune_config.trial_dirname_creator = given["trial_dirname_creator"]


def _creator(spec: ExperimentSpec, field: str) -> Any:
    path = getattr(spec, field)
    if path is None:
        return None
    return resolve_allow_listed(path, field) if path in spec.allow_listed else import_path(path, field)


def with_output_upload(trainable: Any, spec: ExperimentSpec) -> Any:
    """``trainable`` as a Trainable class that uploads its trial's output files when it stops (unchanged when
    ``log_to_file`` is off). A function is first made the class Tune makes of it (``wrap_function``, its name kept)."""
    if not spec.log_to_file:
        return trainable
    from ray.tune.trainable import Trainable, wrap_function

    base = trainable if inspect.isclass(trainable) and issubclass(trainable, Trainable) else wrap_function(trainable)

    class OutputUploading(base):  # type: ignore[valid-type, misc]
        def stop(self) -> None:
            try:
                super().stop()
            finally:
                upload_output(self)

        def reset(self, *args: Any, **kwargs: Any) -> Any:
            upload_output(self)  # the trial this reused actor ran so far
            return super().reset(*args, **kwargs)

    # Tune names trials after the trainable (``_name`` of a wrapped function, else ``__name__``).
    OutputUploading.__name__ = base.__name__
    OutputUploading.__qualname__ = base.__qualname__
    return OutputUploading


def upload_output(trainable: Any) -> None:
    """Copy the trial's non-empty output files from its working directory to its folder in storage. Never raises: a
    failed upload is written to the trial's real stderr and the trial ends as it would have."""
    storage = getattr(trainable, "_storage", None)
    logdir = getattr(trainable, "_logdir", None)
    names = {str(n) for n in (getattr(trainable, "_stdout_file", None), getattr(trainable, "_stderr_file", None)) if n}
    if storage is None or not logdir or not names:
        return
    for handle in (getattr(trainable, "_stdout_fp", None), getattr(trainable, "_stderr_fp", None)):
        try:
            if handle is not None and not handle.closed:
                handle.flush()  # still open when a stop failed before Tune closed it
        except (OSError, ValueError):
            pass
    import pyarrow.fs

    for name in sorted(names):
        local = os.path.join(logdir, name)
        # An empty file says nothing its absence does not (the task log shows both as no output) and costs a request
        # per trial: trivial trials' two requests were the engine's whole overhead over plain Tune.
        if not os.path.isfile(local) or os.path.getsize(local) == 0:
            continue
        try:
            pyarrow.fs.copy_files(
                local, f"{storage.trial_fs_path}/{name}", destination_filesystem=storage.storage_filesystem
            )
        except Exception as exc:  # the output is a convenience; the trial's own result stands
            print(f"[airflow-tune] could not upload the trial's {name} to storage: {exc}", file=sys.__stderr__)
