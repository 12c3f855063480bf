"""DAG-parse cost: importing our operators vs Airflow's BashOperator vs an operator module that imports ray at the top.

Each import runs in a fresh interpreter after ``import airflow.sdk`` (which every DAG file pays anyway); we report the
median extra time and memory over several runs. Modules are imported from bytecode, as from an installed wheel: a
first, uncounted run compiles into a cache folder of the benchmark's own (with ``PYTHONDONTWRITEBYTECODE`` set, as on
some machines, every run would otherwise compile our sources again and measure the compiler).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

PROBE = r"""
import json, resource, sys, time
import airflow.sdk
t0 = time.perf_counter(); r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
exec(sys.argv[1])
t1 = time.perf_counter(); r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
heavy = sorted(m for m in ("ray", "boto3", "botocore", "pyarrow") if m in sys.modules)
print(json.dumps({"seconds": t1 - t0, "mb": (r1 - r0) / 1024, "heavy": heavy}))
"""

CASES = {
    "BashOperator (baseline)": "from airflow.providers.standard.operators.bash import BashOperator",
    "airflow-tune operators, sensor, trigger": (
        "from airflow_tune.operators.tune import RayTuneOperator\n"
        "from airflow_tune.operators.promote import PromoteCheckpointOperator\n"
        "from airflow_tune.sensors.tune import RayTuneSensor\n"
        "from airflow_tune.triggers.tune import RayTuneTrigger"
    ),
    "an operator module importing ray.tune at the top": "from ray import tune\nimport ray.job_submission",
}


def measure(code: str, runs: int, env: dict[str, str]) -> dict[str, float | list[str]]:
    samples = []
    for _ in range(runs + 1):
        out = subprocess.run([sys.executable, "-c", PROBE, code], capture_output=True, text=True, check=True, env=env)
        samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
    samples = samples[1:]  # the first run compiled the bytecode
    return {
        "seconds": statistics.median(s["seconds"] for s in samples),
        "mb": statistics.median(s["mb"] for s in samples),
        "heavy": samples[0]["heavy"],
    }


def main(runs: int = 5) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(prefix="aft-pycache-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        results = {name: measure(code, runs, env) for name, code in CASES.items()}
    base = results["BashOperator (baseline)"]
    print(f"DAG-parse import cost on top of airflow.sdk (median of {runs} fresh interpreters)")
    for name, r in results.items():
        ratio = r["seconds"] / base["seconds"] if base["seconds"] else float("nan")
        heavy = ", ".join(r["heavy"]) or "none"
        print(
            f"  {name:<50} {r['seconds'] * 1000:7.0f} ms {r['mb']:6.0f} MB  x{ratio:5.1f} of baseline  heavy: {heavy}"
        )
    return results


if __name__ == "__main__":
    main()
