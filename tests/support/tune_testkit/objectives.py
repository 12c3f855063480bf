"""A trainable of two objectives that pull apart: ``loss = x + y`` (min) and ``acc = x`` (max). Its first result is
worse in both than its last, so a front built from any result but the last would differ."""

from __future__ import annotations

from ray import tune


def two_objectives(config: dict) -> None:
    x, y = config["x"], config["y"]
    tune.report({"loss": x + y + 10.0, "acc": x - 10.0})
    tune.report({"loss": x + y, "acc": x})
