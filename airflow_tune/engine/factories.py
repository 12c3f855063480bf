"""What a searcher or scheduler built by a user's factory needs from the engine to run as plain Tune runs it.

**Seed points in the searcher's shape.** The spec's points are nested as its space is. Every searcher of Tune's but
HyperOpt (and the random/grid one) names a nested parameter ``"net/width"`` (``flatten_dict(space, "/")``) and takes
a point only in that form (Ray 2.43 to 2.60, tried on 2.60): Nevergrad refuses a nested one ("Got input keys {'x',
'net'} for Dict but expected ..."), ZOOpt fails on it (KeyError), TuneBOHB fails when it registers the trial's result
("Unknown hyperparameter(s) {'net'}"); Ax, HEBO, Optuna and BayesOpt look points up by the flat names. Which searcher a
factory builds shows only once it is built: when points are given, the factory is called once without points to see
it, then with the points in its shape. AxSearch also makes each constant of the space a fixed parameter and refuses a
point without it (as in plain Tune): its points get the space's constants.

**The factory's own metric and mode.** Tune takes the objective from ``TuneConfig`` or from the objects, not both: a
scheduler carrying its own metric makes ``fit()`` raise when ``TuneConfig`` gives one too. The spec's metric and mode
pick the best trial, so an object's own must be the spec's; then the ``TuneConfig`` gives none, as a Tune user writes
it, and the searcher needs its own (the named ones get the spec's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_tune.common.spec.points import flatten
from airflow_tune.engine.imports import EngineError

#: Tune's searchers that name nested parameters ``"a/b"`` and take points in that form (class names in
#: ``ray.tune.search``; a subclass of one is one).
FLAT_POINTS = ("AxSearch", "BayesOptSearch", "HEBOSearch", "NevergradSearch", "OptunaSearch", "TuneBOHB", "ZOOptSearch")


def inner_searcher(searcher: Any) -> Any:
    """The searcher inside Tune's wrappers (``ConcurrencyLimiter``, ``Repeater``), which pass points through."""
    from ray.tune.search import ConcurrencyLimiter, Repeater

    while isinstance(searcher, (ConcurrencyLimiter, Repeater)):
        searcher = searcher.searcher
    return searcher


def point_shape(searcher: Any) -> str:
    """``"flat"`` for a searcher of :data:`FLAT_POINTS`, else ``"nested"`` (HyperOpt, the random/grid one, a
    user's own searcher: the spec's shape)."""
    return "flat" if any(_is_tune_searcher(searcher, name) for name in FLAT_POINTS) else "nested"


def build_searcher(
    factory: Callable[..., Any],
    args: Mapping[str, Any],
    points: list[dict[str, Any]] | None,
    space: Mapping[str, Any],
    tune_space: Mapping[str, Any] | None = None,
) -> Any:
    """``factory(**args)``, given ``points_to_evaluate`` (complete, nested as ``space``) in its searcher's shape.

    :param tune_space: the space as Tune's objects (``build_param_space``): an Ax point also needs its constants.
    """
    if not points:
        return factory(**args)
    flat = [flatten(point, space) for point in points]
    fixed = fixed_parameters(tune_space) if tune_space is not None else {}
    if flat != points or fixed:
        probe = factory(**args)
        if point_shape(probe) == "flat":
            points = flat
        if fixed and _is_tune_searcher(probe, "AxSearch"):
            points = [{**fixed, **point} for point in points]
    return factory(points_to_evaluate=points, **args)


def fixed_parameters(tune_space: Mapping[str, Any]) -> dict[str, Any]:
    """The space's constants named as AxSearch names them: it makes each a fixed parameter of Ax's search space
    (``"net/depth"``, ``"layers/0"``), and Ax's ``attach_trial`` refuses a point without all of them."""
    from ray.tune.search.variant_generator import parse_spec_vars

    resolved, _, _ = parse_spec_vars(dict(tune_space))
    return {"/".join(str(p) for p in path): value for path, value in resolved}


def _is_tune_searcher(searcher: Any, name: str) -> bool:
    return any(
        cls.__name__ == name and cls.__module__.startswith("ray.tune.search.")
        for cls in type(inner_searcher(searcher)).__mro__
    )


def own_objective(obj: Any) -> tuple[Any, Any]:
    """The metric and mode ``obj`` (a scheduler or searcher) was built with. A searcher shows both; a scheduler
    shows its metric only, its mode is in ``_mode`` (a ResourceChangingScheduler's metric and mode are its base's)."""
    base = getattr(obj, "_base_scheduler", obj)
    return getattr(obj, "metric", None), getattr(base, "mode", getattr(base, "_mode", None))


def carries_objective(obj: Any) -> bool:
    metric, mode = own_objective(obj)
    return bool(metric or mode)


def check_own_objective(obj: Any, what: str, metric: str, mode: str) -> None:
    """Refuse a factory's scheduler or searcher built for another metric or mode than the spec's."""
    own_metric, own_mode = own_objective(obj)
    if isinstance(own_metric, (list, tuple)):
        return  # several objectives: not compared with the spec's one here
    if (own_metric and own_metric != metric) or (own_mode and own_mode != mode):
        raise EngineError(
            f"{what} built a {type(obj).__name__} for metric {own_metric!r}, mode {own_mode!r}, but the spec's "
            f"metric and mode are {metric!r}, {mode!r} (the best trial is picked by them): build it without its own "
            "metric and mode (Tune gives it the spec's), or with the spec's"
        )


def check_searcher_objective(searcher: Any, what: str) -> None:
    """With a scheduler carrying its own metric and mode, Tune gives the searcher none: it needs its own."""
    from ray.tune.search import Searcher

    inner = inner_searcher(searcher)
    if isinstance(inner, Searcher) and not (inner.metric and inner.mode):
        raise EngineError(
            f"scheduler.factory built a scheduler carrying its own metric and mode, so Tune gives the searcher none, "
            f"and the {type(inner).__name__} {what} built has none (Tune raises at its first suggestion): build it "
            "with metric and mode too, or build the scheduler without them"
        )


def check_ax_platform(searcher: Any) -> None:
    """Refuse an AxSearch whose ax-platform its Ray cannot drive, before the experiment starts: Ray's AxSearch (2.43 to
    2.60) reads ``Objective.metric``, which ax-platform 1.3 removed, and fails at its first trial with an
    AttributeError that names neither package."""
    if not _is_tune_searcher(searcher, "AxSearch"):
        return
    from importlib.metadata import version

    from ax.core.objective import Objective

    if not hasattr(Objective, "metric"):
        raise EngineError(
            f"AxSearch cannot run with ax-platform {version('ax-platform')} on the cluster: Ray's AxSearch reads "
            "Objective.metric, which ax-platform 1.3 removed; install ax-platform<1.3 on the cluster "
            "(docker/requirements-ray-searchers.txt)"
        )
