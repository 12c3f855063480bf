"""How a rendered operator argument becomes a spec value.

A template renders to a string unless the DAG sets ``render_template_as_native_obj=True``, which renders Python
values. Strings are read by the kind of field: JSON (``'{{ params.space | tojson }}'``), the Python literal that
``{{ params.space }}`` renders (read with :func:`ast.literal_eval`, which builds values and never runs code), numbers
and booleans written as text, and bare names where a field offers them (``scheduler="asha"``).
"""

from __future__ import annotations

import ast
import json
from typing import Any

_STRING_FIELDS = {"trainable", "metric", "mode", "storage_path", "errored_trials", "best_scope"}
_BOOL_FIELDS = {"reuse_actors"}
#: Fields that also take a list (several objectives: metric=["loss", "acc"], mode=["min", "max"]).
_LIST_OR_STRING_FIELDS = {"metric", "mode"}
# A bare name ("asha", "optuna") or a "pkg.mod:factory" path is offered besides a JSON object (a custom stopper's
# "pkg.mod:MyStopper" for stop).
_NAME_OR_JSON_FIELDS = {"scheduler", "search", "stop"}


def coerce_rendered(name: str, value: Any) -> Any:
    """One argument's value from what rendering gave: a Python value as it is; a string read by the field's kind."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if name in _LIST_OR_STRING_FIELDS and text.startswith("["):
        # Several objectives ('{{ params.metrics | tojson }}' or '{{ params.metrics }}'); a name never starts so.
        return _json_shaped(name, _literal(name, text))
    if name in _STRING_FIELDS or name == "experiment_name":
        # '{{ params.mode | tojson }}' renders the JSON string '"max"'; a name or path never starts with a quote.
        if len(text) >= 2 and text[0] == text[-1] == '"':
            try:
                decoded = json.loads(text)
            except json.JSONDecodeError:
                return value
            return decoded if isinstance(decoded, str) else value
        return value
    if name in _NAME_OR_JSON_FIELDS and text and text[0] not in "{[\"'":
        return text
    if name in _BOOL_FIELDS and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text in ("", "None", "null") and name not in _BOOL_FIELDS:
        return None
    return _literal(name, text)


def _literal(name: str, text: str) -> Any:
    """JSON text, or the Python literal a template renders (read with :func:`ast.literal_eval`)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        json_error = exc
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(
            f"{name} = {text[:80]!r}: not valid JSON after rendering ({json_error}); render a JSON value, e.g. with "
            "'{{ params.x | tojson }}', or set render_template_as_native_obj=True on the DAG"
        ) from None
    return _json_shaped(name, parsed)


def _json_shaped(name: str, value: Any) -> Any:
    """A Python literal as the JSON value it stands for (tuples become lists); refuse what JSON cannot hold."""
    if isinstance(value, (tuple, list)):
        return [_json_shaped(name, v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"{name}: keys must be strings, got {sorted(map(repr, value))[:5]}")
        return {k: _json_shaped(name, v) for k, v in value.items()}
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise ValueError(f"{name}: {type(value).__name__} values cannot be part of a spec; use JSON values")
