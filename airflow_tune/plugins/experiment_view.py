"""The Experiment view: a tab on task instances in the Airflow UI (UI plugins need Airflow 3.1 or later).

Registered with the ``airflow.plugins`` entry point (a plugin named only in the provider info is not loaded while
``[core] lazy_discover_providers`` is on, the default). Every Airflow process loads plugins (the scheduler, the
triggerer, each task's process) but only the API server serves this one, so importing this module stays cheap: the
FastAPI app (:mod:`airflow_tune.plugins.experiment_app`, which imports FastAPI and Airflow's API modules) is built
on the first request the API server routes to it. Nothing here imports ray or boto3.
"""

from __future__ import annotations

from typing import Any

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/airflow-tune"
VIEW_NAME = "Experiment"
URL_ROUTE = "airflow-tune-experiment"


def base_path(path: str) -> str:
    """``path`` under the API server's base URL path (``[api] base_url`` may put Airflow under a prefix)."""
    from urllib.parse import urlparse

    base_url = conf.get("api", "base_url", fallback="/") or "/"
    prefix = urlparse(base_url).path if base_url.startswith(("http://", "https://")) else base_url
    return prefix.rstrip("/") + path


class LazyApp:
    """An ASGI app that builds the view's FastAPI app on its first request (only the API server gets one)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from airflow_tune.plugins.experiment_app import get_app

        await get_app()(scope, receive, send)


class ExperimentViewPlugin(AirflowPlugin):
    """Adds the "Experiment" tab to task instances; a task that is not a RayTuneOperator's says so in one sentence."""

    name = "airflow_tune_experiment_view"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "airflow-tune Experiment view"}]
    external_views = [
        {
            "name": VIEW_NAME,
            "href": base_path(
                f"{URL_PREFIX}/experiment?dag_id={{DAG_ID}}&run_id={{RUN_ID}}&task_id={{TASK_ID}}&map_index={{MAP_INDEX}}"
            ),
            "destination": "task_instance",
            "url_route": URL_ROUTE,
        }
    ]
