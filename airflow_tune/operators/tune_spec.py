"""How RayTuneOperator turns its arguments into what a job carries: the validated
:class:`~airflow_tune.common.spec.ExperimentSpec` (the spec step of its reconcile loop, with the security checks that
need the DAG file's view of the arguments: import paths, node pins and loggers' URLs written literally, the storage
root; and the operator-set fields: owner, code digest), and the job's runtime env."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_tune.common.contract import JOB_ID_ENV
from airflow_tune.common.spec import ExperimentSpec, experiment_name_for, node_pins
from airflow_tune.common.spec.callbacks import callback_destinations
from airflow_tune.trust import code, disjoint, roots
from airflow_tune.trust.rendered import coerce_rendered
from airflow_tune.utils import shipped_objects, shipping, trial_naming, tune_values

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_tune.hooks.mlflow import MLflowHook

# Spec fields the operator passes through as they are (each is also a templated argument).
SPEC_FIELDS = (
    "trainable",
    "param_space",
    "metric",
    "mode",
    "num_samples",
    "max_concurrent_trials",
    "reuse_actors",
    "time_budget_s",
    "stop",
    "callbacks",
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
    "log_to_file",
    "sync_artifacts",
)
# BaseOperator has its own "resources"; the spec's field is set from this argument.
_SPEC_NAMES = {"resources_per_trial": "resources"}


def engine_package_dir() -> str:
    import airflow_tune

    return str(Path(airflow_tune.__file__).resolve().parent)


class TuneSpecBuilder:
    """The spec step of :class:`~airflow_tune.operators.tune.RayTuneOperator` (a mixin: it reads the operator's
    arguments, ``hook``, ``log`` and DAG)."""

    # The operator's attributes this step reads.
    trainable_object: Any
    code_objects: dict[str, Any]
    trial_creators: dict[str, Any]
    literal_code_references: dict[str, set[str]]
    literal_node_pins: set[str]
    literal_destinations: set[str]
    experiment_name: Any
    warm_start: Any
    mlflow_tracking: Any
    mlflow_conn_id: str
    aws_conn_id: str | None
    runtime_env: Any
    py_modules: list[str] | None
    working_dir: str | None
    pip: Any
    ship_engine: bool
    stop_wait_s: int
    #: The storage root that admitted the rendered storage path (set by build_spec).
    storage_root: str | None = None
    hook: Any
    log: Any
    task_id: str
    dag: Any

    if TYPE_CHECKING:

        def has_dag(self) -> bool: ...

    def build_spec(self, context: Context) -> ExperimentSpec:
        """The validated spec from the rendered arguments; raises ValueError naming each bad field.

        Also refuses, before anything is submitted, every import path that came from rendering rather than from the
        DAG file (unless the deployment allow-lists it), and every logger URL that did.
        """
        data: dict[str, Any] = {}
        for name in SPEC_FIELDS:
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
        self.check_code_objects(data.get("trainable_kwargs"))
        for field, creator in self.trial_creators.items():
            data[field] = creator if isinstance(creator, str) else self.creator_codes[field].import_path
        seed = self.warm_start_point(data.get("param_space") or {})
        if seed:
            data["points_to_evaluate"] = [seed, *(data.get("points_to_evaluate") or [])]
        tracking = self.mlflow_tracking_spec(context)
        if tracking is not None:
            data["mlflow"] = tracking
        spec = ExperimentSpec.from_dict(data)
        self.check_trainable_object(spec)
        self.storage_root = roots.check_task_storage(self, spec.storage_path)
        self.check_destinations(spec)
        allow_listed = self.check_code_references(spec)
        if allow_listed:
            spec = dataclasses.replace(spec, allow_listed=allow_listed)
        return spec

    def check_trainable_object(self, spec: ExperimentSpec) -> None:
        """What a trainable object of the DAG file cannot run with (see :mod:`airflow_tune.utils.tune_values`)."""
        if self.trainable_object is not None:
            tune_values.resources_left_behind(self.trainable_object, self.trainable_code.by_value)
            tune_values.refuse_function_checkpoints(self.trainable_object, spec.checkpoint)

    def check_before_writing(self, spec: ExperimentSpec) -> None:
        """The checks that ask storage and servers, before anything of a job is written or submitted: the
        experiment's folder lies inside no other experiment's or registry's folder and holds none
        (:mod:`airflow_tune.trust.disjoint`); the tracking server answers."""
        disjoint.check_experiment_folder(spec.storage_path, spec.name, self.storage_root, log=self.log)
        if spec.mlflow is not None:
            self.mlflow_hook.preflight()

    @cached_property
    def mlflow_hook(self) -> MLflowHook:
        from airflow_tune.hooks.mlflow import MLflowHook

        return MLflowHook(mlflow_conn_id=self.mlflow_conn_id)

    def mlflow_tracking_spec(self, context: Context) -> dict[str, Any] | None:
        """The spec's ``mlflow`` from ``mlflow_tracking`` (rendered: ``True``, a dict, or its JSON) and the MLflow
        connection, or None when tracking is off. Where the cluster sends data is the connection's: a rendered
        ``tracking_uri`` or ``ui_url`` is refused. The connection's credentials never enter the spec."""
        value = coerce_rendered("mlflow_tracking", self.mlflow_tracking)
        if not value:
            return None
        if value is True:
            value = {}
        if not isinstance(value, dict):
            raise TypeError(
                f"mlflow_tracking must be True, a dict such as {{'experiment_name': 'x', 'tags': {{...}}}} or its "
                f"JSON, or None; got {type(value).__name__}"
            )
        chosen = [key for key in ("tracking_uri", "ui_url") if key in value]
        if chosen:
            raise ValueError(
                f"mlflow_tracking sets {', '.join(chosen)}: where the cluster sends its data is not data; set it on "
                f"the connection {self.mlflow_conn_id!r} (host, and extra ui_url) instead"
            )
        ti = context["ti"]
        return {
            "experiment_name": f"airflow-tune/{ti.dag_id}/{ti.task_id}",
            **value,
            "tracking_uri": self.mlflow_hook.tracking_uri,
            "ui_url": self.mlflow_hook.ui_url,
        }

    def log_tracking(self, result: dict[str, Any]) -> None:
        """Where the experiment's trials were tracked in MLflow, and how many tracking calls failed."""
        tracking = result.get("mlflow")
        if not isinstance(tracking, dict):
            return
        runs = tracking.get("runs") or {}
        self.log.info(
            "MLflow: experiment %s, parent run %s, best run %s (%d trial runs listed)",
            tracking.get("experiment_id"),
            tracking.get("parent_run_id"),
            tracking.get("best_run_id"),
            len(runs),
        )
        if tracking.get("errors"):
            self.log.warning(
                "MLflow tracking: %s call(s) failed during the experiment, the last: %s; the experiment went on, its "
                "MLflow runs may miss what those calls carried",
                tracking.get("errors"),
                tracking.get("last_error"),
            )

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
    def creator_codes(self) -> dict[str, shipping.TrainableCode]:
        """How each trial name creator given as a function travels (cached: pickled once)."""
        return trial_naming.creator_codes(self.trial_creators)

    @cached_property
    def trainable_code(self) -> shipping.TrainableCode:
        """How the trainable object travels: by import path, or pickled by value (cached: pickled once)."""
        return shipped_objects.trainable_code_of(self.trainable_object)

    @cached_property
    def object_codes(self) -> dict[str, shipping.TrainableCode]:
        """How each code object of ``stop``, ``param_space`` and ``scheduler`` travels, by the import path the spec
        names it by (cached: pickled once)."""
        return {path: shipped_objects.object_code(obj, path) for path, obj in self.code_objects.items()}

    def check_code_objects(self, trainable_kwargs: Any) -> None:
        """Before submission: every code object pickles (else a TypeError naming it, or the ``with_parameters``
        argument that does not), and ``trainable_kwargs`` names no argument ``tune.with_parameters`` gives too."""
        self.object_codes  # noqa: B018 - pickled now, to refuse before anything is written
        if self.trainable_object is None or not isinstance(trainable_kwargs, dict):
            return
        given = shipped_objects.with_parameters_arguments(self.trainable_object)
        twice = sorted(set(given) & set(trainable_kwargs))
        if twice:
            raise ValueError(
                f"trainable_kwargs = {sorted(trainable_kwargs)}: {', '.join(twice)} also given to "
                f"{shipped_objects.describe(self.trainable_object)}; give each argument once"
            )

    def check_code_references(self, spec: ExperimentSpec) -> list[str]:
        """Refuse an import path in ``spec`` that neither the DAG file wrote nor the deployment allow-lists, and a
        node pin the DAG file did not write. Return the paths only the allow-list admitted."""
        mapped_task = self.dag.task_dict.get(self.task_id) if self.has_dag() else None
        mapped = code.arguments_mapped_from_data(mapped_task, [*self.literal_code_references, "resources_per_trial"])
        # A node pin an XCom mapped in (expand()) is not the DAG file's, though the task was built with it.
        written_pins = set() if "resources_per_trial" in mapped else self.literal_node_pins
        pins = [(f, key) for f, key in node_pins(spec.resources) if key not in written_pins]
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
        for field, creator_code in self.creator_codes.items():
            literal[field].add(creator_code.import_path)
        for argument in mapped & set(literal):
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

    def check_destinations(self, spec: ExperimentSpec) -> None:
        """Refuse a URL a logger callback sends data to or reads from (MLflow's ``tracking_uri``) that the DAG file
        did not write in ``callbacks``: a rendered one (a Param, a conf, an XCom) would send the cluster's tracking
        credentials and every trial's data wherever it names. The refusal shows the host, never the whole URL."""
        literal = self.literal_destinations
        mapped_task = self.dag.task_dict.get(self.task_id) if self.has_dag() else None
        if code.arguments_mapped_from_data(mapped_task, ["callbacks"]):
            literal = set()
        refused = [(field, url) for field, url in callback_destinations(spec.callbacks) if url not in literal]
        if not refused:
            return
        lines = "\n".join(f"  - {field} = host {_host(url)!r}: not written in the DAG file" for field, url in refused)
        raise ValueError(
            f"refused {len(refused)} logger URL{'s' if len(refused) > 1 else ''} that came from rendering (a Param, a "
            f"trigger conf, an XCom or a macro); where the cluster sends its data is not data:\n{lines}\n"
            "Write the URL in the DAG file's callbacks, or drop it and track with mlflow_tracking, whose server is "
            f"the connection mlflow_conn_id names ({self.mlflow_conn_id!r})."
        )

    def warm_start_point(self, param_space: dict[str, Any]) -> dict[str, Any] | None:
        """The warm-start config restricted to the sampled keys of the search space, nested ones too, or None.

        Keys the space samples and the config lacks (a parameter added since) are left out: the engine fills them
        by sampling the space for the searchers that need every key.

        :param param_space: the rendered search space.
        """
        from airflow_tune.common.contract import is_mlflow_uri
        from airflow_tune.common.spec.points import restrict

        if not self.warm_start:
            return None
        if isinstance(self.warm_start, str) and ("://" in self.warm_start or is_mlflow_uri(self.warm_start)):
            self.check_warm_start_source()
        config: Any = None
        if is_mlflow_uri(self.warm_start):
            from airflow_tune.hooks.mlflow import MLflowHook
            from airflow_tune.registries.mlflow import champion_config

            # The version's airflow_tune.config tag, parsed as JSON: data only, never unpickled or imported.
            config = champion_config(MLflowHook(self.mlflow_conn_id), self.warm_start)
            if config is None:
                self.log.info("No champion with a config in the MLflow registry %s yet: no warm start", self.warm_start)
                return None
        elif isinstance(self.warm_start, str) and "://" in self.warm_start:
            from airflow_tune.registries.s3 import read_champion

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
        point = restrict(config, param_space)
        self.log.info("Warm start: trying %s first", point)
        return point or None

    def check_warm_start_source(self) -> None:
        """A registry the warm start reads is one the DAG file wrote, or an ``s3://`` one under a root the DAG file
        wrote or the deployment allows, as ``PromoteCheckpointOperator``'s ``registry_uri``: a conf chooses values,
        never whose champion is read."""
        from airflow_tune.registries.promote_written import Written, check_registry
        from airflow_tune.trust import code

        written: Written = getattr(self, "written_warm_start", None) or Written()
        mapped_task = self.dag.task_dict.get(self.task_id) if self.has_dag() else None
        if code.arguments_mapped_from_data(mapped_task, ["warm_start"]):
            written = Written()
        check_registry(
            self.warm_start,
            written,
            lambda: roots.deployment_roots(lambda: self.hook.allowed_storage_roots),
            field="warm_start",
        )

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


def _host(url: str) -> str | None:
    """The host of a URL (never its user or password), for a message."""
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None
