"""RayTuneOperator: run a Ray Tune experiment on a Ray cluster as a Ray job and return its winner through XCom."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseOperator

from airflow_tune.common.contract import RESULT_KEYS, xcom_result
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks import ray_extra
from airflow_tune.hooks.ray import RayHook
from airflow_tune.links.ray import RayJobLink
from airflow_tune.operators.tune_spec import SPEC_FIELDS, TuneSpecBuilder, engine_package_dir
from airflow_tune.operators.tune_submit import JobSubmission
from airflow_tune.operators.tune_wait import JobWaiting
from airflow_tune.registries.promote_written import Written
from airflow_tune.trust import code, roots
from airflow_tune.trust.submitted import SubmittedJobs
from airflow_tune.utils import reconcile, shipped_objects, trial_naming, tune_values
from airflow_tune.utils import trial_logs as trial_logs_module

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["RESULT_KEYS", "RayTuneOperator", "engine_package_dir"]


class RayTuneOperator(BaseOperator, TuneSpecBuilder, JobSubmission, JobWaiting):
    """Run a Ray Tune hyperparameter search on a Ray cluster and return the best trial through XCom.

    The experiment runs as a Ray job whose driver (``python -m airflow_tune.engine``, shipped with the job) builds
    the Tuner from a validated JSON spec. Every try of a task instance works on the same experiment: a retry
    reattaches to a live job, returns the result of a finished one, or starts a job that restores the experiment.

    :param trainable: a function or ``tune.Trainable`` subclass, or its import path ``"package.module:name"``.
        An object the cluster cannot import by name (defined in the DAG file, a lambda, a closure) is pickled by
        value with cloudpickle and travels with the job; what it imports from other modules must be importable on
        the cluster. An import path must be importable on the cluster (ship it with ``py_modules``/``working_dir``/
        ``pip``). Import paths are code: one that appears only after rendering is refused unless allow-listed.
        ``tune.with_parameters(train, data=...)`` travels by value with its arguments (data of any picklable type),
        which the driver puts in Ray's object store as Tune does.
    :param storage_path: where Tune keeps experiment state and checkpoints, e.g. ``s3://bucket/experiments``.
    :param metric: the metric the trainable reports and the search optimizes; or a list of them, several objectives,
        with ``search="optuna"`` (the best trial goes by the first; the result adds the Pareto front).
    :param mode: ``"min"`` or ``"max"``; a list of them, one per metric, with several objectives.
    :param param_space: the search space as JSON, e.g. ``{"lr": {"loguniform": [1e-4, 1e-1]}}``, or as Tune writes
        it, ``{"lr": tune.loguniform(1e-4, 1e-1)}`` (Tune's sample objects at any depth become that JSON form).
    :param num_samples: samples of the space (times each grid point); -1 until time_budget_s or a stopper ends it.
    :param max_concurrent_trials: at most this many trials at once.
    :param reuse_actors: reuse Class API actors between trials (``reset_config``).
    :param time_budget_s: stop starting and running trials after this many seconds (or a ``timedelta``; 0: none).
    :param stop: stop criteria: Tune's ``{"training_iteration": 10}`` (a trial stops once a metric is >= its value),
        or a list any of which stops: ``[{"metric": "loss", "below": 0.1}, {"name": "trial_plateau", "args":
        {"std": 0.01}}]`` (thresholds ``above``/``below``, and Tune's ``trial_plateau``, ``experiment_plateau``,
        ``maximum_iteration`` and ``timeout`` stoppers with their arguments); or custom stoppers, as Tune takes them:
        a ``tune.Stopper`` object, a stop function ``(trial_id, result) -> bool``, or a Stopper subclass, written in
        the DAG file (alone or in the list; they travel as the trainable does), or by import path
        (``"pkg.mod:MyStopper"``, ``{"factory": "pkg.mod:MyStopper", "args": {...}}``: code, written in the DAG file).
    :param callbacks: Tune callbacks added to the run: loggers by name (``"csv"``, ``"json"``, ``"tbx"``, ``"wandb"``,
        ``{"name": "mlflow", "args": {...}}``; no credentials in their arguments, a ``tracking_uri`` as the DAG file
        wrote it) and custom ``tune.Callback`` classes or factories by import path (``"pkg.mod:Cb"`` or
        ``{"factory": "pkg.mod:make", "args": {...}}``; code, so written in the DAG file or allow-listed).
    :param scheduler: ``"asha"`` or ``{"name": "asha", "args": {...}}`` or ``{"factory": "pkg.mod:fn"}``
        (also ``"pkg.mod:fn"``). PBT's ``hyperparam_mutations`` take Tune's sample objects and functions, as Tune does.
    :param search: ``"optuna"`` or ``{"name": "optuna", "args": {...}, "max_concurrent": 2}``.
    :param points_to_evaluate: configs to try first, shaped like the search space (nested configs nested). A key
        the space samples and a point lacks is sampled from its domain (the model-based searchers take a point
        only whole); with Optuna, HyperOpt and BayesOpt a point may not set the space's constants.
    :param resources_per_trial: ``{"cpu": 1, "gpu": 0, "memory": bytes, "<custom>": n}``, or a list of
        placement group bundles ``[{"CPU": 1}, {"CPU": 1}]`` (the trial runs in the first, its child actors in the
        others), or a ``tune.PlacementGroupFactory``; by default a Trainable's ``default_resource_request`` (or what
        ``tune.with_resources`` set), else 1 CPU. A trainable that runs a Ray Train trainer declares its workers
        beside: ``{"cpu": 0.5, "train_workers": {"num_workers": 2, "per_worker": {"cpu": 1}}}`` (Train places them
        outside the trial's placement group; the feasibility check counts them).
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
    :param warm_start: seed the search with a known good config, tried first: a model registry's champion config
        (see :class:`~airflow_tune.operators.promote.PromoteCheckpointOperator`): ``s3://bucket/models/<name>``, or
        ``models:/<name>`` / ``models:/<name>@champion`` in MLflow (the version's ``airflow_tune.config`` tag, read as
        JSON through ``mlflow_conn_id``); or a config dict (an XCom). No champion yet: no warm start (logged). Only the
        keys the search space samples are used, nested ones too; those it lacks are sampled.
    :param mlflow_tracking: log each trial as an MLflow run (config as params, every reported metric per
        training_iteration, its status) under one parent run per experiment: ``True``, or ``{"experiment_name":
        "digits", "tags": {"team": "ml"}}`` (default MLflow experiment: ``airflow-tune/<dag_id>/<task_id>``, so
        every run of the task lines up). Data, so it may be templated; the server is ``mlflow_conn_id``'s (a
        rendered ``tracking_uri`` is refused), checked before the job is submitted. A failing MLflow call during
        the experiment is reported in the task log and does not fail it.
    :param mlflow_conn_id: the connection of the MLflow tracking server, for ``mlflow_tracking`` and a
        ``models:/<name>`` ``warm_start``; looked up only when one of them is used.
    :param ray_conn_id: the ``ray`` connection to the cluster's dashboard.
    :param aws_conn_id: an Amazon connection to read the warm-start registry with (needs
        ``apache-airflow-providers-amazon``); by default boto3's own credential chain.
    :param working_dir: a local folder or URI uploaded as the job's working dir.
    :param py_modules: local packages or URIs shipped with the job.
    :param pip: pip requirements installed for the job.
    :param runtime_env: any other Ray runtime_env settings (merged; ``env_vars`` hold no secrets: they are
        visible in the job's metadata). ``working_dir``, ``py_modules``, ``pip`` and ``runtime_env`` decide what
        code runs on the cluster and where it sends data, so they are written in the DAG file: not templated, and
        refused when ``expand()``/``expand_kwargs()`` maps them from an XCom (a literal list given to ``expand()`` is
        written in the DAG file).
    :param wait_for_completion: wait (default); False returns the job and experiment at once for a ``RayTuneSensor``.
    :param deferrable: wait in the triggerer instead of a worker slot.
    :param poll_interval: seconds between status checks while waiting in a worker (a deferred wait shares one poll
        per cluster, every 0.5 s, among all triggers).
    :param max_unreachable_s: how long the dashboard may go unanswered while waiting before the task fails.
    :param pending_timeout_s: a job still PENDING this long after its submission (its runtime env does not install,
        no node can run its driver) is stopped and the task fails saying so; None waits for ``execution_timeout``.
    :param stop_wait_s: how long Ray waits for the driver to save state after the stop signal.
    :param ship_engine: upload this package with the job (set False when the cluster image has airflow-tune);
        written in the DAG file (refused when mapped from an XCom).
    :param log_to_file: each trial's stdout and stderr in files of its folder in storage, as Tune's ``log_to_file``
        (``True``: ``stdout`` and ``stderr``; one file name; or a ``(stdout, stderr)`` pair); on by default (Tune's
        default is off). ``False`` keeps output in the Ray job's log only.
    :param sync_artifacts: sync every file a trial writes in its working directory to its folder (Tune's
        ``SyncConfig(sync_artifacts=True)``).
    :param trial_name_creator: Tune's ``trial_name_creator``: a function of the Trial returning its name, or its
        import path; code, so written in the DAG file (travels as the trainable does; never templated).
    :param trial_dirname_creator: Tune's ``trial_dirname_creator`` (the trial's folder name), as above.
    :param trial_logs: which trials' output the task log shows after the job ends (the last lines of each file):
        ``"errored"`` (default), ``"all"`` (the trials the result lists, errored first) or ``"none"``.
    :param restore_unproven_state: after the Ray cluster lost its job history (a new head), a retry restores the
        experiment's saved Tune state only when this is True: no job log is left to prove that this experiment's jobs
        wrote those files, and restoring unpickles them. Set it only where no one else can write the storage path;
        written in the DAG file (never templated, never mapped from an XCom).
    """

    # working_dir, py_modules, pip and runtime_env choose the code the cluster runs: never rendered.
    template_fields: Sequence[str] = (*SPEC_FIELDS, "experiment_name", "warm_start", "mlflow_tracking")
    template_fields_renderers = {
        "param_space": "json",
        "stop": "json",
        "callbacks": "json",
        "scheduler": "json",
        "search": "json",
        "points_to_evaluate": "json",
        "resources_per_trial": "json",
        "checkpoint": "json",
        "failure": "json",
        "trainable_kwargs": "json",
        "mlflow_tracking": "json",
    }
    operator_extra_links = (RayJobLink(),)
    ui_color = "#d6ecfa"

    def __init__(
        self,
        *,
        trainable: str | Callable[..., Any] | type,
        storage_path: str,
        metric: str | list[str],
        mode: str | list[str],
        param_space: dict[str, Any] | str | None = None,
        num_samples: int | str = 1,
        max_concurrent_trials: int | str | None = None,
        reuse_actors: bool = False,
        time_budget_s: float | str | None = None,
        stop: dict[str, float] | list[dict[str, Any]] | str | None = None,
        callbacks: list[str | dict[str, Any]] | str | None = None,
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
        mlflow_tracking: bool | dict[str, Any] | str | None = None,
        mlflow_conn_id: str = "mlflow_default",
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
        restore_unproven_state: bool = False,
        log_to_file: bool | str | tuple[str | None, str | None] | list[str | None] = True,
        sync_artifacts: bool = False,
        trial_name_creator: str | Callable[..., str] | None = None,
        trial_dirname_creator: str | Callable[..., str] | None = None,
        trial_logs: str = "errored",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Tune's data objects as JSON before rendering (a PlacementGroupFactory is callable: the renderer would call
        # it); its scheduler, searcher and callback objects refused, naming the forms to write.
        resources_per_trial = tune_values.resources_from_tune(resources_per_trial)
        resources_per_trial = tune_values.resources_of_trainable(trainable, resources_per_trial)
        time_budget_s = tune_values.seconds_from_tune(time_budget_s)
        tune_values.refuse_tune_part("scheduler", scheduler)
        tune_values.refuse_tune_part("search", search)
        tune_values.refuse_tune_callbacks(callbacks)
        # Tune's objects as the spec's JSON form, before anything reads them: sample objects at any depth, and code
        # (sample_from functions, stoppers, stop functions, PBT's mutations) as import paths, the objects kept here.
        param_space, scheduler, stop, self.code_objects = shipped_objects.code_in_arguments(
            param_space, scheduler, stop
        )
        # Airflow calls any callable it finds in a template field, so an object stays out of ``trainable``.
        self.trainable_object = None if isinstance(trainable, str) else trainable
        self.trainable = trainable if isinstance(trainable, str) else shipped_objects.describe(trainable)
        # Import paths as the DAG file wrote them, before any rendering: only these (or allow-listed ones) may run.
        self.literal_code_references = {
            "trainable": code.literal_import_paths(trainable) if isinstance(trainable, str) else set(),
            "param_space": code.literal_import_paths(param_space),
            "scheduler": code.literal_import_paths(scheduler),
            "search": code.literal_import_paths(search),
            "callbacks": code.literal_import_paths(callbacks),
            "stop": code.literal_import_paths(stop),
        }
        # Code written in the DAG file, never templated: a function (shipped as the trainable is) or an import path.
        self.trial_creators = trial_naming.creators(trial_name_creator, trial_dirname_creator)
        self.literal_code_references.update(trial_naming.literal_paths(self.trial_creators))
        # Node pins ({"node:<ip>": 0.01}) and loggers' URLs choose machines and servers: only the DAG file writes them.
        self.literal_node_pins = code.literal_node_pins(resources_per_trial)
        self.literal_destinations = code.literal_destinations(callbacks)
        self.written_warm_start = Written.of(warm_start, None)  # a registry read is a destination too
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
        self.callbacks = callbacks
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
        self.mlflow_tracking = mlflow_tracking
        self.mlflow_conn_id = mlflow_conn_id
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
        if not isinstance(restore_unproven_state, bool):
            raise TypeError(
                f"restore_unproven_state must be True or False, written in the DAG file; got "
                f"{type(restore_unproven_state).__name__}"
            )
        self.restore_unproven_state = restore_unproven_state
        self.log_to_file = log_to_file
        self.sync_artifacts = sync_artifacts
        self.trial_logs = trial_logs_module.check_trial_logs(trial_logs)
        self.job_id: str | None = None
        self.spec: ExperimentSpec | None = None
        self.returned: dict[str, Any] | None = None  # the XCom result, for lineage (also after a deferral)
        self.stopped_here = False  # on_kill stopped the job: a STOPPED status is then not a stop from outside

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    # -- the reconcile loop ---------------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        """Spec, identity, then reattach, return the finished result, or submit (restoring); then wait."""
        # What the cluster installs and imports, and where it sends data, is the DAG file's: never an XCom's.
        code.refuse_mapped_code(self, code.TUNE_CODE_ARGUMENTS)
        # Local code ships only through Ray's client: without Ray here, refuse before anything is written.
        ray_extra.refuse_without_ray(self.working_dir, self.py_modules, self.runtime_env, self.pip)
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
            self.returned = {
                "job_id": job_id,
                "experiment": spec.name,
                "experiment_uri": spec.experiment_uri,
                "dashboard_url": self.hook.job_url(job_id),
            }
            return self.returned
        if self.deferrable:
            self.defer(trigger=self._trigger(context, spec, job_id), method_name="execute_complete")
        status = self.wait_blocking(job_id, spec.experiment_uri, log_interval=spec.progress_interval_s)
        submitted = SubmittedJobs(context, self.log, known={job_id})
        return self.complete(job_id, status, spec.experiment_uri, submitted=submitted)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """The trigger's event: the result believed by the spec ``execute`` submitted, or why the job failed."""
        self.job_id = event.get("job_id")
        experiment_uri = str(event.get("experiment_uri"))
        status = event.get("status")
        if status == "timeout":
            raise RayJobError(f"execution_timeout reached: {event.get('message')}")
        if status == "error":
            raise RayJobError(f"lost track of Ray job {self.job_id}: {event.get('message')}")
        if status == "pending_timeout":
            raise RayJobError(str(event.get("message")))
        # The result is believed only when it is the spec's that execute() submitted: the job's own, proven by the
        # digest Ray keeps, so that no registry or connection is read again now (one may be down by then).
        submitted = SubmittedJobs(context, self.log, resumed=True)
        self.spec = reconcile.spec_of_job(self.hook, str(self.job_id), context["ti"], submitted)
        return self.complete(str(self.job_id), str(status), experiment_uri, event.get("message"), submitted=submitted)

    def on_kill(self) -> None:
        """Stop the Ray job with SIGINT so Tune saves its state; the next try resumes the experiment."""
        if self.job_id:
            self.stopped_here = True
            self.log.info("Stopping Ray job %s; Tune saves the experiment state for the next try", self.job_id)
            try:
                self.hook.stop_job(self.job_id)
            except Exception:
                self.log.exception("Could not stop Ray job %s", self.job_id)

    # -- results ------------------------------------------------------------------------------------------------
    def complete(
        self,
        job_id: str,
        status: str,
        experiment_uri: str,
        message: str | None = None,
        *,
        submitted: SubmittedJobs,
    ) -> dict[str, Any]:
        """The XCom result of a finished job, or a task failure that says why the job did not succeed."""
        log_to_file = self.spec.log_to_file if self.spec is not None else None
        if status == "SUCCEEDED":
            result = reconcile.read_result(self.hook, experiment_uri, job_id, self.spec, submitted=submitted)
            trial_logs_module.log_trial_output(experiment_uri, log_to_file, self.trial_logs, self.log, result)
            return self._xcom_result(result, job_id)
        # The job's own result.json, unproven: only its trials' folder names are read, inside this experiment.
        trial_logs_module.log_trial_output(experiment_uri, log_to_file, self.trial_logs, self.log)
        raise RayJobError(reconcile.job_failure(self.hook, job_id, status, message, stopped_here=self.stopped_here))

    def _xcom_result(self, result: dict[str, Any], job_id: str | None) -> dict[str, Any]:
        chosen = result.get("job_id") or job_id
        out = xcom_result(result, job_id, self.hook.job_url(chosen) if chosen else None)
        self.log_tracking(result)
        self.log.info(
            "Best trial %s: %s=%s config=%s checkpoint=%s",
            out["best_trial_id"],
            out["metric"],
            (out["best_metrics"] or {}).get(out["metric"]),
            json.dumps(out["best_config"]),
            out["best_checkpoint_uri"],
        )
        self.returned = out
        return out

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (called by its provider's listener): the warm-start registry and the datasets the trainable's
        keyword arguments name (``s3://``, ``gs://``, ``file://`` URIs) read; the experiment folder and the best
        checkpoint written (only the folder when the task failed after a job ran); the search and its winner as
        run parameters (:func:`~airflow_tune.utils.lineage_parameters.tune_parameters`). Never raises."""
        from airflow_tune.utils import lineage, lineage_parameters

        ran_on = self.spec.experiment_uri if self.spec is not None and self.job_id else None
        named = lineage.named_dataset_uris(self.spec.trainable_kwargs) if self.spec is not None else []
        return lineage.operator_lineage(
            lambda: lineage.tune_dataset_names(
                self.returned,
                self.warm_start,
                ran_on,
                named=named,
                mlflow_namespace=lineage.mlflow_namespace(self.warm_start, self.mlflow_conn_id),
            ),
            self.log,
            lambda: lineage_parameters.tune_parameters(self.returned, self.spec),
        )
