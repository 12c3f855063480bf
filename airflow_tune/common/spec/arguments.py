"""The keyword arguments of Tune's schedulers and searchers, as static tables read from Ray 2.60's signatures.

``args`` are data: each named scheduler or searcher takes only the arguments in its table, each of a JSON kind. The
arguments the spec sets itself (metric, mode, the space, the points to evaluate, the concurrency limit) are refused in
``args``, and so are those that are code in Ray's signature (objects, callables, storage: Optuna's ``sampler`` and
``storage``, BayesOpt's ``analysis``, PBT's ``custom_explore_fn``): a conf must never pass them, so they are built by
a ``factory``, a code reference that only the DAG file or the deployment's allow-list can name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_tune.common.spec.errors import Errors, did_you_mean, is_int, is_number

#: Schedulers by name, with the keyword arguments Ray Tune 2.60 accepts (metric/mode come from the spec).
SCHEDULERS: dict[str, frozenset[str]] = {
    "fifo": frozenset(),
    "asha": frozenset({"time_attr", "max_t", "grace_period", "reduction_factor", "brackets", "stop_last_trials"}),
    "hyperband": frozenset({"time_attr", "max_t", "reduction_factor", "stop_last_trials"}),
    "median_stopping_rule": frozenset(
        {"time_attr", "grace_period", "min_samples_required", "min_time_slice", "hard_stop"}
    ),
    "pbt": frozenset(
        {
            "time_attr",
            "perturbation_interval",
            "burn_in_period",
            "hyperparam_mutations",
            "quantile_fraction",
            "resample_probability",
            "perturbation_factors",
            "log_config",
            "require_attrs",
            "synch",
        }
    ),
    "pb2": frozenset(
        {
            "time_attr",
            "perturbation_interval",
            "hyperparam_bounds",
            "quantile_fraction",
            "log_config",
            "require_attrs",
            "synch",
        }
    ),
    # Tune's defaults (a FIFO base, DistributeResources); its two arguments are code (SCHEDULER_CODE_ARGS).
    "resource_changing": frozenset(),
}
#: Other names of the schedulers above: Tune's own (``ray.tune.schedulers.SCHEDULER_IMPORT``, the names
#: ``tune.create_scheduler`` takes) and a few shorter ones.
SCHEDULER_ALIASES = {
    "async_hyperband": "asha",
    "asynchyperband": "asha",
    "ashascheduler": "asha",
    "median": "median_stopping_rule",
    "medianstopping": "median_stopping_rule",
}
#: Tune's other scheduler names (``SCHEDULER_IMPORT``), which a spec reaches only through a factory, and why.
SCHEDULERS_BY_FACTORY = {
    "hb_bohb": "HyperBandForBOHB pauses trials through the BOHB searcher (TuneBOHB), which is reached through a "
    "search factory",
    "pbt_replay": "PopulationBasedTrainingReplay replays a policy file read from the driver's disk: a path the "
    "cluster reads, which data never chooses",
}
#: Scheduler arguments that Ray 2.60 types as a callable or an object: code, never in ``args``.
SCHEDULER_CODE_ARGS: dict[str, dict[str, str]] = {
    "pbt": {"custom_explore_fn": "a function (Callable in PopulationBasedTraining's signature)"},
    "pb2": {"custom_explore_fn": "a function (Callable in PB2's signature)"},
    "resource_changing": {
        "base_scheduler": "a TrialScheduler object",
        "resources_allocation_function": "a function (Callable in ResourceChangingScheduler's signature)",
    },
}

#: Searchers by name and the package each needs on the cluster.
SEARCHERS: dict[str, str | None] = {
    "random": None,
    "grid": None,
    "optuna": "optuna",
    "hyperopt": "hyperopt",
    "bayesopt": "bayes_opt",
}
#: Tune's other names of the searchers above (``ray.tune.search.SEARCH_ALG_IMPORT``, the names ``create_searcher``
#: takes); the spec holds the name they stand for.
SEARCHER_ALIASES = {"variant_generator": "random"}
#: Tune's other searcher names (``SEARCH_ALG_IMPORT``), which a spec reaches only through a factory.
SEARCHERS_BY_FACTORY = {
    "ax": "AxSearch",
    "bohb": "TuneBOHB",
    "nevergrad": "NevergradSearch",
    "zoopt": "ZOOptSearch",
    "hebo": "HEBOSearch",
}
_BASIC_VARIANT = {"constant_grid_search": "bool", "random_state": "seed"}
#: The arguments each searcher takes in ``args``, with their JSON kind: Ray 2.60's ``BasicVariantGenerator`` (random,
#: grid), ``OptunaSearch``, ``HyperOptSearch`` and ``BayesOptSearch``, minus what the spec sets and what is code.
SEARCHER_ARGS: dict[str, dict[str, str]] = {
    "random": _BASIC_VARIANT,
    "grid": _BASIC_VARIANT,
    "optuna": {"study_name": "name", "seed": "seed", "evaluated_rewards": "rewards"},
    "hyperopt": {"n_initial_points": "count", "random_state_seed": "seed", "gamma": "fraction"},
    "bayesopt": {
        "utility_kwargs": "utility",
        "random_state": "seed",
        "random_search_steps": "count",
        "verbose": "count",
        "patience": "count",
        "skip_duplicate": "bool",
        "repeat_float_precision": "count",
    },
}
#: Searcher arguments that Ray 2.60 types as an object: code (or storage), never in ``args``.
SEARCHER_CODE_ARGS: dict[str, dict[str, str]] = {
    "optuna": {
        "sampler": "an Optuna sampler object",
        "storage": "an Optuna storage, the database the study is loaded from and written to (Ray checks its type "
        "only with an assert, which python -O removes, and Optuna also takes a database URL)",
    },
    "bayesopt": {"analysis": "an ExperimentAnalysis object, read from an experiment's storage"},
}
#: Searcher arguments the spec sets itself, with the field that sets them.
SEARCHER_SET_BY_SPEC = {
    "metric": "metric",
    "mode": "mode",
    "space": "param_space",
    "points_to_evaluate": "points_to_evaluate",
}
_BASIC_SET_BY_SPEC = {**SEARCHER_SET_BY_SPEC, "max_concurrent": "max_concurrent_trials or search.max_concurrent"}
#: bayes_opt 1.4's ``UtilityFunction(kind, kappa, xi, kappa_decay, kappa_decay_delay)``, which ``utility_kwargs`` feeds.
UTILITY_ARGS = {
    "kind": "utility_kind",
    "kappa": "number",
    "xi": "number",
    "kappa_decay": "number",
    "kappa_decay_delay": "count",
}

_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "seed": ("an integer seed from 0 to 2**32 - 1, or null", lambda v: v is None or (is_int(v) and 0 <= v < 2**32)),
    "count": ("an integer >= 0", lambda v: is_int(v) and v >= 0),
    "number": ("a number", is_number),
    "fraction": ("a number between 0 and 1", lambda v: is_number(v) and 0 < v < 1),
    "name": ("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip())),
    "rewards": (
        "a non-empty list of numbers, one per point to evaluate",
        lambda v: isinstance(v, list) and bool(v) and all(is_number(x) for x in v),
    ),
    "utility": ("an object of UtilityFunction's arguments", lambda v: isinstance(v, Mapping)),
    "utility_kind": ('"ucb", "ei" or "poi"', lambda v: v in ("ucb", "ei", "poi")),
}


def factory_fix(part: str) -> str:
    return (
        f"build it in a {part} factory, a function in a module on the cluster, and name it in the DAG file: "
        f'{part}={{"factory": "pkg.mod:make"}} (a factory is code, so only the DAG file or the allow-list names one)'
    )


def not_json(value: Any, path: str) -> list[tuple[str, Any]]:
    """Every node below ``value`` that is not plain JSON (an object, a callable, a non-string key), with its path."""
    found: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Mapping):
            for k, v in node.items():
                if isinstance(k, str):
                    stack.append((f"{where}.{k}", v))
                else:
                    found.append((where, k))
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))
        elif node is not None and not isinstance(node, (str, int, float)):
            found.append((where, node))
    return sorted(found, key=lambda item: item[0])


def check_json_args(part: str, args: Mapping[str, Any], errors: Errors, *, code: Mapping[str, str]) -> None:
    """``args`` (of a named scheduler or searcher, or of a factory) hold plain JSON only; a code argument is named
    once, as code, by :func:`check_named_args`."""
    for arg, value in args.items():
        if arg in code:
            continue
        for where, node in not_json(value, f"{part}.args.{arg}"):
            errors.add(
                where,
                node,
                f"is a Python {type(node).__name__}, not JSON data",
                "pass JSON values, or " + factory_fix(part),
            )


def check_named_args(
    part: str,
    name: str,
    args: Mapping[str, Any],
    errors: Errors,
    *,
    set_by_spec: Mapping[str, str],
    code: Mapping[str, str],
    known: Mapping[str, str | None],
    at: str | None = None,
) -> None:
    """Each of ``args`` is an argument of the named scheduler or searcher, of its kind; none is set by the spec or
    is code. ``known`` maps each argument to its JSON kind (None: checked by the caller); ``at`` is where the
    arguments are (``<part>.args`` by default)."""
    at = at or f"{part}.args"
    for arg, value in args.items():
        where = f"{at}.{arg}"
        if arg in set_by_spec:
            why = (
                "a searcher's own space is not JSON (Optuna distributions, hyperopt hp objects), and the spec's "
                "param_space is converted for every searcher"
                if arg == "space"
                else "is set by the spec"
            )
            errors.add(where, value, why, f"set the spec's {set_by_spec[arg]} instead")
        elif arg in code:
            errors.add(where, value, f"{name}'s {arg} is {code[arg]}: code, not data", factory_fix(part))
        elif arg not in known:
            close = did_you_mean(arg, sorted(known))
            hint = f"did you mean {close!r}? " if close else ""
            allowed = ", ".join(sorted(known)) or "no arguments"
            errors.add(where, value, f"not an argument of {name}", f"{hint}{name} takes {allowed}")
        elif known[arg] is not None and not not_json(value, where):  # a non-JSON value is named once, above
            check_kind(where, value, str(known[arg]), errors)
    utility = args.get("utility_kwargs") if part == "search" and name == "bayesopt" else None
    if isinstance(utility, Mapping):
        check_named_args(
            part,
            "UtilityFunction",
            utility,
            errors,
            set_by_spec={},
            code={},
            known=UTILITY_ARGS,
            at=f"{at}.utility_kwargs",
        )


def check_kind(where: str, value: Any, kind: str, errors: Errors) -> None:
    what, ok = _KINDS[kind]
    if not ok(value):
        errors.add(where, value, f"must be {what}", f"give {what}")


def check_scheduler_args(name: str, args: Mapping[str, Any], errors: Errors) -> None:
    """The arguments of the scheduler ``name`` (canonical, in :data:`SCHEDULERS`)."""
    code = SCHEDULER_CODE_ARGS.get(name, {})
    check_json_args("scheduler", args, errors, code=code)
    known: dict[str, str | None] = dict.fromkeys(SCHEDULERS[name])
    set_by_spec = {"metric": "metric", "mode": "mode"}
    check_named_args("scheduler", name, args, errors, set_by_spec=set_by_spec, code=code, known=known)


def check_searcher_args(name: str, args: Mapping[str, Any], errors: Errors) -> None:
    """The arguments of the searcher ``name`` (lower case, in :data:`SEARCHERS`)."""
    code = SEARCHER_CODE_ARGS.get(name, {})
    check_json_args("search", args, errors, code=code)
    set_by_spec = _BASIC_SET_BY_SPEC if name in ("random", "grid") else SEARCHER_SET_BY_SPEC
    check_named_args("search", name, args, errors, set_by_spec=set_by_spec, code=code, known=SEARCHER_ARGS[name])
