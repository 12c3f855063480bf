"""What an experiment asks (its identity: the fields a rerun may not change, and their fingerprint) and what a
restored experiment cannot take from a changed spec; both read specs as dicts (a ``spec.json`` an earlier run
recorded, or :meth:`~airflow_tune.common.spec.ExperimentSpec.to_dict`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from airflow_tune.common.contract import SHIPPED_PACKAGE
from airflow_tune.common.spec.errors import show
from airflow_tune.common.spec.space import primitive_of

IDENTITY_FIELDS = (
    "trainable",
    "trainable_digest",
    "param_space",
    "trainable_kwargs",
    "metric",
    "mode",
    "objectives",
    "num_samples",
    "stop",
    "scheduler",
    "search",
)


def identity_of(spec_dict: Mapping[str, Any]) -> dict[str, Any]:
    """:meth:`~airflow_tune.common.spec.ExperimentSpec.identity` of a spec as a dict (e.g. a ``spec.json`` written by an
    earlier run)."""
    identity = {name: spec_dict.get(name) for name in IDENTITY_FIELDS}
    if identity["trainable_digest"] is None:  # an import-path trainable: its path is its identity, as before
        del identity["trainable_digest"]
    if identity["objectives"] is None:  # one objective: metric and mode say it all, as before
        del identity["objectives"]
    return identity


def fingerprint_of(spec_dict: Mapping[str, Any]) -> str:
    text = json.dumps(identity_of(spec_dict), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def identity_differences(before: Mapping[str, Any], after: Mapping[str, Any], limit: int = 6) -> list[str]:
    """Where two specs (as dicts) ask different questions, each as ``path: old -> new``, down to the differing keys."""
    found: list[str] = []

    def walk(path: str, a: Any, b: Any) -> None:
        if a == b:
            return
        nodes = isinstance(a, Mapping) and isinstance(b, Mapping)
        if nodes and primitive_of(a) is None and primitive_of(b) is None:
            for key in [*a, *(k for k in b if k not in a)]:
                walk(f"{path}.{key}", a.get(key, "<unset>"), b.get(key, "<unset>"))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(f"{path}[{i}]", x, y)
        else:
            found.append(f"{path}: {show(a)} -> {show(b)}{_what_changed(path, a, b)}")

    a, b = identity_of(before), identity_of(after)
    for name in IDENTITY_FIELDS:
        walk(name, a.get(name), b.get(name))
    return found[:limit] + ([f"and {len(found) - limit} more"] if len(found) > limit else [])


def _what_changed(path: str, a: Any, b: Any) -> str:
    """What a changed digest stands for: the values alone show two hashes."""
    if path == "trainable_digest":
        return " (the trainable shipped by value changed: its code, or the data tune.with_parameters gives it)"
    shipped = [v.rsplit("_", 1)[0] for v in (a, b) if isinstance(v, str) and v.startswith(SHIPPED_PACKAGE + ":")]
    if len(shipped) == 2 and shipped[0] == shipped[1]:  # the same kind of object, another digest of its code
        return " (the code written in the DAG file and shipped by value changed)"
    return ""


#: Searchers whose concurrency limit is their own argument (a ``BasicVariantGenerator``), not a ConcurrencyLimiter.
_OWN_LIMIT_SEARCHERS = ("random", "grid")


def _concurrency(spec_dict: Mapping[str, Any]) -> int | None:
    search = spec_dict.get("search") or {}
    limits = [n for n in (spec_dict.get("max_concurrent_trials"), search.get("max_concurrent")) if n]
    return min(limits) if limits else None


def restore_conflicts(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What a rerun changed that the experiment, restored from Tune's saved state, cannot take: each as ``field: old
    -> new (why)``. The rest of the policy is applied to the restored experiment (engine/build.py ``apply_policy``);
    the identity's fields are :func:`identity_differences`.

    - ``points_to_evaluate``: Tune restores the searcher from its saved state (``restore_from_dir``), seeded points
      and all; new points are never asked for.
    - ``resources``: Tune restores every trial with the resources saved with it (its placement group factory, in the
      experiment state); only new trials would take new ones.
    - a concurrency limit (``max_concurrent_trials``) where the first run had none, for a searcher other than random
      and grid: the restored searcher is the one the first run built, with no ConcurrencyLimiter to take a limit
      (random and grid take theirs, and a limit the first run had can change).
    """
    found: list[str] = []
    why = {
        "points_to_evaluate": "Tune restores the searcher from its saved state and never asks for new points",
        "resources": "Tune restores every trial with the resources it was saved with",
    }
    for name, reason in why.items():
        if before.get(name) != after.get(name):
            found.append(f"{name}: {show(before.get(name))} -> {show(after.get(name))} ({reason})")
    search = after.get("search") or {}
    own_limit = not search.get("factory") and str(search.get("name") or "random").lower() in _OWN_LIMIT_SEARCHERS
    if not own_limit and _concurrency(before) is None and _concurrency(after) is not None:
        found.append(
            f"max_concurrent_trials: {show(before.get('max_concurrent_trials'))} -> "
            f"{show(after.get('max_concurrent_trials'))} (the restored {search.get('name') or search.get('factory')} "
            "searcher is the one the first run built, without a concurrency limiter to take a limit)"
        )
    return found
