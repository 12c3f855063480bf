"""Where a promotion goes and how it judges are code positions: ``registry_uri`` and ``gate`` as the DAG file wrote
them (or the deployment allows), never chosen by data.

A rendered ``registry_uri`` (a template, a Param, a trigger conf, an XCom, a macro, or ``expand()`` over an XCom)
would let whoever triggers a run promote into another team's model, and a rendered ``gate`` would let them skip the
gate. So :class:`~airflow_tune.operators.promote.PromoteCheckpointOperator` keeps what its arguments were before
rendering (:class:`Written`, taken in ``__init__`` as RayTuneOperator keeps its import paths and storage root) and,
at execute, before any registry or S3 call, :func:`check_task` refuses, naming the field, the value and the fix:

- a ``registry_uri`` that is not one the DAG file wrote (:func:`airflow_tune.trust.code.literal_strings` of
  the argument), unless it is an ``s3://`` registry under a root by the storage roots' rules
  (:mod:`airflow_tune.trust.roots`): the root the DAG file wrote (``s3://bucket/models/{{ params.model }}`` has
  the root ``s3://bucket/models``) or one of the deployment's ``allowed_storage_roots`` (``[airflow_tune]`` in
  airflow.cfg, the ``ray`` connection's extra), and a plain URI (no ``..``, query, userinfo, port, ``%``-escape).
  A ``models:/<name>`` the DAG file did not write is always refused: a registered model's name has no root
  to stay under.
- a ``gate`` that is not one the DAG file wrote. ``gate`` is not a template field; this refuses the Jinja text of
  a DAG written for an older version (it would never render) and a gate ``expand()`` maps from an XCom.

``threshold`` stays templatable: it is a value the gate compares with. Imports airflow only inside functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from airflow_tune.common.spec.errors import show
from airflow_tune.common.spec.naming import parse_storage_uri
from airflow_tune.registries.gates import GATES
from airflow_tune.registries.mlflow import is_mlflow_uri
from airflow_tune.trust import code, roots

#: The operator's arguments that are code positions.
TARGET_ARGUMENTS = ("registry_uri", "gate")
_JINJA = re.compile(r"\{\{|\{%|\{#")
_DATA = "a template, a Param, a trigger conf, an XCom or a macro"


class PromotionTargetError(ValueError):
    """A ``registry_uri`` or ``gate`` that the DAG file did not write and the deployment does not allow."""

    def __init__(self, field: str, value: Any, problem: str, fix: str) -> None:
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field} = {show(value)}: {problem}. {fix}")

    def __reduce__(self) -> tuple[type[PromotionTargetError], tuple[str, Any, str, str]]:
        return (type(self), (self.field, self.value, self.problem, self.fix))


@dataclass(frozen=True)
class Written:
    """What the DAG file wrote for a promotion, from the operator's arguments before rendering."""

    registries: frozenset[str] = frozenset()
    registry_root: str | None = None
    gates: frozenset[str] = frozenset()

    @classmethod
    def of(cls, registry_uri: Any, gate: Any) -> Written:
        root = None
        if isinstance(registry_uri, str) and not is_mlflow_uri(registry_uri):
            root = roots.literal_root(registry_uri)
        return cls(frozenset(code.literal_strings(registry_uri)), root, frozenset(code.literal_strings(gate)))


def check_gate(gate: Any, written: Written) -> None:
    """Refuse a gate the DAG file did not write."""
    if isinstance(gate, str) and gate in written.gates:
        return
    if isinstance(gate, str) and _JINJA.search(gate):
        problem = "gate is not a template field: how a winner is judged is written in the DAG file, not chosen per run"
    else:
        problem = f"the DAG file did not write this gate (it came from {_DATA}, e.g. expand() over an XCom)"
    raise PromotionTargetError(
        "gate",
        gate,
        problem,
        f"Write the gate in the DAG file (one of {', '.join(GATES)}); threshold stays templatable, e.g. "
        'gate="threshold", threshold="{{ params.threshold }}"',
    )


def check_registry(
    registry_uri: Any,
    written: Written,
    deployment_roots: Iterable[str] | Callable[[], Iterable[str]] = (),
    *,
    field: str = "registry_uri",
) -> None:
    """Refuse a registry the DAG file did not write, unless it is an ``s3://`` one under a root the DAG file wrote
    or the deployment allows.

    :param registry_uri: the rendered value.
    :param written: what the DAG file wrote (:meth:`Written.of`).
    :param deployment_roots: the deployment's storage roots, or a function giving them (called only when the
        written root does not admit the registry).
    :param field: the argument named in a refusal (``warm_start`` reads a registry too).
    :raises PromotionTargetError: naming ``registry_uri``, the value and the fix.
    :raises StorageURIError: a rendered ``s3://`` registry that is not a plain URI (naming ``registry_uri``).
    """
    if isinstance(registry_uri, str) and registry_uri in written.registries:
        return
    if is_mlflow_uri(registry_uri):
        raise PromotionTargetError(
            field,
            registry_uri,
            f"the DAG file did not write this MLflow registry (it came from {_DATA}); a registered model's name "
            "chooses whose model a promotion moves, and a name has no root to stay under",
            'Write it in the DAG file, e.g. registry_uri="models:/digits" (one promote task per model)',
        )
    parse_storage_uri(registry_uri, field)
    try:
        roots.check_storage_path(registry_uri, written.registry_root, deployment_roots)
    except roots.StorageRootError as exc:
        wrote = f"the DAG file's root is {exc.literal_root!r}" if exc.literal_root else "the DAG file wrote no root"
        count = exc.deployment_roots
        raise PromotionTargetError(
            field,
            registry_uri,
            f"the DAG file did not write this registry (it came from {_DATA}) and it lies under no root ({wrote}; "
            f"the deployment allows {count} root{'' if count == 1 else 's'}); a registry is where this DAG's winners "
            "go, not data",
            'Write it in the DAG file (registry_uri="s3://bucket/models/my-model"), or write its root with a '
            'template after it ("s3://bucket/models/{{ params.model }}"), or have the deployment add the root to '
            f"[{roots.CONFIG_SECTION}] {roots.ROOTS_OPTION} in airflow.cfg or the ray connection's extra "
            f'"{roots.ROOTS_OPTION}"',
        ) from None


def check_task(task: Any) -> None:
    """:func:`check_gate` and :func:`check_registry` for a PromoteCheckpointOperator at execute (after rendering):
    its ``written_targets``, none for an argument a mapped task got through ``expand()`` from an XCom (data, though
    it arrives as an argument), and the deployment's roots from Airflow's config and the task's ``ray`` connection,
    read only when needed."""
    written: Written = getattr(task, "written_targets", None) or Written()
    mapped_task = task.dag.task_dict.get(task.task_id) if task.has_dag() else None
    from_data = code.arguments_mapped_from_data(mapped_task, TARGET_ARGUMENTS)
    if "gate" in from_data:
        written = Written(written.registries, written.registry_root, frozenset())
    if "registry_uri" in from_data:
        written = Written(frozenset(), None, written.gates)
    check_gate(task.gate, written)

    def connection_roots() -> Iterable[str]:
        from airflow_tune.hooks.ray import RayHook

        return RayHook(task.ray_conn_id).allowed_storage_roots

    check_registry(task.registry_uri, written, lambda: roots.deployment_roots(connection_roots))
