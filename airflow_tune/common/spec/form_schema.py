"""A JSON schema of a flat search space, for trigger forms (Airflow ``Param``): what a UI may offer, narrower than
the spec's grammar (:mod:`.space`), whose checks still apply to what passes."""

from __future__ import annotations

from typing import Any

from airflow_tune.common.spec.space import PRIMITIVES

_SCALAR_SCHEMA: dict[str, Any] = {"type": ["number", "string", "boolean", "null"]}


def search_space_schema(primitives: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A JSON schema of a flat search space: each parameter is one primitive with its exact arguments.

    For trigger forms (Airflow ``Param``): values inside ``choice``/``grid_search`` are scalars, and no other key is
    accepted anywhere, so a form cannot carry nested configs. Parameter names are identifiers of at most 64
    characters. The operator's own checks still apply to what passes.

    :param primitives: the primitives to offer; by default every number primitive plus choice and grid_search
        (``compatibility.searcher_primitives(name)`` gives those one searcher takes).
    """
    numbers = {"type": "array", "items": {"type": "number"}}
    offered = primitives or tuple(p for p in PRIMITIVES if p not in ("sample_from", "const"))
    options = []
    for name in offered:
        if name not in PRIMITIVES or name in ("sample_from", "const"):
            raise ValueError(f"primitive {name!r}: a form offers only {', '.join(PRIMITIVES)} minus sample_from/const")
        low, high = PRIMITIVES[name]
        if name in ("choice", "grid_search"):
            args: dict[str, Any] = {"type": "array", "minItems": 1, "items": _SCALAR_SCHEMA}
        else:
            args = {**numbers, "minItems": low, "maxItems": high}
        options.append(
            {"type": "object", "properties": {name: args}, "required": [name], "additionalProperties": False}
        )
    return {
        "type": "object",
        "minProperties": 1,
        # ``$`` also matches before a trailing newline in Python's re.search (what jsonschema uses), so "lr\n" would
        # pass; ``(?![\s\S])`` is end-of-string in both ECMA-262 (the browser's form) and Python.
        "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,63}(?![\s\S])", "maxLength": 64},
        "additionalProperties": {"oneOf": options},
    }
