"""`make demo`: the weekly retraining DAG end to end on a local Ray head, S3 endpoint and MLflow server, twice.

Run 1 tunes, promotes the winner into MLflow's Model Registry (no champion yet: version 1, alias ``champion``) and
deploys it; run 2 tunes again, warm-started from the champion's config, and the gate decides whether the new winner
beats it. At the end it prints the model's versions and the alias as MLflow has them, and serves the champion with
MLflow's own scoring server (``mlflow models serve``) from a copy ``download_model`` verified, asking it for three
predictions. Everything started here is
stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The MLflow server's own virtualenv (make demo builds it: make mlflow-venv).
MLFLOW_PYTHON = Path(os.environ.get("AIRFLOW_TUNE_MLFLOW_PYTHON", REPO / ".mlflow-venv" / "bin" / "python"))
DAGS = REPO / "dags"
STATE = Path(os.environ.get("AIRFLOW_TUNE_DEMO_DIR", REPO / ".stack" / "demo"))


def follow(log_path: Path, stop: threading.Event, out) -> None:
    """Show the live trial counts and trial errors from the Airflow log as they arrive."""
    with open(log_path, errors="replace") as fh:
        while True:
            line = fh.readline()
            if not line:
                if stop.is_set():
                    return
                time.sleep(0.2)
                continue
            if "[airflow-tune]" not in line:
                continue
            text = line[line.index("[airflow-tune]") + len("[airflow-tune] ") :].split(" [airflow")[0].rstrip()
            if text.startswith("result "):
                continue
            if " trials: " in text or " errored: " in text or text.startswith(("started", "restored")):
                print("   " + text, file=out, flush=True)


def print_checkpoint_keys(result: dict) -> None:
    """The S3 keys the experiment's checkpoints landed at (Tune keeps the best per trial, see num_to_keep)."""
    from airflow_tune.common import storage

    keys = [uri for uri in storage.list_files(result["experiment_uri"]) if "/checkpoint_" in uri]
    folders = sorted({uri.rsplit("/", 1)[0] for uri in keys})
    print(f"   checkpoints in S3: {len(folders)} folders, {len(keys)} objects, e.g.")
    for uri in keys[:3]:
        print(f"     {uri.removeprefix(result['experiment_uri'] + '/')}")


def print_trials(result: dict) -> None:
    from airflow_tune.common import storage
    from airflow_tune.common.contract import TRIALS_FILE, manifest_uri

    manifest = storage.read_json_or_none(manifest_uri(result["experiment_uri"], TRIALS_FILE)) or {}
    metric = result["metric"]
    trials = sorted(
        manifest.get("trials", []),
        key=lambda t: (
            -(t["metrics"].get(metric) or 0.0) if result["mode"] == "max" else (t["metrics"].get(metric) or 0.0)
        ),
    )
    print(f"   {'trial':<14}{'epochs':>7}{metric:>14}  config")
    for t in trials:
        config = {k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in t["config"].items()}
        value = t["metrics"].get(metric)
        shown = f"{value:.4f}" if isinstance(value, (int, float)) else "-"
        print(f"   {t['trial_id']:<14}{t['metrics'].get('training_iteration', '-'):>7}{shown:>14}  {config}")


def print_registry(registry_uri: str) -> None:
    """The registered model's versions and its champion alias, as the MLflow server has them."""
    from airflow_tune.hooks.mlflow import MLflowHook

    name = registry_uri.removeprefix("models:/")
    hook = MLflowHook()
    with hook.client() as client:
        versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))
        champion = client.get_model_version_by_alias(name, "champion")
    print(f"   MLflow model {name!r} at {hook.tracking_uri}: {len(versions)} version(s)")
    for v in versions:
        tags = v.tags or {}
        mark = "  <- champion" if v.version == champion.version else ""
        print(
            f"     version {v.version} {v.status}: {tags.get('airflow_tune.metric')}={tags.get('airflow_tune.value')} "
            f"trial {tags.get('airflow_tune.trial_id')}{mark}"
        )
    print(f"   alias champion -> version {champion.version} (models:/{name}@champion)")
    print(f"     source {champion.source}")
    if champion.run_id:
        print(f"     from the best trial's MLflow run {champion.run_id}")
    print(f"     {hook.model_version_url(name, champion.version)}")


def serve_champion(logs: Path, promotion: dict) -> None:
    """MLflow's own scoring server on the champion (from the MLflow virtualenv, where airflow-tune is not installed),
    asked for the digits of three held-out images over /invocations. It serves a copy ``download_model`` verified:
    ``mlflow models serve -m models:/digits@champion`` would run whatever loader the version's files hold."""
    sys.path.insert(0, str(DAGS))
    from digits_tuning.data import splits

    from airflow_tune.checkpoints import download_model
    from airflow_tune.local.serving import invocations, served_model

    x_test, y_test = splits()["test"]
    shutil.rmtree(STATE / "champion-model", ignore_errors=True)
    # Verified against Airflow's record of the champion's promotion (its promote task's XCom, read from Airflow).
    folder = download_model("models:/digits", str(STATE / "champion-model"), promotion=promotion)
    print(f"   models:/digits/{promotion['version']} (the champion) verified into {folder}")
    started = time.monotonic()
    with served_model(MLFLOW_PYTHON, folder, logs) as url:
        answer = invocations(url, {"inputs": x_test[:3].tolist()})
        print(f"   {url}/invocations answered in {time.monotonic() - started:.0f}s (start included)")
    print(f"   predictions {answer['predictions']} for held-out digits {[int(y) for y in y_test[:3]]}")


def run_dag(dag, log_path: Path) -> dict:
    stop = threading.Event()
    log_path.write_text("")
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved_out), "w")
    watcher = threading.Thread(target=follow, args=(log_path, stop, terminal), daemon=True)
    watcher.start()
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            run = dag.test()
        finally:
            sys.stdout.flush()
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
    stop.set()
    watcher.join()
    terminal.close()
    results = {}
    for ti in run.get_task_instances():
        results[ti.task_id] = (str(ti.state), ti.xcom_pull(task_ids=ti.task_id))
    return {"state": str(run.state), "tasks": results}


def main() -> int:
    # A SIGTERM (Ctrl-C's sibling, a time-out) unwinds like Ctrl-C, so the stack is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    STATE.mkdir(parents=True, exist_ok=True)
    os.environ["AIRFLOW_HOME"] = str(STATE / "airflow")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
    sys.path.insert(0, str(DAGS))

    from airflow_tune.local import LocalStack

    if not MLFLOW_PYTHON.exists():
        print(f"no MLflow virtualenv at {MLFLOW_PYTHON.parent.parent}: run `make mlflow-venv` (make demo does)")
        return 1
    # The S3 endpoint keeps nothing between demos, so neither may the MLflow store: its versions would name
    # checkpoints that are gone.
    shutil.rmtree(STATE / "mlflow", ignore_errors=True)
    print("== Starting a local Ray head, S3 endpoint and MLflow server on 127.0.0.1")
    stack = LocalStack(STATE, num_cpus=2, mlflow_python=MLFLOW_PYTHON)
    started = time.monotonic()
    try:
        state = stack.start()
        os.environ.update(state.env())
        os.environ["AIRFLOW_TUNE_REGISTRY_URI"] = "models:/digits"
        print(f"   Ray dashboard {state.dashboard_url}   S3 {state.s3_endpoint} (bucket {state.bucket})")
        print(f"   MLflow {state.mlflow_url} (the model registry: models:/digits)")

        import importlib

        dag = importlib.import_module("digits_retrain_weekly").dag
        log_path = STATE / "logs" / "airflow-dag-runs.log"
        summaries = []
        for n in (1, 2):
            print(f"\n== Run {n}: {dag.dag_id} (tune -> promote -> deploy)")
            outcome = run_dag(dag, log_path)
            summaries.append(outcome)
            tasks = outcome["tasks"]
            tune_state, result = tasks.get("tune", (None, None))
            if not result:
                print(f"   tuning did not finish ({tune_state}); the Airflow log is at {log_path}")
                return 1
            print_trials(result)
            print(
                f"   winner: trial {result['best_trial_id']} val_accuracy="
                f"{result['best_metrics'].get('val_accuracy'):.4f} config={result['best_config']}"
            )
            counts = f"{result['num_terminated']} finished, {result['num_errored']} errored"
            print(f"   trials: {result['num_trials']} ({counts})")
            print(f"   best checkpoint: {result['best_checkpoint_uri']}")
            tracking = result.get("mlflow")
            if tracking:
                print(
                    f"   tracked in MLflow: experiment {tracking['experiment_id']}, parent run "
                    f"{tracking['parent_run_id']}, best trial's run {tracking['best_run_id']}"
                )
            print_checkpoint_keys(result)
            _, decision = tasks.get("promote", (None, None))
            if decision:
                verdict = f"promoted as version {decision['version']}" if decision["promoted"] else "not promoted"
                print(f"   promotion: {verdict} ({decision['reason']})")
            deploy_state, deployed = tasks.get("deploy_and_smoke_test", (None, None))
            if deployed:
                print(f"   deployed model's held-out accuracy: {deployed['holdout_accuracy']:.4f}")
            else:
                print(f"   deploy: {deploy_state} (nothing new to deploy)")
            if outcome["state"] != "success":
                print(f"   the DAG run ended {outcome['state']}; the Airflow log is at {log_path}")
                return 1
        print("\n== The model registry (MLflow)")
        print_registry(os.environ["AIRFLOW_TUNE_REGISTRY_URI"])
        print("\n== Served by MLflow: download_model, then mlflow models serve -m <that folder> --env-manager local")
        promoted = [d for d in (o["tasks"].get("promote", (None, None))[1] for o in summaries) if d and d["promoted"]]
        serve_champion(STATE / "logs", promoted[-1])
        print(f"\n== Done in {time.monotonic() - started:.0f}s")
        return 0
    finally:
        stopped = stack.stop()
        print(f"== Stopped the local stack ({len(stopped)} processes)")


if __name__ == "__main__":
    sys.exit(main())
