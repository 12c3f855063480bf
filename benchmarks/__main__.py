"""`make bench`: every benchmark in one run, on a fresh local stack that is stopped at the end.

``python -m benchmarks --quick`` (``make bench-quick``): the engine against plain Tune only, on a 4-trial grid and at
100 and 500 trivial trials, one pair each (about five minutes)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile

from benchmarks import (
    airflow_overhead,
    completion_latency,
    engine_scale,
    job_overhead,
    parse_cost,
    provenance_cost,
    trigger_poll,
    triggerer_scale,
)


def main() -> None:
    # A SIGTERM (Ctrl-C's sibling, a time-out) unwinds like Ctrl-C, so the stack is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    root = tempfile.mkdtemp(prefix="aft-bench-")
    os.environ["AIRFLOW_HOME"] = os.path.join(root, "airflow")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(airflow_overhead.DAGS)
    quick = "--quick" in sys.argv[1:]
    if not quick:
        parse_cost.main()
        print()
    from airflow_tune.local import LocalStack

    try:
        with LocalStack(root, airflow=not quick) as state:
            os.environ.update(state.env())
            if quick:
                job_overhead.main(state, repeats=1)
                print()
                engine_scale.main(state, sizes=(100, 500), pairs=1)
                return
            trigger_poll.main(state)
            print()
            triggerer_scale.main(state)
            print()
            completion_latency.main(state)
            print()
            job_overhead.main(state)
            print()
            airflow_overhead.main(state)
            print()
            engine_scale.main(state)
            print()
            provenance_cost.main(state)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
