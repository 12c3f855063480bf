"""The spec's public face for DAG files: the JSON schema of a search space, for the Params of trigger forms.

The spec itself is :mod:`airflow_tune.common.spec` (both sides import it).
"""

from airflow_tune.common.spec import search_space_schema

__all__ = ["search_space_schema"]
