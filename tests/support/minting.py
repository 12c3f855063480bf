"""What anyone who may submit a Ray job can do (a DAG author through ``ray_default``, a trial with the token Ray
hands its workers): submit one whose metadata names another task's experiment, as that task's own jobs carry it,
printing the engine's seal lines; through the product's own hook."""

from __future__ import annotations

import json
import shlex
import time
import uuid
from typing import Any

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.contract import RESULT_FILE, TERMINAL_STATUSES, digest_of, manifest_uri
from airflow_tune.common.provenance import seal_line


def mint_job(metadata: dict[str, str], printed: str = "", *, live: bool = False, job_id: str | None = None) -> str:
    """Submit a job with ``metadata`` that prints ``printed``; return its id once it ended, or at once with
    ``live`` (it then sleeps for a minute after printing)."""
    from airflow_tune.hooks.ray import RayHook

    job_id = job_id or f"minted-{uuid.uuid4().hex[:12]}"
    code = f"import time; print({printed!r}, flush=True); time.sleep({60 if live else 0})"
    hook = RayHook("ray_default")
    hook.submit_job(entrypoint=f"python -c {shlex.quote(code)}", submission_id=job_id, metadata=metadata)
    if live:
        return job_id
    deadline = time.monotonic() + 120
    while (status := hook.get_job_status(job_id)) not in TERMINAL_STATUSES:
        assert time.monotonic() < deadline, f"the minted job {job_id} did not end"
        time.sleep(0.3)
    assert status == "SUCCEEDED", hook.get_job_logs(job_id)
    return job_id


def mint_forged_result(result: dict[str, Any]) -> str:
    """Rewrite the experiment's ``result.json`` with another best config, naming a minted job whose metadata is
    the tune job's own and whose log seals the forged bytes; return the minted job's id."""
    from airflow_tune.hooks.ray import RayHook

    where = manifest_uri(str(result["experiment_uri"]), RESULT_FILE)
    manifest = json.loads(storage.read_bytes(where))
    metadata = RayHook("ray_default").get_job_info(str(manifest["job_id"]))["metadata"]
    job_id = f"minted-{uuid.uuid4().hex[:12]}"
    forged = {**manifest, "job_id": job_id, "best_config": {**manifest["best_config"], "x": "forged"}}
    body = jsonsafe.dumps(forged, indent=1, sort_keys=True).encode()
    mint_job(metadata, seal_line(RESULT_FILE, digest_of(body)), job_id=job_id)
    storage.write_bytes(where, body)
    return job_id
