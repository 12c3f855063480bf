"""RayTuneOperator: run a Ray Tune experiment on a Ray cluster as a Ray job and return its winner through XCom."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseOperator

from airflow_tune import code, roots
from airflow_tune.contract import (
    JOB_ID_ENV,
    LIVE_STATUSES,
    METADATA_EXPERIMENT,
    METADATA_EXPERIMENT_URI,
    METADATA_FINGERPRINT,
    METADATA_OWNER,
    METADATA_SPEC_DIGEST,
    METADATA_SPEC_URI,
    RESULT_FILE,
    RESULT_KEYS,
    SPEC_FILE,
    TERMINAL_STATUSES,
    describe_owner,
    digest_of,
    engine_command,
    failure_text,
    job_spec_uri,
    manifest_uri,
    owner_differs,
    pending_too_long,
    result_mismatch,
    result_succeeded,
    spec_file_bytes,
    xcom_result,
)
from airflow_tune.exceptions import (
    ExperimentConflictError,
    ExperimentStorageError,
    RayConnectionError,
    RayJobError,
)
from airflow_tune.following import ProgressFollower
from airflow_tune.hooks.ray import RayHook
from airflow_tune.links.ray import RayJobLink
from airflow_tune.rendered import coerce_rendered
from airflow_tune.spec import ExperimentSpec, experiment_name_for, fingerprint_of, identity_differences, node_pins

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["RESULT_KEYS", "RayTuneOperator"]
STATE_JOB_ID = "ray_job_id"

# Spec fields the operator passes through as they are (each is also a templated argument).
_SPEC_FIELDS = (
    "trainable",
    "param_space",
    "metric",
    "mode",
    "num_samples",
    "max_concurrent_trials",
    "reuse_actors",
    "time_budget_s",
    "stop",
    "scheduler",
    "search",
    "points_to_evaluate",
    "resources_per_trial",
    "checkpoint",
    "failure",
    "storage_path",
    "trainable_kwargs",
    "errored_trials",
    "best_scope",
    "progress_interval_s",
    "infeasible_wait_s",
)
# BaseOperator has its own "resources"; the spec's field is set from this argument.
_SPEC_NAMES = {"resources_per_trial": "resources"}


def engine_package_dir() -> str:
    import airflow_tune

    return str(Path(airflow_tune.__file__).resolve().parent)


class RayTuneOperator(BaseOperator):
    """Run a Ray Tune hyperparameter search on a Ray cluster and return the best trial through XCom.

    The experiment runs as a Ray job whose driver (``python -m airflow_tune.engine``, shipped with the job) builds
    the Tuner from a validated JSON spec. Every try of a task instance works on the same experiment: a retry
    reattaches to a live job, returns the result of a finished one, or starts a job that restores the experiment.

    :param trainable: a function or ``tune.Trainable`` subclass, or its import path ``"package.module:name"``.
        An object the cluster cannot import by name (defined in the DAG file, a lambda, a closure) is pickled by
        value with cloudpickle and travels with the job; what it imports from other modules must be importable on
        the cluster. An import path must be importable on the cluster (ship it with ``py_modules``/``working_dir``/
        ``pip``). Import paths are code: one that appears only after rendering is refused unless allow-listed.
    :param storage_path: where Tune keeps experiment state and checkpoints, e.g. ``s3://bucket/experiments``.
    :param metric: the metric the trainable reports and the search optimizes.
    :param mode: ``"min"`` or ``"max"``.
    :param param_space: the search space as JSON, e.g. ``{"lr": {"loguniform": [1e-4, 1e-1]}}``.
    :param num_samples: how many times to sample the space (times each grid point).
    :param max_concurrent_trials: at most this many trials at once.
    :param reuse_actors: reuse Class API actors between trials (``reset_config``).
    :param time_budget_s: stop starting and running trials after this many seconds.
    :param stop: per-trial stop criteria, e.g. ``{"training_iteration": 10}``.
    :param scheduler: ``"asha"`` or ``{"name": "asha", "args": {...}}`` or ``{"factory": "pkg.mod:fn"}``
        (also ``"pkg.mod:fn"``).
    :param search: ``"optuna"`` or ``{"name": "optuna", "args": {...}, "max_concurrent": 2}``.
    :param points_to_evaluate: configs to try first.
    :param resources_per_trial: ``{"cpu": 1, "gpu": 0, "memory": bytes, "<custom>": n}``, or a list of
        placement group bundles ``[{"CPU": 1}, {"CPU": 1}]`` (the trial runs in the first, its child actors in the
        others); by default a Trainable's ``default_resource_request``, else 1 CPU.
    :param checkpoint: ``{"num_to_keep": 2, "frequency": 1, "at_end": true}``.
    :param failure: ``{"max_failures": 1, "fail_fast": false, "tolerate_errored_trials": true}``.
    :param trainable_kwargs: JSON keyword arguments for the trainable (``tune.with_parameters``).
    :param errored_trials: on restore, ``resume``, ``restart`` or ``keep`` errored trials.
    :param best_scope: Tune's scope for picking the best trial (``last``, ``all``, ...).
    :param infeasible_wait_s: a trial that asks for resources no node has fails the experiment, naming them, after
        this many seconds (0: at once; on an autoscaling cluster give it the time to add nodes, e.g. 600).
    :param experiment_name: the experiment's name; by default derived from dag, task, map index and run id. One name
        is one experiment: a run that reuses a name with another spec (search space, trainable, metric, ...) is
        refused, naming what differs.
    :param warm_start: seed the search with a known good config, tried first: a model registry URI (its champion's
        config, see :class:`~airflow_tune.operators.promote.PromoteCheckpointOperator`) or a config dict (an XCom).
        Only the keys the search space samples are used.
    :param ray_conn_id: the ``ray`` connection to the cluster's dashboard.
    :param aws_conn_id: an Amazon connection to read the warm-start registry with (needs
        ``apache-airflow-providers-amazon``); by default boto3's own credential chain.
    :param working_dir: a local folder or URI uploaded as the job's working dir.
    :param py_modules: local packages or URIs shipped with the job.
    :param pip: pip requirements installed for the job.
    :param runtime_env: any other Ray runtime_env settings (merged; ``env_vars`` hold no secrets: they are
        visible in the job's metadata). ``working_dir``, ``py_modules``, ``pip`` and ``runtime_env`` decide what
        code runs on the cluster, so they are not templated: write them in the DAG file.
    :param wait_for_completion: wait for the experiment (default); with False, return the job id and
        experiment URI at once for a :class:`~airflow_tune.sensors.tune.RayTuneSensor`.
    :param deferrable: wait in the triggerer instead of a worker slot.
    :param poll_interval: seconds between status checks while waiting in a worker (a deferred wait shares one poll
        per cluster, every 0.5 s, among all triggers).
    :param max_unreachable_s: how long the dashboard may go unanswered while waiting before the task fails.
    :param pending_timeout_s: a job still PENDING this long after its submission (its runtime env does not install,
        no node can run its driver) is stopped and the task fails saying so; None waits for ``execution_timeout``.
    :param stop_wait_s: how long Ray waits for the driver to save state after the stop signal.
    :param ship_engine: upload this package with the job (set False when the cluster image has airflow-tune).
    """

    # working_dir, py_modules, pip and runtime_env choose the code the cluster runs: never rendered.
    template_fields: Sequence[str] = (*_SPEC_FIELDS, "experiment_name", "warm_start")
    template_fields_renderers = {
        "param_space": "json",
        "stop": "json",
        "scheduler": "json",
        "search": "json",
        "points_to_evaluate": "json",
        "resources_per_trial": "json",
        "checkpoint": "json",
        "failure": "json",
        "trainable_kwargs": "json",
    }
    operator_extra_links = (RayJobLink(),)
    ui_color = "#d6ecfa"

    def __init__(
        self,
        *,
        trainable: str | Callable[..., Any] | type,
        storage_path: str,
        metric: str,
        mode: str,
        param_space: dict[str, Any] | str | None = None,
        num_samples: int | str = 1,
        max_concurrent_trials: int | str | None = None,
        reuse_actors: bool = False,
        time_budget_s: float | str | None = None,
        stop: dict[str, float] | str | None = None,
        scheduler: str | dict[str, Any] | None = None,
        search: str | dict[str, Any] | None = None,
        points_to_evaluate: list[dict[str, Any]] | str | None = None,
        resources_per_trial: dict[str, Any] | list[dict[str, float]] | str | None = None,
        checkpoint: dict[str, Any] | str | None = None,
        failure: dict[str, Any] | str | None = None,
        trainable_kwargs: dict[str, Any] | str | None = None,
        errored_trials: str = "resume",
        best_scope: str = "last",
        progress_interval_s: float = 10.0,
        infeasible_wait_s: float = 0.0,
        experiment_name: str | None = None,
        warm_start: str | dict[str, Any] | None = None,
        ray_conn_id: str = RayHook.default_conn_name,
        aws_conn_id: str | None = None,
        working_dir: str | None = None,
        py_modules: list[str] | None = None,
        pip: list[str] | str | None = None,
        runtime_env: dict[str, Any] | str | None = None,
        wait_for_completion: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 1.0,
        max_unreachable_s: float = 120.0,
        pending_timeout_s: float | None = 600.0,
        stop_wait_s: int = 60,
        ship_engine: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow calls any callable it finds in a template field, so an object stays out of ``trainable``.
        self.trainable_object = None if isinstance(trainable, str) else trainable
        self.trainable = trainable if isinstance(trainable, str) else code.describe(trainable)
        # Import paths as the DAG file wrote them, before any rendering: only these (or allow-listed ones) may run.
        self.literal_code_references = {
            "trainable": code.literal_import_paths(trainable) if isinstance(trainable, str) else set(),
            "param_space": code.literal_import_paths(param_space),
            "scheduler": code.literal_import_paths(scheduler),
            "search": code.literal_import_paths(search),
        }
        # Node pins ({"node:<ip>": 0.01}) place trials on chosen machines: only the DAG file may write them.
        self.literal_node_pins = code.literal_node_pins(resources_per_trial)
        self.storage_path = storage_path
        # The storage root the DAG file wrote (before rendering): a rendered storage_path must stay under it.
        self.literal_storage_root = roots.literal_root(storage_path)
        self.metric = metric
        self.mode = mode
        self.param_space = param_space if param_space is not None else {}
        self.num_samples = num_samples
        self.max_concurrent_trials = max_concurrent_trials
        self.reuse_actors = reuse_actors
        self.time_budget_s = time_budget_s
        self.stop = stop
        self.scheduler = scheduler
        self.search = search
        self.points_to_evaluate = points_to_evaluate
        self.resources_per_trial = resources_per_trial
        self.checkpoint = checkpoint
        self.failure = failure
        self.trainable_kwargs = trainable_kwargs if trainable_kwargs is not None else {}
        self.errored_trials = errored_trials
        self.best_scope = best_scope
        self.progress_interval_s = progress_interval_s
        self.infeasible_wait_s = infeasible_wait_s
        self.experiment_name = experiment_name
        self.warm_start = warm_start
        self.ray_conn_id = ray_conn_id
        self.aws_conn_id = aws_conn_id
        self.working_dir = working_dir
        self.py_modules = py_modules
        self.pip = pip
        self.runtime_env = runtime_env
        self.wait_for_completion = wait_for_completion
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.max_unreachable_s = max_unreachable_s
        self.pending_timeout_s = pending_timeout_s
        self.stop_wait_s = stop_wait_s
        self.ship_engine = ship_engine
        self.job_id: str | None = None
        self.spec: ExperimentSpec | None = None

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    # -- spec ---------------------------------------------------------------------------------------------------
    def build_spec(self, context: Context) -> ExperimentSpec:
        """The validated spec from the rendered arguments; raises ValueError naming each bad field.

        Also refuses, before anything is submitted, every import path that came from rendering rather than from the
        DAG file (unless the deployment allow-lists it).
        """
        data: dict[str, Any] = {}
        for name in _SPEC_FIELDS:
            value = getattr(self, name)
            if name == "trainable":
                value = self.trainable_code.import_path if self.trainable_object is not None else value
            else:
                value = coerce_rendered(name, value)
            if value is not None:
                data[_SPEC_NAMES.get(name, name)] = value
        named = coerce_rendered("experiment_name", self.experiment_name)
        data["name"] = named or self.default_experiment_name(context)
        data["owner"] = self.owner_of(context, default_name=not named)
        if self.trainable_object is not None and self.trainable_code.by_value:
            data["trainable_digest"] = self.trainable_code.digest
        seed = self.warm_start_point(data.get("param_space") or {})
        if seed:
            data["points_to_evaluate"] = [seed, *(data.get("points_to_evaluate") or [])]
        spec = ExperimentSpec.from_dict(data)
        roots.check_task_storage(self, spec.storage_path)
        allow_listed = self.check_code_references(spec)
        if allow_listed:
            spec = dataclasses.replace(spec, allow_listed=allow_listed)
        return spec

    def owner_of(self, context: Context, *, default_name: bool) -> dict[str, Any]:
        """The task instance this experiment belongs to; the run too when the name is the run's default one."""
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return {
            "dag_id": str(ti.dag_id),
            "task_id": str(ti.task_id),
            "map_index": int(map_index if map_index is not None else -1),
            "run_id": str(context["run_id"]) if default_name else None,
        }

    @cached_property
    def trainable_code(self) -> code.TrainableCode:
        """How the trainable object travels: by import path, or pickled by value (cached: pickled once)."""
        return code.trainable_code(self.trainable_object)

    def check_code_references(self, spec: ExperimentSpec) -> list[str]:
        """Refuse an import path in ``spec`` that neither the DAG file wrote nor the deployment allow-lists, and a
        node pin the DAG file did not write. Return the paths only the allow-list admitted."""
        pins = [(f, key) for f, key in node_pins(spec.resources) if key not in self.literal_node_pins]
        if pins:
            raise code.CodeReferenceError(
                [
                    f"{field} = {key!r}: a node pin places trials on a chosen machine; write it in the DAG file"
                    for field, key in pins
                ]
            )
        literal = {k: set(v) for k, v in self.literal_code_references.items()}
        if self.trainable_object is not None:
            literal["trainable"].add(self.trainable_code.import_path)
        mapped_task = self.dag.task_dict.get(self.task_id) if self.has_dag() else None
        for argument in code.arguments_mapped_from_data(mapped_task, literal):
            literal[argument] = set()
        refused, allow_listed = code.review_references(spec, literal)
        if not refused:
            return []
        # Only now read the allow-list: a spec of literal paths needs no connection lookup.
        patterns = code.allowed_patterns(self.hook.allowed_code_references)
        refused, allow_listed = code.review_references(spec, literal, patterns)
        if refused:
            raise code.refusal(refused, patterns)
        return allow_listed

    def warm_start_point(self, param_space: dict[str, Any]) -> dict[str, Any] | None:
        """The warm-start config restricted to the sampled keys of the search space, or None."""
        from airflow_tune.spec import primitive_of

        if not self.warm_start:
            return None
        config: Any = None
        if isinstance(self.warm_start, str) and "://" in self.warm_start:
            from airflow_tune.registry import read_champion

            champion = read_champion(self.warm_start, aws_conn_id=self.aws_conn_id)
            if champion is None:
                self.log.info("No champion in %s yet: no warm start", self.warm_start)
                return None
            config = champion.get("config")
        else:
            config = coerce_rendered("warm_start", self.warm_start)
        if not config:
            return None
        if not isinstance(config, dict):
            raise TypeError(f"warm_start must be a registry URI or a config dict, got {type(config).__name__}")
        sampled = {
            k for k, v in param_space.items() if primitive_of(v) not in (None, "const", "grid_search", "sample_from")
        }
        point = {k: v for k, v in config.items() if k in sampled}
        self.log.info("Warm start: trying %s first", point)
        return point or None

    @staticmethod
    def default_experiment_name(context: Context) -> str:
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return experiment_name_for(ti.dag_id, ti.task_id, context["run_id"], -1 if map_index is None else map_index)

    def build_runtime_env(self, spec: ExperimentSpec, job_id: str, shipped_dirs: Sequence[str] = ()) -> dict[str, Any]:
        runtime_env = coerce_rendered("runtime_env", self.runtime_env) if self.runtime_env else {}
        if not isinstance(runtime_env, dict):
            raise TypeError(f"runtime_env must be a dict, got {type(runtime_env).__name__}")
        runtime_env = dict(runtime_env)
        py_modules = list(runtime_env.pop("py_modules", None) or []) + list(self.py_modules or [])
        py_modules = [*shipped_dirs, *py_modules]
        if self.ship_engine:
            py_modules.insert(0, engine_package_dir())
        if py_modules:
            runtime_env["py_modules"] = py_modules
        if self.working_dir:
            runtime_env["working_dir"] = self.working_dir
        if self.pip:
            runtime_env["pip"] = self.pip
        env_vars = dict(runtime_env.get("env_vars") or {})
        env_vars.update(
            {
                JOB_ID_ENV: job_id,
                # Tune saves its state only on SIGINT; Ray's default stop signal is SIGTERM, then SIGKILL after 3 s.
                "RAY_JOB_STOP_SIGNAL": "SIGINT",
                "RAY_JOB_STOP_WAIT_TIME_S": str(self.stop_wait_s),
            }
        )
        runtime_env["env_vars"] = env_vars
        return runtime_env

    # -- execute ------------------------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        spec = self.spec = self.build_spec(context)
        job_id, finished = self.resume_or_submit(context, spec)
        self.job_id = job_id
        if job_id:
            RayJobLink.persist(context, job_url=self.hook.job_url(job_id))
        if finished is not None:
            self.log.info("Experiment %s already finished; returning its result", spec.name)
            return self._xcom_result(finished, job_id)
        assert job_id is not None
        if not self.wait_for_completion:
            return {
                "job_id": job_id,
                "experiment": spec.name,
                "experiment_uri": spec.experiment_uri,
                "dashboard_url": self.hook.job_url(job_id),
            }
        if self.deferrable:
            from airflow_tune.triggers.tune import RayTuneTrigger

            self.defer(
                trigger=RayTuneTrigger(
                    job_id=job_id,
                    ray_conn_id=self.ray_conn_id,
                    poll_interval=self.poll_interval,
                    deadline=self._deadline(context),
                    experiment_uri=spec.experiment_uri,
                    log_interval=spec.progress_interval_s,
                    max_unreachable_s=self.max_unreachable_s,
                    pending_timeout_s=self.pending_timeout_s,
                ),
                method_name="execute_complete",
            )
        status = self.wait_blocking(job_id, spec.experiment_uri, log_interval=spec.progress_interval_s)
        return self.complete(job_id, status, spec.experiment_uri)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        self.job_id = event.get("job_id")
        experiment_uri = str(event.get("experiment_uri"))
        status = event.get("status")
        if status == "timeout":
            raise RayJobError(f"execution_timeout reached: {event.get('message')}")
        if status == "error":
            raise RayJobError(f"lost track of Ray job {self.job_id}: {event.get('message')}")
        if status == "pending_timeout":
            raise RayJobError(str(event.get("message")))
        # The spec again, as execute() built it: the result read back is believed only when it is this spec's.
        self.spec = self.build_spec(context)
        return self.complete(str(self.job_id), str(status), experiment_uri, event.get("message"))

    def on_kill(self) -> None:
        """Stop the Ray job with SIGINT so Tune saves its state; the next try resumes the experiment."""
        if self.job_id:
            self.log.info("Stopping Ray job %s; Tune saves the experiment state for the next try", self.job_id)
            try:
                self.hook.stop_job(self.job_id)
            except Exception:
                self.log.exception("Could not stop Ray job %s", self.job_id)

    # -- retries ------------------------------------------------------------------------------------------------
    def resume_or_submit(self, context: Context, spec: ExperimentSpec) -> tuple[str | None, dict[str, Any] | None]:
        """Reattach to a live job of this experiment, return a finished result, or submit a job that restores.

        Every path first checks that the experiment found under this name asks the same question (the spec's
        fingerprint); another run reusing the name with another spec is refused, naming what differs.

        :return: the job id, and the finished result when there is one.
        """
        from airflow_tune import storage

        for _ in range(2):
            jobs = self.hook.find_jobs({METADATA_EXPERIMENT: spec.name})
            live = [j for j in jobs if j.get("status") in LIVE_STATUSES]
            for job in jobs:  # every job of this name, live or not, must be this task's
                metadata = job.get("metadata") or {}
                self._refuse_other_owner(spec, {k: metadata.get(v) for k, v in METADATA_OWNER.items()}, job)
            if live:
                job = live[0]
                metadata = job.get("metadata") or {}
                theirs = (
                    storage.read_json_or_none(metadata[METADATA_SPEC_URI]) if METADATA_SPEC_URI in metadata else None
                )
                self._refuse_other_question(spec, metadata.get(METADATA_FINGERPRINT), job, theirs)
                job_id = job["submission_id"]
                self.log.info("Reattaching to live Ray job %s of experiment %s", job_id, spec.name)
                self._remember_job(context, job_id)
                return job_id, None
            recorded = storage.read_json_or_none(manifest_uri(spec.experiment_uri, SPEC_FILE))
            if recorded is not None:
                self._refuse_other_owner(spec, recorded.get("owner") if isinstance(recorded, dict) else None, None)
                self._refuse_other_question(spec, fingerprint_of(recorded), None, recorded)
            result = storage.read_json_or_none(manifest_uri(spec.experiment_uri, RESULT_FILE))
            if result is not None and result_succeeded(result):
                self._refuse_other_owner(spec, result.get("owner") if isinstance(result, dict) else None, None)
                self._refuse_other_question(spec, result.get("fingerprint") or "<none>", None, recorded)
                self._believe_result(spec, result)
                job_id = result.get("job_id") or (jobs[0]["submission_id"] if jobs else None)
                return job_id, result
            if jobs:
                self.log.info(
                    "Experiment %s has %d earlier job(s), none live: the new job restores it from %s",
                    spec.name,
                    len(jobs),
                    spec.experiment_uri,
                )
            # Deterministic per experiment and attempt: two tries that list the jobs at the same moment submit the
            # same id, and Ray refuses the second; that one then finds the first's job above and reattaches.
            job_id = f"{spec.name}-{len(jobs) + 1}"
            try:
                self._submit(context, spec, job_id)
            except RayJobError as exc:
                if "already exists" not in str(exc):
                    raise
                self.log.info("Ray job %s was submitted by another try at the same moment; looking again", job_id)
                continue
            self._remember_job(context, job_id)
            return job_id, None
        raise RayJobError(f"experiment {spec.name}: jobs kept appearing while submitting; retry the task")

    def _refuse_other_owner(self, spec: ExperimentSpec, theirs: Any, job: dict[str, Any] | None) -> None:
        """Raise when the experiment found under this name belongs to another task: name it, show none of its values."""
        if not owner_differs(theirs, spec.owner):
            return
        where = f"live or earlier Ray job {job['submission_id']}" if job else spec.experiment_uri
        raise ExperimentConflictError(
            f"experiment {spec.name!r} ({where}) belongs to {describe_owner(theirs)}, not to this task "
            f"(DAG {spec.owner and spec.owner['dag_id']!r}, task {spec.owner and spec.owner['task_id']!r}); an "
            "experiment is read and resumed only by the task that started it: give this task its own "
            "experiment_name (or leave it unset: the default is unique per task instance)"
        )

    def _believe_result(self, spec: ExperimentSpec, result: Any) -> None:
        """Raise unless ``result`` (a ``result.json`` read back from storage) is this experiment's own."""
        mismatch = result_mismatch(result, spec)
        if mismatch:
            raise ExperimentStorageError(
                f"the result of experiment {spec.name!r} in storage is not believed: {mismatch}. Storage under the "
                "experiment was written by someone else; remove the experiment's folder or give this task another "
                "experiment_name"
            )

    def _refuse_other_question(
        self,
        spec: ExperimentSpec,
        theirs: str | None,
        job: dict[str, Any] | None,
        recorded: dict[str, Any] | None = None,
    ) -> None:
        """Raise when the experiment found under this name was started with another spec."""
        if not theirs or theirs == spec.fingerprint():
            return
        from airflow_tune import storage

        if recorded is None:
            recorded = storage.read_json_or_none(manifest_uri(spec.experiment_uri, SPEC_FILE))
        differences = identity_differences(recorded, spec.to_dict()) if recorded else []
        where = f"live Ray job {job['submission_id']}" if job else spec.experiment_uri
        raise ExperimentConflictError(
            f"experiment {spec.name!r} already exists ({where}) with another spec"
            + (f": {'; '.join(differences)}" if differences else "")
            + ". One experiment name answers one question: another run uses this experiment_name; give this run "
            "its own experiment_name (or leave it unset: the default is unique per task instance)"
        )

    def _submit(self, context: Context, spec: ExperimentSpec, job_id: str) -> None:
        import uuid

        from airflow_tune import storage

        ti = context["ti"]
        # Before anything is written or submitted: the engine runs on the cluster with the cluster's Ray.
        self.hook.check_ray_version()
        # The spec travels through storage, not in the job's environment: no size limit applies to it. Its digest
        # travels in the entrypoint, where no storage writer can change it: the driver runs only these bytes.
        spec_uri = job_spec_uri(spec.experiment_uri, job_id, uuid.uuid4().hex[:8])
        spec_bytes = spec_file_bytes(spec.to_dict())
        spec_digest = digest_of(spec_bytes)
        try:
            storage.write_bytes(spec_uri, spec_bytes)
        except OSError as exc:
            raise ExperimentStorageError(
                f"cannot write the experiment's spec to {spec_uri} ({exc}); check that the bucket of storage_path "
                f"{spec.storage_path!r} exists and that Airflow workers may write to it"
            ) from exc
        metadata = {
            METADATA_EXPERIMENT: spec.name,
            METADATA_EXPERIMENT_URI: spec.experiment_uri,
            METADATA_FINGERPRINT: spec.fingerprint(),
            METADATA_SPEC_URI: spec_uri,
            METADATA_SPEC_DIGEST: spec_digest,
            **{METADATA_OWNER[k]: str((spec.owner or {}).get(k)) for k in METADATA_OWNER},
            "airflow_run_id": str(context["run_id"]),
            "airflow_try_number": str(getattr(ti, "try_number", "")),
        }
        with contextlib.ExitStack() as stack:
            shipped = []
            if self.trainable_object is not None and self.trainable_code.by_value:
                shipped.append(stack.enter_context(code.shipped_package(self.trainable_code)))
                self.log.info("Shipping trainable %s by value with the job", self.trainable_code.source)
            self.hook.submit_job(
                entrypoint=engine_command(spec_uri, spec_digest),
                submission_id=job_id,
                runtime_env=self.build_runtime_env(spec, job_id, shipped),
                metadata=metadata,
                same_ray_version=False,  # checked above
            )
        self.log.info("Submitted Ray job %s for experiment %s", job_id, spec.name)

    def _remember_job(self, context: Context, job_id: str) -> None:
        store = context.get("task_state_store")  # type: ignore[call-overload]
        if store is None:
            return
        try:
            store.set(STATE_JOB_ID, job_id)
        except Exception as exc:  # the job metadata still identifies the experiment's jobs
            self.log.warning("Could not keep the job id in task_state_store: %s", exc)

    def _deadline(self, context: Context) -> float | None:
        if not self.execution_timeout:
            return None
        start = getattr(context["ti"], "start_date", None)
        started = start.timestamp() if start is not None else time.time()
        timeout = self.execution_timeout
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        return started + seconds

    # -- waiting ------------------------------------------------------------------------------------------------
    def wait_blocking(self, job_id: str, experiment_uri: str, log_interval: float = 10.0) -> str:
        """Poll until the job ends, printing the experiment's progress (from ``progress.json``) into the task log.

        A dashboard that does not answer is asked again until it has been unreachable for ``max_unreachable_s``
        since its last answer, as the trigger does.

        :param log_interval: read ``progress.json`` at most this often (and once more at the end).
        """
        follower = ProgressFollower(experiment_uri)
        progress_at = float("-inf")
        answered_at = time.monotonic()
        while True:
            try:
                info = self.hook.get_job_info(job_id)
            except RayConnectionError as exc:
                waited = time.monotonic() - answered_at
                if waited >= self.max_unreachable_s:
                    raise RayConnectionError(
                        f"the Ray dashboard was unreachable for {waited:.0f}s while waiting for job {job_id}: {exc}"
                    ) from exc
                self.log.warning("Ray dashboard unreachable for %.0fs: %s", waited, exc)
                time.sleep(self.poll_interval)
                continue
            answered_at = time.monotonic()
            stuck = pending_too_long({**info, "submission_id": job_id}, self.pending_timeout_s, time.time())
            if stuck:
                self.hook.stop_job(job_id)
                raise RayJobError(stuck)
            status = str(info.get("status"))
            terminal = status in TERMINAL_STATUSES
            if terminal or time.monotonic() - progress_at >= log_interval:
                progress_at = time.monotonic()
                self._print_progress(follower)
            if terminal:
                return status
            time.sleep(self.poll_interval)

    def _print_progress(self, follower: ProgressFollower) -> None:
        try:
            lines = follower.poll()
        except Exception as exc:  # progress is best effort
            self.log.debug("Could not read the experiment's progress: %s", exc)
            return
        for line in lines:
            self.log.info("%s", line)

    # -- results ------------------------------------------------------------------------------------------------
    def complete(self, job_id: str, status: str, experiment_uri: str, message: str | None = None) -> dict[str, Any]:
        """The XCom result of a finished job, or a task failure that says why the job did not succeed."""
        from airflow_tune import storage

        if status == "SUCCEEDED":
            result_uri = manifest_uri(experiment_uri, RESULT_FILE)
            result = storage.read_json_or_none(result_uri)
            if result is None:
                raise RayJobError(f"Ray job {job_id} succeeded but wrote no result at {result_uri}")
            if self.spec is not None:
                self._believe_result(self.spec, result)
            return self._xcom_result(result, job_id)
        raise RayJobError(self._failure_text(job_id, status, message))

    def _failure_text(self, job_id: str, status: str, message: str | None) -> str:
        if message is None:
            try:
                message = str(self.hook.get_job_info(job_id).get("message") or "")
            except Exception:
                message = ""
        try:
            logs = self.hook.get_job_logs(job_id)
        except Exception as exc:
            logs = f"(job logs unavailable: {exc})"
        return failure_text(job_id, status, message, logs)

    def _xcom_result(self, result: dict[str, Any], job_id: str | None) -> dict[str, Any]:
        chosen = result.get("job_id") or job_id
        out = xcom_result(result, job_id, self.hook.job_url(chosen) if chosen else None)
        self.log.info(
            "Best trial %s: %s=%s config=%s checkpoint=%s",
            out["best_trial_id"],
            out["metric"],
            (out["best_metrics"] or {}).get(out["metric"]),
            json.dumps(out["best_config"]),
            out["best_checkpoint_uri"],
        )
        return out
