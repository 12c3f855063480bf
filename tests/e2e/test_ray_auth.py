"""Ray's token auth is on in the suite's cluster, as Ray 2.59+ has by default: an unauthenticated client is refused,
the operator reaches the cluster with the token in the ray connection's password, and the token appears in no job's
metadata, entrypoint, runtime_env or log, nor in the XCom. (The one cluster without auth is in
tests/integration/test_local_stack.py.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone

import pytest

from airflow_tune.hooks.ray import RayHook
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag


@pytest.mark.timeout(240)
def test_the_operator_runs_against_a_token_cluster_and_the_token_goes_nowhere(stack):
    token = stack.auth_token
    assert token, "the suite's stack runs with Ray's token auth on"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{stack.dashboard_url}/api/jobs/", timeout=10)
    assert refused.value.code == 401

    date = datetime(2005, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    conf = {"space": {"x": {"grid_search": [1, 3]}, "steps": 1}, "scheduler": "fifo", "search": "random", "kwargs": {}}
    run = run_dag(load_dag("aft_conf_as_data", "hostile_confs.py"), conf, logical_date=date)
    assert run.state == "success", run.errors("tune")
    result = run.xcom("tune")
    [job] = jobs_of(experiment("aft_conf_as_data", run.run_id))
    hook = RayHook()
    seen = {
        "xcom": result,
        "job": job,
        "info": hook.get_job_info(job["submission_id"]),
        "logs": hook.get_job_logs(job["submission_id"]),
    }
    assert token not in json.dumps(seen, default=str)
    assert result["best_config"]["x"] == 3
