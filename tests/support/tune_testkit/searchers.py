"""Searcher factories for the ``search.factory`` field of a spec."""

from __future__ import annotations

from typing import Any


def needs_missing_package(metric: str, mode: str, points_to_evaluate: Any = None, **kwargs: Any) -> Any:
    """A factory whose searcher needs a package the cluster does not have."""
    import airflow_tune_missing_searcher_pkg  # noqa: F401  (does not exist, on purpose)

    raise AssertionError("unreachable")


def optuna_seeded(metric: str, mode: str, points_to_evaluate: Any = None, **kwargs: Any) -> Any:
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(metric=metric, mode=mode, points_to_evaluate=points_to_evaluate, seed=kwargs.get("seed", 1))
