"""Where experiments may live: the storage roots (the Airflow side's rule for ``storage_path``).

The storage path is not only data: the engine reads its spec back from there, Tune unpickles ``tuner.pkl`` from
there, and a ``result.json`` found there becomes the task's XCom. So a storage path that appears only after rendering
(a template, a Param, a trigger conf, an XCom, a macro) must lie under a root that the DAG file wrote or that the
deployment allows; no DAG run can change either:

- **the literal root**, from the operator's ``storage_path`` as the DAG file gives it (before rendering): a string
  with no Jinja block is itself the root; with one, the text before the first ``{{``/``{%``/``{#`` cut back to its
  last ``/`` (``s3://bucket/experiments/{{ params.team }}`` has the root ``s3://bucket/experiments``), and none when
  that text is not a whole URI with a bucket (``{{ params.path }}``, ``s3://{{ params.bucket }}/x``);
- **the deployment's roots**: ``[airflow_tune] allowed_storage_roots`` in airflow.cfg
  (``AIRFLOW__AIRFLOW_TUNE__ALLOWED_STORAGE_ROOTS``) and the ``ray`` connection's extra ``allowed_storage_roots``,
  each comma-separated URIs or a JSON list, read only when the rendered path is not under the literal root.

"Under" compares canonical forms at segment boundaries (:func:`airflow_tune.common.spec.naming.is_under`): same scheme,
same bucket, the root's segments a prefix of the path's. The path itself is refused before that when it is not plain
(userinfo, a port, a query, a fragment, ``.``/``..``/``//``; see :mod:`airflow_tune.common.spec.naming`).

``warm_start`` is not a storage path: a registry URI there is only read for its champion's config, which is data and
is checked as ``points_to_evaluate`` is; nothing from it becomes code, so it is not confined to these roots (confine
what the workers may read with the bucket's own permissions).

Imports airflow only inside functions, and never ray or boto3.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from airflow_tune.common.spec.errors import show
from airflow_tune.common.spec.naming import StorageURIError, normalize_storage_uri, parse_storage_uri

ROOTS_OPTION = "allowed_storage_roots"
CONFIG_SECTION = "airflow_tune"
_JINJA_START = re.compile(r"\{\{|\{%|\{#")
_TEAM_EXAMPLE = 'storage_path="s3://bucket/experiments/{{ params.team }}"'


class StorageRootError(ValueError):
    """A rendered storage path under no root the DAG file wrote or the deployment allows."""

    def __init__(self, rendered: str, literal_root: str | None, deployment_roots: int) -> None:
        self.rendered, self.literal_root, self.deployment_roots = rendered, literal_root, deployment_roots
        wrote = f"the DAG file's root is {literal_root!r}" if literal_root else "the DAG file wrote no root"
        super().__init__(
            f"storage_path = {show(rendered)}: lies under no storage root ({wrote}; the deployment allows "
            f"{deployment_roots} root{'' if deployment_roots == 1 else 's'}). A storage path chosen by rendering (a "
            "template, a Param, a trigger conf, an XCom) must stay under a root, because the cluster reads specs "
            f"and state back from it. Write the root in the DAG file (e.g. {_TEAM_EXAMPLE}), or have the deployment "
            f"add it to [{CONFIG_SECTION}] {ROOTS_OPTION} in airflow.cfg or the ray connection's extra "
            f'"{ROOTS_OPTION}".'
        )

    def __reduce__(self) -> tuple[type[StorageRootError], tuple[str, str | None, int]]:
        return (type(self), (self.rendered, self.literal_root, self.deployment_roots))


def literal_root(storage_path: Any) -> str | None:
    """The root the DAG file wrote in ``storage_path`` (the unrendered argument), canonical, or None."""
    if not isinstance(storage_path, str):
        return None
    block = _JINJA_START.search(storage_path)
    text = storage_path
    if block is not None:
        text = storage_path[: block.start()]
        cut = text.rfind("/")
        if cut < 0:
            return None
        text = text[:cut]
    try:
        return normalize_storage_uri(text)
    except StorageURIError:
        return None


def parse_roots(value: Any) -> list[str]:
    """Roots as a setting gives them: a list, a JSON list, or comma-separated URIs (not yet checked)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise TypeError(f"{ROOTS_OPTION} is not a valid JSON list: {value!r}") from None
        else:
            return [r.strip() for r in text.split(",") if r.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(r, str) for r in value):
        return [r.strip() for r in value if r.strip()]
    raise TypeError(f"{ROOTS_OPTION} must be a list of URIs, a JSON list or a comma-separated string, got {value!r}")


def deployment_roots(connection_roots: Iterable[str] | Callable[[], Iterable[str]] = ()) -> Iterator[str]:
    """The deployment's roots, canonical: the Airflow config option's, then the ``ray`` connection's extra (given,
    or a function called only once the config's are used up, so a path the config admits needs no connection).

    :raises ValueError: a root that is not a plain storage URI, naming where it is set.
    """
    from airflow.configuration import conf

    def checked(where: str, roots: Iterable[str]) -> Iterator[str]:
        for root in roots:
            try:
                yield normalize_storage_uri(root, field=where)
            except StorageURIError as exc:
                raise ValueError(f"{exc}: the deployment's storage root cannot be used; fix it there") from None

    configured = conf.get(CONFIG_SECTION, ROOTS_OPTION, fallback="") or ""
    yield from checked(f"[{CONFIG_SECTION}] {ROOTS_OPTION}", parse_roots(configured))
    extra = connection_roots() if callable(connection_roots) else connection_roots
    yield from checked(f"the ray connection's extra {ROOTS_OPTION}", extra)


def check_storage_path(
    rendered: str, literal_root: str | None, deployment_roots: Iterable[str] | Callable[[], Iterable[str]] = ()
) -> str:
    """Refuse a rendered storage path under neither the literal root nor any of the deployment's roots; return the
    root that admits it (canonical).

    :param rendered: the storage path as rendered.
    :param literal_root: :func:`literal_root` of the unrendered argument.
    :param deployment_roots: the deployment's roots, or a function giving them (called only when needed; read
        lazily, one root at a time, until one admits the path).
    :raises StorageURIError: the path is not a plain storage URI (naming ``storage_path``).
    :raises StorageRootError: the path lies under no root.
    """
    where = parse_storage_uri(rendered)
    if literal_root is not None and where.is_under(admitting := parse_storage_uri(literal_root, "root")):
        return admitting.uri
    counted = 0
    for root in deployment_roots() if callable(deployment_roots) else deployment_roots:
        counted += 1
        if where.is_under(admitting := parse_storage_uri(root, ROOTS_OPTION)):
            return admitting.uri
    raise StorageRootError(rendered, literal_root, counted)


def check_task_storage(task: Any, rendered: str) -> str:
    """:func:`check_storage_path` for a RayTuneOperator: its ``literal_storage_root``, none when a mapped task got
    ``storage_path`` through ``expand()`` from an XCom (data, though it arrives as an argument), and the deployment's
    roots from Airflow's config and the task's ``ray`` connection, read only when needed. Returns the admitting root."""
    from airflow_tune.trust import code

    literal = getattr(task, "literal_storage_root", None)
    mapped_task = task.dag.task_dict.get(task.task_id) if task.has_dag() else None
    if literal is not None and code.arguments_mapped_from_data(mapped_task, ["storage_path"]):
        literal = None
    return check_storage_path(rendered, literal, lambda: deployment_roots(lambda: task.hook.allowed_storage_roots))
