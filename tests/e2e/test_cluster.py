"""The production shape on one machine: example DAGs and a lost node on a Ray cluster that shares nothing with Airflow
but the dashboard URL and S3.

The ``cluster`` fixture is a Ray head that offers no CPUs and two worker nodes of 1 CPU each, every node run by the
separate cluster virtualenv (Ray and scikit-learn; no Airflow, no airflow-tune, no moto) with its own temp dir, home,
working folder and ports, plus an S3 endpoint of its own. Airflow runs here, in the project's virtualenv, with
``dag.test()``; the engine reaches the cluster with each job. Trials that change node can only get their checkpoints
from S3, and the test trainable's markers are S3 objects too.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import manifest_uri
from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RESULT_KEYS
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag, run_id_for, stop_live_jobs, wait_for
from tests.support.cluster_venv import CLUSTER_PYTHON
from tests.support.head_loss import kill_head, lasting_thread, restart_exited_workers, saved_trials, start_new_head
from tests.support.mlflow_server import MlflowRest, tags

REPO = Path(__file__).resolve().parents[2]
# The retraining DAG promotes into MLflow's Model Registry (models:/digits): the cluster fixture adds a server.
CLUSTER_MLFLOW = True

PROBE = """\
import importlib.util, json, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def report():
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "python": sys.executable,
        "importable": [m for m in ("airflow", "airflow_tune", "moto", "tests") if importlib.util.find_spec(m)],
        "sklearn": importlib.util.find_spec("sklearn") is not None,
        "home": os.environ.get("HOME"),
        "tmpdir": os.environ.get("TMPDIR"),
        "cwd": os.getcwd(),
    }


ray.init()
probe = ray.remote(num_cpus=0)(report)
nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
found = ray.get(
    [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
)
print("PROBE " + json.dumps({"driver": report(), "nodes": found}))
"""


def _submit_probe(state: Any, folder: Path) -> dict:
    """Run PROBE as a Ray job (its own working_dir, nothing else shipped) and return what it found."""
    from ray.job_submission import JobSubmissionClient

    (folder / "probe.py").write_text(PROBE)
    client = JobSubmissionClient(state.dashboard_url, headers=state.auth_headers)
    job_id = client.submit_job(entrypoint="python probe.py", runtime_env={"working_dir": str(folder)})
    status = wait_for(
        lambda: (s := str(client.get_job_status(job_id)).split(".")[-1]) in ("SUCCEEDED", "FAILED", "STOPPED") and s,
        120,
        "the probe job",
    )
    logs = client.get_job_logs(job_id)
    assert status == "SUCCEEDED", logs[-3000:]
    [line] = [line for line in logs.splitlines() if line.startswith("PROBE ")]
    return json.loads(line[len("PROBE ") :])


def test_the_cluster_shares_nothing_with_the_airflow_side(cluster, tmp_path):
    state = cluster.state
    nodes = cluster.alive_nodes()
    assert set(nodes) == {state.head_node_id, *state.worker_node_ids} and len(nodes) == 3
    assert "CPU" not in nodes[state.head_node_id]["resources_total"], "no trial may run on the head"
    assert [nodes[n]["resources_total"]["CPU"] for n in state.worker_node_ids] == [1.0, 1.0]
    assert {n["node_ip"] for n in nodes.values()} == {"127.0.0.1"}
    # The hook reads the cluster's Ray version; it is the one this side runs, so submissions are allowed.
    assert RayHook().check_ray_version() == "2.60.0"

    found = _submit_probe(state, tmp_path)
    venv = str(CLUSTER_PYTHON.parent.parent)
    own_dirs = {state.head_node_id: state.ray_temp_dir}
    own_dirs.update(zip(state.worker_node_ids, state.worker_temp_dirs, strict=True))
    reports = {r["node_id"]: r for r in found["nodes"]}
    assert set(reports) == set(nodes)
    for report in [found["driver"], *found["nodes"]]:
        assert report["importable"] == [], f"Airflow's packages reached a Ray process: {report}"
        assert report["sklearn"] is True
        assert report["python"].startswith(venv + "/"), report
        # Each node's home and temp dir are its own, under its own Ray temp dir.
        own = own_dirs[report["node_id"]]
        assert report["home"].startswith(own + "/") and report["tmpdir"] == own, (report, own)
    assert found["driver"]["node_id"] == state.head_node_id
    assert len({r["home"] for r in found["nodes"]}) == 3

    # Each node's own processes: started in its own folder (not this checkout, which `python -m` would put on
    # sys.path), with the cluster's environment and none of this one (the raylet starts the node's workers).
    for pid, temp_dir in zip([state.ray_pid, *state.worker_pids], [*own_dirs.values()], strict=True):
        node = psutil.Process(pid)
        [raylet] = [p for p in node.children(recursive=True) if p.name() == "raylet"]
        assert node.cwd() == temp_dir and temp_dir in " ".join(raylet.cmdline())
        for proc in (node, raylet):
            env = proc.environ()
            assert env["HOME"] == f"{temp_dir}/home" and env["TMPDIR"] == temp_dir
            assert env["PATH"].split(os.pathsep)[0] == str(CLUSTER_PYTHON.parent)
            assert not [k for k in env if k.startswith(("AIRFLOW", "PYTHON", "PYTEST"))], sorted(env)


@pytest.mark.timeout(420)
def test_the_retraining_dag_runs_on_both_workers_of_the_cluster(cluster, monkeypatch):
    state = cluster.state
    # The example DAGs folder as a second DAG bundle beside the tests' (dag.test() serializes the DAG from a bundle).
    bundle = "airflow.dag_processing.bundles.local.LocalDagBundle"
    bundles = [
        {"name": "dags-folder", "classpath": bundle, "kwargs": {}},
        {"name": "examples", "classpath": bundle, "kwargs": {"path": str(REPO / "dags")}},
    ]
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
    monkeypatch.syspath_prepend(str(REPO / "dags"))
    monkeypatch.delenv("AIRFLOW_TUNE_REGISTRY_URI", raising=False)  # the DAGs' default: models:/digits
    examples = ("digits_common", "digits_retrain_weekly", "digits_deploy_on_promotion", "digits_tuning")
    for name in [m for m in sys.modules if m.split(".")[0] in examples]:
        monkeypatch.delitem(sys.modules, name)
    dag = importlib.import_module("digits_retrain_weekly").dag

    run = run_dag(dag)
    assert run.state == "success", (run.task_states(), run.errors("tune"), run.errors("promote"))
    assert run.try_numbers()["tune"] == 1
    result = run.xcom("tune")
    assert set(result) == set(RESULT_KEYS)
    assert (result["num_trials"], result["num_terminated"], result["num_errored"]) == (6, 6, 0)
    assert result["best_checkpoint_uri"].startswith(result["experiment_uri"] + "/")
    assert result["experiment_uri"].startswith(f"s3://{state.bucket}/")

    manifest = storage.read_json(manifest_uri(result["experiment_uri"], "result.json"))
    node_of = {trial["trial_id"]: trial["node_id"] for trial in manifest["trials"]}
    assert len(node_of) == 6
    # Two trials at a time on two 1-CPU workers: both workers ran trials, the head (no CPUs) none.
    assert set(node_of.values()) == set(state.worker_node_ids), (node_of, state.worker_node_ids)
    assert "node_id" not in result["best_metrics"]

    # Promoted into MLflow: version 1 of models:/digits, its source the MLflow Model around the best checkpoint, the
    # alias on it.
    decision = run.xcom("promote")
    assert decision["promoted"] is True and decision["version"] == "1", decision
    assert decision["model_uri"] == "models:/digits/1"
    assert decision["uri"] == f"{decision['mlflow_model_uri']}/checkpoint", "the version's own copy of the checkpoint"
    assert decision["mlflow_model"] == "pyfunc", decision
    rest = MlflowRest(str(state.mlflow_url))
    alias = rest.get("registered-models/alias", name="digits", alias="champion")["model_version"]
    assert alias["version"] == "1" and alias["source"] == decision["mlflow_model_uri"]
    assert "/mlflow-models/digits/versions/" in alias["source"]
    assert not alias["source"].startswith(result["experiment_uri"]), "never under the experiment's folder"
    # The trials were tracked on the same server (the examples track when the registry is MLflow's): a run per trial
    # under the DAG run's parent run, and the version names the best trial's run.
    tracking = result["mlflow"]
    assert tracking["best_run_id"] and alias["run_id"] == tracking["best_run_id"], (tracking, alias)
    runs = rest.runs(tracking["experiment_id"])
    trial_runs = [r for r in runs if tags(r).get("mlflow.parentRunId") == tracking["parent_run_id"]]
    assert len(trial_runs) == 6 and all(r["info"]["status"] == "FINISHED" for r in trial_runs), trial_runs
    deployed = run.xcom("deploy_and_smoke_test")
    assert deployed["version"] == decision["version"] and deployed["holdout_accuracy"] >= 0.8

    # The deploy DAG loads models:/digits@champion (verified, then by MLflow's pyfunc loader) and serves it.
    deploy = run_dag(importlib.import_module("digits_deploy_on_promotion").dag)
    assert deploy.state == "success", (deploy.task_states(), deploy.errors("deploy_champion"))
    served = deploy.xcom("deploy_champion")
    assert served["model_uri"] == "models:/digits@champion" and served["holdout_accuracy"] >= 0.8, served

    # The shipped smoke test loads only a copy verified against Airflow's record of the promotion (the promote task's
    # XCom): a loader swapped in the version's folder (by anyone who can write its storage) is refused, naming the
    # file, and never unpickled (MLflow's own load_model would run it).
    import pickle

    from airflow_tune.exceptions import PromotionError
    from airflow_tune.registries.s3 import s3_client, split_s3_uri

    marker = Path(state.root) / f"swapped-loader-ran-{uuid.uuid4().hex}"
    bucket, prefix = split_s3_uri(decision["mlflow_model_uri"])
    s3 = s3_client()
    key = f"{prefix}/python_model.pkl"
    written = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=pickle.dumps(_TouchOnUnpickle(marker)))
    smoke_test = dag.task_dict["deploy_and_smoke_test"].python_callable
    try:
        with pytest.raises(PromotionError, match=r"as Airflow recorded it \(changed: 'python_model.pkl'\)"):
            smoke_test(decision)
    finally:
        s3.put_object(Bucket=bucket, Key=key, Body=written)
    assert not marker.exists(), "the swapped loader ran"
    assert smoke_test(decision)["holdout_accuracy"] >= 0.8


class _TouchOnUnpickle:
    """Unpickling it creates ``marker``: what a swapped loader pickle would do with the deploy task's rights."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return (Path.touch, (self.marker,))


# -- losing a node -------------------------------------------------------------------------------------------------

LONG = 8
# Four trials, two at a time (one per worker). x=1 ends after 2 steps; the others run 8 steps of 1 s each, so there is
# a moment when one trial has finished and another runs with checkpoints behind it.
NODE_LOSS_SPACE = {"x": {"grid_search": [1, 2, 3, 4]}, "steps": {"1": 2, "2": LONG, "3": LONG, "4": LONG}, "sleep": 1.0}


def _marks(marker_uri: str) -> list[dict]:
    return sorted(
        (storage.read_json(uri) for uri in storage.list_files(marker_uri) if uri.endswith(".json")),
        key=lambda m: m["time"],
    )


def _running_with_checkpoints(marker_uri: str, progress_uri: str, at_least: int) -> dict | None:
    """A trial the driver knows at iteration >= ``at_least`` (so its checkpoint is registered) that has not ended,
    while some other trial has ended; with the node it runs on."""
    marks = _marks(marker_uri)
    ended = {m["x"] for m in marks if m["event"] == "end"}
    progress = storage.read_json_or_none(progress_uri)
    if not ended or progress is None:
        return None
    for trial in progress["running"]:
        x = trial["config"]["x"]
        if x in ended or (trial["iteration"] or 0) < at_least:
            continue
        [node_id] = {m["node_id"] for m in marks if m["x"] == x}
        return {"x": x, "iteration": trial["iteration"], "node_id": node_id, "ended": sorted(ended)}
    return None


@pytest.mark.timeout(360)
def test_a_worker_node_lost_mid_experiment_costs_one_try_nothing(cluster):
    state = cluster.state
    logical_date = datetime(2003, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    name = experiment("aft_cluster_node_loss", run_id_for(logical_date))
    marker_uri = f"s3://{state.bucket}/markers/{name}"
    progress_uri = manifest_uri(f"{state.storage_uri}/{name}", "progress.json")
    lost: dict[str, Any] = {}

    def lose_a_node() -> None:
        try:
            victim = wait_for(
                lambda: _running_with_checkpoints(marker_uri, progress_uri, at_least=2),
                150,
                "a finished trial and a running one with 2 checkpointed steps",
                interval=0.5,
            )
            index = state.worker_node_ids.index(victim["node_id"])
            lost.update(victim, index=index, temp_dir=state.worker_temp_dirs[index])
            lost["pids"] = cluster.kill_worker(index)
            lost["at"] = time.time()  # every process of the lost node is gone: later markers come from the other
        except BaseException as exc:  # reported by the test body
            lost["error"] = exc

    killer = threading.Thread(target=lose_a_node, daemon=True)
    killer.start()
    try:
        run = run_dag(
            load_dag("aft_cluster_node_loss", "cluster_cases.py"),
            {"space": {**NODE_LOSS_SPACE, "marker_uri": marker_uri}},
            logical_date,
        )
        killer.join(timeout=30)
        assert "error" not in lost, lost.get("error")
        assert lost.get("pids"), "the experiment ended before a node could be lost"
        # The node is gone, every process of it and its temp dir: nothing it wrote locally can reach the other node.
        assert not [p for p in lost["pids"] if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert not os.path.exists(lost["temp_dir"])

        # The Airflow task succeeded in its one try, with the whole XCom.
        assert run.state == "success", (run.task_states(), run.errors("tune"))
        assert run.try_numbers() == {"tune": 1} and run.errors("tune") == []
        result = run.xcom("tune")
        assert set(result) == set(RESULT_KEYS)
        # Every key is filled but the MLflow block (not tracked) and the Pareto front (one objective).
        unset = {"mlflow", "pareto_front", "pareto_front_size"}
        assert all(result[k] is not None for k in RESULT_KEYS if k not in unset), result
        assert result["mlflow"] is None  # not tracked
        assert (result["num_trials"], result["num_terminated"], result["num_errored"]) == (4, 4, 0)
        assert result["best_config"]["x"] == 3 and result["best_checkpoint_uri"].startswith(result["experiment_uri"])

        survivor = state.worker_node_ids[1 - lost["index"]]
        victim_x = lost["x"]
        marks = _marks(marker_uri)
        starts = Counter(m["x"] for m in marks if m["event"] == "start")
        resumes = [m for m in marks if m["event"] == "resume"]
        ends = Counter(m["x"] for m in marks if m["event"] == "end")
        # Counted from the markers: every trial started from scratch once and ended once; only the interrupted one
        # resumed, once, on the other node, from a checkpoint at least as new as the driver knew of (S3 alone holds
        # it: the lost node's temp dir is deleted, and the nodes share no folder).
        assert starts == {1: 1, 2: 1, 3: 1, 4: 1}, starts
        assert ends == {1: 1, 2: 1, 3: 1, 4: 1}, ends
        assert [(m["x"], m["node_id"]) for m in resumes] == [(victim_x, survivor)], resumes
        assert lost["iteration"] <= resumes[0]["step"] < LONG, (lost, resumes)
        # No finished trial ran again, and everything after the loss ran on the surviving node.
        after = [m for m in marks if m["time"] > lost["at"]]
        assert not [m for m in after if m["x"] in lost["ended"]], after
        assert {m["node_id"] for m in after} == {survivor}

        manifest = storage.read_json(manifest_uri(result["experiment_uri"], "result.json"))
        node_of = {t["config"]["x"]: t["node_id"] for t in manifest["trials"]}
        print(
            f"node loss: killed worker {lost['index']} ({len(lost['pids'])} processes) while x={victim_x} was at "
            f"iteration {lost['iteration']}; it resumed at step {resumes[0]['step']} on the other node "
            f"{resumes[0]['time'] - lost['at']:.1f}s later; the DAG run took {run.seconds:.0f}s"
        )
        assert node_of[victim_x] == survivor
        assert set(node_of.values()) <= set(state.worker_node_ids)
    finally:
        stop_live_jobs(name)
        if "pids" in lost:  # the module's cluster gets its two workers back
            cluster.start_worker(lost["index"])


# -- losing the head -----------------------------------------------------------------------------------------------

# Three trials on two workers: x=1 ends after 2 steps, x=2 and x=3 run 8 steps of 1 s each.
HEAD_LOSS_SPACE = {"x": {"grid_search": [1, 2, 3]}, "steps": {"1": 2, "2": LONG, "3": LONG}, "sleep": 1.0}


def _saved_with_one_done_one_running(experiment_uri: str, marker_uri: str, at_least: int) -> dict | None:
    """The moment to lose the head, as S3 holds it (all a new cluster gets): Tune's saved experiment state has a
    trial TERMINATED (its end marker written) and another RUNNING at iteration >= ``at_least`` that has not ended."""
    saved = saved_trials(experiment_uri)
    ended = {m["x"] for m in _marks(marker_uri) if m["event"] == "end"}
    done = sorted(x for x, (status, _) in saved.items() if status == "TERMINATED" and x in ended)
    running = [(x, i) for x, (status, i) in saved.items() if status == "RUNNING" and i >= at_least and x not in ended]
    if not done or not running:
        return None
    return {"ended": done, "x": running[0][0], "iteration": running[0][1]}


@pytest.mark.timeout(300)
def test_the_head_lost_mid_experiment_costs_one_try_and_the_next_restores_it_on_the_new_cluster(cluster):
    state = cluster.state
    logical_date = datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    name = experiment("aft_cluster_head_loss", run_id_for(logical_date))
    marker_uri = f"s3://{state.bucket}/markers/{name}"
    experiment_uri = f"{state.storage_uri}/{name}"
    old_nodes = {state.head_node_id, *state.worker_node_ids}
    lost: dict[str, Any] = {}

    def lose_the_head() -> None:
        lost.update(
            wait_for(
                lambda: _saved_with_one_done_one_running(experiment_uri, marker_uri, at_least=2),
                150,
                "a finished trial and a running one with 2 checkpointed steps in the saved experiment state",
                interval=0.5,
            )
        )
        [job] = jobs_of(name)
        lost["job_id"] = job["submission_id"]
        lost["pids"] = kill_head(cluster)
        lost["at"] = time.time()
        start_new_head(cluster)  # same GCS and dashboard address, as KubeRay recreates the head pod
        lost["head_up"] = time.time()
        lost["workers_gone"] = restart_exited_workers(cluster)
        lost["rejoined"] = time.time()

    # The new nodes must outlive this test (they are the module's cluster now), so the thread that starts them too.
    killer = lasting_thread().submit(lose_the_head)
    try:
        run = run_dag(
            load_dag("aft_cluster_head_loss", "cluster_cases.py"),
            {"space": {**HEAD_LOSS_SPACE, "marker_uri": marker_uri}},
            logical_date,
        )
        error = killer.exception(timeout=60)
        assert error is None, repr(error)
        assert lost.get("pids"), "the experiment ended before the head could be lost"
        assert not [p for p in lost["pids"] if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]

        # The first try saw its job's cluster go: a task failure naming the job, as soon as the new head answered.
        assert run.state == "success", (run.task_states(), run.errors("tune"))
        assert run.try_numbers() == {"tune": 2}
        [first_error] = run.errors("tune")
        assert isinstance(first_error, RayJobError), repr(first_error)
        assert f"lost track of Ray job {lost['job_id']}: job not found" in str(first_error), str(first_error)

        # The next try submitted a job to the new cluster (it knows no job of the old one), whose driver restored
        # the experiment from S3; it was submitted before the workers were back, and waited for them.
        [job] = jobs_of(name)
        assert job["status"] == "SUCCEEDED" and job["metadata"]["airflow_try_number"] == "2", job
        # The new head takes the job as soon as it answers, which can be before start_new_head has seen it answer
        # (it polls): so the guaranteed lower bound is the loss itself, not head_up.
        submitted = job["start_time"] / 1000
        assert lost["at"] < submitted < lost["head_up"] + 30, (lost, submitted)
        nodes = cluster.alive_nodes()
        assert set(nodes) == {state.head_node_id, *state.worker_node_ids} and not set(nodes) & old_nodes

        result = run.xcom("tune")
        assert set(result) == set(RESULT_KEYS)
        # Every key is filled but the MLflow block (not tracked) and the Pareto front (one objective).
        unset = {"mlflow", "pareto_front", "pareto_front_size"}
        assert all(result[k] is not None for k in RESULT_KEYS if k not in unset), result
        assert result["mlflow"] is None  # not tracked
        assert result["job_id"] == job["submission_id"]
        assert (result["num_trials"], result["num_terminated"], result["num_errored"]) == (3, 3, 0)
        assert result["best_config"]["x"] == 3 and result["best_checkpoint_uri"].startswith(experiment_uri + "/")

        marks = _marks(marker_uri)
        after = [m for m in marks if m["time"] > lost["at"]]
        ends = Counter(m["x"] for m in marks if m["event"] == "end")
        resumed = [m for m in after if m["event"] == "resume" and m["x"] == lost["x"]]
        # Every trial ended once; those that had ended before the loss never ran again; the interrupted one resumed
        # once, on a new worker node, from the checkpoint the saved state held (a report's checkpoint is registered
        # in the step after its result at the latest).
        assert ends == {1: 1, 2: 1, 3: 1}, ends
        assert not [m for m in after if m["x"] in lost["ended"]], after
        assert [m["node_id"] for m in resumed] in ([state.worker_node_ids[0]], [state.worker_node_ids[1]]), resumed
        assert max(1, lost["iteration"] - 1) <= resumed[0]["step"] < LONG, (lost, resumed)
        assert {m["node_id"] for m in after if m["event"] != "step"} <= set(state.worker_node_ids), after
        exits = ", ".join(f"{t - lost['at']:.0f}s" for t in lost["workers_gone"].values())
        print(
            f"head loss: killed the head ({len(lost['pids'])} processes) while x={lost['x']} was saved at iteration "
            f"{lost['iteration']}; new head up {lost['head_up'] - lost['at']:.1f}s later; the old workers exited "
            f"{exits} after the loss and "
            f"rejoined as new nodes {lost['rejoined'] - lost['at']:.0f}s after it; x={lost['x']} resumed at step "
            f"{resumed[0]['step']}; the DAG run took {run.seconds:.0f}s"
        )
    finally:
        stop_live_jobs(name)
