"""OpenLineage run parameters of a tune and a promote task, in OpenLineage's standard ``executionParameters`` run
facet (``ExecutionParametersRunFacet`` 1-0-0, which openlineage-python generates; a ``JobRunParametersFacet.json``
of the same shape, key ``jobRunParameters``, appears in the spec's history, but openlineage-python 1.54 has no class
for it).

The tune task's COMPLETE event names what the search asked and what it found: the metric and mode, the search space,
the number of samples asked for, the best trial's config and value, and the trial counts; the promote task's names
the gate's decision (promoted or not, the reason, the version written, the gate and what it compared).

The facet's values are strings (its schema types them so): a string as it is, anything else as JSON text
(``jsonsafe``'s, so a NaN is ``"NaN"``, never a bare ``NaN`` token). Every string is cleared of credentials first: a
URI anywhere in a value loses its userinfo, query and fragment (``s3://u:pw@bkt/x?token=y`` becomes ``s3://bkt/x``),
through :func:`airflow_tune.utils.namespaces.server_namespace`, as dataset names do.

A value is at most :data:`MAX_VALUE_CHARS` characters. The events go to whatever reads the lineage backend (HTTP,
Kafka with its 1 MB default message limit, a file), beside the OpenLineage provider's own facets (which already hold
the DAG's whole task tree), and are emitted within the listener's ``execution_timeout``; a grid of thousands of
points must not make every tune event that size. A longer search space or config is shortened into JSON that still
parses (long lists and objects cut to their first items with a ``"... N more"`` marker, long strings cut), and its
``description`` says so with the SHA-256 of the full JSON text; the full value stays in the experiment's
``.airflow_tune/spec.json`` and ``result.json``. Pure logic but :func:`parameters_facet`, which imports the OpenLineage
client (call it only from the lineage hooks).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from airflow_tune import __version__
from airflow_tune.common import jsonsafe
from airflow_tune.utils.namespaces import server_namespace

#: The run facet's key in an event's ``run.facets`` (the spec's name for ExecutionParametersRunFacet).
FACET_KEY = "executionParameters"
#: The facet's ``_producer``: this package, at its version.
PRODUCER = f"https://github.com/airflow-tune/airflow-tune/tree/{__version__}"
#: The longest value written, in characters of JSON text (see the module's docstring for why).
MAX_VALUE_CHARS = 4096
#: How a value is shortened, step by step until it fits: (items kept per list or object, characters per string).
_SHORTEN_STEPS = ((32, 256), (8, 64), (3, 32), (1, 16))

Parameter = dict[str, str]

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]*")


def without_credentials(uri: str) -> str:
    """``uri`` with scheme, host, port and path only: no userinfo, query or fragment (``<uri>`` when it does not
    parse)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(uri)
        _ = parts.port  # raises on a port that is not a number
    except ValueError:
        return "<uri>"
    base = server_namespace(uri, default="")
    if not base:  # no host: file:///x, or a scheme with no authority
        base = f"{parts.scheme.lower()}://" if parts.scheme else ""
    return base + parts.path


def scrub(value: Any) -> Any:
    """``value`` (JSON-safe, see :func:`airflow_tune.common.jsonsafe.strict`) with every URI in its strings and keys
    cleared of credentials."""
    if isinstance(value, str):
        return _URI.sub(lambda m: without_credentials(m.group(0)), value) if "://" in value else value
    if isinstance(value, Mapping):
        return {scrub(str(k)): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _shorten(value: Any, items: int, chars: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + "..."
    if isinstance(value, list):
        kept = [_shorten(v, items, chars) for v in value[:items]]
        return kept + ([f"... {len(value) - items} more"] if len(value) > items else [])
    if isinstance(value, Mapping):
        keys = sorted(value)
        out = {k[:chars]: _shorten(value[k], items, chars) for k in keys[:items]}
        if len(keys) > items:
            out["..."] = f"{len(keys) - items} more keys"
        return out
    return value


def bounded_json(value: Any, limit: int = MAX_VALUE_CHARS) -> tuple[str, str | None]:
    """``value`` as compact JSON text (sorted keys, strict, credentials cleared) of at most ``limit`` characters,
    and None; or, when the full text is longer, a shortened value's text and a description saying so."""
    clean = scrub(jsonsafe.strict(value))
    full = _compact(clean)
    if len(full) <= limit:
        return full, None
    digest = hashlib.sha256(full.encode()).hexdigest()
    note = (
        f"shortened from {len(full)} characters to fit {limit} (lists and objects cut to their first items, long "
        f"strings cut); SHA-256 of the full JSON text: {digest}"
    )
    for items, chars in _SHORTEN_STEPS:
        text = _compact(_shorten(clean, items, chars))
        if len(text) <= limit:
            return text, note
    return _compact({"shortened_from_chars": len(full), "sha256": digest}), note


def _text(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """A scalar parameter's value: a string as it is, anything else as JSON text; credentials cleared, cut to
    ``limit``."""
    clean = scrub(jsonsafe.strict(value))
    text = clean if isinstance(clean, str) else _compact(clean)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _add(params: list[Parameter], key: str, name: str, value: Any, *, as_json: bool = False) -> None:
    if value is None:
        return
    if as_json:
        text, note = bounded_json(value)
        params.append({"key": key, "name": name, "value": text, **({"description": note} if note else {})})
    else:
        params.append({"key": key, "name": name, "value": _text(value)})


def tune_parameters(result: Mapping[str, Any] | None, spec: Any = None) -> list[Parameter]:
    """The tune task's parameters (``tune.*`` keys), from its XCom result and its spec.

    :param result: the task's XCom result (None when it returned none: it failed; only the job and experiment when
        it did not wait for the job).
    :param spec: the task's ``ExperimentSpec`` (None before it was built): its ``param_space`` (the declarative
        search space) and ``num_samples``, and its ``metric`` and ``mode`` when the result has none.
    """
    got: Mapping[str, Any] = result if isinstance(result, Mapping) else {}
    metric = got.get("metric") or getattr(spec, "metric", None)
    mode = getattr(spec, "mode", None)
    param_space = getattr(spec, "param_space", None)
    num_samples = getattr(spec, "num_samples", None)
    best_metrics = got.get("best_metrics")
    params: list[Parameter] = []
    _add(params, "tune.experiment", "Experiment", got.get("experiment"))
    _add(params, "tune.metric", "Metric", metric)
    _add(params, "tune.mode", "Mode", got.get("mode") or mode)
    _add(params, "tune.search_space", "Search space", param_space, as_json=True)
    _add(params, "tune.num_samples", "Samples asked for", num_samples)
    if "best_config" in got:  # a finished search (not a job left running)
        value = best_metrics.get(metric) if isinstance(best_metrics, Mapping) and isinstance(metric, str) else None
        _add(params, "tune.best_value", f"Best {metric}", value)
        _add(params, "tune.best_config", "Best config", got.get("best_config"), as_json=True)
        _add(params, "tune.best_trial_id", "Best trial", got.get("best_trial_id"))
        for key, name in (("num_trials", "Trials"), ("num_terminated", "Trials ended"), ("num_errored", "Errored")):
            _add(params, f"tune.{key}", name, got.get(key))
    return params


def promote_parameters(decision: Mapping[str, Any] | None, gate: Any, threshold: Any = None) -> list[Parameter]:
    """The promote task's parameters (``promote.*`` keys): the gate and its decision.

    :param decision: the task's XCom result, or what the gate decided when the task failed after it (None before).
    :param gate: the operator's gate; ``threshold`` is named only with ``gate="threshold"``.
    """
    params: list[Parameter] = []
    _add(params, "promote.gate", "Gate", gate if isinstance(gate, str) else None)
    if gate == "threshold":
        _add(params, "promote.threshold", "Threshold", threshold)
    if not isinstance(decision, Mapping):
        return params
    promoted = decision.get("promoted")
    _add(params, "promote.promoted", "Promoted", promoted if isinstance(promoted, bool) else None)
    _add(params, "promote.reason", "Reason", decision.get("reason"))
    _add(params, "promote.version", "Version", decision.get("version") or None)
    _add(params, "promote.metric", "Metric", decision.get("metric"))
    _add(params, "promote.mode", "Mode", decision.get("mode"))
    _add(params, "promote.value", "Candidate's value", decision.get("value"))
    champion = decision.get("champion")
    if isinstance(champion, Mapping):
        _add(params, "promote.champion_version", "Champion's version", champion.get("version"))
        _add(params, "promote.champion_value", "Champion's value", champion.get("value"))
    return params


def parameters_facet(params: list[Parameter]) -> Any:
    """OpenLineage's ``ExecutionParametersRunFacet`` of ``params``, produced by this package; None when the
    installed OpenLineage client has no such class (older than the facet). Imports the client."""
    try:
        from openlineage.client.generated.execution_parameters_run import (
            ExecutionParameter,
            ExecutionParametersRunFacet,
        )
    except ImportError:
        return None
    return ExecutionParametersRunFacet(
        parameters=[ExecutionParameter(**p) for p in params],
        producer=PRODUCER,
    )
