"""``python -m airflow_tune.local up|down|env|status [--root DIR]``: the local stack from a shell.

``up`` starts the stack and returns; ``eval "$(python -m airflow_tune.local env)"`` points a shell at it
(Ray Jobs, S3, an AIRFLOW_HOME with a ``ray_default`` connection, and the DAGs folder that ``dag.test()`` runs DAG
files from: ``--dags-folder``, by default ``./dags`` when it exists, else the current folder); ``down`` stops exactly
what ``up`` started.
``up --workers 2 --cluster-python .cluster-venv/bin/python`` starts the production shape instead: a head with no
CPUs and two worker nodes, all run by the separate cluster virtualenv (``make cluster-venv``).
``up --mlflow-python .mlflow-venv/bin/python`` also starts an MLflow tracking server from its own virtualenv
(``make mlflow-venv``); ``env`` then sets ``MLFLOW_TRACKING_URI`` and the ``mlflow_default`` connection.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from airflow_tune.local.processes import StackError
from airflow_tune.local.stack import LocalStack
from airflow_tune.local.state import load_state, stop_from_state

DEFAULT_ROOT = ".stack"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_tune.local", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "env", "status"])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="folder for the stack's state (default: .stack)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the Ray head (default 2; 0 with workers)")
    parser.add_argument("--workers", type=int, default=0, help="Ray worker nodes joined to the head (default none)")
    parser.add_argument("--worker-cpus", type=int, default=1, help="CPUs of each worker node")
    parser.add_argument(
        "--cluster-python",
        default=None,
        help="run every Ray node with this Python, from a separate cluster virtualenv (make cluster-venv)",
    )
    parser.add_argument(
        "--mlflow-python",
        default=None,
        help="also run an MLflow tracking server, with this Python from its own virtualenv (make mlflow-venv)",
    )
    parser.add_argument(
        "--dags-folder",
        help="env: the folder of your DAG files; dag.test() runs only DAGs inside the DAGs folder "
        "(default: ./dags if it exists, else the current folder)",
    )
    args = parser.parse_args(argv)

    if args.command == "up":
        if load_state(args.root) is not None:
            print(f"a stack is already up under {args.root}; run 'down' first", file=sys.stderr)
            return 1
        num_cpus = args.num_cpus if args.num_cpus is not None else (0 if args.workers else 2)
        stack = LocalStack(
            args.root,
            num_cpus=num_cpus,
            outlive_owner=True,
            workers=args.workers,
            worker_cpus=args.worker_cpus,
            cluster_python=args.cluster_python,
            mlflow_python=args.mlflow_python,
        )
        try:
            state = stack.start()
        except StackError as exc:
            print(f"could not start the local stack: {exc}", file=sys.stderr)
            return 1
        print(f"Ray dashboard: {state.dashboard_url}")
        if state.worker_node_ids:
            print(f"Ray nodes:     head {state.head_node_id} (no trials), workers {', '.join(state.worker_node_ids)}")
        print(f"S3 endpoint:   {state.s3_endpoint} (bucket {state.bucket})")
        if state.mlflow_url:
            print(f"MLflow:        {state.mlflow_url} (artifacts in {state.mlflow_artifacts_uri})")
        print(f"AIRFLOW_HOME:  {state.airflow_home}")
        print(f'Use it from a shell: eval "$(python -m airflow_tune.local env --root {args.root})"')
        return 0
    if args.command == "down":
        stopped = stop_from_state(args.root)
        print(f"stopped {len(stopped)} processes" if stopped else "no stack was up")
        return 0
    current = load_state(args.root)
    if current is None:
        print(f"no stack is up under {args.root}", file=sys.stderr)
        return 1
    if args.command == "env":
        dags_folder = args.dags_folder or ("dags" if os.path.isdir("dags") else ".")
        # dag.test() syncs the DAGs folder to the database and refuses a DAG that is not in it.
        env = {**current.env(), "AIRFLOW__CORE__DAGS_FOLDER": os.path.abspath(dags_folder)}
        for key, value in env.items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    print(f"Ray dashboard {current.dashboard_url} (pid {current.ray_pid})")
    for index, (pid, node_id) in enumerate(zip(current.worker_pids, current.worker_node_ids, strict=True)):
        print(f"Ray worker {index}  node {node_id} (pid {pid})")
    print(f"S3 endpoint   {current.s3_endpoint} (pid {current.s3_pid})")
    if current.mlflow_url:
        print(f"MLflow        {current.mlflow_url} (pid {current.mlflow_pid})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
