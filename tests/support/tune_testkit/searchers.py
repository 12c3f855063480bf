"""Searcher factories for the ``search.factory`` field of a spec (the Tuner sets metric and mode)."""

from __future__ import annotations

from typing import Any


def needs_missing_package(**kwargs: Any) -> Any:
    """A factory whose searcher needs a package the cluster does not have."""
    import airflow_tune_missing_searcher_pkg  # noqa: F401  (does not exist, on purpose)

    raise AssertionError("unreachable")
