"""The parts of a spec (scheduler, searcher, resources, checkpoints, failures), each a frozen dataclass that checks
itself when built, as Ray's own ``CheckpointConfig`` does, listing every problem with the field, the value and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal

from airflow_tune.common.spec.arguments import (
    SCHEDULER_ALIASES,
    SCHEDULERS,
    SCHEDULERS_BY_FACTORY,
    SEARCHER_ALIASES,
    SEARCHERS,
    SEARCHERS_BY_FACTORY,
    check_json_args,
    check_scheduler_args,
    check_searcher_args,
    factory_fix,
)
from airflow_tune.common.spec.compatibility import check_mutations, check_scheduler_values
from airflow_tune.common.spec.errors import Errors, SpecError, did_you_mean, is_int, is_number
from airflow_tune.common.spec.resources import check_bundle, is_node_pin
from airflow_tune.common.spec.space import IMPORT_PATH
from airflow_tune.common.spec.train_workers import check_train_workers

__all__ = [
    "PARTS",
    "PLACEMENT_STRATEGIES",
    "SCHEDULERS",
    "SCHEDULER_ALIASES",
    "SEARCHERS",
    "CheckpointSpec",
    "FailureSpec",
    "ResourcesSpec",
    "SchedulerSpec",
    "SearchSpec",
    "build_part",
    "field_list",
    "node_pins",
    "normalize_part",
]

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class _Part:
    """A spec part: its ``FIELD`` in the spec, and ``problems()`` checked when it is built."""

    FIELD: ClassVar[str]

    def __post_init__(self) -> None:
        errors = Errors()
        self.check(errors)
        errors.raise_if_any()

    def check(self, errors: Errors) -> None:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class SchedulerSpec(_Part):
    """A Tune scheduler by ``name``, or a user's ``factory`` (``"pkg.mod:fn"``), with JSON ``args``."""

    FIELD: ClassVar[str] = "scheduler"
    name: str | None = "fifo"
    factory: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def canonical_name(self) -> str:
        return SCHEDULER_ALIASES.get(str(self.name).lower(), str(self.name).lower())

    def check(self, errors: Errors) -> None:
        if not isinstance(self.args, Mapping):
            errors.add("scheduler.args", self.args, "must be a JSON object", "pass keyword arguments as {name: value}")
            return
        if self.factory is not None:
            if not isinstance(self.factory, str) or not IMPORT_PATH.match(self.factory):
                errors.add("scheduler.factory", self.factory, "not an import path", 'write "package.module:function"')
            check_json_args("scheduler", self.args, errors, code={})
            return
        name = self.canonical_name
        if name in SCHEDULERS_BY_FACTORY:
            errors.add(
                "scheduler.name",
                self.name,
                f"Tune's name {name!r} is taken here only through a factory: {SCHEDULERS_BY_FACTORY[name]}",
                factory_fix("scheduler"),
            )
            return
        if name not in SCHEDULERS:
            errors.add(
                "scheduler.name",
                self.name,
                "unknown scheduler",
                f"use one of {', '.join(SCHEDULERS)}, or a factory import path",
            )
            return
        args = self.args
        check_scheduler_args(name, args, errors)
        check_scheduler_values(name, args, errors)
        for arg in ("max_t", "grace_period", "reduction_factor", "perturbation_interval", "brackets"):
            if arg not in args:
                continue
            value = args[arg]
            if arg == "grace_period" and name == "median_stopping_rule":
                # MedianStoppingRule stops only trials older than grace_period: 0 judges them from their first result.
                if not is_number(value) or value < 0:
                    errors.add(
                        f"scheduler.args.{arg}", value, "must be a number >= 0", "give e.g. 0, or 60 (Tune's default)"
                    )
            elif not is_number(value) or value <= 0:
                errors.add(f"scheduler.args.{arg}", value, "must be a positive number", "give e.g. 1")
        if name == "pbt":
            mutations = args.get("hyperparam_mutations")
            if not isinstance(mutations, Mapping) or not mutations:
                errors.add(
                    "scheduler.args.hyperparam_mutations",
                    mutations,
                    "PBT needs mutations",
                    'write {"lr": {"loguniform": [1e-4, 1e-1]}} or {"lr": [0.1, 0.01]}',
                )
            else:
                check_mutations(mutations, "scheduler.args.hyperparam_mutations", errors)
        if name == "pb2":
            bounds = args.get("hyperparam_bounds")
            if not isinstance(bounds, Mapping) or not bounds:
                errors.add(
                    "scheduler.args.hyperparam_bounds", bounds, "PB2 needs bounds", 'write {"lr": [0.0001, 0.1]}'
                )
            else:
                check_bounds(bounds, "scheduler.args.hyperparam_bounds", errors)


@dataclass(frozen=True, kw_only=True)
class SearchSpec(_Part):
    """A search algorithm by ``name`` or a user's ``factory``, with JSON ``args`` and an optional concurrency limit."""

    FIELD: ClassVar[str] = "search"
    name: str | None = "random"
    factory: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    max_concurrent: int | None = None

    def check(self, errors: Errors) -> None:
        if not isinstance(self.args, Mapping):
            errors.add("search.args", self.args, "must be a JSON object", "pass keyword arguments as {name: value}")
            return
        if self.max_concurrent is not None and (not is_int(self.max_concurrent) or self.max_concurrent < 1):
            errors.add("search.max_concurrent", self.max_concurrent, "must be an integer >= 1", "give e.g. 2, or null")
        if self.factory is not None:
            if not isinstance(self.factory, str) or not IMPORT_PATH.match(self.factory):
                errors.add("search.factory", self.factory, "not an import path", 'write "package.module:function"')
            check_json_args("search", self.args, errors, code={})
            return
        name = str(self.name).lower()
        if name in SEARCHERS_BY_FACTORY:
            errors.add(
                "search.name",
                self.name,
                f"Tune's name for {SEARCHERS_BY_FACTORY[name]}, which is taken here only through a factory (the spec "
                f"checks the arguments and search space of {', '.join(SEARCHERS)} only)",
                factory_fix("search"),
            )
            return
        if name not in SEARCHERS:
            errors.add("search.name", self.name, "unknown search algorithm", f"use one of {', '.join(SEARCHERS)}")
            return
        check_searcher_args(name, self.args, errors)


@dataclass(frozen=True, kw_only=True)
class ResourcesSpec(_Part):
    """Resources per trial: one dict (``{"cpu": 1, "gpu": 0, "memory": bytes, "<custom>": n}``) or placement
    group ``bundles`` with a ``strategy`` (the trainable runs in the first bundle, its child actors in the others)."""

    FIELD: ClassVar[str] = "resources"
    per_trial: dict[str, float] | None = None
    bundles: list[dict[str, float]] | None = None
    strategy: str = "PACK"
    #: The Ray Train workers the trainable starts, outside the trial's placement group (:mod:`.train_workers`).
    train_workers: dict[str, Any] | None = None

    def check(self, errors: Errors) -> None:
        if self.per_trial is not None and self.bundles is not None:
            errors.add("resources", asdict(self), "give per_trial or bundles, not both", "drop one of them")
        if self.per_trial is not None:
            if not isinstance(self.per_trial, Mapping) or not self.per_trial:
                errors.add("resources", self.per_trial, "must be a non-empty object", 'write {"cpu": 1, "gpu": 0}')
            else:
                check_bundle(self.per_trial, "resources", errors)
        if self.bundles is not None:
            if not isinstance(self.bundles, list) or not self.bundles:
                errors.add(
                    "resources.bundles", self.bundles, "must be a non-empty list", 'write [{"CPU": 1}, {"CPU": 1}]'
                )
            else:
                for i, bundle in enumerate(self.bundles):
                    # An empty first bundle is Tune's empty head: the trainable holds nothing, its actors the rest.
                    empty_head = i == 0 and len(self.bundles) > 1
                    if not isinstance(bundle, Mapping) or (not bundle and not empty_head):
                        fix = 'write {"CPU": 1}' + (" (an empty first bundle needs others after it)" if i == 0 else "")
                        errors.add(f"resources.bundles[{i}]", bundle, "must be a non-empty object", fix)
                    else:
                        check_bundle(bundle, f"resources.bundles[{i}]", errors, may_be_empty=empty_head)
        if self.strategy not in PLACEMENT_STRATEGIES:
            errors.add(
                "resources.strategy", self.strategy, "unknown strategy", f"use one of {', '.join(PLACEMENT_STRATEGIES)}"
            )
        if self.train_workers is not None:
            check_train_workers(self.train_workers, errors)


def check_bounds(bounds: Mapping[str, Any], path: str, errors: Errors) -> None:
    """PB2's ``hyperparam_bounds``: each ``[low, high]`` with low <= high, or an object of those for a nested config
    (PB2 flattens them with "/", and raises ValueError on a key that holds one)."""
    for key, value in bounds.items():
        where = f"{path}.{key}"
        if isinstance(key, str) and "/" in key:
            errors.add(
                where,
                key,
                "PB2 names nested bounds by their path joined with '/', and raises ValueError on a key that holds one",
                "nest the bounds as objects instead, without '/' in a key",
            )
        if isinstance(value, Mapping) and value:
            check_bounds(value, where, errors)
        elif not (isinstance(value, list) and len(value) == 2 and all(is_number(x) for x in value)):
            errors.add(
                where,
                value,
                "must be [low, high], or an object of bounds for a nested config",
                'write e.g. [0.0001, 0.1], or {"lr": [0.0001, 0.1]}',
            )
        elif value[0] > value[1]:
            errors.add(where, value, f"low {value[0]} is above high {value[1]}", "write [low, high]")


def node_pins(resources: ResourcesSpec | None) -> list[tuple[str, str]]:
    """Every ``node:`` key of ``resources`` (a pin of trials to one node, ``node:<ip>``), with its field path.

    A pin is legitimate only when the DAG file wrote it: the Airflow side refuses one that appears only after rendering.
    """
    if resources is None:
        return []
    dicts: list[tuple[str, Any]] = [("resources", resources.per_trial)]
    if isinstance(resources.bundles, list):
        dicts += [(f"resources.bundles[{i}]", b) for i, b in enumerate(resources.bundles)]
    return [(f"{path}.{key}", key) for path, d in dicts if isinstance(d, Mapping) for key in d if is_node_pin(key)]


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec(_Part):
    """How many checkpoints to keep and by what score; ``frequency``/``at_end`` are for Class API trainables."""

    FIELD: ClassVar[str] = "checkpoint"
    num_to_keep: int | None = None
    score_attribute: str | None = None
    score_order: Literal["min", "max"] | None = None
    frequency: int = 0
    at_end: bool | None = None

    def check(self, errors: Errors) -> None:
        if self.num_to_keep is not None and (not is_int(self.num_to_keep) or self.num_to_keep < 1):
            errors.add(
                "checkpoint.num_to_keep", self.num_to_keep, "must be an integer >= 1", "give e.g. 2, or null for all"
            )
        if not is_int(self.frequency) or self.frequency < 0:
            errors.add(
                "checkpoint.frequency", self.frequency, "must be an integer >= 0", "0 turns periodic checkpoints off"
            )
        if self.at_end is not None and not isinstance(self.at_end, bool):
            errors.add("checkpoint.at_end", self.at_end, "must be true, false or null", "write true or false")
        if self.score_order is not None and self.score_order not in ("min", "max"):
            errors.add("checkpoint.score_order", self.score_order, "must be 'min' or 'max'", 'say "min" or "max"')
        if self.score_attribute is not None and (not isinstance(self.score_attribute, str) or not self.score_attribute):
            errors.add("checkpoint.score_attribute", self.score_attribute, "must be a metric name", 'e.g. "loss"')


@dataclass(frozen=True, kw_only=True)
class FailureSpec(_Part):
    """Retries of failed trials and whether one failed trial stops the experiment.

    ``tolerate_errored_trials``: with False, any errored trial fails the job; with True (default) the job fails only
    when no trial finished.
    """

    FIELD: ClassVar[str] = "failure"
    max_failures: int = 0
    fail_fast: bool = False
    tolerate_errored_trials: bool = True

    def check(self, errors: Errors) -> None:
        if not is_int(self.max_failures) or self.max_failures < -1:
            errors.add("failure.max_failures", self.max_failures, "must be an integer >= -1", "-1 retries forever")
        if isinstance(self.fail_fast, str) and self.fail_fast.lower() == "raise":
            # Refused on purpose: tune.run re-raises it before its final save of the experiment's state (the forced
            # checkpoint after the loop), and Tune warns that Ray processes may be left behind.
            errors.add(
                "failure.fail_fast",
                self.fail_fast,
                "Tune's 'raise' raises the trial's error from fit() before its final save of the experiment's state "
                "(a retry resumes an older snapshot) and may leave trial processes behind; it is not offered",
                "write true: the first errored trial stops the experiment and fails the task with its error",
            )
        for flag in ("fail_fast", "tolerate_errored_trials"):
            value = getattr(self, flag)
            if not isinstance(value, bool) and not (flag == "fail_fast" and str(value).lower() == "raise"):
                errors.add(f"failure.{flag}", value, "must be true or false", "write true or false")
        if self.fail_fast is True and is_int(self.max_failures) and self.max_failures != 0:
            # Tune's FailureConfig raises this when it is built, on the cluster: a failed trial is never retried.
            errors.add(
                "failure.max_failures",
                self.max_failures,
                "Tune refuses it with fail_fast: max_failures must be 0 if fail_fast=True",
                "set max_failures to 0, or fail_fast to false to retry failed trials",
            )


PARTS: dict[str, type[_Part]] = {
    cls.FIELD: cls for cls in (SchedulerSpec, SearchSpec, ResourcesSpec, CheckpointSpec, FailureSpec)
}


def normalize_part(key: str, value: Any) -> Any:
    """The short forms a part accepts, as its full form: ``"asha"``, ``"pkg.mod:make"``, a resources dict or list."""
    if key == "resources" and isinstance(value, list):
        return {"bundles": value}
    if key == "resources" and isinstance(value, Mapping) and isinstance(value.get("custom_resources"), Mapping):
        # Tune's dict form: {"cpu": 1, "custom_resources": {"accel": 1}} is the bundle {"cpu": 1, "accel": 1}.
        value = {**{k: v for k, v in value.items() if k != "custom_resources"}, **value["custom_resources"]}
    if key == "resources" and isinstance(value, Mapping) and "bundles" not in value and "per_trial" not in value:
        amounts = {k: v for k, v in value.items() if k not in ("strategy", "train_workers")}
        kept = {k: value[k] for k in ("strategy", "train_workers") if k in value}
        if not amounts and "train_workers" in value:  # the trial itself asks for Tune's default
            return kept
        return {"per_trial": amounts, **kept}
    if key in ("scheduler", "search") and isinstance(value, str):
        value = {"factory": value} if ":" in value else {"name": value}
    if key in ("scheduler", "search") and isinstance(value, Mapping) and value.get("factory") and "name" not in value:
        return {**value, "name": None}
    if key == "search" and isinstance(value, Mapping) and str(value.get("name")).lower() in SEARCHER_ALIASES:
        return {**value, "name": SEARCHER_ALIASES[str(value["name"]).lower()]}
    return value


def build_part(key: str, value: Any, errors: Errors) -> Any:
    """The part ``key`` built from ``value``; every problem is added to ``errors`` (and None returned)."""
    cls: Any = PARTS[key]
    value = normalize_part(key, value)
    if not isinstance(value, Mapping):
        errors.add(key, value, "must be a JSON object", f"write {key} as {{...}} with fields {field_list(cls)}")
        return None
    known = {f.name for f in fields(cls)}
    bad = [k for k in value if k not in known]
    for k in bad:
        close = did_you_mean(k, [f.name for f in fields(cls)])
        hint = f"did you mean {close!r}? " if close else ""
        errors.add(f"{key}.{k}", value[k], "unknown field", f"{hint}{key} takes {field_list(cls)}")
    if bad:
        return None
    try:
        return cls(**value)
    except SpecError as exc:
        errors.items.extend(exc.errors)
        return None


def field_list(cls: type) -> str:
    return ", ".join(f.name for f in fields(cls))


def seeded_searcher(search: Any) -> str | None:
    """Who takes a spec's points: a named searcher, ``"factory"``, or None for the random/grid one (which fills
    missing keys and sets constants itself)."""
    if not isinstance(search, SearchSpec):
        return None
    if search.factory is not None:
        return "factory"
    name = str(search.name).lower()
    return None if name in ("random", "grid") else name
