"""The experiment spec: everything a tuning experiment needs, as plain JSON, validated before anything is submitted.

Imports neither airflow nor ray: the Airflow side validates with it at task time, the engine builds the Tuner from it
on the cluster. Every error names the field, the value and the fix, and all of them are listed at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from airflow_tune.common.contract import join_uri
from airflow_tune.common.spec.callbacks import check_callbacks
from airflow_tune.common.spec.compatibility import check_combinations
from airflow_tune.common.spec.errors import Errors, SpecError, did_you_mean, is_int, is_number, show
from airflow_tune.common.spec.identity import fingerprint_of, identity_of
from airflow_tune.common.spec.naming import METRIC_NAME, check_name, check_storage
from airflow_tune.common.spec.objectives import check_objectives, objectives_from_lists
from airflow_tune.common.spec.parts import (
    PARTS,
    CheckpointSpec,
    FailureSpec,
    ResourcesSpec,
    SchedulerSpec,
    SearchSpec,
    build_part,
    seeded_searcher,
)
from airflow_tune.common.spec.points import point_problems
from airflow_tune.common.spec.space import (
    IMPORT_PATH,
    check_param_space,
)
from airflow_tune.common.spec.stopping import check_stop, experiment_stoppers, normalize_stop
from airflow_tune.common.spec.tracking import check_no_double_tracking, check_tracking
from airflow_tune.common.spec.trial_output import check_trial_output
from airflow_tune.common.spec.trust import check_data_only, check_provenance, field_code_references
from airflow_tune.common.spec.tune_objects import not_carried

SPEC_VERSION = 1
ERRORED_TRIAL_POLICIES = ("resume", "restart", "keep")
BEST_SCOPES = ("last", "all", "last-5-avg", "last-10-avg", "avg")


@dataclass(frozen=True, kw_only=True)
class ExperimentSpec:
    """A Ray Tune experiment as plain JSON. Build it with :meth:`from_dict`, which validates every field.

    :param trainable: import path of a function or ``tune.Trainable`` subclass, ``"package.module:attr"``.
    :param name: experiment name, unique in ``storage_path``; a rerun with the same name restores the experiment.
    :param storage_path: where Tune keeps state and checkpoints: ``s3://bucket/prefix``, an absolute path, or a
        pyarrow filesystem URI.
    :param metric: the metric to optimize, as the trainable reports it; with several objectives, the first
        (:meth:`from_dict` takes ``metric`` and ``mode`` as lists, see :mod:`~airflow_tune.common.spec.objectives`).
    :param mode: ``"min"`` or ``"max"``.
    :param objectives: every objective in order, ``[{"metric", "mode"}, ...]``, when there are several; else null.
    :param param_space: the declarative search space (see :data:`PRIMITIVES`).
    :param stop: Tune's ``{metric: threshold}`` dict, or a list of criteria any of which stops (thresholds in both
        directions, Tune's stoppers by name; see :mod:`~airflow_tune.common.spec.stopping`).
    :param callbacks: Tune callbacks added to the run: loggers by name, custom ones by import path (see
        :mod:`~airflow_tune.common.spec.callbacks`).
    :param errored_trials: what a rerun does with trials that errored: resume from their checkpoint, restart them
        from scratch, or keep them as errored.
    :param infeasible_wait_s: how long a trial may ask for resources no node has before the experiment fails (0 on
        a fixed cluster; give an autoscaling cluster time to add nodes).
    :param owner: the task instance the experiment belongs to, ``{"dag_id", "task_id", "map_index", "run_id"}``
        (``run_id`` only for a default-named experiment, else null); set by the operator, recorded in every manifest.
    :param trainable_digest: for a trainable shipped by value, a digest of its code (part of the identity: another
        function of the same name is another trainable).
    :param allow_listed: the import paths only the deployment's allow-list admitted; the engine resolves them
        strictly (a function or class defined in the named module, never reached through another module).
    :param mlflow: track each trial as an MLflow run under one parent run of the experiment: ``{"tracking_uri",
        "experiment_name", "tags", "ui_url"}``, or null (see :mod:`~airflow_tune.common.spec.tracking`). Not part of the
        identity.
    :param log_to_file: each trial's stdout and stderr in files of its folder in storage (Tune's forms: true, one
        file name, or a ``[stdout, stderr]`` pair; on by default); see :mod:`~airflow_tune.common.spec.trial_output`.
    :param sync_artifacts: sync every file a trial writes in its working directory to its folder (Tune's).
    :param trial_name_creator: import path of Tune's ``trial_name_creator`` (a function of the Trial), or null.
    :param trial_dirname_creator: import path of Tune's ``trial_dirname_creator``, or null.
    """

    trainable: str
    name: str
    storage_path: str
    metric: str
    mode: Literal["min", "max"]
    objectives: list[dict[str, str]] | None = None
    param_space: dict[str, Any] = field(default_factory=dict)
    trainable_kwargs: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    reuse_actors: bool = False
    time_budget_s: float | None = None
    stop: dict[str, float] | list[dict[str, Any]] | None = None
    callbacks: list[Any] = field(default_factory=list)
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    search: SearchSpec = field(default_factory=SearchSpec)
    points_to_evaluate: list[dict[str, Any]] | None = None
    resources: ResourcesSpec | None = None
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    failure: FailureSpec = field(default_factory=FailureSpec)
    errored_trials: Literal["resume", "restart", "keep"] = "resume"
    best_scope: str = "last"
    progress_interval_s: float = 10.0
    infeasible_wait_s: float = 0.0
    owner: dict[str, Any] | None = None
    trainable_digest: str | None = None
    allow_listed: list[str] = field(default_factory=list)
    mlflow: dict[str, Any] | None = None
    log_to_file: bool | str | list[str | None] = True
    sync_artifacts: bool = False
    trial_name_creator: str | None = None
    trial_dirname_creator: str | None = None
    version: int = SPEC_VERSION

    # -- JSON in/out ----------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentSpec:
        """Validate ``data`` and build the spec; raise :class:`SpecError` listing every problem."""
        errors = Errors()
        if not isinstance(data, Mapping):
            raise SpecError([f"spec = {show(data)}: must be a JSON object; pass a dict of the spec's fields"])
        # Checked as the engine reads it: its JSON has lists where a rendered value had tuples.
        data = objectives_from_lists(_lists_for_tuples(data), errors)
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                close = did_you_mean(key, sorted(known))
                errors.add(
                    str(key),
                    data[key],
                    "unknown field",
                    f"did you mean {close!r}?" if close else f"known fields: {', '.join(sorted(known))}",
                )
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            if key in PARTS and value is not None:
                part = build_part(key, value, errors)
                if part is not None:
                    kwargs[key] = part
            elif key in PARTS and value is None and key != "resources":
                continue
            else:
                kwargs[key] = value
        for required in ("trainable", "name", "storage_path", "metric", "mode"):
            if data.get(required) in (None, ""):
                errors.add(required, data.get(required), "is required", _REQUIRED_FIX[required])
        _validate_fields(kwargs, errors)
        check_data_only(data, errors)
        errors.raise_if_any()
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> ExperimentSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError([f"spec is not valid JSON: {exc}; check quotes and commas"]) from None
        except TypeError:
            raise SpecError([f"spec = {show(text)}: is not JSON text; pass a str (or use from_dict)"]) from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("sort_keys", True)
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    # -- derived --------------------------------------------------------------------------------------------------
    @property
    def experiment_uri(self) -> str:
        return join_uri(self.storage_path, self.name)

    def identity(self) -> dict[str, Any]:
        """What question the experiment answers: the fields two runs of one experiment name must agree on.

        A restored Tune experiment keeps its search space, trainable, scheduler and searcher whatever a rerun asks, and
        a finished one's result answers the question it was asked. Policies (checkpoints, failures, budgets,
        concurrency, actor reuse, progress) may change between tries and are applied to a restored experiment; the
        few other fields a restored experiment cannot take are
        :func:`~airflow_tune.common.spec.identity.restore_conflicts`.
        """
        return identity_of(self.to_dict())

    def fingerprint(self) -> str:
        return fingerprint_of(self.to_dict())


_REQUIRED_FIX = {
    "trainable": 'give the import path of a function or Trainable class, e.g. "my_pkg.train:train_fn"',
    "name": "give an experiment name (the Airflow operator derives one from the task instance)",
    "storage_path": 'give where checkpoints go, e.g. "s3://my-bucket/experiments"',
    "metric": 'name the metric the trainable reports, e.g. "loss"',
    "mode": 'say "min" or "max"',
}


def _validate_fields(kw: dict[str, Any], errors: Errors) -> None:
    trainable = kw.get("trainable")
    if trainable is not None and (not isinstance(trainable, str) or not IMPORT_PATH.match(trainable)):
        errors.add(
            "trainable",
            trainable,
            "not an import path",
            'write "package.module:function_or_class" (the module must be importable on the cluster)'
            + (
                "; a name Tune's registry holds is not taken: write its import path instead, e.g. "
                '"ray.rllib.algorithms.ppo:PPO" for "PPO"'
                if isinstance(trainable, str) and ":" not in trainable
                else ""
            ),
        )
    name = kw.get("name")
    if name not in (None, ""):
        check_name(name, errors)
    storage = kw.get("storage_path")
    if storage not in (None, ""):
        check_storage(storage, errors)
    metric, mode = kw.get("metric"), kw.get("mode")
    multiple = isinstance(metric, list) or isinstance(mode, list)  # refused by objectives_from_lists
    if not multiple and metric not in (None, "") and (not isinstance(metric, str) or not METRIC_NAME.match(metric)):
        errors.add("metric", metric, "not a metric name", 'use the key the trainable reports, e.g. "loss"')
    if not multiple and mode not in (None, "") and mode not in ("min", "max"):
        errors.add("mode", mode, "must be 'min' or 'max'", 'say "min" to minimize the metric, "max" to maximize it')
    space = kw.get("param_space", {})
    if not isinstance(space, Mapping):
        errors.add("param_space", space, "must be a JSON object", 'write {"lr": {"loguniform": [1e-4, 1e-1]}, ...}')
    else:
        check_param_space(space, "param_space", errors)
        for where, value, problem, fix in not_carried(space, "param_space"):
            errors.add(where, value, problem, fix)
    tk = kw.get("trainable_kwargs", {})
    if not isinstance(tk, Mapping):
        errors.add("trainable_kwargs", tk, "must be a JSON object", "pass keyword arguments as {name: value}")
    else:
        try:
            json.dumps(tk)
        except (TypeError, ValueError):
            errors.add("trainable_kwargs", tk, "is not JSON", "pass only JSON values (numbers, strings, lists, dicts)")
    if is_number(kw.get("time_budget_s")) and kw["time_budget_s"] == 0:
        kw["time_budget_s"] = None  # Tune sets no budget for a falsy time_budget_s (Experiment: "if time_budget_s")
    if is_int(kw.get("num_samples")) and kw["num_samples"] == -1:
        # Tune's -1 samples until something ends the experiment; a per-trial stop does not.
        if not is_number(kw.get("time_budget_s")) and not experiment_stoppers(kw.get("stop")):
            errors.add(
                "num_samples",
                -1,
                "samples without end: nothing ends the experiment",
                "set time_budget_s (Tune's -1 samples until the budget is spent) or an experiment-wide stopper "
                '(stop=[{"name": "timeout", ...}] or "experiment_plateau"), or give a count, e.g. 8',
            )
    else:
        _check_int(
            kw,
            "num_samples",
            errors,
            minimum=1,
            fix="give how many times to sample the space (e.g. 8), or -1 with a time_budget_s",
        )
    # Tune's TuneConfig: "If None or 0, no limit will be applied."
    _check_int(
        kw,
        "max_concurrent_trials",
        errors,
        minimum=0,
        optional=True,
        fix="give a positive limit, or 0 or null for none",
    )
    if "reuse_actors" in kw and not isinstance(kw["reuse_actors"], bool):
        errors.add("reuse_actors", kw["reuse_actors"], "must be true or false", "write true or false")
    tb = kw.get("time_budget_s")
    if tb is not None and (not is_number(tb) or tb <= 0):
        errors.add("time_budget_s", tb, "must be a positive number of seconds", "give e.g. 3600, or 0 or null for none")
    wait = kw.get("infeasible_wait_s", 0.0)
    if not is_number(wait) or wait < 0:
        errors.add(
            "infeasible_wait_s",
            wait,
            "must be a number of seconds >= 0",
            "give 0, or e.g. 600 on an autoscaling cluster",
        )
    pi = kw.get("progress_interval_s", 10.0)
    if not is_number(pi) or pi < 0.5:
        errors.add("progress_interval_s", pi, "must be a number >= 0.5", "give e.g. 10")
    if kw.get("stop") is not None:
        check_stop(kw["stop"], errors)
        kw["stop"] = normalize_stop(kw["stop"])  # a custom stopper's path in its full form, as the object form gives
    check_callbacks(kw.get("callbacks"), errors)
    if kw.get("mlflow") is not None:
        tracking = check_tracking(kw["mlflow"], errors)
        if tracking is not None:
            kw["mlflow"] = tracking
        check_no_double_tracking(kw["mlflow"], kw.get("callbacks"), errors)
    check_combinations(kw, errors)
    check_trial_output(kw, errors)
    check_objectives(kw, errors)
    ptes = kw.get("points_to_evaluate")
    if ptes is not None:
        if not isinstance(ptes, list) or not all(isinstance(p, Mapping) for p in ptes):
            errors.add("points_to_evaluate", ptes, "must be a list of configs", 'write [{"lr": 0.01}, ...]')
        elif isinstance(space, Mapping):
            searcher = seeded_searcher(kw.get("search"))
            for i, point in enumerate(ptes):
                for problem, fix in point_problems(point, space, searcher):
                    errors.add(f"points_to_evaluate[{i}]", point, problem, fix)
    et = kw.get("errored_trials", "resume")
    if et not in ERRORED_TRIAL_POLICIES:
        errors.add("errored_trials", et, "unknown policy", f"use one of {', '.join(ERRORED_TRIAL_POLICIES)}")
    scope = kw.get("best_scope", "last")
    if scope not in BEST_SCOPES:
        errors.add("best_scope", scope, "unknown scope", f"use one of {', '.join(BEST_SCOPES)}")
    check_provenance(kw, errors)
    version = kw.get("version", SPEC_VERSION)
    if not is_int(version) or version != SPEC_VERSION:
        errors.add("version", version, "unsupported spec version", f"this engine reads version {SPEC_VERSION}")


def _check_int(kw: dict[str, Any], key: str, errors: Errors, *, minimum: int, fix: str, optional: bool = False) -> None:
    if key not in kw:
        return
    value = kw[key]
    if value is None and optional:
        return
    if not is_int(value) or value < minimum:
        errors.add(key, value, f"must be an integer >= {minimum}", fix)


def _lists_for_tuples(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _lists_for_tuples(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists_for_tuples(child) for child in value]
    return value


def code_references(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """Every import path of a spec, with its field: the code the cluster imports and runs for this experiment.

    ``trainable``, ``scheduler.factory``, ``search.factory``, each callback's ``factory`` and each ``sample_from`` in
    ``param_space`` or in PBT's ``hyperparam_mutations``, each custom stopper, and the trial name creators
    (:func:`~airflow_tune.common.spec.trust.field_code_references`). Everything else in a spec is data.
    """
    fields_as_given = {
        "trainable": spec.trainable,
        "scheduler": {"factory": spec.scheduler.factory, "args": spec.scheduler.args},
        "search": {"factory": spec.search.factory},
        "callbacks": spec.callbacks or [],
        "param_space": spec.param_space,
        "stop": spec.stop,
        "trial_name_creator": spec.trial_name_creator,
        "trial_dirname_creator": spec.trial_dirname_creator,
    }
    return [
        (where, path)
        for name, value in fields_as_given.items()
        for where, path in field_code_references(name, value)
        if isinstance(path, str)
    ]
