"""The handshake between the Airflow side and the engine: one home for every name both sides must agree on.

The operator submits ``ENGINE_ENTRYPOINT`` with the spec and job id in the job's environment and tags the job with
``METADATA_*``; the engine writes its manifests beside the experiment (``manifest_uri``) and marks the log lines meant
for the Airflow side with ``LOG_MARK``, ending a failed run with one ``VERDICT`` line that says why. The XCom result is
``xcom_result`` of the result manifest. Imports neither airflow nor ray: both sides import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# -- the job ---------------------------------------------------------------------------------------------------------
ENGINE_MODULE = "airflow_tune.engine"
ENGINE_ENTRYPOINT = f"python -m {ENGINE_MODULE}"
#: The package code written in the DAG file travels in by value (a folder in the job's ``py_modules``): its import
#: paths are ``airflow_tune_shipped:<kind>_<digest>`` (the trainable's ``airflow_tune_shipped:trainable``).
SHIPPED_PACKAGE = "airflow_tune_shipped"
#: Environment of the driver: the spec's JSON (or ``--spec URI``), and the job's own submission id.
SPEC_ENV = "AIRFLOW_TUNE_SPEC"
JOB_ID_ENV = "AIRFLOW_TUNE_JOB_ID"
#: When set, the driver's last log line says whether anything imported airflow (the engine must not).
DEBUG_IMPORTS_ENV = "AIRFLOW_TUNE_DEBUG_IMPORTS"
#: Driver exit codes: finished (result.json written), the experiment failed, bad spec or setup, interrupted.
EXIT_OK, EXIT_FAILED, EXIT_BAD_SPEC, EXIT_INTERRUPTED = 0, 1, 2, 130

#: Job metadata keys: which experiment a job runs, where, and the spec's identity (see ``ExperimentSpec.fingerprint``).
METADATA_EXPERIMENT = "airflow_tune_experiment"
METADATA_EXPERIMENT_URI = "airflow_tune_experiment_uri"
METADATA_FINGERPRINT = "airflow_tune_fingerprint"
#: Where the job's spec is: the operator writes it beside the experiment and hands the driver only its URI
#: (``--spec``), so no size limit of an environment variable or of the Jobs API applies to it.
METADATA_SPEC_URI = "airflow_tune_spec_uri"
#: The digest of the job's spec file (``sha256:<hex>``): also in the entrypoint (``--spec-digest``), which nobody who
#: can write to storage can change, so the driver runs only the spec the operator validated.
METADATA_SPEC_DIGEST = "airflow_tune_spec_digest"
#: Which task instance the job's experiment belongs to (see ``ExperimentSpec.owner``).
METADATA_OWNER = {"dag_id": "airflow_dag_id", "task_id": "airflow_task_id", "map_index": "airflow_map_index"}


def pending_too_long(info: Mapping[str, Any], limit_s: float | None, now: float) -> str | None:
    """Why a job that is still PENDING ``limit_s`` after its submission should be given up, or None.

    A job stays PENDING while its runtime env installs and until a node can run its driver; one that never gets
    there would hold the task until its execution_timeout.
    """
    if limit_s is None or info.get("status") != "PENDING" or not info.get("start_time"):
        return None
    waited = now - float(info["start_time"]) / 1000.0
    if waited < limit_s:
        return None
    return (
        f"Ray job {info.get('submission_id')} stayed PENDING for {waited:.0f}s (pending_timeout_s={limit_s:.0f}): "
        f"{info.get('message') or 'no message'}; its runtime env may not install (check pip/py_modules/working_dir) "
        "or no node can run its driver. Stopping it was requested (Ray ends a job whose driver never starts after its "
        "RAY_JOB_START_TIMEOUT_SECONDS, 15 min by default)"
    )


#: Ray job statuses.
LIVE_STATUSES = frozenset({"PENDING", "RUNNING"})
TERMINAL_STATUSES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})

# -- files beside the experiment ---------------------------------------------------------------------------------------
MANIFEST_DIR = ".airflow_tune"
SPEC_FILE, PROGRESS_FILE, RESULT_FILE = "spec.json", "progress.json", "result.json"
#: Every trial's row (config, metrics, error, path) once the experiment ends; ``result.json`` lists only the best and
#: the errored trials, so what the Airflow side reads stays small.
TRIALS_FILE = "trials.json"
#: Metric curves (``training_iteration`` -> metric), downsampled, for a bounded number of trials: the best ones and
#: the running ones. ``{"metric", "mode", "updated_at", "max_trials", "max_points",
#: "trials": {trial_id: {"status", "config", "points": [[iteration, value], ...]}}}``; strict JSON, bounded size.
HISTORY_FILE = "history.json"


#: An MLflow Model Registry URI's scheme: a registered model (``models:/<name>``), an alias or a version of one.
MODELS_PREFIX = "models:/"


def is_mlflow_uri(uri: Any) -> bool:
    """Whether ``uri`` names a model in MLflow's registry (``models:/...``): the one place this is decided."""
    return isinstance(uri, str) and uri.startswith(MODELS_PREFIX)


def join_uri(base: str, *parts: str) -> str:
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def manifest_uri(experiment_uri: str, name: str) -> str:
    """URI of one of the experiment's own files beside Tune's: ``spec.json``, ``progress.json``, ``result.json``."""
    return join_uri(experiment_uri, MANIFEST_DIR, name)


def job_spec_uri(experiment_uri: str, job_id: str, token: str) -> str:
    """Where one job's spec is kept: ``jobs/<job id>-<token>.json`` (the token keeps racing submitters apart)."""
    return join_uri(experiment_uri, MANIFEST_DIR, "jobs", f"{job_id}-{token}.json")


def spec_file_bytes(spec_dict: Mapping[str, Any]) -> bytes:
    """A job's spec file as written to storage: strict, sorted JSON (its digest is taken over exactly these bytes)."""
    from airflow_tune.common import jsonsafe

    return jsonsafe.dumps(spec_dict, indent=1, sort_keys=True).encode()


def digest_of(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


#: The entrypoint's licence to restore: the earlier job of the same experiment that wrote the Tune state
#: (``tuner.pkl``, which ``Tuner.restore`` unpickles). Without it the engine never restores.
RESTORE_AFTER = "--restore-after"
#: With it, the state files the submitter proved (``{file name: digest}``, JSON): the engine restores only those.
RESTORE_STATE = "--restore-state"


def engine_command(
    spec_uri: str,
    spec_digest: str,
    *,
    restore_after: str | None = None,
    restore_state: Mapping[str, str] | None = None,
) -> str:
    """The job's entrypoint: the engine, reading its spec from ``spec_uri`` and running it only if its bytes have
    ``spec_digest``; restoring the experiment's saved Tune state only when ``restore_after`` names the earlier job of
    this experiment that the submitter knows wrote it, and only the files ``restore_state`` names, with those bytes."""
    import json
    import shlex

    command = f"{ENGINE_ENTRYPOINT} --spec {shlex.quote(spec_uri)} --spec-digest {shlex.quote(spec_digest)}"
    if restore_after:
        command += f" {RESTORE_AFTER} {shlex.quote(restore_after)}"
        state = json.dumps(dict(restore_state or {}), sort_keys=True, separators=(",", ":"))
        command += f" {RESTORE_STATE} {shlex.quote(state)}"
    return command


def owner_differs(recorded: Any, owner: Mapping[str, Any] | None, *, same_dag_only: bool = False) -> bool:
    """Whether an experiment's recorded owner is not ``owner``: another DAG, task or map index, or another run when
    the recorded owner names one (experiments with the default name). A record with no owner differs from every
    owner: it was not written by this version of the operator. ``same_dag_only``: a reader of the owner's DAG (a
    sensor, a promote task, the Experiment view) needs only the DAG to match."""
    if owner is None:
        return False
    if not isinstance(recorded, Mapping):
        return True
    keys = ("dag_id",) if same_dag_only else ("dag_id", "task_id", "map_index")
    if any(str(recorded.get(k)) != str(owner.get(k)) for k in keys):
        return True
    if same_dag_only or recorded.get("run_id") is None:
        return False
    return str(recorded.get("run_id")) != str(owner.get("run_id"))


def describe_owner(recorded: Any) -> str:
    """Who owns an experiment, for a refusal: its DAG, task and map index, never a value of its spec."""
    if not isinstance(recorded, Mapping):
        return "no recorded owner (not written by this version of airflow-tune)"
    text = f"DAG {str(recorded.get('dag_id'))[:250]!r}, task {str(recorded.get('task_id'))[:250]!r}"
    map_index = recorded.get("map_index")
    if map_index not in (None, -1, "-1"):
        text += f", map index {str(map_index)[:12]}"
    return text


# -- the job log -----------------------------------------------------------------------------------------------------
#: Lines the engine prints for the Airflow side (trial tables, trial errors, the result) start with this.
LOG_MARK = "[airflow-tune] "
#: The engine's last word on a run that did not finish: ``LOG_MARK + VERDICT + one line``.
VERDICT = "verdict: "


def engine_lines(logs: str, kind: str = "") -> list[str]:
    """What follows ``LOG_MARK + kind`` on each line of a job log that starts with it, oldest first: every reader of
    the engine's lines (seals, progress, the verdict) reads them here.

    A line ends at ``\n`` only (the dashboard serves a ``\r`` as ``\n``), never where ``str.splitlines()`` would also
    break it (``\x0b``, ``\x0c``, ``\x1c`` to ``\x1e``, ``\x85``, ``\u2028``, ``\u2029``): those can sit in a value
    a trial prints or raises with, after Ray's ``(name pid=...)`` prefix. No line starts with the mark unless the
    engine wrote it: the driver escapes the mark at the start of every line it did not write itself
    (:mod:`airflow_tune.engine.log_lines`).
    """
    head = LOG_MARK + kind
    return [line[len(head) :] for line in logs.split("\n") if line.startswith(head)]


def progress_lines(logs: str) -> list[str]:
    """The engine's own lines of a job log."""
    return [LOG_MARK + line for line in engine_lines(logs)]


def verdict_of(logs: str) -> str | None:
    """The engine's verdict on a run that did not finish, from its job log; None when it printed none."""
    found = engine_lines(logs, VERDICT)
    return found[-1].strip() if found else None


def failure_text(job_id: str, status: str, message: str | None, logs: str, *, tail_lines: int = 20) -> str:
    """Why a job did not succeed, cause first: the engine's verdict, then Ray's status, trial errors, the log's end."""
    verdict = verdict_of(logs)
    # Ray's message may carry the whole log ("last available logs ..."): its first sentence is enough here.
    brief = (message or "").strip().splitlines()[0].split(", last available logs")[0] if message else ""
    ray_says = f"Ray job {job_id} {status}" + (f": {brief}" if brief else "")
    parts = [verdict if verdict else ray_says]
    if verdict:
        parts.append(f"({ray_says})")
    by_trial: dict[str, str] = {}  # the last line about each trial
    for line in progress_lines(logs):
        head, sep, _ = line[len(LOG_MARK) :].partition(" errored: ")
        if sep and head.startswith("trial "):
            by_trial.pop(head, None)
            by_trial[head] = line[len(LOG_MARK) :]
    if by_trial:
        shown = list(by_trial.values())
        more = f"\n  ... and {len(shown) - 10} more" if len(shown) > 10 else ""
        parts.append("Trial errors:\n  " + "\n  ".join(shown[:10]) + more)
    tail = "\n".join(line[:500] for line in logs.strip().splitlines()[-tail_lines:])
    if tail:
        parts.append(f"Last lines of the job log:\n{tail}")
    return "\n".join(parts)


# -- the result --------------------------------------------------------------------------------------------------------
#: Keys of the XCom result; stable, documented in docs/operators/ray_tune.rst.
RESULT_KEYS = (
    "experiment",
    "experiment_uri",
    "job_id",
    "metric",
    "mode",
    "best_trial_id",
    "best_config",
    "best_metrics",
    "best_checkpoint_uri",
    "best_checkpoint_digest",
    "num_trials",
    "num_terminated",
    "num_errored",
    "dashboard_url",
    "finished_at",
    "mlflow",
    "objectives",
    "pareto_front",
    "pareto_front_size",
)
#: What the XCom result's ``mlflow`` holds when trials were tracked (null when not): the run map stays in the
#: manifests, so the XCom stays small whatever the number of trials.
MLFLOW_RESULT_KEYS = ("tracking_uri", "experiment_id", "parent_run_id", "best_run_id")


def result_succeeded(manifest: Mapping[str, Any]) -> bool:
    """Whether a result manifest is a finished, successful experiment (a failed one is kept only for diagnosis)."""
    return manifest.get("status", "succeeded") == "succeeded"


def result_mismatch(manifest: Any, spec: Any) -> str | None:
    """Why a ``result.json`` read back from storage is not the result of ``spec``'s experiment, or None.

    Storage is believed only when it is what we wrote: the result names this experiment, asks this spec's question
    (its fingerprint), belongs to this spec's owner, and its best checkpoint lies inside the experiment.
    """
    if not isinstance(manifest, Mapping):
        return "it is not a JSON object"
    if manifest.get("experiment") != spec.name or manifest.get("experiment_uri") != spec.experiment_uri:
        return "it names another experiment"
    if manifest.get("fingerprint") != spec.fingerprint():
        return "it answers another spec (its fingerprint differs or is missing)"
    if owner_differs(manifest.get("owner"), spec.owner):
        return f"it belongs to {describe_owner(manifest.get('owner'))}"
    checkpoint = manifest.get("best_checkpoint_uri")
    if checkpoint is not None and not inside_experiment(checkpoint, spec.experiment_uri):
        return "its best checkpoint lies outside the experiment"
    return None


def inside_experiment(uri: Any, experiment_uri: Any) -> bool:
    """Whether ``uri`` (a checkpoint's) lies below ``experiment_uri``, at a path-segment boundary, with no ``.`` or
    ``..`` segment: deploy tasks unpickle a checkpoint, so only one the experiment wrote is handed on."""
    if not (isinstance(uri, str) and isinstance(experiment_uri, str) and experiment_uri):
        return False
    if not uri.startswith(experiment_uri.rstrip("/") + "/"):
        return False
    return not {".", ".."} & set(uri.split("://", 1)[-1].split("/"))


def xcom_mlflow(tracking: Any) -> dict[str, Any] | None:
    """The XCom result's ``mlflow`` from a manifest's (result.json or progress.json): :data:`MLFLOW_RESULT_KEYS`."""
    return {key: tracking.get(key) for key in MLFLOW_RESULT_KEYS} if isinstance(tracking, Mapping) else None


def xcom_result(manifest: Mapping[str, Any], job_id: str | None, dashboard_url: str | None) -> dict[str, Any]:
    """The XCom result of a finished experiment: :data:`RESULT_KEYS` of its result manifest."""
    out = {key: manifest.get(key) for key in RESULT_KEYS}
    out["mlflow"] = xcom_mlflow(manifest.get("mlflow"))
    # Every objective, first the one best_* go by (one for a single metric; a result written before had none).
    out["objectives"] = manifest.get("objectives") or [{"metric": manifest.get("metric"), "mode": manifest.get("mode")}]
    out["job_id"] = manifest.get("job_id") or job_id
    out["dashboard_url"] = dashboard_url
    return out
