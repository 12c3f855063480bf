"""Airflow internals that tests read and that moved between 3.1 and 3.3 (the product's own shims are in
:mod:`airflow_tune.utils.version_compat`): so the unit tests run on every supported Airflow."""

from __future__ import annotations

from typing import Any

from airflow_tune.utils.version_compat import AIRFLOW_V_3_2_PLUS


def import_string(path: str) -> Any:
    """What the triggerer does with a trigger's class path."""
    from airflow.sdk.module_loading import import_string as _import_string

    return _import_string(path)


def serde_round_trip(value: Any) -> Any:
    """``value`` through Airflow's serde, as the triggerer stores a trigger's kwargs."""
    if AIRFLOW_V_3_2_PLUS:
        from airflow.sdk.serde import deserialize, serialize
    else:
        from airflow.serialization.serde import deserialize, serialize  # type: ignore[no-redef]
    return deserialize(serialize(value))


def fastapi_apps() -> list[Any]:
    """The ``fastapi_apps`` of every plugin, as the API server mounts them."""
    from airflow import plugins_manager

    if AIRFLOW_V_3_2_PLUS:
        return list(plugins_manager.get_fastapi_plugins()[0])
    plugins_manager.initialize_fastapi_plugins()  # type: ignore[attr-defined]
    return list(plugins_manager.fastapi_apps or [])  # type: ignore[attr-defined]


def external_views() -> list[Any]:
    """The ``external_views`` of every plugin that the UI is given (after the url_route check)."""
    from airflow import plugins_manager

    if AIRFLOW_V_3_2_PLUS:
        return list(plugins_manager._get_ui_plugins()[0])
    plugins_manager.initialize_ui_plugins()  # type: ignore[attr-defined]
    return list(plugins_manager.external_views or [])  # type: ignore[attr-defined]


def task_runtime_hooks() -> Any:
    """The hooks a task's process knows (by connection type), as the Task SDK looks them up."""
    if AIRFLOW_V_3_2_PLUS:
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

        return ProvidersManagerTaskRuntime().hooks
    from airflow.providers_manager import ProvidersManager

    return ProvidersManager().hooks


_HOOK_META = """
import json, sys
from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService
meta = [m.model_dump(mode="json") for m in HookMetaService.hook_meta_data() if m.connection_type == sys.argv[1]]
print(json.dumps(meta))
"""


def connection_form(conn_type: str) -> dict[str, Any]:
    """What the UI's connection form is given for ``conn_type`` (``GET /ui/connections/hook_meta``), as JSON.

    3.2+ read ``conn-fields`` from the provider info. 3.1 calls the hook's form methods under a mocked wtforms, and
    only when the hook is first imported in the process: so there it is asked in a fresh one, as an API server is.
    """
    if AIRFLOW_V_3_2_PLUS:
        from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

        metas = [m.model_dump(mode="json") for m in HookMetaService.hook_meta_data() if m.connection_type == conn_type]
    else:
        import json
        import subprocess
        import sys

        out = subprocess.run(
            [sys.executable, "-c", _HOOK_META, conn_type], capture_output=True, text=True, timeout=120, check=True
        )
        metas = json.loads(out.stdout.strip().splitlines()[-1])
    [meta] = metas
    return dict(meta)
