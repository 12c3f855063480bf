"""What in a spec may never be code, and the fields only the operator sets.

- :func:`check_data_only`: a spec is strict JSON data: no mapping with a key a Ray Tune decoder acts on and no NaN or
  infinity, in any field at any depth (see :data:`~airflow_tune.common.spec.space.TUNE_DECODER_KEYS`).
- :func:`check_provenance`: ``owner``, ``trainable_digest`` and ``allow_listed`` have their operator-made shapes.
- :func:`field_code_references`: where a field holds code (an import path the cluster imports); the rest is data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow_tune.common.spec.callbacks import callback_factory
from airflow_tune.common.spec.errors import Errors
from airflow_tune.common.spec.parts import PARTS, normalize_part
from airflow_tune.common.spec.space import (
    IMPORT_PATH,
    decoder_keys_of,
    non_finite_numbers,
    space_code_references,
    tune_code_nodes,
)
from airflow_tune.common.spec.stopping import stop_code_references
from airflow_tune.common.spec.trial_output import NAMING_FIELDS

#: The fields that hold code, each in the positions :func:`field_code_references` names.
CODE_FIELDS = (
    "trainable",
    "param_space",
    "scheduler",
    "search",
    "callbacks",
    "trial_name_creator",
    "trial_dirname_creator",
    "stop",
)

_OWNER_KEYS: dict[str, type | tuple[type, ...]] = {
    "dag_id": str,
    "task_id": str,
    "map_index": int,
    "run_id": (str, type(None)),
}
_DIGEST = re.compile(r"^sha256:[0-9a-f]{16,64}\Z")


def check_provenance(kw: dict[str, Any], errors: Errors) -> None:
    """``owner``, ``trainable_digest`` and ``allow_listed`` are the operator's, never rendered: check their shape."""
    owner = kw.get("owner")
    if owner is not None and (
        not isinstance(owner, Mapping)
        or set(owner) != set(_OWNER_KEYS)
        or not all(isinstance(owner[k], t) and not isinstance(owner[k], bool) for k, t in _OWNER_KEYS.items())
    ):
        errors.add(
            "owner",
            owner,
            "must be {dag_id: str, task_id: str, map_index: int, run_id: str or null}",
            "leave it unset: the operator sets it",
        )
    digest = kw.get("trainable_digest")
    if digest is not None and (not isinstance(digest, str) or not _DIGEST.match(digest)):
        errors.add("trainable_digest", digest, "not a sha256 digest", "leave it unset: the operator sets it")
    listed = kw.get("allow_listed", [])
    if not isinstance(listed, list) or not all(isinstance(p, str) and IMPORT_PATH.match(p) for p in listed):
        errors.add("allow_listed", listed, "must be a list of import paths", "leave it unset: the operator sets it")


def check_data_only(data: Mapping[str, Any], errors: Errors) -> None:
    """A spec is strict JSON data: no node Tune runs as code and no NaN or infinity, in any field at any depth.

    Looks at the fields as given (a part that failed its own checks is looked at too), after the other checks, so a
    number a field's own check named already is not named twice.
    """
    for key, value in data.items():
        plain = normalize_part(key, value) if key in PARTS else value
        for where, node in tune_code_nodes(plain, key):
            keys = " and ".join(repr(k) for k in decoder_keys_of(node))
            errors.add(
                where,
                node,
                f'Ray Tune decodes a mapping with the key {keys} as code ({{"eval": ...}} runs Python, '
                '{"_type": "CLOUDPICKLE_FALLBACK"} unpickles), so no spec carries such a key at any depth',
                "rename the key, or give a plain value; code is a sample_from or factory import path written in the "
                "DAG file",
            )
        for where, number in non_finite_numbers(plain, key):
            named = {item.split(" = ", 1)[0] for item in errors.items}
            # A field's own check may have named this number already (e.g. the bounds of a uniform).
            if any(where[: m.start()] in named for m in re.finditer(r"[.\[]|$", where)):
                continue
            errors.add(
                where,
                number,
                "not a finite number (strict JSON has no NaN or infinity)",
                "give a finite number, or null or a string that the trainable converts",
            )


def field_code_references(name: str, value: Any) -> list[tuple[str, Any]]:
    """The code positions of the spec field ``name`` holding ``value`` (in any form the field accepts), with what each
    holds: the ``trainable`` itself; each trial name creator; each ``sample_from`` of ``param_space`` (inside nested
    configs, lists, ``choice`` and ``grid_search``, never inside ``const``; the space's own keys are parameter names);
    a scheduler's or searcher's ``factory`` (``"pkg.mod:make"`` alone is one) and each ``sample_from`` of PBT's
    ``hyperparam_mutations`` that is not a list of values; each callback's class path or ``factory``; each custom
    stopper's ``factory`` in ``stop`` (``"pkg.mod:MyStopper"`` alone or in the list is one). Everything
    else a field holds is data. The one grammar of code: :func:`~airflow_tune.common.spec.code_references` reads a spec
    with it, and the operator reads its arguments as the DAG file wrote them with it."""
    if name in ("trainable", *NAMING_FIELDS):
        return [(name, value)] if isinstance(value, str) else []
    if name == "param_space":
        items = value.items() if isinstance(value, Mapping) else []
        return [ref for key, node in items for ref in space_code_references(node, f"param_space.{key}")]
    if name == "stop":
        return stop_code_references(value)
    if name == "callbacks":
        entries = enumerate(value if isinstance(value, list) else [])
        return [(f"callbacks[{i}].factory", path) for i, entry in entries if (path := callback_factory(entry))]
    if name not in ("scheduler", "search"):
        return []
    part = normalize_part(name, value)
    if not isinstance(part, Mapping):
        return []
    refs: list[tuple[str, Any]] = [(f"{name}.factory", part["factory"])] if part.get("factory") else []
    args = part.get("args")
    mutations = args.get("hyperparam_mutations") if name == "scheduler" and isinstance(args, Mapping) else None
    for key, node in mutations.items() if isinstance(mutations, Mapping) else []:
        if not isinstance(node, list):  # a list of values is data; anything else is a search-space node
            refs += space_code_references(node, f"scheduler.args.hyperparam_mutations.{key}")
    return refs
