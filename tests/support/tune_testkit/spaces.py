"""A trainable for the search-space tests: it reports once, and the trial's config is what the test reads back (every
trial's config is in the experiment's trials.json)."""

from __future__ import annotations

from ray import tune


def reports_once(config: dict) -> None:
    tune.report({"score": 1.0})
