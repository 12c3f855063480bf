"""What the Airflow side believes only with proof from the Ray job, whose metadata (fixed at submission) and log
(served by the dashboard) no storage writer can change: a finished experiment's ``result.json``
(:func:`proven_result`), Tune's saved state before a retry restores it (:func:`restore_state_proof`), and the
progress a sensor's target is judged on (:func:`proven_progress`). See :mod:`airflow_tune.common.provenance` for the
seals the engine prints. Imports neither ray nor boto3; every function takes the RayHook it reads through.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_tune.common import storage
from airflow_tune.common.contract import (
    METADATA_EXPERIMENT,
    METADATA_EXPERIMENT_URI,
    METADATA_OWNER,
    RESULT_FILE,
    digest_of,
    manifest_uri,
    owner_differs,
)
from airflow_tune.exceptions import ExperimentStorageError, RayJobNotFoundError

if TYPE_CHECKING:
    from airflow_tune.common.spec import ExperimentSpec
    from airflow_tune.hooks.ray import RayHook
    from airflow_tune.trust.submitted import SubmittedJobs


def proven_result(
    hook: RayHook,
    experiment_uri: str,
    data: bytes,
    *,
    owner: Mapping[str, Any] | None,
    submitted: SubmittedJobs | None,
    same_dag_only: bool = False,
    dags: Collection[str] | None = None,
) -> dict[str, Any]:
    """``result.json``'s bytes as a dict, when the Ray job it names vouched for exactly these bytes in its log.

    Storage writers can write any file, and compute every field a result is checked against; they cannot change a
    job's metadata (fixed at submission) or its log (served by the dashboard). So the job the result names must be
    this experiment's (its metadata names ``experiment_uri`` and, given ``owner``, that owner) and its log's last
    ``sealed result.json`` line must carry the digest of ``data``; else :class:`ExperimentStorageError`. Given
    ``dags``, the job must have run for one of them (a registry's DAGs, :mod:`airflow_tune.registries.owner`).
    Given ``submitted`` (a task's view of Airflow's records), the job must be one Airflow recorded as submitted by
    the task instance its metadata names (:mod:`airflow_tune.trust.submitted`); None only where no task runs.
    """
    from airflow_tune.common.provenance import sealed_digests

    where = manifest_uri(experiment_uri, RESULT_FILE)
    result = json_object_of(data, where)
    job_id = result.get("job_id")
    refused = f"the result at {where} is not believed"
    if not isinstance(job_id, str) or not job_id:
        raise ExperimentStorageError(f"{refused}: it names no Ray job that wrote it")
    try:
        info = hook.get_job_info(job_id)
    except RayJobNotFoundError:
        raise ExperimentStorageError(
            f"{refused}: the Ray job it names ({job_id[:200]}) is unknown to the cluster (restarted, or another "
            "cluster), so nothing proves that job wrote it. Run the experiment again under a new experiment_name "
            "(or remove its folder)"
        ) from None
    metadata = info.get("metadata") or {}
    theirs = {k: metadata.get(v) for k, v in METADATA_OWNER.items()}
    if metadata.get(METADATA_EXPERIMENT_URI) != experiment_uri or owner_differs(
        theirs, owner, same_dag_only=same_dag_only
    ):
        raise ExperimentStorageError(f"{refused}: the Ray job it names ({job_id[:200]}) ran another experiment")
    if submitted is not None:
        try:
            submitted.check({**info, "submission_id": job_id})
        except ExperimentStorageError as exc:
            raise ExperimentStorageError(f"{refused}: {exc}") from None
    if dags is not None and theirs.get("dag_id") not in dags:
        raise ExperimentStorageError(
            f"{refused}: the Ray job it names ({job_id[:200]}) ran for DAG {str(theirs.get('dag_id'))[:250]!r}, "
            f"which is not one of the registry's DAGs ({', '.join(repr(d) for d in sorted(dags)) or 'none'})"
        )
    sealed = sealed_digests(hook.get_job_logs(job_id), RESULT_FILE)
    if not sealed or sealed[-1] != digest_of(data):
        raise ExperimentStorageError(
            f"{refused}: its bytes are not the ones Ray job {job_id} wrote (digest {digest_of(data)}, the job's log "
            f"vouches for {sealed[-1] if sealed else 'none'}); something changed it in storage after the job ended"
        )
    return result


def restore_state_proof(
    hook: RayHook,
    spec: ExperimentSpec,
    jobs: Sequence[Mapping[str, Any]],
    licence: str | None,
    log: Any = None,
    *,
    allow_unproven: bool = False,
) -> dict[str, str] | None:
    """The Tune state files the next job may restore (``{file name: digest}``, passed in its entrypoint), or None
    when there is nothing to restore; raise when one of them is not proven to be this experiment's.

    Proven means: one of ``jobs``, the experiment's in Ray's job list (owner-checked by
    :func:`~airflow_tune.utils.reconcile.find_experiment`), vouched for
    exactly those bytes in its log (:mod:`airflow_tune.engine.state_seals`). A cluster that lost its job history
    (the licence is this task's own record of an earlier try) keeps no logs: the restore is then refused, unless the
    DAG file set ``allow_unproven`` (``restore_unproven_state``): then the files are restored as found now (the engine
    refuses them if they change before it reads them), and the task log says that nothing proves who wrote them.
    """
    from airflow_tune.common.provenance import is_tune_state, unproven_state

    if licence is None:
        return None
    state = {k: v for k, v in storage.file_digests(spec.experiment_uri, recursive=False).items() if is_tune_state(k)}
    if not jobs:
        if not allow_unproven:
            raise ExperimentStorageError(
                f"the Tune state at {spec.experiment_uri} was saved by job {licence}, which the cluster no longer "
                "knows (a new head lost the job history, its logs with it): nothing proves these files are the ones it "
                "wrote, and restoring unpickles them. Refusing to restore: give this task another experiment_name "
                "(or remove the folder) to start again, or, where no one else can write that storage, set "
                "restore_unproven_state=True in the DAG file"
            )
        if log is not None:
            log.warning(
                "Restoring the Tune state at %s that job %s saved, unproven (restore_unproven_state=True): the "
                "cluster no longer knows that job (a new head), so its log cannot prove these files are the ones "
                "it wrote",
                spec.experiment_uri,
                licence,
            )
        return state
    unproven = unproven_state(state, (hook.get_job_logs(str(job["submission_id"])) for job in jobs))
    if unproven:
        shown = "; ".join(f"{name[:200]}: {why}" for name, why in list(unproven.items())[:5])
        raise ExperimentStorageError(
            f"the Tune state at {spec.experiment_uri} is not all this experiment's ({shown}): refusing to restore "
            "it, since restoring unpickles it. Something other than this experiment's jobs writes that folder: give "
            "this task another experiment_name (or storage_path), or remove the folder to start again"
        )
    return state


def proven_progress(
    hook: RayHook,
    experiment_uri: str,
    job_id: str | None,
    *,
    reader: Mapping[str, Any] | None,
    submitted: SubmittedJobs | None,
) -> dict[str, Any] | None:
    """The experiment's progress as its Ray job's log says it (``progress.json`` is a hint anyone who can write
    storage can forge), shaped as ``progress.json``; None when no job of the experiment has printed any yet.

    The job is ``job_id``, else the experiment's newest job; it must be this experiment's (its metadata, fixed at
    submission, names ``experiment_uri``) and, given ``reader``, of the reader's DAG; given ``submitted``, one
    Airflow recorded (:mod:`airflow_tune.trust.submitted`): the newest such job when ``job_id`` is not given.
    """
    from airflow_tune.common.provenance import logged_progress

    if job_id:
        info: Mapping[str, Any] | None = hook.get_job_info(job_id)
    else:
        found = hook.find_jobs({METADATA_EXPERIMENT_URI: experiment_uri})
        info = next((j for j in found if _recorded(submitted, j)), found[0] if found else None)
    if not info:
        return None
    metadata = info.get("metadata") or {}
    owner = {k: metadata.get(v) for k, v in METADATA_OWNER.items()}
    job = str(info.get("submission_id") or job_id)
    if metadata.get(METADATA_EXPERIMENT_URI) != experiment_uri or owner_differs(owner, reader, same_dag_only=True):
        raise ExperimentStorageError(
            f"Ray job {job[:200]} is not one of experiment {experiment_uri}'s in the reader's DAG: its progress is "
            "not this experiment's"
        )
    if submitted is not None:
        submitted.check({**info, "submission_id": job})
    logged = logged_progress(hook.get_job_logs(job))
    if logged is None:
        return None
    counts = logged.get("counts")
    counts = counts if isinstance(counts, dict) else {}
    return {
        **logged,
        "experiment": metadata.get(METADATA_EXPERIMENT),
        "owner": owner,
        "num_trials": sum(v for v in counts.values() if isinstance(v, int)),
        "job_id": job,
    }


def _recorded(submitted: SubmittedJobs | None, info: Mapping[str, Any]) -> bool:
    if submitted is None:
        return True
    try:
        submitted.check(info)
    except ExperimentStorageError:
        return False
    return True


def json_object_of(data: bytes, where: str) -> dict[str, Any]:
    import json

    try:
        parsed = json.loads(data)
    except ValueError:
        raise ExperimentStorageError(f"the result at {where} is not JSON") from None
    if not isinstance(parsed, dict):
        raise ExperimentStorageError(f"the result at {where} is not a JSON object")
    return parsed
