"""The engine's own tracking on a large experiment: N trivial trials through airflow-tune's engine (progress callback,
progress.json, manifests) vs the same experiment as a plain Tune driver script, both as Ray jobs on the same head,
in interleaved pairs; and the sizes of the manifests the Airflow side reads at that size.

Each run writes to a bucket of its own and the order alternates pair by pair (plain first, then ours first): an S3
endpoint that slows as a bucket fills (the local one lists every key of a bucket) would otherwise favour whichever
half runs first. Both halves reuse actors: otherwise each trivial trial starts a Python worker (about 3 s on 2
cores), and the run measures process start-up rather than the driver-side tracking this benchmark is about."""

from __future__ import annotations

import statistics
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.engine_jobs import TESTKIT, submit

PLAIN_DRIVER = textwrap.dedent(
    """
    from ray import tune
    from tune_testkit.functions import return_dict
    tuner = tune.Tuner(
        return_dict,
        param_space={{"x": tune.uniform(0, 4)}},
        tune_config=tune.TuneConfig(metric="score", mode="max", num_samples={trials}, reuse_actors=True),
        run_config=tune.RunConfig(name={name!r}, storage_path={storage!r}, verbose=0),
    )
    print("best", tuner.fit().get_best_result().config)
    """
)


def _run(entrypoint: str, name: str, runtime_env: dict[str, Any]) -> float:
    from airflow_tune.hooks.ray import RayHook

    start = time.perf_counter()
    RayHook().submit_job(entrypoint=entrypoint, submission_id=name, runtime_env=runtime_env)
    return _wait(name, start)


def _wait(name: str, start: float, timeout: float = 3600) -> float:
    from airflow_tune.hooks.ray import RayHook

    hook = RayHook()
    while (status := hook.get_job_status(name)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.perf_counter() - start > timeout:
            hook.stop_job(name)
            raise RuntimeError(f"benchmark job {name} took over {timeout:.0f}s")
        time.sleep(0.5)
    if status != "SUCCEEDED":
        raise RuntimeError(f"benchmark job {name} {status}:\n{hook.get_job_logs(name)[-2000:]}")
    return time.perf_counter() - start


def fresh_storage(name: str) -> str:
    """A new bucket on the stack's S3 endpoint for one run, as an experiments folder URI."""
    import boto3

    bucket = name.lower()
    boto3.client("s3").create_bucket(Bucket=bucket)  # endpoint and keys from the stack's env
    return f"s3://{bucket}/experiments"


def run_ours(state: Any, trials: int) -> tuple[float, str]:
    name = f"bench-scale-ours-{uuid.uuid4().hex[:8]}"
    spec = {
        "trainable": "tune_testkit.functions:return_dict",
        "name": name,
        "storage_path": fresh_storage(name),
        "metric": "score",
        "mode": "max",
        "param_space": {"x": {"uniform": [0, 4]}},
        "num_samples": trials,
        "reuse_actors": True,
    }
    start = time.perf_counter()
    job_id, experiment_uri = submit(state, spec)
    return _wait(job_id, start), experiment_uri


def run_plain(state: Any, trials: int) -> float:
    name = f"bench-scale-plain-{uuid.uuid4().hex[:8]}"
    folder = Path(state.root) / "drivers" / name
    folder.mkdir(parents=True)
    storage = fresh_storage(name)
    (folder / "driver.py").write_text(PLAIN_DRIVER.format(name=name, storage=storage, trials=trials))
    return _run("python driver.py", name, {"working_dir": str(folder), "py_modules": [str(TESTKIT)]})


def main(stack_state: Any = None, trials: int = 2000, pairs: int = 2) -> dict[str, Any]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    from airflow_tune.common import storage
    from airflow_tune.common.contract import PROGRESS_FILE, RESULT_FILE, TRIALS_FILE, manifest_uri

    ratios, ours_s, plain_s = [], [], []
    experiment_uri = ""
    for pair in range(1, pairs + 1):  # interleaved, in turn first: drift on the machine hits both alike
        if pair % 2:
            plain = run_plain(stack_state, trials)
            ours, experiment_uri = run_ours(stack_state, trials)
        else:
            ours, experiment_uri = run_ours(stack_state, trials)
            plain = run_plain(stack_state, trials)
        plain_s.append(plain)
        ours_s.append(ours)
        ratios.append(plain / ours)
        print(
            f"  pair {pair}/{pairs}: plain {plain:.1f} s, ours {ours:.1f} s, baseline/ours {plain / ours:.2f}",
            flush=True,
        )
    sizes = {
        name: len(storage.read_bytes(manifest_uri(experiment_uri, name)))
        for name in (PROGRESS_FILE, RESULT_FILE, TRIALS_FILE)
    }
    result = {
        "trials": trials,
        "plain_s": statistics.median(plain_s),
        "ours_s": statistics.median(ours_s),
        "throughput_ratio": statistics.median(ratios),
        "sizes": sizes,
    }
    print(f"{trials} trivial trials, S3 storage, real Ray head ({pairs} pairs in alternating order, medians)")
    print(f"  plain Tune driver script (baseline)   {result['plain_s']:7.1f} s")
    print(
        f"  airflow-tune engine as a Ray job      {result['ours_s']:7.1f} s   "
        f"baseline/ours wall time {result['throughput_ratio']:.2f} (1.00 = no overhead)"
    )
    print(
        f"  manifests at {trials} trials: progress.json {sizes[PROGRESS_FILE] / 1024:.1f} KB, result.json (read by "
        f"Airflow) {sizes[RESULT_FILE] / 1024:.1f} KB, trials.json {sizes[TRIALS_FILE] / 1024:.0f} KB"
    )
    return result
