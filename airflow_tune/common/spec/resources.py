"""What a trial may ask Ray for: resource names and amounts, checked against Ray 2.60's own rules.

Ray schedules by names, and some names are Ray's, not the user's (``ray/_common/constants.py``,
``ray/_common/utils.py``, ``ray/autoscaler/_private/util.py``):

- ``node:__internal_head__`` is on the head node only, so asking for a sliver of it (``{"cpu": 0,
  "node:__internal_head__": 0.001}``) runs trials on a head started with ``--num-cpus=0``; no ``node:__internal*`` name
  is the user's;
- ``node:<ip>`` is on the node with that address (1 of it): a pin to one node, legitimate only when the DAG file wrote
  it (see ``node_pins`` in :mod:`airflow_tune.common.spec.parts`);
- ``accelerator_type:<type>`` is on each node with that accelerator (1 of it): a constraint to a node type, as Ray's
  own ``accelerator_type=`` option writes it (0.001);
- ``bundle`` and any ``<name>_group_<id>`` / ``<name>_group_<i>_<id>`` are a placement group's own resources.

Amounts are fixed point (``ray_constants.MIN_RESOURCE_GRANULARITY`` = 0.0001, ``ray._raylet.RESOURCE_UNIT_SCALING``
= 10000; at most ``MAX_RESOURCE_QUANTITY`` = 1e14). Tested on a Ray 2.60 head: a placement group takes
``{"CPU": 1e-9}`` but the trial's actor in it is refused ("cannot go beyond 0.0001"); ``{"CPU": 0.00015}`` is silently
rounded down to 0.0001; ``{"GPU": 1.5}`` is refused ("GPU resource quantities >1 must be whole numbers") while
``{"CPU": 1.5}`` and custom ``{"accel": 1.5}`` run; ``bundle`` is refused as "a system reserved resource".
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from typing import Any

from airflow_tune.common.spec.errors import Errors, is_number

#: Ray's smallest resource amount (``ray_constants.MIN_RESOURCE_GRANULARITY``); amounts are counted in these units.
RESOURCE_UNIT = 0.0001
_UNITS_PER_ONE = 10_000  # ray._raylet.RESOURCE_UNIT_SCALING
#: Ray's largest resource amount (``ray_constants.MAX_RESOURCE_QUANTITY``).
MAX_RESOURCE_QUANTITY = 100e12
NODE_PREFIX = "node:"  # ray._common.constants.NODE_ID_PREFIX
INTERNAL_NODE_PREFIX = "node:__internal"  # HEAD_NODE_RESOURCE_NAME = "node:__internal_head__"
ACCELERATOR_TYPE_PREFIX = "accelerator_type:"  # ray._common.utils.RESOURCE_CONSTRAINT_PREFIX
BUNDLE_RESOURCE = "bundle"  # ray._common.utils.PLACEMENT_GROUP_BUNDLE_RESOURCE_NAME
#: ``ray.autoscaler._private.util.is_placement_group_resource`` (``re.match``: any name that starts so).
_PLACEMENT_GROUP_RESOURCE = re.compile(r"(.+)_group_([0-9a-zA-Z]+)")
#: Ray's unit-instance resources (``predefined_unit_instance_resources`` "GPU" and the default
#: ``custom_unit_instance_resources``): each device is one instance, shared only in fractions below 1.
UNIT_INSTANCE_RESOURCES = frozenset({"GPU", "neuron_cores", "TPU", "NPU", "HPU", "RBLN", "FURIOSA", "TTNPU", "MBLT"})
#: Accelerators whose Ray manager takes whole numbers only (``validate_resource_request_quantity``).
WHOLE_ONLY_RESOURCES = frozenset({"neuron_cores", "HPU", "RBLN", "FURIOSA", "TTNPU", "MBLT"})
TPU_CHIP_OPTIONS = (1, 2, 4, 8)  # ray._private.accelerators.tpu.TPU_VALID_CHIP_OPTIONS
_PREDEFINED = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}


def ray_name(key: str) -> str:
    """The name Ray sees for a resource key: ``cpu``/``gpu``/``memory`` in any case, else the key itself."""
    return _PREDEFINED.get(key.lower(), key)


def is_node_pin(key: Any) -> bool:
    """A ``node:`` key: a pin to one node (``node:<ip>``), or one of Ray's internal names (refused anyway)."""
    return isinstance(key, str) and key.startswith(NODE_PREFIX)


def _is_constraint(key: str) -> bool:
    """A key that places a trial but holds nothing: a node pin or an accelerator type."""
    return key.startswith(NODE_PREFIX) or key.startswith(ACCELERATOR_TYPE_PREFIX)


def name_problem(key: str) -> tuple[str, str] | None:
    """Why Ray keeps the resource name ``key`` for itself, and the fix; None for a name the user may ask for."""
    if key.startswith(INTERNAL_NODE_PREFIX):
        return (
            "is a resource Ray keeps for itself (node:__internal_head__ is on the head node only, so a trial asking "
            "for it runs on the head, even one started with 0 CPUs)",
            "drop it: trials run on the nodes that offer the CPUs, GPUs or custom resources they ask for",
        )
    if key.startswith(NODE_PREFIX):
        try:
            ipaddress.ip_address(key[len(NODE_PREFIX) :])
        except ValueError:
            return (
                "names no node (Ray's node resources are node:<ip-address>)",
                'pin a node by its address in the DAG file, e.g. "node:10.0.0.5": 0.01, or drop it',
            )
        return None
    if key == ACCELERATOR_TYPE_PREFIX:
        return "names no accelerator type", 'write e.g. "accelerator_type:A100": 0.001, or drop it'
    if key == BUNDLE_RESOURCE or _PLACEMENT_GROUP_RESOURCE.match(key):
        return (
            "is the form of a placement group's own resource (bundle, <name>_group_<id>), which Ray reserves",
            "drop it, or rename the custom resource so that it does not contain _group_",
        )
    return None


def _units(value: float) -> tuple[bool, float]:
    """Whether ``value`` is a whole number of Ray's units, and the amount Ray keeps (it rounds down)."""
    units = value * _UNITS_PER_ONE
    whole = round(units)
    exact = math.isclose(units, whole, rel_tol=1e-9, abs_tol=1e-6)
    kept = whole if exact else math.floor(units)
    return exact, kept / _UNITS_PER_ONE


def amount_problem(key: str, value: float) -> tuple[str, str] | None:
    """Why Ray would refuse or silently change ``value`` of resource ``key`` (a number >= 0), and the fix."""
    if value == 0:
        return None
    name = ray_name(key)
    if value > MAX_RESOURCE_QUANTITY:
        return f"exceeds Ray's largest amount {MAX_RESOURCE_QUANTITY:g}", "give a smaller amount"
    if value < RESOURCE_UNIT:
        return (
            f"is below Ray's smallest amount {RESOURCE_UNIT} (Ray refuses it for the trial, or counts it as 0)",
            f"give 0, or at least {RESOURCE_UNIT}",
        )
    if name == "memory":
        if not float(value).is_integer():
            return (
                "memory is in bytes and Ray rounds it down to whole bytes",
                "give whole bytes, e.g. 2147483648 (2 GiB)",
            )
        return None
    exact, kept = _units(value)
    if not exact:
        return (
            f"Ray counts resources in units of {RESOURCE_UNIT} and would round this down to {kept:g}",
            f"give a multiple of {RESOURCE_UNIT}, e.g. {kept:g}",
        )
    if _is_constraint(key) and value > 1:
        return "each node holds exactly 1 of it, so no node could take this trial", "give a small share, e.g. 0.001"
    if name == "TPU" and value not in TPU_CHIP_OPTIONS:
        return "Ray takes TPU only in chip counts 1, 2, 4 or 8", "give 1, 2, 4 or 8"
    if name in WHOLE_ONLY_RESOURCES and not float(value).is_integer():
        return f"Ray takes {name} in whole numbers only", f"give {math.floor(value) or 1} or {math.ceil(value)}"
    if name in UNIT_INSTANCE_RESOURCES and value > 1 and not float(value).is_integer():
        return (
            f"Ray refuses a fraction of {name} above 1 (one device is shared only in fractions below 1)",
            f"give a whole number ({math.floor(value)} or {math.ceil(value)}) or a fraction below 1",
        )
    return None


def check_bundle(bundle: Mapping[Any, Any], path: str, errors: Errors, *, may_be_empty: bool = False) -> None:
    """One resource dict (``per_trial`` or one bundle): its names, its amounts, and that it holds something.

    :param may_be_empty: the first of several bundles, which Tune takes empty (all 0): the trainable then holds no
        resources, and its child actors the other bundles' (``PlacementGroupFactory``'s empty head bundle).
    """
    seen: dict[str, Any] = {}
    holds = False
    numbers_only = True
    for key, value in bundle.items():
        if not isinstance(key, str) or not key or key != key.strip():
            errors.add(path, key, "not a resource name", 'name a resource, e.g. "cpu", "gpu" or a custom one')
            numbers_only = False
            continue
        where = f"{path}.{key}"
        if not is_number(value) or value < 0:
            errors.add(where, value, "must be a number >= 0", "give an amount, e.g. 1 or 0.5")
            numbers_only = False
            continue
        name = ray_name(key)
        if name in seen:
            errors.add(where, value, f"names {name} again (as {seen[name]!r} too)", "give each resource once")
        seen[name] = key
        problem = name_problem(key) or amount_problem(key, value)
        if problem:
            errors.add(where, value, *problem)
            numbers_only = False
            continue
        holds = holds or (value > 0 and not _is_constraint(key))
    if numbers_only and not holds:
        if may_be_empty and all(v == 0 for v in bundle.values()):
            return
        if all(v == 0 for v in bundle.values()):
            errors.add(path, dict(bundle), "asks for no resources at all", 'ask for at least {"cpu": 1}')
        else:
            errors.add(
                path,
                dict(bundle),
                "asks only for a node pin or accelerator type, so the trial would hold no CPU, GPU or memory there",
                'ask for a resource beside it, e.g. {"cpu": 1}',
            )
