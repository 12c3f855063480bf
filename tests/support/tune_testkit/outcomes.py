"""Trainables for the tests of how Tune's own policies end an experiment (a time budget, fail_fast)."""

from __future__ import annotations

import time

from ray import tune


def fails_at(config: dict) -> None:
    """Reports a loss every ``sleep`` seconds for ``steps`` steps; the trial with ``x == fail_x`` raises instead of
    reporting its step ``fail_step``, so its own exception is what fail_fast must show."""
    for step in range(int(config["steps"])):
        time.sleep(float(config["sleep"]))
        if config["x"] == config.get("fail_x") and step == config.get("fail_step"):
            raise ValueError(f"boom at step {step} of x={config['x']}")
        tune.report({"loss": (config["x"] - 3) ** 2 + 1.0 / (step + 1), "step": step})
