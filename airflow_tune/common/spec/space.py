"""The search-space grammar: declarative JSON primitives (``{"loguniform": [1e-4, 1e-1]}``), their checks, the forms
Ray Tune would run as code, the import paths a space names, and the JSON schema a trigger form can check a space with.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from airflow_tune.common.spec.errors import Errors, is_int, is_number

#: Tune's parameter names of each number primitive, in Tune's order, and how many of them are required (the rest
#: have Tune's defaults): ``ray/tune/search/sample.py``, the same names in Ray 2.43 to 2.60. A primitive's arguments
#: are a list, bound by position, or an object, bound by these names (``{"qrandn": {"mean": 100, "sd": 20, "q": 1}}``).
PARAMETERS: dict[str, tuple[tuple[str, ...], int]] = {
    "uniform": (("lower", "upper"), 2),
    "quniform": (("lower", "upper", "q"), 3),
    "loguniform": (("lower", "upper", "base"), 2),
    "qloguniform": (("lower", "upper", "q", "base"), 3),
    "randn": (("mean", "sd"), 0),
    "qrandn": (("mean", "sd", "q"), 3),
    "randint": (("lower", "upper"), 2),
    "qrandint": (("lower", "upper", "q"), 2),
    "lograndint": (("lower", "upper", "base"), 2),
    "qlograndint": (("lower", "upper", "q", "base"), 3),
}
#: Tune's defaults of the optional parameters that can come before a given one (``randn(mean=0.0, sd=1.0)``,
#: ``qrandint(q=1)``); a log ``base`` is last and has none (Tune ignores it from 2.50 on, and so does the engine).
DEFAULTS: dict[tuple[str, str], Any] = {("randn", "mean"): 0.0, ("randn", "sd"): 1.0, ("qrandint", "q"): 1}

#: Search-space primitives and how many positional arguments each takes (min, max).
PRIMITIVES: dict[str, tuple[int, int]] = {
    **{name: (required, len(names)) for name, (names, required) in PARAMETERS.items()},
    "choice": (1, 1),
    "grid_search": (1, 1),
    "sample_from": (1, 1),
    "const": (1, 1),
}
_INT_PRIMITIVES = {"randint", "qrandint", "lograndint", "qlograndint"}
_LOG_PRIMITIVES = {"loguniform", "qloguniform", "lograndint", "qlograndint"}

# ``\Z``, not ``$``: ``$`` also matches before a trailing newline, which would let "name\n" through.
IMPORT_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z"
)


def primitive_of(node: Any) -> str | None:
    """The primitive a search-space node names (``{"uniform": [0, 1]}`` -> ``"uniform"``), or None for a plain value."""
    if isinstance(node, Mapping) and len(node) == 1:
        (key,) = node.keys()
        if key in PRIMITIVES:
            return str(key)
    return None


#: Names people write for a primitive Tune spells otherwise.
_ALIASES = {"normal": "randn", "qnormal": "qrandn", "loguniform_int": "lograndint", "sample": "sample_from"}


def _normal(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


def _looks_like_arguments(name: str, value: Any) -> bool:
    """Whether ``value`` has the form of ``name``'s arguments (see :func:`misread_primitive`)."""
    if name in ("choice", "grid_search"):
        return isinstance(value, list) and bool(value)
    if name == "sample_from":
        return isinstance(value, str) and bool(IMPORT_PATH.match(value))
    if name == "const":
        return False
    values = list(value.values()) if isinstance(value, Mapping) else value
    low, high = PRIMITIVES[name]
    return isinstance(values, list) and low <= len(values) <= high and all(is_number(v) for v in values)


def _close_primitive(key: str) -> str | None:
    text = _normal(key)
    for name in PRIMITIVES:
        if _normal(name) == text:
            return name
    if text in _ALIASES:
        return _ALIASES[text]
    names = {_normal(n): n for n in PRIMITIVES if n != "const"}
    close = difflib.get_close_matches(text, list(names), n=1, cutoff=0.8)
    # A plural ("choices") is an English word a nested config may use; a typo of a primitive is not.
    return names[close[0]] if close and text.rstrip("s") != close[0] else None


def misread_primitive(node: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a mapping that is not a primitive would be read as one by its author, with the fix; None if it is not.

    The rule never refuses a plausible nested config; it refuses a mapping only when one of its keys:

    - is a primitive's name up to case, underscores and small typos (difflib ratio >= 0.8; a trailing "s" is a
      plural, not a typo; ``const`` only up to case and underscores) or a common alias (``normal`` for ``randn``),
    - and holds that primitive's argument form: a list (or object) of numbers of the primitive's arity, a non-empty
      list for ``choice``/``grid_search``, an import path for ``sample_from``;
    - and, for a primitive's exact name (not ``const``), the mapping has other keys (``{"uniform": [0, 1], "q": 0.1}``).

    ``{"model": {"layers": 3}}``, ``{"choices": [1, 2]}`` and ``{"sample": 0.1}`` stay nested configs.
    """
    for key, value in node.items():
        if not isinstance(key, str):
            continue
        if key in PRIMITIVES:
            if len(node) > 1 and _looks_like_arguments(key, value):
                others = ", ".join(repr(k) for k in node if k != key)
                return (
                    f"a primitive is a one-key object, and {key!r} comes with {others}",
                    f'write {{"{key}": ...}} alone (its arguments go in its list'
                    + (', e.g. {"quniform": [low, high, q]}' if key == "uniform" else "")
                    + ")",
                )
            continue
        close = _close_primitive(key)
        if close is not None and _looks_like_arguments(close, value):
            return (
                f"unknown search-space primitive {key!r}",
                f"did you mean {close!r}? The primitives are {', '.join(PRIMITIVES)}",
            )
    return None


def tune_grid_nodes(value: Any, path: str) -> list[tuple[str, Any]]:
    """Every one-key ``{"grid_search": ...}`` mapping below ``value``: Tune expands each into a grid, wherever it is
    in a config (``ray/tune/search/variant_generator.py``, ``_try_resolve``)."""
    return mappings_where(value, path, lambda node: len(node) == 1 and "grid_search" in node)


def mappings_where(value: Any, path: str, matches: Callable[[Mapping[Any, Any]], bool]) -> list[tuple[str, Any]]:
    """Every mapping below ``value`` (at any depth, through lists) that ``matches``, with its path, sorted by path;
    a matching mapping's own values are not searched further."""
    found: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Mapping):
            if matches(node):
                found.append((where, node))
                continue
            stack.extend((f"{where}.{k}", v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))
    return sorted(found, key=lambda item: item[0])


def check_param_space(space: Mapping[str, Any], path: str, errors: Errors) -> None:
    """The root of a search space maps parameter names to nodes; it is never a primitive itself (a parameter may be
    called "choice" or "sample"), which is also how the engine reads it."""
    for key, child in space.items():
        if not isinstance(key, str):
            errors.add(path, key, "search-space keys must be strings", "use string parameter names")
            continue
        check_space(child, f"{path}.{key}", errors)


def check_space(node: Any, path: str, errors: Errors) -> None:
    """One search-space node: a primitive with its arguments, a nested config, a list or a constant.

    A mapping that reads as a primitive but is not one is refused (:func:`misread_primitive`); values inside
    ``choice``/``grid_search`` are checked like any node.
    """
    name = primitive_of(node)
    if name is None:
        if isinstance(node, Mapping):
            misread = misread_primitive(node)
            if misread is not None:
                problem, fix = misread
                errors.add(path, node, problem, fix + ', or {"const": {...}} for a plain nested value')
                return
            check_param_space(node, path, errors)
            return
        if isinstance(node, list):
            for i, child in enumerate(node):
                if primitive_of(child) is not None or isinstance(child, (Mapping, list)):
                    check_space(child, f"{path}[{i}]", errors)
        return
    args = node[name]
    if name in ("choice", "grid_search"):
        if not isinstance(args, list) or not args:
            errors.add(path, node, f"{name} needs a non-empty list of values", f'write {{"{name}": [v1, v2, ...]}}')
            return
        for i, value in enumerate(args):
            check_space(value, f"{path}.{name}[{i}]", errors)
        return
    if name == "sample_from":
        if not isinstance(args, str) or not IMPORT_PATH.match(args):
            errors.add(
                path,
                node,
                "sample_from takes an import path, never code",
                'write {"sample_from": "package.module:function"}; the function receives the config',
            )
        return
    if name == "const":
        for where, grid in tune_grid_nodes(args, f"{path}.const"):
            errors.add(
                where,
                grid,
                'Tune expands every one-key {"grid_search": [...]} object into a grid, inside const too',
                "use grid_search itself, or give the object another key",
            )
        return
    low_n, high_n = PRIMITIVES[name]
    if isinstance(args, Mapping):
        try:
            args = positional_arguments(name, args)
        except ArgumentNameError as exc:
            errors.add(path, node, exc.problem, exc.fix)
            return
    if not isinstance(args, list):
        errors.add(path, node, f"{name} takes a list of numbers", _write(name))
        return
    if not (low_n <= len(args) <= high_n):
        errors.add(path, node, f"{name} takes {_arg_names(name)}", _write(name))
        return
    if not all(is_number(a) for a in args):
        errors.add(path, node, f"{name} takes finite numbers only", f"write [{_arg_names(name)}] as numbers")
        return
    if name in ("randn", "qrandn"):
        if len(args) >= 2 and args[1] <= 0:
            errors.add(path, node, "the standard deviation must be > 0", "give a positive sd")
        if name == "qrandn" and args[2] <= 0:
            errors.add(path, node, "q must be > 0", "give a positive quantization step")
        return
    low, high = args[0], args[1]
    if low >= high:
        errors.add(path, node, f"lower bound {low} is not below upper bound {high}", "swap or widen the bounds")
    if name in _LOG_PRIMITIVES and low <= 0:
        errors.add(path, node, f"{name} needs a lower bound > 0 (log scale)", "use a positive lower bound")
    if name in _INT_PRIMITIVES and not (is_int(low) and is_int(high)):
        errors.add(path, node, f"{name} needs integer bounds", "write the bounds without a decimal point")
    if name in ("quniform", "qloguniform", "qrandint", "qlograndint") and len(args) >= 3:
        q = args[2]
        if q <= 0:
            errors.add(path, node, "q must be > 0", "give a positive quantization step")
        elif name in ("qrandint", "qlograndint") and not is_int(q):
            errors.add(path, node, "q must be an integer for integer primitives", "use an integer step")
    base_at = 3 if name in ("qloguniform", "qlograndint") else 2
    if name in _LOG_PRIMITIVES and len(args) > base_at and args[base_at] <= 1:
        errors.add(path, node, "the log base must be > 1", "use base 10 or e")


def _arg_names(name: str) -> str:
    """A primitive's arguments by Tune's names, the optional ones in brackets: ``lower, upper, q[, base]``."""
    if name not in PARAMETERS:
        return "values"
    names, required = PARAMETERS[name]
    if required == 0:
        return f"[{', '.join(names)}]"
    return ", ".join(names[:required]) + "".join(f"[, {n}]" for n in names[required:])


def _write(name: str) -> str:
    """How to write a primitive's arguments: by position, or by Tune's names."""
    names, required = PARAMETERS[name]
    shown = names[:required] or names
    positional = _arg_names(name) if required else ", ".join(names)
    by_name = ", ".join(f'"{n}": ...' for n in shown)
    return f'write {{"{name}": [{positional}]}} or by name, {{"{name}": {{{by_name}}}}}'


class ArgumentNameError(ValueError):
    """A primitive's arguments given by name that Tune's function does not take, or that lack a required one."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


def positional_arguments(name: str, args: Mapping[str, Any]) -> list[Any]:
    """The arguments of number primitive ``name`` given by name, in Tune's order, as the engine passes them.

    Bound by Tune's parameter names (:data:`PARAMETERS`), never by the order of the object's keys (the spec file is
    written with sorted keys): ``{"qrandn": {"mean": 100, "sd": 20, "q": 0.5}}`` is ``qrandn(100, 20, 0.5)``. An
    optional argument left out before a given one takes Tune's default (``{"randn": {"sd": 5}}`` is
    ``randn(0.0, 5)``). Raises :class:`ArgumentNameError` for a name Tune does not take (with a did-you-mean) and for
    a missing required one.
    """
    names, required = PARAMETERS[name]
    unknown = [key for key in args if key not in names]
    if unknown:
        close = {str(k): difflib.get_close_matches(str(k).lower(), names, n=1, cutoff=0.6) for k in unknown}
        hints = [f"{m[0]!r} (for {k!r})" for k, m in close.items() if m]
        shown = ", ".join(repr(k) for k in unknown)
        raise ArgumentNameError(
            f"{name} takes the arguments {', '.join(names)} (Tune's names), not {shown}",
            (f"did you mean {', '.join(hints)}? " if hints else "") + _write(name),
        )
    missing = [n for n in names[:required] if n not in args]
    if missing:
        raise ArgumentNameError(
            f"{name} needs {', '.join(names[:required])}; {', '.join(repr(n) for n in missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing",
            _write(name),
        )
    last = max((names.index(key) for key in args), default=-1)
    out = []
    for position in range(last + 1):
        key = names[position]
        if key in args:
            out.append(args[key])
        elif (name, key) in DEFAULTS:
            out.append(DEFAULTS[(name, key)])
        else:  # pragma: no cover - only a trailing base lacks a default, and nothing comes after it
            raise ArgumentNameError(f"{name} needs {key} before the arguments after it", _write(name))
    return out


def bound_arguments(name: str, args: Any) -> list[Any]:
    """A number primitive's arguments as a positional list: a list as it is, an object bound by Tune's names."""
    if isinstance(args, Mapping):
        return positional_arguments(name, args)
    return list(args) if isinstance(args, (list, tuple)) else []


def grids(node: Any, path: str) -> list[tuple[str, Any]]:
    """Every grid_search node in a space, with its path."""
    if primitive_of(node) == "grid_search":
        return [(path, node)]
    if isinstance(node, Mapping) and primitive_of(node) is None:
        return [g for k, v in node.items() for g in grids(v, f"{path}.{k}")]
    return []


#: The dict keys Ray Tune's decoders act on, so no data may carry them, as a key of any mapping at any depth:
#:
#: - ``"eval"``: Tune runs ``{"eval": "<python>"}`` as Python wherever it meets it in a config, a sampled ``choice``
#:   value or a point to evaluate (``ray/tune/search/variant_generator.py``, ``_try_resolve``).
#: - ``"_type"``: Tune's JSON state decoder (``ray/tune/utils/serialization.py``, ``TuneFunctionDecoder.object_hook``)
#:   ``cloudpickle.loads`` any ``{"_type": "CLOUDPICKLE_FALLBACK", "value": "<hex>"}`` when it reads an experiment back
#:   (``Tuner.restore``, ``ExperimentAnalysis``, a trial's metadata), and trial configs are written into that state
#:   verbatim: a config holding such a dict is a pickle.
#:
#: ``tests/unit/common/test_tune_decoders.py`` walks Ray Tune's source for every decoder call site and every key
#: they test, so a new marker in a later Ray fails a test instead of passing silently. Everything else a spec holds is
#: plain JSON that no Tune decoder turns into code (``grid_search`` expands to values; ``Domain`` objects and
#: callables cannot be written in JSON).
TUNE_DECODER_KEYS = frozenset({"eval", "_type"})
#: The older name, kept for imports.
TUNE_CODE_KEYS = TUNE_DECODER_KEYS


def tune_code_nodes(value: Any, path: str) -> list[tuple[str, Any]]:
    """Every mapping below ``value`` with a key a Tune decoder acts on (:data:`TUNE_DECODER_KEYS`), with its path."""
    return mappings_where(value, path, lambda node: any(isinstance(k, str) and k in TUNE_DECODER_KEYS for k in node))


def decoder_keys_of(node: Mapping[str, Any]) -> list[str]:
    """The keys of ``node`` that a Ray Tune decoder acts on."""
    return sorted(key for key in node if isinstance(key, str) and key in TUNE_DECODER_KEYS)


def non_finite_numbers(value: Any, path: str) -> list[tuple[str, float]]:
    """Every NaN or infinite float below ``value``, with its path: strict JSON has no such numbers."""
    found: list[tuple[str, float]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            found.append((where, node))
        elif isinstance(node, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))
    return sorted(found, key=lambda item: item[0])


def space_code_references(node: Any, path: str) -> list[tuple[str, str]]:
    """The ``sample_from`` import paths of a search-space node, where the engine resolves them (not inside const)."""
    name = primitive_of(node)
    if name == "sample_from":
        return [(path, node["sample_from"])] if isinstance(node["sample_from"], str) else []
    if name == "const":
        return []
    if name in ("choice", "grid_search"):
        values = node[name] if isinstance(node[name], list) else []
        return [ref for i, v in enumerate(values) for ref in space_code_references(v, f"{path}.{name}[{i}]")]
    if name is not None:
        return []
    if isinstance(node, Mapping):
        return [ref for k, v in node.items() for ref in space_code_references(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [ref for i, v in enumerate(node) for ref in space_code_references(v, f"{path}[{i}]")]
    return []
