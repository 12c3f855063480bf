"""An auth manager with per-DAG permissions for the end-to-end tests (Airflow's Simple auth manager has none).

``AIRFLOW__CORE__AUTH_MANAGER=tests.support.dag_auth_manager.DagAccessAuthManager`` with
``AIRFLOW_TUNE_TEST_DAG_ACCESS="reader=dag_a|dag_b;other=dag_c"``: each named user may reach only the DAGs listed for
it (any access entity, within what its Simple auth manager role allows); every other user is the Simple auth
manager's. A request about no DAG in particular (a list) is the role's to decide, and lists are then filtered DAG by
DAG through :meth:`is_authorized_dag`, as Airflow's own endpoints do.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

ACCESS_ENV = "AIRFLOW_TUNE_TEST_DAG_ACCESS"


def dag_access() -> dict[str, set[str]]:
    """``{user: {dag_id, ...}}`` from :data:`ACCESS_ENV`."""
    access: dict[str, set[str]] = {}
    for entry in filter(None, os.environ.get(ACCESS_ENV, "").split(";")):
        user, _, dags = entry.partition("=")
        access[user.strip()] = {d.strip() for d in dags.split("|") if d.strip()}
    return access


class DagAccessAuthManager(SimpleAuthManager):
    """The Simple auth manager, with each user named in :data:`ACCESS_ENV` confined to its DAGs."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        allowed = dag_access().get(user.get_name())
        dag_id = getattr(details, "id", None)
        if allowed is not None and dag_id is not None and dag_id not in allowed:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
