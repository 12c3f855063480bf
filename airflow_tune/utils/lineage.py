"""OpenLineage for the operators: the datasets a tune or promote task read and wrote, from what the task holds after
it ran (its XCom result, its rendered arguments).

The operators' ``get_openlineage_facets_on_complete`` name their datasets with :func:`tune_dataset_names` and
:func:`promote_dataset_names` and wrap them with :func:`operator_lineage`, the one place that imports the OpenLineage
provider's classes, so importing the operators (DAG parsing) never imports them; the naming (:func:`dataset_name`)
is plain logic over URIs. Datasets follow OpenLineage's naming:
``s3://bucket/key`` is namespace ``s3://bucket``, name ``key`` (``gs://`` likewise), a local path is namespace
``file``, name the absolute path. A name never carries a URI's userinfo, port, query or fragment (``s3://user:pw@
bucket:9000/x?token=y`` is ``s3://bucket``, ``x``): lineage goes to whoever reads the lineage backend.

The tasks' run parameters (the search and its winner, the gate's decision) are built in
:mod:`airflow_tune.utils.lineage_parameters`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow_tune.utils.namespaces import server_namespace

#: Schemes whose URIs are named ``<scheme>://<bucket>`` + key (``gcs://`` is gs:// under another name).
_BUCKET_SCHEMES = {"s3": "s3", "gs": "gs", "gcs": "gs"}

Name = tuple[str, str]


def dataset_name(uri: Any) -> Name | None:
    """OpenLineage's ``(namespace, name)`` of a storage URI, or None for anything that is not one (a dict, a
    relative path, a template left unrendered by a failed task, a scheme with no naming here)."""
    if not isinstance(uri, str) or not uri or any(c.isspace() for c in uri) or "{{" in uri or "{%" in uri:
        return None
    if uri.startswith("/"):
        return ("file", uri.rstrip("/") or "/")
    try:
        parts = urlsplit(uri)
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    # The host only: userinfo and a port are dropped, and urlsplit keeps the query and fragment out of the path.
    host = parts.hostname
    if scheme in _BUCKET_SCHEMES and host:
        return (f"{_BUCKET_SCHEMES[scheme]}://{host}", parts.path.strip("/") or "/")
    if scheme == "file" and parts.path.startswith("/") and (host or not parts.netloc):
        return (f"file://{host}" if host else "file", parts.path.rstrip("/") or "/")
    return None


def _unique(uris: Iterable[Any]) -> list[Name]:
    names: list[Name] = []
    for uri in uris:
        name = dataset_name(uri)
        if name is not None and name not in names:
            names.append(name)
    return names


def named_dataset_uris(value: Any) -> list[str]:
    """The storage URIs (``s3://``, ``gs://``, ``file://``) among the strings of ``value``, nested ones too, in order:
    the datasets a spec names for its trainable (e.g. ``trainable_kwargs={"data": "s3://bucket/train.parquet"}``).
    A plain path is not taken: it may name anything on the cluster's nodes."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, str):
            scheme = node.partition("://")[0].lower() if "://" in node else ""
            if (scheme in _BUCKET_SCHEMES or scheme == "file") and dataset_name(node) is not None:
                found.append(node)
        elif isinstance(node, Mapping):
            for item in node.values():
                walk(item)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item)

    walk(value)
    return found


def tune_dataset_names(
    result: Mapping[str, Any] | None,
    warm_start: Any,
    experiment_uri: str | None = None,
    named: Iterable[str] = (),
    mlflow_namespace: str | None = None,
) -> tuple[list[Name], list[Name]]:
    """What a tune task read and wrote: ``(inputs, outputs)``.

    :param result: the task's XCom result (None when it returned none: it failed, or has not run).
    :param warm_start: the rendered ``warm_start``: a registry URI is an input (the champion's config seeds the
        search); a config dict (an XCom) is not a dataset.
    :param experiment_uri: the experiment folder, when a job ran on it but no result came back (a failed task).
    :param named: the dataset URIs the spec names (:func:`named_dataset_uris` of its ``trainable_kwargs``): inputs.
    :param mlflow_namespace: the MLflow tracking server's URI, the namespace of a ``models:/`` warm start (as
        :func:`promote_dataset_names` names the model it promotes into).
    :return: inputs (the warm-start registry, the named datasets) and outputs (the experiment folder, the best
        checkpoint).
    """
    warm: list[Name] = []
    if isinstance(warm_start, str) and warm_start.startswith("models:/"):
        warm = [(server_namespace(mlflow_namespace), warm_start.split("@", 1)[0].rstrip("/"))]
    elif isinstance(warm_start, str) and "://" in warm_start:
        warm = _unique([warm_start])
    inputs = warm + [n for n in _unique(named) if n not in warm]
    if isinstance(result, Mapping):
        outputs = _unique([result.get("experiment_uri"), result.get("best_checkpoint_uri")])
    else:
        outputs = _unique([experiment_uri])
    return inputs, outputs


def promote_dataset_names(
    decision: Mapping[str, Any] | None, source: Any, registry_uri: Any
) -> tuple[list[Name], list[Name]]:
    """What a promote task read and wrote: ``(inputs, outputs)``.

    :param decision: the task's XCom result (None when it returned none).
    :param source: the best checkpoint URI it was given (read, and copied when promoted).
    :param registry_uri: the registry. A promotion writes the version (``<registry>/versions/<version>``: the
        checkpoint's copy and ``model.json``) and moves the registry's champion pointer, which a warm start reads.
        In MLflow (``models:/<name>``) it registers the version ``models:/<name>/<version>`` and moves the model's
        ``champion`` alias: both are named in the namespace of the tracking server (the decision's
        ``tracking_uri``; ``mlflow`` when it has none).
    :return: inputs (the checkpoint) and outputs (the version and the registry; none when nothing was promoted).
    """
    inputs = _unique([source])
    outputs: list[Name] = []
    version = decision.get("version") if isinstance(decision, Mapping) and decision.get("promoted") else None
    if not (isinstance(version, str) and version and isinstance(registry_uri, str) and registry_uri):
        return inputs, outputs
    if registry_uri.startswith("models:/"):
        assert isinstance(decision, Mapping)
        namespace = server_namespace(decision.get("tracking_uri"))
        model = registry_uri.rstrip("/")
        return inputs, [(namespace, f"{model}/{version}"), (namespace, model)]
    try:  # the version's folder is under the registry's path, not after its query
        base = urlsplit(registry_uri)._replace(query="", fragment="").geturl().rstrip("/")
    except ValueError:
        return inputs, outputs
    outputs = _unique([f"{base}/versions/{version}", registry_uri])
    return inputs, outputs


def mlflow_namespace(warm_start: Any, mlflow_conn_id: str) -> str | None:
    """The tracking server's URI, the namespace of a ``models:/`` warm start; None for any other warm start (no
    connection is looked up)."""
    if not (isinstance(warm_start, str) and warm_start.startswith("models:/")):
        return None
    from airflow_tune.hooks.mlflow import MLflowHook

    return MLflowHook(mlflow_conn_id).tracking_uri


def operator_lineage(
    names: Callable[[], tuple[list[Name], list[Name]]],
    log: Any,
    parameters: Callable[[], list[dict[str, str]]] | None = None,
) -> Any:
    """The OpenLineage provider's ``OperatorLineage`` of the datasets ``names()`` gives, with the run parameters
    ``parameters()`` gives (:mod:`airflow_tune.utils.lineage_parameters`) in the ``executionParameters`` run facet. What
    raises is left out (with a warning in the task log), so lineage never fails a task. Imports the provider: call
    it only from ``get_openlineage_facets_on_complete``, which the provider's listener calls."""
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_tune.utils import lineage_parameters

    run_facets: dict[str, Any] = {}
    try:
        facet = lineage_parameters.parameters_facet(parameters()) if parameters is not None else None
    except Exception:
        log.warning("OpenLineage: could not report the parameters of this task; reporting none", exc_info=True)
        facet = None
    if facet is not None:
        run_facets[lineage_parameters.FACET_KEY] = facet
    try:
        inputs, outputs = names()
    except Exception:
        log.warning("OpenLineage: could not name the datasets of this task; reporting none", exc_info=True)
        return OperatorLineage(run_facets=run_facets)
    return OperatorLineage(
        inputs=[Dataset(namespace=ns, name=name) for ns, name in inputs],
        outputs=[Dataset(namespace=ns, name=name) for ns, name in outputs],
        run_facets=run_facets,
    )
