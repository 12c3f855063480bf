"""From an :class:`~airflow_tune.common.spec.ExperimentSpec` to the parts of a Ray Tune ``Tuner`` (search space,
trainable, scheduler, searcher, configs); :mod:`.tuner` puts them together, new or restored from storage."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory

from airflow_tune.common import storage
from airflow_tune.common.shipped import WithParameters
from airflow_tune.common.spec import SCHEDULER_ALIASES, SEARCHERS, ExperimentSpec, primitive_of, tune_code_nodes
from airflow_tune.common.spec.space import ArgumentNameError, bound_arguments
from airflow_tune.engine import compat, factories
from airflow_tune.engine.imports import EngineError, import_path
from airflow_tune.engine.objectives import check_searcher_objectives, searcher_objectives
from airflow_tune.engine.seeds import seed_points
from airflow_tune.engine.stopping import build_stop

# --- search space -------------------------------------------------------------------------------------------------


def build_domain(node: Any) -> Any:
    """Turn one declarative search-space node into a Tune domain, recursively; plain values stay as they are."""
    name = primitive_of(node)
    if name is None:
        if isinstance(node, Mapping):
            if tune_code_nodes(node, "node"):
                refuse_tune_code({"node": node})
            return {k: build_domain(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build_domain(v) for v in node]
        return node
    args = node[name]
    if name == "const":
        return args
    if name == "choice":
        return tune.choice([build_domain(v) for v in args])
    if name == "grid_search":
        return tune.grid_search([build_domain(v) for v in args])
    if name == "sample_from":
        fn = import_path(args, "sample_from")
        return tune.sample_from(fn)
    # Arguments given by name are bound by Tune's names, never by the order of the spec file's (sorted) keys.
    try:
        positional = bound_arguments(name, args)
    except ArgumentNameError as exc:
        raise EngineError(f"search-space primitive {node!r}: {exc}") from None
    return getattr(tune, name)(*compat.log_domain_args(name, positional))


def build_param_space(spec: ExperimentSpec) -> dict[str, Any]:
    return {k: build_domain(v) for k, v in spec.param_space.items()}


# --- trainable ----------------------------------------------------------------------------------------------------
def is_class_trainable(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, tune.Trainable)


def build_trainable(spec: ExperimentSpec) -> Any:
    """The user's trainable with its keyword arguments and per-trial resources attached."""
    trainable, parameters = import_trainable(spec)
    if not (is_class_trainable(trainable) or callable(trainable)):
        raise EngineError(f"trainable {spec.trainable!r} is neither a function nor a tune.Trainable subclass")
    class_api = is_class_trainable(trainable)
    if not class_api and (spec.checkpoint.frequency or spec.checkpoint.at_end):
        raise EngineError(
            f"checkpoint.frequency/at_end apply to Class API trainables only, and {spec.trainable!r} is a function: "
            "report checkpoints with tune.report(metrics, checkpoint=...) instead and drop these fields"
        )
    if class_api and (spec.checkpoint.frequency or spec.checkpoint.at_end) and not saves_checkpoints(trainable):
        raise EngineError(
            f"checkpoint.frequency/at_end ask {spec.trainable!r} for checkpoints, but it does not implement "
            "save_checkpoint/load_checkpoint: implement them, or drop these fields"
        )
    if not class_api and not inspect.isgeneratorfunction(trainable):
        trainable = report_zero_return(trainable)
    # Arguments of a tune.with_parameters written in the DAG file, then the JSON ones: into the object store, as Tune.
    parameters.update(spec.trainable_kwargs)
    if parameters:
        trainable = tune.with_parameters(trainable, **parameters)
    resources = build_resources(spec)
    if resources is not None:
        trainable = tune.with_resources(trainable, resources)
    return trainable


def import_trainable(spec: ExperimentSpec) -> tuple[Any, dict[str, Any]]:
    """The trainable and the arguments a ``tune.with_parameters(fn, **data)`` written in the DAG file gave it
    (shipped by value as a :class:`~airflow_tune.common.shipped.WithParameters`), else none."""
    obj = import_path(spec.trainable, "trainable")
    return (obj.trainable, dict(obj.parameters)) if isinstance(obj, WithParameters) else (obj, {})


def saves_checkpoints(cls: Any) -> bool:
    """Whether a Class API trainable implements ``save_checkpoint`` (``tune.Trainable``'s own raises)."""
    return getattr(cls, "save_checkpoint", None) is not tune.Trainable.save_checkpoint


def checkpoint_at_end(spec: ExperimentSpec) -> bool | None:
    """``checkpoint.at_end``, with None resolved for Class trainables that cannot save.

    Tune (2.43 to 2.60) turns ``checkpoint_at_end=None`` into True for every Class trainable, so a trainable
    without ``save_checkpoint`` errors with NotImplementedError once it finishes; such a trainable gets False.
    """
    if spec.checkpoint.at_end is not None:
        return spec.checkpoint.at_end
    try:
        trainable = import_trainable(spec)[0]
    except EngineError:
        return None
    if is_class_trainable(trainable) and not saves_checkpoints(trainable):
        return False
    return None


def report_zero_return(fn: Any) -> Any:
    """``fn`` that also reports a returned 0 as the metric ``_metric``.

    Tune (2.43 to 2.60) reports a number a function trainable returns as ``{"_metric": value}``, but skips any
    falsy return (``if not output: return``), so a trial returning exactly 0 (often the best value) reports nothing.
    """
    from ray.tune.result import DEFAULT_METRIC

    @functools.wraps(fn)
    def trainable(config: dict[str, Any], **kwargs: Any) -> Any:
        output = fn(config, **kwargs)
        if isinstance(output, numbers.Number) and not isinstance(output, bool) and output == 0:
            tune.report({DEFAULT_METRIC: output})
            return None
        return output

    return trainable


def build_resources(spec: ExperimentSpec) -> dict[str, float] | PlacementGroupFactory | None:
    """Per-trial resources; None leaves Tune to its defaults (a Trainable's ``default_resource_request``, or 1 CPU)."""
    res = spec.resources
    if res is None:
        return None
    if res.bundles is not None:
        return PlacementGroupFactory([_ray_bundle(b) for b in res.bundles], strategy=res.strategy)
    assert res.per_trial is not None
    out: dict[str, float] = {}
    custom: dict[str, float] = {}
    for key, value in res.per_trial.items():
        low = key.lower()
        if low in ("cpu", "gpu", "memory"):
            out[low] = value
        else:
            custom[key] = value
    if custom:
        # Tune's dict form takes custom resources only under "resources"; a bundle says the same more plainly.
        return PlacementGroupFactory([_ray_bundle(res.per_trial)])
    return out


def _ray_bundle(bundle: Mapping[str, float]) -> dict[str, float]:
    names = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}
    return {names.get(k.lower(), k): v for k, v in bundle.items() if v}


# --- scheduler and searcher ---------------------------------------------------------------------------------------
def build_scheduler(spec: ExperimentSpec) -> Any:
    """The trial scheduler. A named one gets metric and mode from the Tuner; a factory's may carry its own, the
    spec's (see :mod:`.factories`)."""
    sched = spec.scheduler
    args = dict(sched.args)
    if sched.factory:
        factory = import_path(sched.factory, "scheduler.factory")
        with _missing_package_is_fatal(f"scheduler.factory {sched.factory!r}"):
            built = factory(**args)
        factories.check_own_objective(built, f"scheduler.factory {sched.factory!r}", spec.metric, spec.mode)
        return built
    from ray.tune import schedulers

    name = SCHEDULER_ALIASES.get(str(sched.name).lower(), str(sched.name).lower())
    what = f"scheduler {sched.name!r}"
    if name == "fifo":
        return schedulers.FIFOScheduler()
    if name == "asha":
        return _construct(schedulers.ASHAScheduler, args, what)
    if name == "hyperband":
        return _construct(schedulers.HyperBandScheduler, args, what)
    if name == "median_stopping_rule":
        return _construct(schedulers.MedianStoppingRule, args, what)
    if name == "resource_changing":
        return _construct(schedulers.ResourceChangingScheduler, args, what)
    if name == "pbt":
        compat.check_arguments(schedulers.PopulationBasedTraining, args, what)
        # A function is Tune's callable mutation (called with no arguments); PBT refuses a tune.sample_from there.
        mutations = {
            k: v if isinstance(v, list) else _callable(v) or build_domain(v)
            for k, v in args.pop("hyperparam_mutations").items()
        }
        return schedulers.PopulationBasedTraining(hyperparam_mutations=mutations, **args)
    if name == "pb2":
        _require_package("sklearn", "the pb2 scheduler", "scikit-learn")
        from ray.tune.schedulers.pb2 import PB2

        return _construct(PB2, args, what)
    raise EngineError(f"unknown scheduler {sched.name!r}")  # pragma: no cover - the spec rejects it


def _callable(node: Any) -> Any:
    """The function a ``{"sample_from": path}`` node names, else None."""
    return import_path(node["sample_from"], "sample_from") if primitive_of(node) == "sample_from" else None


def _construct(cls: Any, args: dict[str, Any], what: str, **more: Any) -> Any:
    """``cls(**more, **args)`` once the cluster's Ray is known to take every argument (see :mod:`.compat`)."""
    compat.check_arguments(cls, {**more, **args}, what)
    return cls(**more, **args)


def concurrency_limit(spec: ExperimentSpec) -> int | None:
    """The tighter of ``max_concurrent_trials`` and ``search.max_concurrent``, or None."""
    limits = [n for n in (spec.max_concurrent_trials, spec.search.max_concurrent) if n]
    return min(limits) if limits else None


def build_search(spec: ExperimentSpec, *, own_objective: bool = False) -> Any:
    """The search algorithm, with the concurrency limit applied here; a named searcher built with the spec's metric
    and mode when ``own_objective`` (the scheduler carries its own, so the Tuner gives none).

    Tune (2.43 to 2.60) ignores ``TuneConfig(max_concurrent_trials=...)`` (with only a warning) when the search
    algorithm is a ``BasicVariantGenerator`` instance, as the random/grid one is: the limit must be given to the
    generator itself.
    """
    search = spec.search
    limit = concurrency_limit(spec)
    args = dict(search.args)
    # Model-based searchers take a point only whole and in their own shape: see engine/seeds.py.
    seeded_by = "factory" if search.factory else str(search.name).lower()
    points = seed_points(spec.points_to_evaluate, spec.param_space, seeded_by, build_domain)
    if search.factory:
        factory = import_path(search.factory, "search.factory")
        with _missing_package_is_fatal(f"search.factory {search.factory!r}"):
            searcher = factories.build_searcher(factory, args, points, spec.param_space, build_param_space(spec))
        factories.check_ax_platform(searcher)
        factories.check_own_objective(searcher, f"search.factory {search.factory!r}", spec.metric, spec.mode)
        check_searcher_objectives(searcher, spec, f"search.factory {search.factory!r}")
    else:
        name = str(search.name).lower()
        package = SEARCHERS.get(name)
        if package:
            _require_package(package, f"the {name} searcher", "bayesian-optimization" if name == "bayesopt" else None)
        if name in ("random", "grid"):
            from ray.tune.search.basic_variant import BasicVariantGenerator

            if limit:
                args.setdefault("max_concurrent", limit)
            return _construct(BasicVariantGenerator, args, f"search {search.name!r}", points_to_evaluate=points)
        what = f"search {search.name!r}"
        objective = {"metric": spec.metric, "mode": spec.mode} if own_objective else {}
        args = {**{k: v for k, v in objective.items() if k not in args}, **args}
        if name == "optuna":
            from ray.tune.search.optuna import OptunaSearch

            # Several objectives go to Optuna's searcher itself, as Tune's docs write it (TuneConfig takes one).
            searcher = _construct(OptunaSearch, args, what, points_to_evaluate=points, **searcher_objectives(spec))
        elif name == "hyperopt":
            from ray.tune.search.hyperopt import HyperOptSearch

            searcher = _construct(HyperOptSearch, args, what, points_to_evaluate=points)
        elif name == "bayesopt":
            from ray.tune.search.bayesopt import BayesOptSearch

            searcher = _construct(BayesOptSearch, args, what, points_to_evaluate=points)
        else:  # pragma: no cover - the spec rejects it
            raise EngineError(f"unknown search algorithm {search.name!r}")
    if limit:
        from ray.tune.search import ConcurrencyLimiter, Searcher

        if isinstance(searcher, Searcher):
            searcher = ConcurrencyLimiter(searcher, max_concurrent=limit)
        elif not searcher.set_max_concurrency(limit):
            raise EngineError(
                f"search.factory {search.factory!r} returned a {type(searcher).__name__}, which takes no concurrency "
                "limit: return a Searcher, or drop max_concurrent_trials / search.max_concurrent"
            )
    return searcher


@contextlib.contextmanager
def _missing_package_is_fatal(what: str) -> Iterator[None]:
    """A factory that imports a package the cluster lacks is a setup error naming the package, not a crash."""
    try:
        yield
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise EngineError(
            f"{what} needs the package {missing!r}, which is not installed on the cluster ({exc}): add it to the "
            "operator's pip=[...] or to the cluster image"
        ) from exc


def _require_package(module: str, what: str, pip_name: str | None = None) -> None:
    if importlib.util.find_spec(module) is None:
        raise EngineError(
            f"{what} needs the package {pip_name or module!r}, which is not installed on the cluster: add it to the "
            f"operator's pip=[...] or to the cluster image"
        )


# --- configs ------------------------------------------------------------------------------------------------------
def build_checkpoint_config(spec: ExperimentSpec) -> tune.CheckpointConfig:
    ckpt = spec.checkpoint
    # Tune's own defaults: without a score_attribute, num_to_keep keeps the newest checkpoints (the best one handed
    # on is the best of those kept), and the score order is "max" unless given.
    return tune.CheckpointConfig(
        num_to_keep=ckpt.num_to_keep,
        checkpoint_score_attribute=ckpt.score_attribute,
        checkpoint_score_order=ckpt.score_order or "max",
        checkpoint_frequency=ckpt.frequency,
        checkpoint_at_end=checkpoint_at_end(spec),
    )


def build_failure_config(spec: ExperimentSpec) -> tune.FailureConfig:
    return tune.FailureConfig(max_failures=spec.failure.max_failures, fail_fast=spec.failure.fail_fast)


def build_run_config(spec: ExperimentSpec, callbacks: list[Any]) -> tune.RunConfig:
    storage_path, storage_filesystem = storage.tune_storage(spec.storage_path)
    return tune.RunConfig(
        name=spec.name,
        storage_path=storage_path,
        storage_filesystem=storage_filesystem,
        stop=build_stop(spec),
        checkpoint_config=build_checkpoint_config(spec),
        failure_config=build_failure_config(spec),
        callbacks=callbacks,
        verbose=0,
    )


def build_tune_config(spec: ExperimentSpec) -> tune.TuneConfig:
    scheduler = build_scheduler(spec)
    # Tune raises at fit() when a scheduler carries its own metric and mode and the TuneConfig gives them too.
    own = factories.carries_objective(scheduler)
    search_alg = build_search(spec, own_objective=own)
    if own:
        factories.check_searcher_objective(search_alg, f"search.factory {spec.search.factory!r}")
    return tune.TuneConfig(
        metric=None if own or spec.objectives else spec.metric,
        mode=None if own or spec.objectives else spec.mode,
        num_samples=spec.num_samples,
        max_concurrent_trials=None,  # applied by build_search, where Tune honours it for every searcher
        time_budget_s=spec.time_budget_s,
        reuse_actors=spec.reuse_actors,
        scheduler=scheduler,
        search_alg=search_alg,
    )


def refuse_tune_code(data: Mapping[str, Any]) -> None:
    """Defence in depth: the spec's own checks refuse the keys Tune's decoders act on (``eval``, ``_type``) already;
    the engine refuses them again here, before anything reaches Tune, whatever produced the spec."""
    found = [where for key, value in data.items() for where, _ in tune_code_nodes(value, key)]
    if found:
        raise EngineError(
            f"refusing to run the spec: {', '.join(found)} hold a key Ray Tune decodes as code "
            '({"eval": ...} runs Python, {"_type": "CLOUDPICKLE_FALLBACK"} unpickles)'
        )
