"""How RayTuneOperator starts its experiment's job: reattach to a live one, return a finished result, or submit a
job (whose driver restores the experiment's proven state when an earlier job saved it), with the trainable shipped
by value when it must be."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from airflow_tune.common.contract import engine_command
from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks import ray_extra
from airflow_tune.trust import proofs
from airflow_tune.trust import submitted as submitted_record
from airflow_tune.trust.submitted import SubmittedJobs
from airflow_tune.utils import reconcile, shipping

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_tune.common.spec import ExperimentSpec

#: How long a try that lost the race to submit waits for the winner's record of its job (written right after).
RECORD_WAIT_S = 10.0


class JobSubmission:
    """The submitting step of :class:`~airflow_tune.operators.tune.RayTuneOperator` (a mixin: it reads the
    operator's ``hook``, ``log``, trainable and spec builder)."""

    # The operator's attributes and methods this step uses.
    hook: Any
    log: Any
    trainable_object: Any
    trainable_code: Any
    creator_codes: Any
    object_codes: Any
    restore_unproven_state: bool

    if TYPE_CHECKING:

        def check_before_writing(self, spec: ExperimentSpec) -> None: ...

        def build_runtime_env(self, spec: ExperimentSpec, job_id: str, shipped: list[str]) -> dict[str, Any]: ...

    def resume_or_submit(self, context: Context, spec: ExperimentSpec) -> tuple[str | None, dict[str, Any] | None]:
        """Reattach to a live job of this experiment, return a finished result, or submit a job that restores.

        What is found under the name must be this task's and ask this spec's question
        (:func:`~airflow_tune.utils.reconcile.find_experiment`); another task's is refused naming its owner, this task's
        with another spec naming what differs.

        :return: the job id, and the finished result when there is one.
        """
        submitted = SubmittedJobs(context, self.log)
        for _ in range(2):
            found = reconcile.find_experiment(self.hook, spec, submitted)
            if found.live is not None:
                job_id = str(found.live["submission_id"])
                self.log.info("Reattaching to live Ray job %s of experiment %s", job_id, spec.name)
                reconcile.remember_job(context, job_id, found.live.get("start_time"), self.log)
                return job_id, None
            if found.result is not None:
                return found.result.get("job_id") or (found.jobs[0]["submission_id"] if found.jobs else None), (
                    found.result
                )
            if found.jobs:
                self.log.info(
                    "Experiment %s has %d earlier job(s), none live: the new job restores it from %s",
                    spec.name,
                    len(found.jobs),
                    spec.experiment_uri,
                )
            job_id = reconcile.next_job_id(spec, found)
            restore_after = reconcile.restore_licence(spec, found, reconcile.remembered_job(context))
            restore_state = proofs.restore_state_proof(
                self.hook, spec, found.jobs, restore_after, self.log, allow_unproven=self.unproven_restore_allowed()
            )
            try:
                self.submit_experiment(context, spec, job_id, restore_after, restore_state)
            except RayJobError as exc:
                if "already exists" not in str(exc):
                    raise
                self.log.info("Ray job %s was submitted by another try at the same moment; looking again", job_id)
                # That try records its job right after submitting it: give it the moment to.
                # Its record is in this task instance's XCom (before 3.3, the only place): read it there.
                recorded = submitted_record.wait_for_record(context, job_id, timeout_s=RECORD_WAIT_S)
                submitted = SubmittedJobs(context, self.log, resumed=recorded)
                continue
            reconcile.remember_job(context, job_id, self.started_at(job_id), self.log)
            return job_id, None
        raise RayJobError(f"experiment {spec.name}: jobs kept appearing while submitting; retry the task")

    def submit_experiment(
        self,
        context: Context,
        spec: ExperimentSpec,
        job_id: str,
        restore_after: str | None = None,
        restore_state: dict[str, str] | None = None,
    ) -> None:
        """Write the job's spec and submit the driver, with the trainable shipped by value when it must be; the
        driver restores saved Tune state only when ``restore_after`` names the earlier job that wrote it, and only
        the files ``restore_state`` names (see :func:`~airflow_tune.trust.proofs.restore_state_proof`)."""
        # Before anything is written or submitted: the experiment's folder is its own and the tracking server answers
        # (check_before_writing); the engine runs on the cluster Ray.
        self.check_before_writing(spec)
        cluster_ray = self.hook.check_ray_version()
        by_value = [(what, c) for what, c in self.shipped_codes() if c.by_value]
        for _, shipped_code in by_value:
            ray_extra.refuse_by_value(shipped_code.source, cluster_ray, self.hook.cluster_python())
        spec_uri, spec_digest = reconcile.write_job_spec(spec, job_id)
        metadata = reconcile.job_metadata(
            spec, spec_uri, spec_digest, run_id=context["run_id"], try_number=getattr(context["ti"], "try_number", "")
        )
        with contextlib.ExitStack() as stack:
            shipped = []
            if by_value:
                shipped.append(stack.enter_context(shipping.shipped_package(*(c for _, c in by_value))))
                self.log.info(
                    "Shipping %s by value with the job", ", ".join(f"{what} {c.source}" for what, c in by_value)
                )
            self.hook.submit_job(
                entrypoint=engine_command(
                    spec_uri, spec_digest, restore_after=restore_after, restore_state=restore_state
                ),
                submission_id=job_id,
                runtime_env=self.build_runtime_env(spec, job_id, shipped),
                metadata=metadata,
                same_ray_version=False,  # checked above
            )
        self.log.info("Submitted Ray job %s for experiment %s", job_id, spec.name)

    def started_at(self, job_id: str) -> int | None:
        """Ray's start time of the job just submitted, recorded with its id (a job of that id on a new head is
        another job); None when the dashboard does not say."""
        try:
            started = self.hook.get_job_info(job_id).get("start_time")
        except Exception as exc:
            self.log.warning("Could not read Ray job %s's start time: %s", job_id, exc)
            return None
        return started if isinstance(started, int) else None

    def shipped_codes(self) -> list[tuple[str, shipping.TrainableCode]]:
        """The code given as Python objects, each with its argument: the trainable, then the trial name creators."""
        codes = [("trainable", self.trainable_code)] if self.trainable_object is not None else []
        return [*codes, *self.creator_codes.items(), *((path, c) for path, c in self.object_codes.items())]

    def unproven_restore_allowed(self) -> bool:
        """``restore_unproven_state``, as the DAG file wrote it (one mapped from an XCom was refused at the start of
        ``execute``: :data:`~airflow_tune.trust.code.TUNE_CODE_ARGUMENTS`)."""
        return self.restore_unproven_state
