"""Wall time of the same small experiment through airflow-tune's engine (spec validation, progress tracking,
``progress.json`` and the result manifest on S3) vs a plain Tune driver script (the baseline), both submitted as Ray
jobs through the Jobs API to the same head, interleaved.
"""

from __future__ import annotations

import json
import statistics
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TESTKIT = REPO / "tests" / "support"

PLAIN_DRIVER = textwrap.dedent(
    """
    from ray import tune
    from tune_testkit.functions import quadratic
    tuner = tune.Tuner(
        quadratic,
        param_space={{"x": tune.grid_search([1, 2, 3, 4]), "steps": 5}},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name={name!r}, storage_path={storage!r}, verbose=0),
    )
    best = tuner.fit().get_best_result()
    print("best", best.config)
    """
)


def _spec(name: str, storage: str) -> dict[str, Any]:
    return {
        "trainable": "tune_testkit.functions:quadratic",
        "name": name,
        "storage_path": storage,
        "metric": "loss",
        "mode": "min",
        "param_space": {"x": {"grid_search": [1, 2, 3, 4]}, "steps": 5},
        "progress_interval_s": 1.0,
    }


def _run_job(entrypoint: str, name: str, runtime_env: dict[str, Any]) -> float:
    from airflow_tune.hooks.ray import RayHook

    hook = RayHook()
    start = time.perf_counter()
    job_id = hook.submit_job(entrypoint=entrypoint, submission_id=name, runtime_env=runtime_env)
    while (status := hook.get_job_status(job_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        time.sleep(0.1)
    elapsed = time.perf_counter() - start
    if status != "SUCCEEDED":
        raise RuntimeError(f"benchmark job {job_id} {status}:\n{hook.get_job_logs(job_id)[-2000:]}")
    return elapsed


def run_ours(state: Any) -> float:
    from airflow_tune.common.contract import ENGINE_ENTRYPOINT
    from airflow_tune.operators.tune import engine_package_dir

    name = f"bench-ours-{uuid.uuid4().hex[:8]}"
    env = {"py_modules": [engine_package_dir(), str(TESTKIT / "tune_testkit")]}
    return _run_job(
        ENGINE_ENTRYPOINT, name, {**env, "env_vars": {"AIRFLOW_TUNE_SPEC": json.dumps(_spec(name, state.storage_uri))}}
    )


def run_plain(state: Any) -> float:
    name = f"bench-plain-{uuid.uuid4().hex[:8]}"
    folder = Path(state.root) / "drivers" / name
    folder.mkdir(parents=True)
    (folder / "driver.py").write_text(PLAIN_DRIVER.format(name=name, storage=state.storage_uri))
    return _run_job(
        "python driver.py", name, {"working_dir": str(folder), "py_modules": [str(TESTKIT / "tune_testkit")]}
    )


def main(stack_state: Any = None, repeats: int = 3) -> dict[str, float]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    ours, plain = [], []
    for _ in range(repeats):  # interleaved, so drift on the machine hits both alike
        plain.append(run_plain(stack_state))
        ours.append(run_ours(stack_state))
    result = {"plain_s": statistics.median(plain), "ours_s": statistics.median(ours)}
    result["ratio"] = result["ours_s"] / result["plain_s"]
    print(f"4-trial grid experiment, S3 storage, real Ray head (median of {repeats}, interleaved)")
    print(f"  plain Tune driver script (baseline)         {result['plain_s']:6.1f} s")
    print(
        f"  airflow-tune engine as a Ray job            {result['ours_s']:6.1f} s   x{result['ratio']:.2f} of baseline"
    )
    return result
