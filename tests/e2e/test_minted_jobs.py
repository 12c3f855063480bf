"""A task believes only the Ray jobs Airflow recorded it submitting (issue 40), on the real stack (Ray head, S3
endpoint, Airflow's dag.test): a job minted through ``ray_default`` with the metadata the task's own jobs carry is
refused by the tune task (which would otherwise reattach to it and take its result) and by the promote task (which
would otherwise believe a forged ``result.json`` its log seals), each naming the job; nothing is registered."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common.contract import METADATA_EXPERIMENT, METADATA_EXPERIMENT_URI, METADATA_OWNER
from airflow_tune.exceptions import AirflowTuneException, PromotionError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.trust.submitted import METADATA_RUN_ID, METADATA_TRY_NUMBER, RECORD_KEY
from tests.e2e.dags.minted_job_cases import REGISTRY, STORAGE
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag, run_id_for, stop_live_jobs
from tests.support.minting import mint_job

FILE = "minted_job_cases.py"
pytestmark = pytest.mark.usefixtures("stack")


def _date() -> datetime:
    return datetime(2004, 4, 4, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


@pytest.mark.timeout(240)
def test_the_tune_task_refuses_a_live_job_minted_with_its_metadata_and_submits_nothing():
    date = _date()
    dag_id, run_id = "aft_minted_tune", run_id_for(date)
    name = experiment(dag_id, run_id)
    metadata = {
        METADATA_EXPERIMENT: name,
        METADATA_EXPERIMENT_URI: f"{STORAGE}/{name}",
        METADATA_OWNER["dag_id"]: dag_id,
        METADATA_OWNER["task_id"]: "tune",
        METADATA_OWNER["map_index"]: "-1",
        METADATA_RUN_ID: run_id,
        METADATA_TRY_NUMBER: "1",
    }
    minted = mint_job(metadata, "[airflow-tune] the attacker's job", live=True, job_id=f"{name}-1")
    try:
        run = run_dag(load_dag(dag_id, FILE), logical_date=date)
        assert run.task_states() == {"tune": "failed"}
        [error] = run.errors("tune")
        assert isinstance(error, AirflowTuneException), error
        assert re.search(
            rf"Ray job {re.escape(minted)} is not believed: Airflow has no record of task 'tune'", str(error)
        )
        # Nothing submitted: the only job of the experiment is the minted one.
        assert [j["submission_id"] for j in jobs_of(name)] == [minted]
    finally:
        stop_live_jobs(name)


@pytest.mark.timeout(300)
def test_the_promote_task_refuses_a_result_sealed_by_a_minted_job_and_registers_nothing(s3_client: Any):
    run = run_dag(load_dag("aft_minted_promote", FILE), logical_date=_date())
    states = run.task_states()
    assert states["tune"] == "success" and states["mint"] == "success", (states, run.errors("tune"))
    assert states["promote"] == "failed", states
    [error] = run.errors("promote")
    assert isinstance(error, PromotionError), error
    assert re.search(r"Ray job minted-[0-9a-f]{12} is not believed: Airflow has no record of task 'tune'", str(error))
    # The record the promote task read: the tune task's own, listing its one job with Ray's start time.
    record = run.xcom("tune", RECORD_KEY)
    [job] = record
    info = RayHook("ray_default").get_job_info(job)
    assert record[job] == info["start_time"] and job == run.xcom("tune")["job_id"]
    bucket, _, prefix = REGISTRY.removeprefix("s3://").partition("/")
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    assert not [o["Key"] for o in listed if o["Key"].endswith(("champion.json", "model.json"))]


@pytest.mark.timeout(300)
def test_a_job_a_trial_minted_under_the_next_tries_id_is_refused_by_the_retry():
    date = _date()
    name = experiment("aft_minted_in_trial", run_id_for(date))
    try:
        run = run_dag(load_dag("aft_minted_in_trial", FILE), logical_date=date)
        assert run.task_states() == {"tune": "failed"} and run.try_numbers() == {"tune": 2}
        first, retry = run.errors("tune")
        assert "this trial minted a job" in str(first), first
        # The retry found the live job the trial submitted as {name}-2, with the first job's metadata: refused.
        assert re.search(rf"Ray job {re.escape(name)}-2 is not believed: Airflow has no record", str(retry)), retry
        jobs = {j["submission_id"]: j["status"] for j in jobs_of(name)}
        assert set(jobs) == {f"{name}-1", f"{name}-2"} and jobs[f"{name}-2"] == "RUNNING", jobs
    finally:
        stop_live_jobs(name)
