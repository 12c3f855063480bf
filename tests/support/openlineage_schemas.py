"""The OpenLineage JSON schemas the lineage tests validate facets against, and a validator.

Neither openlineage-python nor the Airflow OpenLineage provider ships the spec's JSON files, and this machine has no
network: the rules are written here from the spec (``spec/OpenLineage.json`` 2-0-2 and
``spec/facets/ExecutionParametersRunFacet.json`` 1-0-0 in the OpenLineage repository), as the client's generated
classes for them carry them (``openlineage.client.generated.base.RunFacet``,
``openlineage.client.generated.execution_parameters_run``): a run facet has a ``_producer`` and a ``_schemaURL``
(both URIs) and any other property; the execution parameters facet holds ``parameters``, each with a required string
``key`` and optional string ``name``, ``description`` and ``value``. The parameter allows no other property here (as
the facet's first version, ``JobRunParametersFacet``, wrote), which is stricter than the client's class."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import jsonschema

BASE_FACET: dict[str, Any] = {
    "type": "object",
    "properties": {
        "_producer": {"type": "string", "format": "uri"},
        "_schemaURL": {"type": "string", "format": "uri"},
    },
    "additionalProperties": True,
    "required": ["_producer", "_schemaURL"],
}

RUN_FACET: dict[str, Any] = {"type": "object", "allOf": [BASE_FACET, {"type": "object", "additionalProperties": True}]}

EXECUTION_PARAMETER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "key": {"type": "string"},
        "name": {"type": "string"},
        "description": {"type": "string"},
        "value": {"type": "string"},
    },
    "required": ["key"],
    "additionalProperties": False,
}

EXECUTION_PARAMETERS_RUN_FACET: dict[str, Any] = {
    "type": "object",
    "allOf": [
        RUN_FACET,
        {"type": "object", "properties": {"parameters": {"type": "array", "items": EXECUTION_PARAMETER}}},
    ],
}

EXECUTION_PARAMETERS_SCHEMA_URL = (
    "https://openlineage.io/spec/facets/1-0-0/ExecutionParametersRunFacet.json#/$defs/ExecutionParametersRunFacet"
)


def _absolute_uri(value: str) -> None:
    parts = urlsplit(value)
    assert parts.scheme in ("http", "https") and parts.netloc, f"not an absolute http(s) URI: {value!r}"


def validate_run_facet(facet: dict[str, Any]) -> None:
    """Raise unless ``facet`` (as serialized into an event) is a valid run facet; one whose ``_schemaURL`` is the
    execution parameters facet's must be a valid one of those too. The ``uri`` format is checked here (jsonschema
    checks it only with an extra package installed)."""
    jsonschema.Draft202012Validator(RUN_FACET).validate(facet)
    _absolute_uri(facet["_producer"])
    _absolute_uri(facet["_schemaURL"])
    if facet["_schemaURL"] == EXECUTION_PARAMETERS_SCHEMA_URL:
        jsonschema.Draft202012Validator(EXECUTION_PARAMETERS_RUN_FACET).validate(facet)
