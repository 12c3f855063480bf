"""The named steps of a tune task's reconcile loop, shared by RayTuneOperator and RayTuneSensor.

``find_experiment`` (what exists under the experiment's name: its jobs, recorded spec and result, each checked to be
this task's and to ask this spec's question), then reattach to the live job, return the finished result, or
``submit_experiment`` (a new job, whose driver restores the experiment from storage); then ``wait_for_job`` and
``read_result``, or ``job_failure`` saying why the job did not succeed. Like the KubernetesPodOperator's
``find_pod``/``get_or_create_pod``/``await_pod_start``.

Imports neither ray nor boto3 (storage imports pyarrow when it runs); every step takes the RayHook it works through.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_tune.common import storage
from airflow_tune.common.contract import (
    LIVE_STATUSES,
    METADATA_EXPERIMENT,
    METADATA_EXPERIMENT_URI,
    METADATA_FINGERPRINT,
    METADATA_OWNER,
    METADATA_SPEC_DIGEST,
    METADATA_SPEC_URI,
    RESULT_FILE,
    SPEC_FILE,
    describe_owner,
    digest_of,
    failure_text,
    job_spec_uri,
    join_uri,
    manifest_uri,
    owner_differs,
    result_mismatch,
    result_succeeded,
    spec_file_bytes,
)
from airflow_tune.common.spec import ExperimentSpec, fingerprint_of, identity_differences, restore_conflicts
from airflow_tune.exceptions import (
    ExperimentConflictError,
    ExperimentStorageError,
    RayConnectionError,
    RayJobError,
    RayJobNotFoundError,
)
from airflow_tune.trust.proofs import json_object_of, proven_result
from airflow_tune.trust.submitted import SubmittedJobs, record_job
from airflow_tune.utils.following import ProgressFollower
from airflow_tune.utils.waiting import ERROR, PENDING_TIMEOUT, JobWait

if TYPE_CHECKING:
    from airflow_tune.hooks.ray import RayHook

_NEW_NAME = "give this task its own experiment_name (or leave it unset: the default is unique per task instance)"


@dataclass(frozen=True)
class FoundExperiment:
    """What exists under an experiment's name, already checked to be this task's and this spec's question.

    :param jobs: every Ray job of the experiment, live or not.
    :param live: the live job to reattach to, if any.
    :param result: the finished experiment's result (``result.json``), if it succeeded and is believed.
    """

    jobs: list[dict[str, Any]] = field(default_factory=list)
    live: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


def find_experiment(hook: RayHook, spec: ExperimentSpec, submitted: SubmittedJobs) -> FoundExperiment:
    """Look up the experiment's jobs and files; raise when any belongs to another task, asks another question, or
    is a job Airflow has no record of this task submitting (:mod:`airflow_tune.trust.submitted`)."""
    jobs = hook.find_jobs({METADATA_EXPERIMENT: spec.name})
    for job in jobs:  # every job of this name, live or not, must be this task's, as Airflow recorded it
        metadata = job.get("metadata") or {}
        refuse_other_owner(spec, {k: metadata.get(v) for k, v in METADATA_OWNER.items()}, job)
        try:
            submitted.check(job)
        except ExperimentStorageError as exc:
            raise ExperimentConflictError(f"experiment {spec.name!r}: {exc}") from None
    live = next((j for j in jobs if j.get("status") in LIVE_STATUSES), None)
    if live is not None:
        metadata = live.get("metadata") or {}
        theirs = storage.read_json_or_none(metadata[METADATA_SPEC_URI]) if METADATA_SPEC_URI in metadata else None
        refuse_other_question(spec, metadata.get(METADATA_FINGERPRINT), live, theirs)
        return FoundExperiment(jobs=jobs, live=live)
    recorded = storage.read_json_or_none(manifest_uri(spec.experiment_uri, SPEC_FILE))
    if recorded is not None:
        refuse_other_owner(spec, _owner_in(recorded), None)
        refuse_other_question(spec, fingerprint_of(recorded), None, recorded)
    result_uri = manifest_uri(spec.experiment_uri, RESULT_FILE)
    data = storage.read_bytes_or_none(result_uri)
    result = json_object_of(data, result_uri) if data is not None else None
    if data is not None and result is not None and result_succeeded(result):
        refuse_other_owner(spec, _owner_in(result), None)
        refuse_other_question(spec, result.get("fingerprint") or "<none>", None, recorded)
        believe_result(spec, result)
        return FoundExperiment(
            jobs=jobs,
            result=proven_result(hook, spec.experiment_uri, data, owner=spec.owner, submitted=submitted),
        )
    if recorded is not None:
        refuse_restore_conflicts(spec, recorded)
    return FoundExperiment(jobs=jobs)


def _owner_in(manifest: Any) -> Any:
    return manifest.get("owner") if isinstance(manifest, Mapping) else None


def refuse_other_owner(spec: ExperimentSpec, theirs: Any, job: Mapping[str, Any] | None) -> None:
    """Raise when the experiment found under this name belongs to another task: name it, show none of its values."""
    if not owner_differs(theirs, spec.owner):
        return
    where = f"live or earlier Ray job {job['submission_id']}" if job else spec.experiment_uri
    ours = spec.owner or {}
    raise ExperimentConflictError(
        f"experiment {spec.name!r} ({where}) belongs to {describe_owner(theirs)}, not to this task "
        f"(DAG {ours.get('dag_id')!r}, task {ours.get('task_id')!r}); an experiment is read and resumed only by the "
        f"task that started it: {_NEW_NAME}"
    )


def refuse_other_question(
    spec: ExperimentSpec, theirs: str | None, job: Mapping[str, Any] | None, recorded: Mapping[str, Any] | None = None
) -> None:
    """Raise when the experiment found under this name (this task's own) was started with another spec."""
    if not theirs or theirs == spec.fingerprint():
        return
    if recorded is None:
        recorded = storage.read_json_or_none(manifest_uri(spec.experiment_uri, SPEC_FILE))
    differences = identity_differences(recorded, spec.to_dict()) if recorded else []
    where = f"live Ray job {job['submission_id']}" if job else spec.experiment_uri
    raise ExperimentConflictError(
        f"experiment {spec.name!r} already exists ({where}) with another spec"
        + (f": {'; '.join(differences)}" if differences else "")
        + f". One experiment name answers one question: another run uses this experiment_name; {_NEW_NAME}"
    )


def refuse_restore_conflicts(spec: ExperimentSpec, recorded: Mapping[str, Any]) -> None:
    """Raise when the next job would restore the experiment (Tune's ``tuner.pkl`` is there) and the spec changed
    what a restored experiment cannot take (:func:`~airflow_tune.common.spec.restore_conflicts`); the rest of a changed
    policy is applied by the engine."""
    conflicts = restore_conflicts(recorded, spec.to_dict()) if isinstance(recorded, Mapping) else []
    if not conflicts or not storage.exists(join_uri(spec.experiment_uri, "tuner.pkl")):
        return
    raise ExperimentConflictError(
        f"experiment {spec.name!r} ({spec.experiment_uri}) is restored from Tune's saved state on this try, and "
        f"that cannot take this change: {'; '.join(conflicts)}. Keep the earlier value, or {_NEW_NAME}"
    )


def believe_result(spec: ExperimentSpec, result: Any) -> None:
    """Raise unless ``result`` (a ``result.json`` read back from storage) is this experiment's own."""
    mismatch = result_mismatch(result, spec)
    if mismatch:
        raise ExperimentStorageError(
            f"the result of experiment {spec.name!r} in storage is not believed: {mismatch}. Storage under the "
            "experiment was written by someone else; remove the experiment's folder or give this task another "
            "experiment_name"
        )


def next_job_id(spec: ExperimentSpec, found: FoundExperiment) -> str:
    """Deterministic per experiment and attempt: two tries that look at the same moment submit the same id, Ray
    refuses the second, and that one then finds the first's job and reattaches."""
    return f"{spec.name}-{len(found.jobs) + 1}"


#: Where a try keeps its job's id for the next try (Airflow 3.3's ``task_state_store``): the task's own record.
STATE_JOB_ID = "ray_job_id"


def remember_job(context: Any, job_id: str, started: int | None, log: Any) -> None:
    """Record ``job_id`` as this task instance's (:func:`~airflow_tune.trust.submitted.record_job`; ``started``:
    Ray's start time of the job) and keep it as the job a next try restores after."""
    record_job(context, job_id, started, log)
    store = context.get("task_state_store")
    if store is None:
        return
    try:
        store.set(STATE_JOB_ID, job_id)
    except Exception as exc:  # the job metadata still identifies the experiment's jobs
        log.warning("Could not keep the job id in task_state_store: %s", exc)


def remembered_job(context: Any) -> str | None:
    """The job an earlier try of this task instance submitted, as Airflow kept it (3.3 and newer), or None."""
    store = context.get("task_state_store")
    try:
        found = store.get(STATE_JOB_ID) if store is not None else None
    except Exception:
        return None
    return str(found) if found else None


def restore_licence(spec: ExperimentSpec, found: FoundExperiment, remembered: str | None) -> str | None:
    """The earlier job of this experiment whose saved Tune state the next job may restore (``tuner.pkl`` is
    unpickled), or None when there is none to restore; raise when storage holds Tune state no known job wrote.

    Known means: in Ray's job list under this experiment's name (owner-checked by :func:`find_experiment`), or
    remembered by this task instance's earlier try (a cluster that lost its job history, e.g. a new head).
    """
    if found.jobs:
        return str(found.jobs[0]["submission_id"])
    if remembered and remembered.startswith(f"{spec.name}-"):
        return remembered
    if storage.exists(join_uri(spec.experiment_uri, "tuner.pkl")):
        raise ExperimentStorageError(
            f"Tune state (tuner.pkl) exists at {spec.experiment_uri}, but no job of experiment {spec.name!r} is known "
            "to have written it (none in Ray's job list, none remembered by an earlier try of this task): refusing "
            "to restore it, since restoring unpickles it. Give this task another experiment_name (or storage_path), "
            "or remove that folder if it is this task's own experiment"
        )
    return None


def write_job_spec(spec: ExperimentSpec, job_id: str) -> tuple[str, str]:
    """Write the job's spec beside the experiment; return its URI and the digest of its bytes.

    The spec travels through storage, not in the job's environment, so no size limit applies to it; its digest
    travels in the entrypoint, where no storage writer can change it, so the driver runs only these bytes.
    """
    spec_uri = job_spec_uri(spec.experiment_uri, job_id, uuid.uuid4().hex[:8])
    data = spec_file_bytes(spec.to_dict())
    try:
        storage.write_bytes(spec_uri, data)
    except OSError as exc:
        raise ExperimentStorageError(
            f"cannot write the experiment's spec to {spec_uri} ({exc}); check that the bucket of storage_path "
            f"{spec.storage_path!r} exists and that Airflow workers may write to it"
        ) from exc
    return spec_uri, digest_of(data)


def job_metadata(spec: ExperimentSpec, spec_uri: str, spec_digest: str, **airflow: str) -> dict[str, str]:
    """The job's metadata: which experiment, where, its question, its spec and digest, its owner; plus ``airflow``
    facts (``run_id``, ``try_number``) as ``airflow_<name>``."""
    return {
        METADATA_EXPERIMENT: spec.name,
        METADATA_EXPERIMENT_URI: spec.experiment_uri,
        METADATA_FINGERPRINT: spec.fingerprint(),
        METADATA_SPEC_URI: spec_uri,
        METADATA_SPEC_DIGEST: spec_digest,
        **{METADATA_OWNER[k]: str((spec.owner or {}).get(k)) for k in METADATA_OWNER},
        **{f"airflow_{name}": str(value) for name, value in airflow.items()},
    }


def spec_of_job(hook: RayHook, job_id: str, ti: Any, submitted: SubmittedJobs) -> ExperimentSpec:
    """The spec a job of this task instance runs: the file beside the experiment, believed only when Airflow recorded
    the job, its bytes have the digest the job's metadata holds (Ray keeps it: no storage writer can change it) and
    its owner is ``ti``.

    What a deferred task believes its result by when the job has ended: nothing is rendered, and no registry or
    connection is read again (one may be down by then, though the experiment succeeded).
    """
    info = hook.get_job_info(job_id)
    submitted.check({**info, "submission_id": job_id})
    metadata = info.get("metadata") or {}
    uri, digest = metadata.get(METADATA_SPEC_URI), metadata.get(METADATA_SPEC_DIGEST)
    if not uri or not digest:
        raise ExperimentStorageError(f"Ray job {job_id} names no spec of airflow-tune's: it is not this task's job")
    data = storage.read_bytes_or_none(str(uri))
    if data is None or digest_of(data) != digest:
        raise ExperimentStorageError(
            f"the spec of Ray job {job_id} at {uri} is missing or not the one the job was submitted with (its digest "
            "differs): storage under the experiment was changed by someone else"
        )
    spec = ExperimentSpec.from_dict(json_object_of(data, str(uri)))
    map_index = getattr(ti, "map_index", -1)
    ours = {"dag_id": ti.dag_id, "task_id": ti.task_id, "map_index": -1 if map_index is None else int(map_index)}
    if {key: (spec.owner or {}).get(key) for key in ours} != ours:
        raise ExperimentConflictError(
            f"Ray job {job_id} runs the experiment of {describe_owner(spec.owner)}, not this task's"
        )
    return spec


def wait_for_job(
    hook: RayHook,
    job_id: str,
    experiment_uri: str,
    *,
    poll_interval: float,
    max_unreachable_s: float,
    pending_timeout_s: float | None,
    log_interval: float,
    log: Any,
) -> str:
    """Poll until the job ends, printing the experiment's progress (from ``progress.json``) into ``log``; return
    its final status. Each answer means what it means to the trigger (:class:`~airflow_tune.utils.waiting.JobWait`
    decides for both): a dashboard that does not answer is asked again until it has been unreachable for
    ``max_unreachable_s`` since its last answer; a job PENDING too long is stopped."""
    follower = ProgressFollower(experiment_uri)
    wait = JobWait(
        job_id, max_unreachable_s=max_unreachable_s, pending_timeout_s=pending_timeout_s, log_interval=log_interval
    )
    while True:
        try:
            info: Mapping[str, Any] | None = hook.get_job_info(job_id)
        except RayJobNotFoundError:
            info = None
        except RayConnectionError as exc:
            log.warning("Ray dashboard unreachable for %.0fs: %s", wait.unreachable_for(), exc)
            step = wait.unreachable(exc)
            if step.end is not None:
                raise RayConnectionError(str(step.message)) from exc
            time.sleep(poll_interval)
            continue
        step = wait.answered(info)
        if step.log_progress:
            print_progress(follower, log)
        if step.stop_job:
            hook.stop_job(job_id)
        if step.end == PENDING_TIMEOUT:
            raise RayJobError(str(step.message))
        if step.end == ERROR:
            raise RayJobNotFoundError(f"lost track of Ray job {job_id}: {step.message}")
        if step.end is not None:
            return step.end
        time.sleep(wait.next_check_in(poll_interval, on_change=False))


def print_progress(follower: ProgressFollower, log: Any) -> None:
    """The experiment's new progress lines into ``log``; progress is best effort."""
    try:
        lines = follower.poll()
    except Exception as exc:
        log.debug("Could not read the experiment's progress: %s", exc)
        return
    for line in lines:
        log.info("%s", line)


def read_result(
    hook: RayHook,
    experiment_uri: str,
    job_id: str | None,
    spec: ExperimentSpec | None = None,
    *,
    submitted: SubmittedJobs,
    reader: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The finished experiment's ``result.json``, believed only when the job it names sealed exactly its bytes (see
    :func:`~airflow_tune.trust.proofs.proven_result`) and, given ``spec``, when it is ``spec``'s; a ``reader`` (a
    sensor's ``{"dag_id"}``) needs only its DAG to be the owner's."""
    result_uri = manifest_uri(experiment_uri, RESULT_FILE)
    data = storage.read_bytes_or_none(result_uri)
    if data is None:
        raise RayJobError(f"Ray job {job_id} succeeded but wrote no result at {result_uri}")
    if spec is not None:
        believe_result(spec, json_object_of(data, result_uri))
    if spec is not None:
        return proven_result(hook, experiment_uri, data, owner=spec.owner, submitted=submitted)
    return proven_result(hook, experiment_uri, data, owner=reader, submitted=submitted, same_dag_only=True)


#: The first line of a task's failure when its Ray job was stopped by someone else: today's wording for a stop the
#: task sent itself (on_kill) reads like this one, which it is not.
STOPPED_FROM_OUTSIDE = (
    "Ray job {job_id} was stopped from outside this task (Ray's job client, `ray job stop` or the dashboard), not by "
    "Airflow. Tune saves the experiment's state when its job is stopped: the task's next try (a retry, or clearing "
    "the task) restores the experiment."
)


def job_failure(
    hook: RayHook, job_id: str, status: str, message: str | None = None, *, stopped_here: bool = False
) -> str:
    """Why a job did not succeed, cause first (the engine's verdict, Ray's status, trial errors, the log's end).

    :param stopped_here: the task stopped the job itself (its ``on_kill``); else a STOPPED job was stopped from
        outside, and the text says so first.
    """
    if message is None:
        try:
            message = str(hook.get_job_info(job_id).get("message") or "")
        except Exception:
            message = ""
    try:
        logs = hook.get_job_logs(job_id)
    except Exception as exc:
        logs = f"(job logs unavailable: {exc})"
    text = failure_text(job_id, status, message, logs)
    if status == "STOPPED" and not stopped_here:
        return f"{STOPPED_FROM_OUTSIDE.format(job_id=job_id)}\n{text}"
    return text
