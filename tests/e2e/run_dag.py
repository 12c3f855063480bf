"""Run one DAG of the e2e DAGs folder with ``dag.test()`` in a process of its own (for tests that kill it).

``python run_dag.py DAG_ID LOGICAL_DATE_ISO CONF_JSON [DAG_FILE]``: the run id is ``manual__<LOGICAL_DATE_ISO>`` every
time; DAG_FILE is a file of the e2e DAGs folder (airflow_cases.py when left out). Prints the run's state and task
states (``DAG_RUN_STATE``), then each task's return XCom (``DAG_RUN_XCOM``, one JSON object by task id).
Exits 0 when the DAG run succeeded, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.e2e.helpers import load_dag, run_dag  # noqa: E402


def main() -> int:
    dag_id, logical_date, conf = sys.argv[1], datetime.fromisoformat(sys.argv[2]), json.loads(sys.argv[3])
    dag_file = sys.argv[4] if len(sys.argv) > 4 else "airflow_cases.py"
    result = run_dag(load_dag(dag_id, dag_file), conf, logical_date)
    states = result.task_states()
    # One write per line: print() writes the text and its newline apart, and another process's log line (the task's
    # own, on the same pipe) can land between them.
    xcoms = json.dumps({task_id: result.xcom(task_id) for task_id in states}, default=str)
    sys.stdout.write(f"DAG_RUN_STATE {result.state} {json.dumps(states)}\nDAG_RUN_XCOM {xcoms}\n")
    sys.stdout.flush()
    return 0 if result.state == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
