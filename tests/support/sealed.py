"""A result that a Ray job vouches for, as the engine's would be: for tests of the readers (promotion, deploy
helpers) that need a finished experiment without running one.

The result is written to storage and a real Ray job on the session's cluster prints the seal line of its bytes,
carrying the metadata the engine's jobs carry (the experiment's URI and its owner), through the product's own hook.
"""

from __future__ import annotations

import shlex
import time
import uuid
from typing import Any

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.contract import (
    METADATA_EXPERIMENT,
    METADATA_EXPERIMENT_URI,
    METADATA_OWNER,
    RESULT_FILE,
    TERMINAL_STATUSES,
    digest_of,
    manifest_uri,
)
from airflow_tune.common.provenance import CHECKPOINT_DIGEST_KEY, CHECKPOINT_FILES_KEY, files_digest, seal_line


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


def sealed_result(
    xcom: dict[str, Any], dag_id: str, *, write: bool = True, seal: bytes | None = None
) -> dict[str, Any]:
    """Write ``xcom``'s experiment's result.json and run a Ray job that vouches for its bytes (or for ``seal``);
    return the XCom result as the tune task would return it."""
    from airflow_tune.hooks.ray import RayHook

    job_id = f"sealed-{uuid.uuid4().hex[:12]}"
    manifest = manifest_for(xcom, dag_id, job_id)
    body = jsonsafe.dumps(manifest, indent=1, sort_keys=True).encode()
    if write:
        storage.write_bytes(manifest_uri(str(xcom["experiment_uri"]), RESULT_FILE), body)
    line = seal_line(RESULT_FILE, digest_of(seal if seal is not None else body))
    hook = RayHook("ray_default")
    hook.submit_job(
        entrypoint=f"python -c {shlex.quote(f'print({line!r})')}",
        submission_id=job_id,
        metadata={
            METADATA_EXPERIMENT: str(xcom.get("experiment")),
            METADATA_EXPERIMENT_URI: str(xcom["experiment_uri"]),
            METADATA_OWNER["dag_id"]: dag_id,
            METADATA_OWNER["task_id"]: "tune",
            METADATA_OWNER["map_index"]: "-1",
        },
    )
    deadline = time.monotonic() + 120
    while (status := hook.get_job_status(job_id)) not in TERMINAL_STATUSES:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the sealing job {job_id} did not end")
        time.sleep(0.3)
    assert status == "SUCCEEDED", hook.get_job_logs(job_id)
    return {**xcom, "job_id": job_id, CHECKPOINT_DIGEST_KEY: manifest[CHECKPOINT_DIGEST_KEY]}
