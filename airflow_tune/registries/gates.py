"""The promotion gates, shared by both registries (S3 and MLflow): whether a tuning winner replaces the champion."""

from __future__ import annotations

import math
from typing import Any

GATES = ("always", "better_than_champion", "threshold")


def beats(value: float | None, other: float | None, mode: str, *, inclusive: bool = False) -> bool:
    """Whether ``value`` is better than ``other`` under ``mode`` (``min``/``max``)."""
    # A result's NaN and infinities are the strings "NaN"/"Infinity" in strict JSON: never better than anything.
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return False
    if other is None:
        return True
    if inclusive:
        return value <= other if mode == "min" else value >= other
    return value < other if mode == "min" else value > other


def gate_decision(
    gate: str,
    *,
    metric: str,
    mode: str,
    value: float | None,
    threshold: float | None,
    has_champion: bool,
    champion_value: float | None,
    incomparable: str | None = None,
) -> tuple[bool, str]:
    """``(promote, reason)`` for a winner with ``value`` of ``metric``.

    :param has_champion: whether the registry has a champion at all.
    :param champion_value: the champion's value of the same metric.
    :param incomparable: why the champion has no value to compare with (e.g. it was not promoted by airflow-tune);
        the winner is then compared with nothing, and the reason says so.
    """
    if gate == "always":
        return True, "gate 'always'"
    if gate == "threshold":
        ok = beats(value, threshold, mode, inclusive=True)
        return ok, f"{metric}={value} {'reaches' if ok else 'misses'} threshold {threshold} ({mode})"
    if not has_champion:
        return beats(value, None, mode), f"no champion yet; {metric}={value}"
    if incomparable:
        ok = beats(value, None, mode)
        return ok, f"{incomparable}: compared with nothing; {metric}={value}"
    ok = beats(value, champion_value, mode)
    return ok, f"{metric}={value} {'beats' if ok else 'does not beat'} champion {champion_value} ({mode})"


def decision_record(
    promoted: bool, reason: str, *, champion: Any, metric: str, mode: str, value: float | None
) -> dict[str, Any]:
    """A promote task's return value as the gate leaves it (both registries): ``version``, ``uri`` and ``model_uri``
    are filled once the promotion is written."""
    return {
        "promoted": promoted,
        "version": None,
        "uri": None,
        "model_uri": None,
        "reason": reason,
        "champion": champion,
        "metric": metric,
        "mode": mode,
        "value": value,
    }
