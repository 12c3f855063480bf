"""Where Ray Tune differs between the releases the engine runs on (:data:`airflow_tune.common.versions.SUPPORTED_RAY`).

The engine runs on the cluster with the cluster's Ray, any release from 2.43.0 to 2.60.x. Every place where it
depends on more than Tune's documented API, or where Tune behaves differently between those releases, goes through
this module: by feature checks (an attribute, a signature) wherever the API itself tells, never by version number
where it does not need to. What differs, read from the sources of 2.43.0, 2.50.1 and 2.60.0:

- Callbacks' ``on_trial_result`` gets the result itself in 2.60 (a callback may add to it) and a copy in 2.43 and
  2.50, where what a callback adds is lost: :func:`add_to_result` writes to both the result and the trial's last one.
- Searchers gained arguments (``BayesOptSearch(repeat_float_precision=)`` is new in 2.60): :func:`check_arguments`
  refuses one the cluster's class does not take, naming it and the cluster's Ray, before Tune starts.
- The ``base`` of the log-uniform domains is used in 2.43 and deprecated (with a warning) from 2.50 on; a
  log-uniform distribution is the same in any base, so :func:`log_domain_args` drops it on every release.
- Tune internals the engine reaches (the names are the same in every supported release, and checked here so that a
  changed one fails clearly): the trial runtime_env's propagated variables (:func:`stop_propagating`), a restored
  Tuner's RunConfig (:func:`tuner_run_config`), the Tuner's trials (:func:`tuner_trials`), a trial's actor
  (:func:`trial_actor_id`), Tune's handlers of the stop signals (:func:`watch_stop_signals`), and the policy a
  restored experiment runs with (:func:`apply_policy_on_resume`: Tune restores it from the experiment state, over
  what the restored Tuner hands ``tune.run``), where Tune reads an errored trial's error
  (:func:`read_trial_errors_as_text`) and its saved state on a restore (:mod:`.compat_state`).
- Nodes on one host share the folder Ray unpacks a ``working_dir`` into in 2.43 and 2.50 (a worker node's
  ``--temp-dir`` is ignored there), and a node that unpacks a package another node already unpacked deletes it
  first, under the driver that runs in it: :func:`leave_working_dir_package` moves the driver into a copy of its
  own, on every release.

Imports neither airflow nor, at module level, ray (the engine's modules import this one before ``ray.init``).
"""

from __future__ import annotations

import atexit
import inspect
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from airflow_tune.engine.imports import EngineError

__all__ = [
    "add_to_last_result",
    "add_to_result",
    "check_arguments",
    "leave_working_dir_package",
    "log_domain_args",
    "ray_version",
    "read_trial_errors_as_text",
    "stop_propagating",
    "trial_actor_id",
    "tuner_run_config",
    "tuner_tune_config",
    "tuner_trials",
    "watch_stop_signals",
]

#: Where the optional log base sits in the arguments of the log primitives.
LOG_BASE_AT = {"loguniform": 2, "qloguniform": 3, "lograndint": 2, "qlograndint": 3}


def ray_version() -> str:
    import ray

    return str(ray.__version__)


# --- results --------------------------------------------------------------------------------------------------------
def add_to_result(trial: Any, result: dict[str, Any], key: str, value: Any) -> None:
    """Add ``key`` to a trial's result from a callback's ``on_trial_result``, unless the trial reported it itself.

    Ray 2.60 hands callbacks the result it then stores as the trial's last result; 2.43 and 2.50 hand them a copy
    and then store the original (``Trial.update_last_result``), so what a callback adds there is lost. On those
    releases the key reaches the stored results only through :func:`add_to_last_result`, called again when the
    trial ends (``on_trial_complete``/``on_trial_error``, after Tune stored the final result): the last result is
    what the ResultGrid and the experiment state hold.
    """
    result.setdefault(key, value)
    add_to_last_result(trial, key, value)


def add_to_last_result(trial: Any, key: str, value: Any) -> None:
    """Add ``key`` to the result Tune keeps as the trial's last one, unless it is there already."""
    last = getattr(trial, "last_result", None)
    if isinstance(last, dict):
        last.setdefault(key, value)


# --- arguments ------------------------------------------------------------------------------------------------------
def check_arguments(cls: Any, args: Mapping[str, Any], what: str, *, named: bool = False) -> None:
    """Refuse keyword arguments that ``cls`` (a scheduler, searcher, stopper or callback of the cluster's Ray) does
    not take.

    The spec admits the arguments of the newest supported Ray; an older cluster may lack some. A class whose
    signature takes ``**kwargs`` is left to check its own, unless ``named``: then ``args`` must be named in the
    signature (``WandbLoggerCallback`` hands its ``**kwargs`` to ``wandb.init``, so an argument that only 2.60 names,
    such as ``video_kwargs``, would reach wandb.init on 2.43).
    """
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return
    if not named and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(k for k in args if k not in params)
    if unknown:
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        taken = ", ".join(k for k, p in params.items() if p.kind not in variadic)
        raise EngineError(
            f"{what}: {', '.join(map(repr, unknown))} not taken by {cls.__name__} of the cluster's Ray "
            f"{ray_version()} (it takes {taken}): drop {'them' if len(unknown) > 1 else 'it'} from the args, or run a "
            "newer Ray on the cluster"
        )


def log_domain_args(name: str, positional: list[Any]) -> list[Any]:
    """The arguments of a log primitive without its ``base``: the distribution is the same in any base, 2.43 uses
    the base and 2.50+ only warn that it is deprecated."""
    at = LOG_BASE_AT.get(name)
    return positional[:at] if at is not None and len(positional) > at else positional


# --- Tune internals -------------------------------------------------------------------------------------------------
def stop_propagating(names: tuple[str, ...]) -> None:
    """Stop Tune from copying the driver's environment variables ``names`` into each trial actor's runtime_env.

    Tune keeps them in ``ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE`` (a set, in every supported
    release). When it is not there, Tune copies them some other way: refuse to run rather than leak them.
    """
    from ray.tune.execution import class_cache

    propagated = getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if not isinstance(propagated, set):
        raise EngineError(
            f"cannot keep the driver's credentials out of the trials' runtime_env on Ray {ray_version()} (Tune's "
            "class_cache.ENV_VARS_TO_PROPAGATE is not a set here): run a Ray release airflow-tune supports"
        )
    for name in names:
        propagated.discard(name)


#: The callbacks Tune's telemetry counts by class name (``ray.air._internal.usage._count_callbacks``) besides
#: ``DEFAULT_CALLBACK_CLASSES``: its logger integrations.
_INTEGRATION_CALLBACKS = frozenset(
    {"WandbLoggerCallback", "MLflowLoggerCallback", "CometLoggerCallback", "AimLoggerCallback"}
)


def count_callbacks_by_name() -> None:
    """Have Tune's usage telemetry count the experiment's callbacks without importing its logger integrations.

    ``tune.run`` tags the callbacks it is given (``air_usage.tag_callbacks``, every supported release); to count them
    by class it imports the MLflow, W&B, Comet and Aim integrations, and the MLflow one imports ``mlflow``: on a
    cluster with MLflow installed that was 0.7 s of a short experiment's driver (plain Tune without callbacks skips
    the count; the engine always passes its own). Ray compares the classes by name, so the same counts come from the
    names. Where Tune counts some other way, it is left alone.
    """
    from ray.air._internal import usage

    if not callable(getattr(usage, "_count_callbacks", None)):
        return
    setattr(usage, "_count_callbacks", _count_callbacks_by_name)  # noqa: B010 - patching a module


def _count_callbacks_by_name(callbacks: Any) -> dict[str, int]:
    from ray.tune import Callback
    from ray.tune.logger import LoggerCallback
    from ray.tune.utils.callback import DEFAULT_CALLBACK_CLASSES

    built_in = _INTEGRATION_CALLBACKS | {cls.__name__ for cls in DEFAULT_CALLBACK_CLASSES}
    counts: dict[str, int] = {}
    for callback in callbacks or []:
        if not isinstance(callback, Callback):
            continue
        name = type(callback).__name__
        if name in built_in:
            key = name
        elif isinstance(callback, LoggerCallback):
            key = "CustomLoggerCallback"
        else:
            key = "CustomCallback"
        counts[key] = counts.get(key, 0) + 1
    return counts


def read_trial_errors_as_text() -> None:
    """Have Tune give an errored trial's error as the text of its ``error.txt``, never by unpickling its ``error.pkl``.

    A ResultGrid (``fit()``, ``get_results()``) fills each errored trial's ``Result.error`` with
    ``Trial.get_pickled_error()``, which ``cloudpickle.loads`` the trial's ``error.pkl`` from storage, else with
    ``Trial.get_error()``, the text of ``error.txt`` beside it (``ResultGrid._populate_exception``, every supported
    release). Storage is written by more than this driver, and Tune uploads its files before it reads them back, so
    ``error.pkl`` is never read: ``error.txt`` holds the same text, and text is never code.
    """
    from ray.tune.experiment.trial import Trial

    if not callable(getattr(Trial, "get_pickled_error", None)) or not callable(getattr(Trial, "get_error", None)):
        raise EngineError(
            f"cannot keep Tune from unpickling errored trials' error.pkl on Ray {ray_version()} (Trial has no "
            "get_pickled_error/get_error here): run a Ray release airflow-tune supports"
        )
    setattr(Trial, "get_pickled_error", _no_pickled_error)  # noqa: B010 - patching a class


def _no_pickled_error(self: Any) -> None:
    return None


def tuner_run_config(tuner: Any) -> Any:
    """The RunConfig a (restored) Tuner runs with: ``tuner._local_tuner._run_config`` in every supported release."""
    run_config = getattr(getattr(tuner, "_local_tuner", None), "_run_config", None)
    if run_config is None or not hasattr(run_config, "callbacks"):
        raise EngineError(
            f"cannot attach progress tracking to the restored experiment on Ray {ray_version()} (the Tuner has no "
            "_local_tuner._run_config here): run a Ray release airflow-tune supports"
        )
    return run_config


def tuner_tune_config(tuner: Any) -> Any:
    """The TuneConfig a (restored) Tuner runs with: ``tuner._local_tuner._tune_config`` in every supported release."""
    tune_config = getattr(getattr(tuner, "_local_tuner", None), "_tune_config", None)
    if tune_config is None or not hasattr(tune_config, "time_budget_s"):
        raise EngineError(
            f"cannot apply the spec's policy to the restored experiment on Ray {ray_version()} (the Tuner has no "
            "_local_tuner._tune_config here): run a Ray release airflow-tune supports"
        )
    return tune_config


def tuner_trials(tuner: Any) -> list[Any] | None:
    """The experiment's trials as Tune left them after ``fit()``, or None when the Tuner does not expose them
    (``get_results()._experiment_analysis.trials`` in every supported release)."""
    analysis = getattr(tuner.get_results(), "_experiment_analysis", None)
    trials = getattr(analysis, "trials", None)
    return list(trials) if trials is not None else None


def trial_actor_id(trial: Any) -> str | None:
    """The hex id of the actor running ``trial`` (``trial.temporary_state.ray_actor``), or None before it starts."""
    actor = getattr(getattr(trial, "temporary_state", None), "ray_actor", None)
    actor_id = getattr(actor, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else None


#: The signals on which Tune ends its run and saves the experiment's state (the engine forwards SIGTERM as SIGUSR1).
STOP_SIGNALS = ("SIGINT", "SIGUSR1")


def watch_stop_signals(note: Callable[[int], None]) -> bool:
    """Have ``note(signum)`` called before Tune's own handler when a stop signal reaches the driver during ``fit()``.

    Call it from a callback's ``setup``: ``tune.run`` installs its handlers of SIGINT and SIGUSR1 (they set the event
    that ends its loop, ``_setup_signal_catching``, every supported release) before it sets up the callbacks. Tune
    keeps no record of that event once ``fit()`` returns, and its cleanup marks the trials it stops TERMINATED as a
    time budget's stop does, so this is how the engine tells an interrupted run from one Tune ended itself. Return
    False when a stop signal has no Python handler here to wrap (SIGUSR1 not set by Tune, or not the main thread).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    watched = True
    for name in STOP_SIGNALS:
        signum = getattr(signal, name, None)
        current = signal.getsignal(signum) if signum is not None else None
        if signum is None or not callable(current):
            watched = False
            continue

        def handler(sig: int, frame: Any, _tune: Callable[..., Any] = current) -> Any:
            note(sig)
            return _tune(sig, frame)

        signal.signal(signum, handler)
    return watched


# --- the driver's working directory ---------------------------------------------------------------------------------
#: The folder under which Ray's runtime env agent unpacks ``working_dir`` packages, one folder per package named by
#: its URI (``WorkingDirPlugin._resources_dir`` in ray/_private/runtime_env/working_dir.py, every supported release).
WORKING_DIR_PACKAGES = "working_dir_files"


def leave_working_dir_package() -> Path | None:
    """Move the driver out of the unpacked ``working_dir`` package it starts in, into a copy of its own (hard links
    where the filesystem allows), with the package's entries of ``sys.path`` and PYTHONPATH moved along; return the
    copy, or None when the driver does not start in such a package.

    A job's driver starts in its ``working_dir``: Ray starts the job supervisor with ``cd <package folder> &&`` and
    the folder first on PYTHONPATH (``WorkingDirPlugin.modify_context``), and the supervisor runs the entrypoint as
    its child. The folder is named by the package's content hash, so consecutive jobs shipping the same
    ``working_dir`` use the same folder, and it can be deleted under a running driver: a runtime env agent that
    meets a package for the first time (not in its ``URICache``, ray/_private/runtime_env/plugin.py
    ``create_for_plugin_if_needed``) unpacks it with ``download_and_unpack_package(..., overwrite=True)``
    (``WorkingDirPlugin.create``), which deletes an existing folder (``shutil.rmtree``), downloads the package and
    unpacks it again at the same path (ray/_private/runtime_env/packaging.py). Each node's agent does so once per
    package, normally in its own node's folder; but on Ray 2.43 and 2.50 a worker node started on the head's host
    ignores its ``--temp-dir`` ("temp_dir is only configurable from a head node", ray/scripts/scripts.py) and takes
    the head's session folder (``Node._init_temp``, ray/_private/node.py), so the nodes of one host share one
    ``working_dir_files``. The worker node's agent then replaces the folder the driver runs in when the driver's
    ``ray.init()`` has the job's runtime env installed on every node (``eager_install``). From then on the driver's
    working directory is a deleted folder, and ``os.getcwd()`` raises FileNotFoundError: Tune calls it when the
    trials are done (``ExperimentAnalysis`` finds the experiment state with ``_list_at_fs_path``, whose
    ``os.path.relpath`` of a storage path makes it absolute against the cwd). An import from the package while the
    agent unpacks it again fails too (``ModuleNotFoundError``: the path briefly does not exist).

    Nothing of the copy is Ray's to delete, and it holds the package's files as the driver found them: the driver
    imports from it (the package's ``sys.path`` entries, absolute or relative, now name the copy; so does
    PYTHONPATH, for the driver's own subprocesses) and reads relative paths in it as before; what it writes there is
    its own, and the copy is removed at exit. Done before ``ray.init()``, so the job's own installs cannot be
    unpacking the package meanwhile. The same on every release: Ray 2.60 sets a ``working_dir`` up alike (its worker
    nodes take their own ``--temp-dir``, but nodes that share a temp folder meet the same deletion), and the trials,
    which Ray starts in their own node's package folder, are not concerned. A copy that cannot be made leaves the
    driver where it is, as before.
    """
    try:
        here = os.getcwd()
    except FileNotFoundError:
        # Replaced before this driver started: its shell's PWD still names the path, unpacked again since.
        here = os.environ.get("PWD", "")
        if not here or not os.path.isdir(here):
            return None
    package = Path(here)
    if package.parent.name != WORKING_DIR_PACKAGES:
        return None
    own = Path(tempfile.mkdtemp(prefix="airflow-tune-driver-"))
    copy = own / package.name
    try:
        shutil.copytree(package, copy, symlinks=True, copy_function=_link_or_copy)
    except (OSError, shutil.Error) as exc:
        shutil.rmtree(own, ignore_errors=True)
        print(f"airflow-tune: the driver stays in its working_dir {package} (no copy of it: {exc})", file=sys.stderr)
        return None
    atexit.register(shutil.rmtree, own, ignore_errors=True)

    def moved(entry: str) -> str:
        absolute = entry if os.path.isabs(entry) else os.path.join(here, entry)
        inside = absolute == here or absolute.startswith(here.rstrip(os.sep) + os.sep)
        return str(copy) + absolute[len(here) :] if inside else entry

    sys.path[:] = [moved(entry) for entry in sys.path]
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(moved(e) for e in os.environ["PYTHONPATH"].split(os.pathsep))
    os.chdir(copy)
    return copy


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link to ``src`` (the file outlives Ray's deletion of its folder), or a copy across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
