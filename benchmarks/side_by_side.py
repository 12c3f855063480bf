"""One experiment run twice on one stack: as a plain Tune driver script (the baseline a user would otherwise submit)
and through airflow-tune's engine, both as Ray jobs on the same head, each writing to a bucket of its own (an S3
endpoint that slows as a bucket fills would otherwise favour whichever half runs first).

Besides the wall time from submission to the job's end, each run reports the CPU seconds its driver spent and those
its trials' worker processes spent (sampled from the processes, every half second: a figure that holds on a busy
machine, where wall times do not). Used by ``make bench`` (:mod:`benchmarks.engine_scale`,
:mod:`benchmarks.job_overhead`) and by the guard in ``make test`` (``tests/integration/test_engine_speed.py``).
"""

from __future__ import annotations

import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.engine_jobs import TESTKIT, submit

#: A trivial trial: one result, no sleep (what the engine's per-trial cost is measured with).
TRIVIAL = {
    "trainable": "tune_testkit.functions:return_dict",
    "metric": "score",
    "mode": "max",
    "param_space": {"x": {"uniform": [0, 4]}},
    "reuse_actors": True,
}
#: A short grid: four trials of five steps (what a user's first experiment looks like).
GRID = {
    "trainable": "tune_testkit.functions:quadratic",
    "metric": "loss",
    "mode": "min",
    "param_space": {"x": {"grid_search": [1, 2, 3, 4]}, "steps": 5},
}

PLAIN_DRIVER = textwrap.dedent(
    """
    from ray import tune
    from tune_testkit.functions import {function}
    tuner = tune.Tuner(
        {function},
        param_space={param_space},
        tune_config=tune.TuneConfig(metric={metric!r}, mode={mode!r}, num_samples={trials}, reuse_actors={reuse}),
        run_config=tune.RunConfig(name={name!r}, storage_path={storage!r}, verbose=0),
    )
    print("best", tuner.fit().get_best_result().config)
    """
)


@dataclass
class Run:
    """One job's figures."""

    wall_s: float
    driver_cpu_s: float
    trials_cpu_s: float
    experiment_uri: str
    job_id: str
    logs: str = field(repr=False, default="")


def fresh_storage(name: str) -> str:
    """A new bucket on the stack's S3 endpoint for one run, as an experiments folder URI."""
    import boto3

    bucket = name.lower()
    boto3.client("s3").create_bucket(Bucket=bucket)  # endpoint and keys from the stack's env
    return f"s3://{bucket}/experiments"


def _plain_space(space: dict[str, Any]) -> str:
    def one(value: Any) -> str:
        if isinstance(value, dict) and "uniform" in value:
            low, high = value["uniform"]
            return f"tune.uniform({low!r}, {high!r})"
        if isinstance(value, dict) and "grid_search" in value:
            return f"tune.grid_search({value['grid_search']!r})"
        return repr(value)

    return "{" + ", ".join(f"{k!r}: {one(v)}" for k, v in space.items()) + "}"


class CpuSampler:
    """CPU seconds of a job's driver and of the trial workers (Ray's ``ray::<trainable>`` processes) while it runs."""

    def __init__(self, job_id: str, worker_title: str) -> None:
        self.job_id = job_id
        self.worker_title = worker_title
        self._driver = 0.0
        self._workers: dict[int, tuple[float, float]] = {}  # pid: (first seen, last seen) CPU seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._seed()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def driver_s(self) -> float:
        return self._driver

    @property
    def workers_s(self) -> float:
        return sum(last - first for first, last in self._workers.values())

    def _seed(self) -> None:
        # Workers idle from an earlier run count from here on.
        for pid, spent in self._worker_times().items():
            self._workers[pid] = (spent, spent)

    def _worker_times(self) -> dict[int, float]:
        import psutil

        out = {}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info.get("cmdline") or []
            if cmd and cmd[0].startswith("ray::") and (self.worker_title in cmd[0] or "ImplicitFunc" in cmd[0]):
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                out[proc.info["pid"]] = times.user + times.system
        return out

    def _loop(self) -> None:
        import psutil

        from airflow_tune.hooks.ray import RayHook

        hook, driver = RayHook(), None
        while not self._stop.wait(0.5):
            if driver is None:
                try:
                    info = hook.get_conn().get_job_info(self.job_id)  # Ray's job details as JSON: the driver's pid
                    pid = (info.get("driver_info") or {}).get("pid")
                    driver = psutil.Process(int(pid)) if pid else None
                except Exception:
                    driver = None
            if driver is not None:
                try:
                    times = driver.cpu_times()
                    self._driver = times.user + times.system
                except psutil.Error:
                    pass  # ended: the last sample stands
            for pid, spent in self._worker_times().items():
                first, _ = self._workers.get(pid, (0.0, 0.0))
                self._workers[pid] = (first, spent)


def _wait(job_id: str, start: float, timeout: float) -> tuple[float, str]:
    from airflow_tune.hooks.ray import RayHook

    hook = RayHook()
    while (status := hook.get_job_status(job_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.perf_counter() - start > timeout:
            hook.stop_job(job_id)
            raise RuntimeError(f"benchmark job {job_id} took over {timeout:.0f}s")
        time.sleep(0.1)
    elapsed = time.perf_counter() - start
    logs = hook.get_job_logs(job_id)
    if status != "SUCCEEDED":
        raise RuntimeError(f"benchmark job {job_id} {status}:\n{logs[-3000:]}")
    return elapsed, logs


def run_plain(state: Any, experiment: dict[str, Any], trials: int = 1, timeout: float = 3600) -> Run:
    """``experiment`` (:data:`TRIVIAL` or :data:`GRID`) as a plain Tune driver script."""
    from airflow_tune.hooks.ray import RayHook

    name = f"bench-plain-{uuid.uuid4().hex[:8]}"
    folder = Path(state.root) / "drivers" / name
    folder.mkdir(parents=True)
    storage = fresh_storage(name)
    function = experiment["trainable"].rsplit(":", 1)[1]
    (folder / "driver.py").write_text(
        PLAIN_DRIVER.format(
            function=function,
            param_space=_plain_space(experiment["param_space"]),
            metric=experiment["metric"],
            mode=experiment["mode"],
            trials=trials,
            reuse=bool(experiment.get("reuse_actors", False)),
            name=name,
            storage=storage,
        )
    )
    with CpuSampler(name, function) as cpu:
        start = time.perf_counter()
        RayHook().submit_job(
            entrypoint="python driver.py",
            submission_id=name,
            runtime_env={"working_dir": str(folder), "py_modules": [str(TESTKIT)]},
        )
        wall, logs = _wait(name, start, timeout)
    return Run(wall, cpu.driver_s, cpu.workers_s, f"{storage}/{name}", name, logs)


def run_ours(state: Any, experiment: dict[str, Any], trials: int = 1, timeout: float = 3600) -> Run:
    """``experiment`` through the engine, submitted as the operator submits it."""
    name = f"bench-ours-{uuid.uuid4().hex[:8]}"
    spec = {**experiment, "name": name, "storage_path": fresh_storage(name), "num_samples": trials}
    function = experiment["trainable"].rsplit(":", 1)[1]
    with CpuSampler(name, function) as cpu:
        start = time.perf_counter()
        job_id, experiment_uri = submit(state, spec)
        wall, logs = _wait(job_id, start, timeout)
    return Run(wall, cpu.driver_s, cpu.workers_s, experiment_uri, job_id, logs)


def pair(state: Any, experiment: dict[str, Any], trials: int, *, ours_first: bool) -> tuple[Run, Run]:
    """(plain, ours), run one after the other in the order given."""
    if ours_first:
        ours = run_ours(state, experiment, trials)
        return run_plain(state, experiment, trials), ours
    plain = run_plain(state, experiment, trials)
    return plain, run_ours(state, experiment, trials)
