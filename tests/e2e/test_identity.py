"""One name, one experiment, one owner: another DAG that reaches an experiment through a templated name is refused on
every path (a live job, a finished result), naming the experiment and its owner only; the owner's own task reusing
the name with another spec is refused naming what differs, and with the same spec gets its result; two tries that
submit at the same moment make one Ray job."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.exceptions import ExperimentConflictError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RayTuneOperator
from tests.e2e.helpers import jobs_of, load_dag, run_dag, stop_live_jobs, wait_for

pytestmark = pytest.mark.usefixtures("stack")
FILE = "identity_cases.py"


def _date() -> datetime:
    return datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _space(xs: list[int], marker_dir: str, sleep: float = 0.0) -> dict[str, Any]:
    return {"x": {"grid_search": xs}, "steps": 3, "sleep": sleep, "marker_dir": marker_dir}


@pytest.mark.timeout(300)
def test_a_name_reused_by_another_dag_is_refused_naming_the_owner_only_and_by_its_own_task_as_its_spec_says(tmp_path):
    name = f"shared-name-{uuid.uuid4().hex[:8]}"
    space_a = _space([1, 2], str(tmp_path), sleep=1.5)
    space_b = _space([3, 4], str(tmp_path), sleep=1.5)
    try:
        submitted = run_dag(load_dag("aft_named_submit", FILE), {"name": name, "space": space_a}, _date())
        assert submitted.state == "success", submitted.errors("tune")
        job_a = submitted.xcom("tune")["job_id"]

        # Another DAG reaches A's experiment through its templated name, while A runs and after: refused, naming the
        # experiment and its owner, and showing none of A's values; A goes on alone.
        for moment in ("while A runs", "after A finished"):
            other = run_dag(load_dag("aft_named_blocking", FILE), {"name": name, "space": space_b}, _date())
            assert other.state == "failed", moment
            [error] = other.errors("tune")
            assert isinstance(error, ExperimentConflictError), (moment, error)
            first = str(error).splitlines()[0]
            assert f"experiment {name!r}" in first and "belongs to DAG 'aft_named_submit', task 'tune'" in first, first
            assert "grid_search" not in str(error) and "param_space" not in str(error), str(error)
            assert [j["submission_id"] for j in jobs_of(name)] == [job_a], moment
            if moment == "while A runs":
                assert jobs_of(name)[0]["status"] in ("PENDING", "RUNNING")
                wait_for(lambda: jobs_of(name)[0]["status"] == "SUCCEEDED", 180, "A's job to succeed")

        # A's own task asking another question under its name is refused, naming what differs (its own values).
        changed = run_dag(load_dag("aft_named_submit", FILE), {"name": name, "space": space_b}, _date())
        assert changed.state == "failed"
        [error] = changed.errors("tune")
        assert isinstance(error, ExperimentConflictError), error
        assert f"experiment {name!r} already exists (s3://" in str(error) and "param_space" in str(error)

        # The same spec under the same name from its own task is the same experiment: its result, no new job.
        same = run_dag(load_dag("aft_named_submit", FILE), {"name": name, "space": space_a}, _date())
        assert same.state == "success", same.errors("tune")
        result = same.xcom("tune")
        assert result["job_id"] == job_a and result["best_config"]["x"] == 2
        assert len(jobs_of(name)) == 1
    finally:
        stop_live_jobs(name)


class _BarrierHook(RayHook):
    """The real hook; each thread's first job listing waits until both threads have listed, so both see no job; the
    losing try's submission waits until the winner's has returned (which try wins is the test's choice)."""

    def __init__(self, barrier: threading.Barrier, winner_submitted: threading.Event, wins: bool) -> None:
        super().__init__()
        self.barrier = barrier
        self.winner_submitted = winner_submitted
        self.wins = wins
        self.listed = 0

    def submit_job(self, **kwargs: Any) -> Any:
        if not self.wins:
            self.winner_submitted.wait(timeout=60)
        try:
            return super().submit_job(**kwargs)
        finally:
            if self.wins:
                self.winner_submitted.set()

    def find_jobs(self, metadata_filter: dict[str, Any]) -> list[dict[str, Any]]:
        jobs = super().find_jobs(metadata_filter)
        self.listed += 1
        if self.listed == 1:
            self.barrier.wait(timeout=60)
        return jobs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("winner", [1, 2], ids=["the-first-try-wins", "the-later-try-wins"])
def test_two_tries_that_submit_at_the_same_moment_make_one_job(tmp_path, winner):
    name = f"race-{uuid.uuid4().hex[:8]}"
    barrier = threading.Barrier(2)
    winner_submitted = threading.Event()
    outcomes: list[Any] = [None, None]
    shared: dict[str, Any] = {}

    def attempt(i: int) -> None:
        op = RayTuneOperator(
            task_id="tune",
            trainable="tune_testkit.airflow_cases:stepper",
            storage_path=_storage(),
            metric="loss",
            mode="min",
            experiment_name=name,
            param_space=_space([1], str(tmp_path), sleep=0.5),
            py_modules=[_testkit()],
        )
        op.__dict__["hook"] = _BarrierHook(barrier, winner_submitted, wins=i + 1 == winner)
        # Two tries of one task instance share its record (Airflow 3.3's task_state_store, or its XCom).
        ti = SimpleNamespace(
            dag_id="race",
            task_id="tune",
            map_index=-1,
            try_number=i + 1,
            xcom_push=lambda key, value: shared.__setitem__(key, value),
            xcom_pull=lambda key, **_: shared.get(key),
        )
        context = {"ti": ti, "run_id": "manual__race", "params": {}}
        spec = op.build_spec(context)  # type: ignore[arg-type]
        try:
            outcomes[i] = op.resume_or_submit(context, spec)  # type: ignore[arg-type]
        except BaseException as exc:  # reported below
            outcomes[i] = exc

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert all(isinstance(o, tuple) for o in outcomes), outcomes
        job_ids = {o[0] for o in outcomes}
        assert job_ids == {f"{name}-1"}, outcomes
        assert [j["submission_id"] for j in jobs_of(name)] == [f"{name}-1"]
    finally:
        stop_live_jobs(name)


def _storage() -> str:
    import os

    return os.environ["AIRFLOW_TUNE_STORAGE_URI"]


def _testkit() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1] / "support" / "tune_testkit")
