"""A result that a Ray job vouches for, as the engine's would be: for tests of the readers (promotion, deploy
helpers) that need a finished experiment without running one.

The result is written to storage and a real Ray job on the session's cluster prints the seal line of its bytes,
carrying the metadata the engine's jobs carry (the experiment's URI and its owner), through the product's own hook.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.contract import (
    METADATA_EXPERIMENT,
    METADATA_EXPERIMENT_URI,
    METADATA_OWNER,
    RESULT_FILE,
    digest_of,
    manifest_uri,
)
from airflow_tune.common.provenance import CHECKPOINT_DIGEST_KEY, CHECKPOINT_FILES_KEY, files_digest, seal_line
from airflow_tune.trust.submitted import METADATA_RUN_ID, METADATA_TRY_NUMBER
from tests.support.minting import mint_job


def manifest_for(xcom: dict[str, Any], dag_id: str, job_id: str) -> dict[str, Any]:
    """The result.json an engine would write for the XCom result ``xcom`` of an experiment of ``dag_id``."""
    checkpoint = xcom.get("best_checkpoint_uri")
    files = storage.file_digests(checkpoint) if checkpoint else None
    return {
        **xcom,
        "status": "succeeded",
        "job_id": job_id,
        "owner": {"dag_id": dag_id, "task_id": "tune", "map_index": -1, "run_id": None},
        CHECKPOINT_FILES_KEY: files,
        CHECKPOINT_DIGEST_KEY: files_digest(files) if files else None,
    }


#: Where a result sealed for a DAG run (``run_id=None``) carries its pending job until the run's stand-in ``tune``
#: task mints it (:func:`stand_in_tune`); popped there, so the promote task never sees it.
SEALING_KEY = "_sealing"
#: The run the jobs of results sealed for a direct ``execute()`` (no DAG run) name.
DIRECT_RUN = "manual__sealed"
#: Airflow's record of the jobs the stand-in tune task instances submitted, for direct ``execute()`` runs whose task
#: instance is a stand-in too (:func:`xcom_pull`): ``{(dag_id, run_id, task_id, map_index): {job id: start time}}``.
RECORDS: dict[tuple[str, str, str, int], dict[str, Any]] = {}


def sealed_result(
    xcom: dict[str, Any],
    dag_id: str,
    *,
    write: bool = True,
    seal: bytes | None = None,
    run_id: str | None = DIRECT_RUN,
) -> dict[str, Any]:
    """Write ``xcom``'s experiment's result.json and run a Ray job that vouches for its bytes (or for ``seal``);
    return the XCom result as the tune task would return it.

    The job names the tune task of ``run_id`` and is recorded as that task instance's (:data:`RECORDS`, read by the
    stand-in task instances of direct ``execute()`` runs through :func:`xcom_pull`). With ``run_id=None`` the job is
    left to the DAG run's stand-in tune task (:func:`stand_in_tune`), which mints it for its own run and records it
    in Airflow's XCom, as RayTuneOperator does.
    """
    job_id = f"sealed-{uuid.uuid4().hex[:12]}"
    manifest = manifest_for(xcom, dag_id, job_id)
    body = jsonsafe.dumps(manifest, indent=1, sort_keys=True).encode()
    if write:
        storage.write_bytes(manifest_uri(str(xcom["experiment_uri"]), RESULT_FILE), body)
    sealing = {
        "job_id": job_id,
        "digest": digest_of(seal if seal is not None else body),
        "dag_id": dag_id,
        "experiment": str(xcom.get("experiment")),
        "experiment_uri": str(xcom["experiment_uri"]),
    }
    out = {**xcom, "job_id": job_id, CHECKPOINT_DIGEST_KEY: manifest[CHECKPOINT_DIGEST_KEY]}
    if run_id is None:
        return {**out, SEALING_KEY: sealing}
    RECORDS.setdefault((dag_id, run_id, "tune", -1), {})[job_id] = _mint(sealing, run_id)
    return out


def _mint(sealing: dict[str, Any], run_id: str, task_id: str = "tune") -> int | None:
    """Run the job that prints the seal, naming the task ``task_id`` of ``run_id``; return Ray's start time of it."""
    from airflow_tune.hooks.ray import RayHook

    metadata = {
        METADATA_EXPERIMENT: str(sealing["experiment"]),
        METADATA_EXPERIMENT_URI: str(sealing["experiment_uri"]),
        METADATA_OWNER["dag_id"]: str(sealing["dag_id"]),
        METADATA_OWNER["task_id"]: task_id,
        METADATA_OWNER["map_index"]: "-1",
        METADATA_RUN_ID: run_id,
        METADATA_TRY_NUMBER: "1",
    }
    job_id = mint_job(metadata, seal_line(RESULT_FILE, str(sealing["digest"])), job_id=str(sealing["job_id"]))
    started = RayHook("ray_default").get_job_info(job_id).get("start_time")
    return started if isinstance(started, int) else None


def stand_in_tune() -> dict[str, Any]:
    """The body of a test DAG's stand-in ``tune`` task: the run's conf ``result``, its job minted for this run and
    recorded in Airflow as this task instance's, as RayTuneOperator records the jobs it submits."""
    from airflow.sdk import get_current_context

    from airflow_tune.trust.submitted import record_job

    context = get_current_context()
    result = dict(context["dag_run"].conf["result"])
    sealing = result.pop(SEALING_KEY, None)
    if isinstance(sealing, dict):
        started = _mint(sealing, str(context["run_id"]), str(context["ti"].task_id))
        record_job(context, str(sealing["job_id"]), started, logging.getLogger(__name__))
    return result


def xcom_pull(*, task_ids: str, dag_id: str, run_id: str, map_indexes: int, key: str, **_: Any) -> Any:
    """A stand-in task instance's ``xcom_pull`` for direct ``execute()`` runs: the records of :func:`sealed_result`."""
    from airflow_tune.trust.submitted import RECORD_KEY

    return RECORDS.get((dag_id, run_id, task_ids, map_indexes)) if key == RECORD_KEY else None
