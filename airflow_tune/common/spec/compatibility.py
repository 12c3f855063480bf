"""Which search spaces each named searcher takes, and the combinations of fields Tune refuses only once it runs.

The table is read from each searcher's ``convert_search_space`` in Ray 2.43 to 2.60 (``ray/tune/search/<name>/``):
what a searcher raises on fails the job on the cluster, and what it only warns about (a dropped quantization or log
scale) samples another distribution than the spec says. Both are refused here, naming the field, the searcher and
the fix. ``random`` and ``grid`` are one searcher, Tune's ``BasicVariantGenerator``, which samples every primitive
and expands every grid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_tune.common.spec.errors import Errors, is_number
from airflow_tune.common.spec.points import missing_paths
from airflow_tune.common.spec.space import (
    PARAMETERS,
    PRIMITIVES,
    ArgumentNameError,
    bound_arguments,
    check_space,
    misread_primitive,
    primitive_of,
)

_NUMBERS = ("uniform", "quniform", "loguniform", "qloguniform", "randn", "qrandn")
_INTEGERS = ("randint", "qrandint", "lograndint", "qlograndint")


@dataclass(frozen=True)
class Refusal:
    """Why a searcher cannot take a primitive, and what to write instead; ``when`` narrows it to some arguments."""

    why: str
    instead: str
    when: Callable[[list[Any]], bool] | None = None


@dataclass(frozen=True)
class Takes:
    """What one searcher takes.

    :param refused: the primitives it cannot take, with why.
    :param choice_values: what values inside ``choice`` may hold: ``"any"`` (Tune samples primitives found in a
        sampled value), ``"spaces"`` (HyperOpt converts primitives in a choice's values, and objects of them, but
        not lists of them) or ``"plain"`` (a primitive reaches the trainable as an unsampled Domain object).
    :param in_lists: whether primitives may sit inside lists (Optuna and BayesOpt name parameters by joining their
        path with "/", which fails on a list index with a TypeError).
    :param slash_keys: whether keys may hold "/" (Optuna and BayesOpt flatten the space with "/" and raise
        ValueError on a key that holds one).
    """

    refused: Mapping[str, Refusal] = field(default_factory=dict)
    choice_values: str = "any"
    in_lists: bool = True
    slash_keys: bool = True


_RANDOM = "the random searcher"
_GRID = Refusal("raises ValueError: grid_search cannot be converted to its search space", f'use "choice", or {_RANDOM}')
_SAMPLE_FROM = Refusal(
    "raises ValueError: a sample_from function is none of its distributions",
    f"use choice or a range primitive, or {_RANDOM}",
)
_BAYES_BOUNDS = "takes [low, high] bounds of floats only"

#: Per named searcher (``SEARCHERS``), what its ``convert_search_space`` does with each primitive.
SEARCHER_SPACES: dict[str, Takes] = {
    "random": Takes(),
    "grid": Takes(),
    "optuna": Takes(
        refused={
            "randn": Refusal(
                "raises ValueError: Optuna has no normal distribution", f"use uniform, or the hyperopt or {_RANDOM[4:]}"
            ),
            "qrandn": Refusal(
                "raises ValueError: Optuna has no normal distribution",
                f"use quniform, or the hyperopt or {_RANDOM[4:]}",
            ),
            "qloguniform": Refusal(
                "drops the quantization (a warning only) and samples loguniform",
                f"use loguniform, or the hyperopt or {_RANDOM[4:]}",
            ),
            "qlograndint": Refusal(
                "raises ValueError: Optuna takes no step > 1 on a log scale",
                f"use lograndint (or q 1), or the hyperopt or {_RANDOM[4:]}",
                when=lambda args: len(args) >= 3 and args[2] != 1,
            ),
            "sample_from": _SAMPLE_FROM,
            "grid_search": _GRID,
        },
        choice_values="plain",
        in_lists=False,
        slash_keys=False,
    ),
    "hyperopt": Takes(refused={"sample_from": _SAMPLE_FROM, "grid_search": _GRID}, choice_values="spaces"),
    "bayesopt": Takes(
        refused={
            **{
                name: Refusal(
                    f"{_BAYES_BOUNDS}: it samples uniform between the bounds, dropping {what} (a warning only)",
                    f"use uniform, or the optuna, hyperopt or {_RANDOM[4:]}",
                )
                for name, what in (
                    ("quniform", "the quantization"),
                    ("loguniform", "the log scale"),
                    ("qloguniform", "the log scale and the quantization"),
                )
            },
            **{
                name: Refusal(
                    f"{_BAYES_BOUNDS}: a normal distribution has no bounds",
                    f"use uniform, or the hyperopt or {_RANDOM[4:]}",
                )
                for name in ("randn", "qrandn")
            },
            **{
                name: Refusal(
                    f"raises ValueError: it {_BAYES_BOUNDS}, no integers",
                    f"use uniform and round in the trainable, or the optuna, hyperopt or {_RANDOM[4:]}",
                )
                for name in _INTEGERS
            },
            "choice": Refusal(
                f"raises ValueError: it {_BAYES_BOUNDS}, no categories",
                f"use the optuna, hyperopt or {_RANDOM[4:]}",
            ),
            "sample_from": _SAMPLE_FROM,
            "grid_search": _GRID,
        },
        in_lists=False,
        slash_keys=False,
    ),
}


def searcher_primitives(name: str) -> tuple[str, ...]:
    """The primitives a trigger form may offer for searcher ``name`` (for ``search_space_schema(primitives=...)``)."""
    refused = SEARCHER_SPACES[name].refused
    return tuple(p for p in PRIMITIVES if p not in ("sample_from", "const") and p not in refused)


def check_searcher_space(name: str, space: Mapping[str, Any], errors: Errors) -> None:
    """Every node of ``space`` (a checked ``param_space``) that searcher ``name`` cannot take, with the fix."""
    takes = SEARCHER_SPACES.get(name)
    if takes is None or takes == Takes():
        return
    has_primitive = _walk(name, takes, space, "param_space", errors, in_choice=False, in_list=False, root=True)
    if not takes.slash_keys and has_primitive:
        hits = [(f"param_space.{k}", k) for k in space if "/" in str(k)]
        hits += [hit for key, child in space.items() for hit in _slash_keys(child, f"param_space.{key}")]
        for path, key in hits:
            errors.add(
                path,
                key,
                f"the {name} searcher names parameters by their path joined with '/', and raises ValueError on a "
                "key that holds one",
                f"rename the key without '/', or use {_RANDOM}",
            )


def _walk(
    name: str, takes: Takes, node: Any, path: str, errors: Errors, *, in_choice: bool, in_list: bool, root: bool
) -> bool:
    """Check ``node``; return whether it holds a primitive (const aside)."""
    primitive = None if root else primitive_of(node)
    if primitive == "const":
        return False
    if primitive is not None:
        args = node[primitive]
        listed = _listed(primitive, args)
        refusal, count = takes.refused.get(primitive), len(errors.items)
        if refusal is not None and (refusal.when is None or refusal.when(listed)):
            errors.add(path, node, f"the {name} searcher {refusal.why}", refusal.instead)
        elif in_choice and (takes.choice_values == "plain" or (in_list and takes.choice_values == "spaces")):
            where = "in a list in a choice's value" if in_list else "in a choice's value"
            errors.add(
                path,
                node,
                f"the {name} searcher does not sample a primitive {where}: the trainable would get an unsampled "
                "Domain object",
                f"list plain values in the choice, or use {'an object of primitives, or ' if in_list else ''}{_RANDOM}",
            )
        elif not in_choice and in_list and not takes.in_lists:
            errors.add(
                path,
                node,
                f"the {name} searcher cannot take a primitive inside a list (it raises TypeError naming it)",
                f"use an object with a key per item, or {_RANDOM}",
            )
        # A refused node is named once, not again for what its values hold.
        if len(errors.items) == count and primitive in ("choice", "grid_search") and isinstance(args, list):
            for i, value in enumerate(args):
                _walk(name, takes, value, f"{path}.{primitive}[{i}]", errors, in_choice=True, in_list=False, root=False)
        return True
    found = False
    if isinstance(node, Mapping):
        for key, child in node.items():
            found |= _walk(
                name, takes, child, f"{path}.{key}", errors, in_choice=in_choice, in_list=in_list, root=False
            )
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found |= _walk(name, takes, child, f"{path}[{i}]", errors, in_choice=in_choice, in_list=True, root=False)
    return found


def _listed(primitive: str, args: Any) -> list[Any]:
    """A primitive's arguments by position (an object of arguments bound by Tune's names), or [] when they are not
    arguments Tune takes (``check_space`` names that)."""
    if primitive not in PARAMETERS:
        return args if isinstance(args, list) else []
    try:
        return bound_arguments(primitive, args)
    except ArgumentNameError:
        return []


def _slash_keys(node: Any, path: str, *, plain: bool = False) -> list[tuple[str, str]]:
    """Keys with "/" in the objects Tune flattens: nested configs and const objects, not lists or primitives."""
    if not isinstance(node, Mapping):
        return []
    name = None if plain else primitive_of(node)
    if name == "const":  # the literal is a nested config once built, and flattened as one
        return _slash_keys(node["const"], f"{path}.const", plain=True)
    if name is not None:
        return []
    found = [(f"{path}.{key}", key) for key in node if isinstance(key, str) and "/" in key]
    return found + [hit for key, child in node.items() for hit in _slash_keys(child, f"{path}.{key}", plain=plain)]


# --- PBT's mutations ----------------------------------------------------------------------------------------------
def check_mutations(mutations: Mapping[str, Any], path: str, errors: Errors, *, top: bool = True) -> None:
    """PBT's ``hyperparam_mutations``: each a non-empty list of values, a distribution, a function, or an object of
    those.

    A top-level ``{"sample_from": "pkg.mod:fn"}`` is Tune's callable mutation: the engine gives PBT the function
    itself, which it calls with no arguments for a new value (a ``tune.sample_from`` object there PBT refuses; a nested
    one it calls with no config). ``PopulationBasedTraining`` raises TypeError on a top-level constant, and ValueError
    on a nested constant at its first perturbation; a ``grid_search`` would be read as a nested mutation named
    "grid_search", and a primitive inside a list reaches the trainable as the object itself.
    """
    for key, node in mutations.items():
        where = f"{path}.{key}"
        name = primitive_of(node)
        if isinstance(node, list):
            if not node:
                errors.add(where, node, "PBT picks from an empty list", "list the values to pick from")
            for i, value in enumerate(node):
                if primitive_of(value) is not None:
                    errors.add(
                        f"{where}[{i}]",
                        value,
                        "PBT uses a list's values as they are: the trainable would get this object",
                        "write the distribution itself as the mutation, or list plain values",
                    )
        elif name in ("grid_search", "const"):
            why = {
                "grid_search": "PBT has no grid: it would read this as a nested mutation named 'grid_search'",
                "const": "a constant is no mutation (PBT raises TypeError or ValueError on it)",
            }[name]
            errors.add(where, node, why, 'use a list of values or a distribution, e.g. {"uniform": [0, 1]}')
        elif name is not None:
            check_space(node, where, errors)
        elif isinstance(node, Mapping) and misread_primitive(node) is not None:
            problem, fix = misread_primitive(node) or ("", "")
            errors.add(where, node, problem, fix + ", or a list of values")
        elif isinstance(node, Mapping):
            check_mutations(node, where, errors, top=False)
        else:
            errors.add(
                where,
                node,
                "PBT mutates a list of values, a distribution or an object of those, not a constant (it raises "
                "TypeError, or ValueError at its first perturbation)",
                f'write [{node!r}, ...] with the values to try, or {{"uniform": [low, high]}}',
            )


# --- scheduler arguments -----------------------------------------------------------------------------------------
def check_scheduler_values(name: str, args: Mapping[str, Any], errors: Errors) -> None:
    """Values of a named scheduler's arguments that its constructor refuses (asserts and ValueErrors)."""

    def number(arg: str, default: Any = None) -> Any:
        value = args.get(arg, default)
        return value if is_number(value) else None

    if name == "asha":
        grace, max_t = number("grace_period", 1), number("max_t", 100)  # ASHAScheduler's defaults
        if grace is not None and max_t is not None and grace > max_t:
            given = "max_t" if "max_t" in args else "max_t (by default)"
            errors.add(
                "scheduler.args.grace_period" if "grace_period" in args else "scheduler.args.max_t",
                args.get("grace_period", args.get("max_t")),
                f"grace_period {grace} exceeds {given} {max_t}",
                "make grace_period <= max_t",
            )
    factor = number("reduction_factor")
    if name in ("asha", "hyperband") and factor is not None and factor <= 1:
        errors.add(
            "scheduler.args.reduction_factor",
            factor,
            "must be > 1 (ASHA asserts it; HyperBand divides by its logarithm)",
            "give e.g. 3 or 4 (Tune's default)",
        )
    fraction = number("quantile_fraction")
    if name in ("pbt", "pb2") and fraction is not None and not 0 <= fraction <= 0.5:
        errors.add(
            "scheduler.args.quantile_fraction",
            fraction,
            "Tune raises ValueError: quantile_fraction must be between 0 and 0.5",
            "give e.g. 0.25 (Tune's default)",
        )


# --- combinations of fields ---------------------------------------------------------------------------------------
_POPULATION = {"pbt": "PopulationBasedTraining", "pb2": "PB2"}


def check_combinations(kw: Mapping[str, Any], errors: Errors) -> None:
    """What Tune refuses only once it runs, from two fields: the searcher and the space, Optuna's rewards and the
    points, PBT/PB2 and a searcher. ``kw`` holds the spec's fields as built (parts as objects)."""
    search, scheduler, space = kw.get("search"), kw.get("scheduler"), kw.get("param_space", {})
    named_search = getattr(search, "factory", "unset") is None
    search_name = str(getattr(search, "name", "random")).lower() if named_search else None
    if search_name is not None and isinstance(space, Mapping):
        check_searcher_space(search_name, space, errors)
    search_args = getattr(search, "args", None)
    if search_name == "optuna" and isinstance(search_args, Mapping):
        _check_evaluated_rewards(search_args.get("evaluated_rewards"), kw.get("points_to_evaluate"), space, errors)
    scheduler_name = getattr(scheduler, "canonical_name", None) if getattr(scheduler, "factory", 1) is None else None
    if scheduler_name in _POPULATION and search_name not in (None, "random", "grid"):
        errors.add(
            "search.name",
            getattr(search, "name", None),
            f"Tune raises ValueError: search algorithms cannot be used with {_POPULATION[scheduler_name]} "
            f"schedulers (scheduler {scheduler_name!r})",
            'use search "random" (PBT explores by itself), or another scheduler',
        )


def _check_evaluated_rewards(rewards: Any, points: Any, space: Any, errors: Errors) -> None:
    """Optuna's ``evaluated_rewards`` are the results of ``points_to_evaluate``, one each: it raises ValueError when
    the counts differ and ignores rewards without points; a reward for a point the engine completes by sampling
    would be credited to values nobody evaluated."""
    if not isinstance(rewards, list) or not rewards:
        return
    count = len(points) if isinstance(points, list) else 0
    if count != len(rewards):
        errors.add(
            "search.args.evaluated_rewards",
            rewards,
            f"Optuna pairs each reward with a point to evaluate, and there are {count} points (a warm_start adds "
            "one, first)",
            "give one reward per point of points_to_evaluate, in order, or drop evaluated_rewards",
        )
        return
    if not isinstance(space, Mapping):
        return
    for i, point in enumerate(points):
        missing = missing_paths(point, space) if isinstance(point, Mapping) else []
        if missing:
            errors.add(
                f"points_to_evaluate[{i}]",
                point,
                f"has a reward in search.args.evaluated_rewards but no {', '.join('.'.join(p) for p in missing)}: "
                "the engine would sample them, and Optuna credit the reward to values never evaluated",
                "give every sampled parameter in a point with a reward, or drop evaluated_rewards",
            )
