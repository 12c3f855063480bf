"""Strict JSON for every file the product writes (spec.json, progress.json, result.json, model.json, champion.json).

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which a browser's ``JSON.parse`` and most JSON parsers
refuse. Metrics and configs can hold such numbers (a diverged loss is NaN), so they are encoded explicitly, as
protobuf's JSON mapping does: the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``. Objects JSON cannot hold
become their ``repr``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

NAN, POS_INF, NEG_INF = "NaN", "Infinity", "-Infinity"


def encode_float(value: float) -> float | str:
    if math.isnan(value):
        return NAN
    if math.isinf(value):
        return POS_INF if value > 0 else NEG_INF
    return value


def strict(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps(..., allow_nan=False)`` accepts."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return encode_float(value)
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return repr(value)
    if type(value).__name__.startswith("bool"):  # numpy.bool_
        return bool(value)
    try:  # numpy scalars and the like
        number = float(value)
    except (TypeError, ValueError):
        return repr(value)
    return int(number) if number.is_integer() and "int" in type(value).__name__ else encode_float(number)


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict` ``(value)``: never a NaN or Infinity token."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)
