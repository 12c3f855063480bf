"""The Experiment view's FastAPI app, mounted by Airflow's API server under ``/airflow-tune``.

- ``GET /airflow-tune/experiment?dag_id=&run_id=&task_id=&map_index=``: the page (the UI shows it in a tab).
- ``GET /airflow-tune/experiment/data?...``: what the page shows, as bounded JSON (read by
  :mod:`airflow_tune.plugins.experiment_files`, shaped by :mod:`airflow_tune.plugins.experiment_shape`), for an
  experiment of the same DAG only: another DAG's experiment is refused in one sentence.
- ``/airflow-tune/static/...``: the page's script and the vendored chart library (uPlot, MIT).

Both routes use Airflow's own authentication (the UI's ``_token`` cookie or a bearer token) and authorization: the
caller must be allowed to read the DAG's task instances (and, for the data, its XComs, which the view reads and
shows); otherwise 403. The server reads storage with the API server's own credentials; none reach the browser.

How a task instance's experiment is found, in order:

1. the task's XCom result (``experiment_uri``): a finished task, or one that returned at once
   (``wait_for_completion=False``);
2. its rendered template fields (``storage_path`` and ``experiment_name``, else the deterministic name
   :func:`airflow_tune.common.spec.experiment_name_for`): Airflow writes them before ``execute`` starts, so they are
   there while the experiment runs and the task is deferred, before any result exists;
3. its arguments in the serialized DAG, when they hold no template (rendered fields of old runs are pruned, and a
   failed task has no result).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, Query
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import select

from airflow_tune.common.contract import join_uri
from airflow_tune.common.spec import experiment_name_for
from airflow_tune.plugins.experiment_bounds import RAY_JOB_ID
from airflow_tune.plugins.experiment_shape import NOT_STARTED_STATES, TaskFacts, build_view

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

STATIC_DIR = Path(__file__).resolve().parent / "static"
PAGE_FILE = STATIC_DIR / "experiment.html"
TUNE_OPERATOR = "RayTuneOperator"
PROMOTE_OPERATOR = "PromoteCheckpointOperator"
#: A task whose template fields include these is a RayTuneOperator (or a subclass of one).
TUNE_FIELDS = frozenset({"storage_path", "param_space", "metric", "mode", "experiment_name"})
PROMOTE_FIELDS = frozenset({"result", "registry_uri", "gate"})
NO_STORE = {"Cache-Control": "no-store"}

read_task_instances = Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))
read_xcoms = Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))


def parse_map_index(value: str | None) -> int:
    """The UI fills ``{MAP_INDEX}`` only for mapped tasks; anything that is not a number means -1."""
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1


# -- the task instance, from Airflow's database ------------------------------------------------------------------
@functools.cache
def _dag_bag() -> Any:
    from airflow.api_fastapi.common.dagbag import create_dag_bag

    return create_dag_bag()


def _serialized_task(session: Session, dag_run: Any, task_id: str) -> Any:
    if dag_run is None:
        return None
    try:
        dag = _dag_bag().get_dag_for_run(dag_run, session=session)
    except Exception:
        return None
    if dag is None or not dag.has_task(task_id):
        return None
    return dag.get_task(task_id)


def _kind(task: Any, operator: str | None, fields: frozenset[str], name: str) -> bool:
    if task is None:
        return operator == name
    return getattr(task, "task_type", None) == name or fields <= set(getattr(task, "template_fields", ()) or ())


def _xcom(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int, key: str) -> Any:
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(run_id=run_id, key=key, task_ids=task_id, dag_ids=dag_id, map_indexes=map_index, limit=1)
    row = session.scalars(query).first()
    if row is None:
        return None
    try:
        return XComModel.deserialize_value(row)
    except Exception:
        return None


def _rendered(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int) -> dict[str, Any] | None:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF

    fields = session.scalar(
        select(RTIF.rendered_fields).where(
            RTIF.dag_id == dag_id, RTIF.run_id == run_id, RTIF.task_id == task_id, RTIF.map_index == map_index
        )
    )
    return fields if isinstance(fields, dict) else None


def _text(value: Any) -> str | None:
    """A rendered name or path: '{{ x | tojson }}' renders a JSON string ('"name"'); None and "None" are nothing."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError:
            return text
        return decoded if isinstance(decoded, str) else None
    return text if text and text not in ("None", "null") and "{{" not in text else None


def _experiment_uri(
    facts: TaskFacts, result: Any, rendered: dict[str, Any] | None, task: Any
) -> tuple[str | None, str | None]:
    """The experiment's URI and where it came from (see the module's docstring), or ``(None, None)``."""
    if isinstance(result, dict) and isinstance(result.get("experiment_uri"), str):
        return result["experiment_uri"], "xcom"
    candidates: list[tuple[str, dict[str, Any]]] = []
    if rendered:
        candidates.append(("rendered", rendered))
    if task is not None and (facts.state or "none") not in NOT_STARTED_STATES:
        # An unstarted task has no experiment yet, even when its arguments name one that exists.
        arguments = {name: getattr(task, name, None) for name in ("storage_path", "experiment_name")}
        candidates.append(("dag", arguments))
    for source, values in candidates:
        storage_path = _text(values.get("storage_path"))
        if not storage_path:
            continue
        raw_name = values.get("experiment_name")
        name = _text(raw_name)
        if raw_name not in (None, "", "None", "null") and not name:
            continue  # a template not rendered here: the name is unknown
        default = experiment_name_for(facts.dag_id, facts.task_id, facts.run_id, facts.map_index)
        return join_uri(storage_path, name or default), source
    return None, None


def _promotion(session: Session, facts: TaskFacts, dag: Any) -> dict[str, Any] | None:
    """The decision of a PromoteCheckpointOperator of the same run about this task's experiment, if one made one."""
    if dag is None:
        return None
    for task in dag.tasks:
        if not _kind(task, None, PROMOTE_FIELDS, PROMOTE_OPERATOR):
            continue
        decision = _xcom(session, facts.dag_id, facts.run_id, task.task_id, facts.map_index, "return_value")
        if decision is None and facts.map_index != -1:
            decision = _xcom(session, facts.dag_id, facts.run_id, task.task_id, -1, "return_value")
        if not isinstance(decision, dict) or "promoted" not in decision:
            continue
        rendered = _rendered(session, facts.dag_id, facts.run_id, task.task_id, facts.map_index) or _rendered(
            session, facts.dag_id, facts.run_id, task.task_id, -1
        )
        judged = (rendered or {}).get("result")
        if isinstance(judged, str):
            try:
                judged = json.loads(judged)
            except json.JSONDecodeError:
                judged = None
        if isinstance(judged, dict) and judged.get("experiment_uri"):
            if judged["experiment_uri"] != facts.experiment_uri:
                continue
        elif facts.task_id not in (getattr(task, "upstream_task_ids", None) or ()):
            continue
        return {**decision, "task_id": task.task_id}
    return None


def mlflow_server(conn_id: str | None = None) -> dict[str, str] | None:
    """The deployment's MLflow server, the base of every MLflow link the view shows: the connection ``conn_id``
    (``mlflow_default``, what ``mlflow_conn_id`` defaults to), its extra ``ui_url`` else its host, as
    :class:`~airflow_tune.hooks.mlflow.MLflowHook` reads them (credentials in either are refused); None without one.
    The experiment's files supply only ids: a URL they name is never linked."""
    from airflow_tune.hooks.mlflow import MLflowHook

    hook = MLflowHook(conn_id or MLflowHook.default_conn_name)
    try:
        return {"conn_id": hook.mlflow_conn_id, "tracking_uri": hook.tracking_uri, "ui_url": hook.ui_url}
    except Exception:  # no such connection, or one the hook refuses: no links
        return None


def ray_job_link(job_id: Any) -> str | None:
    """The Ray job's page on the deployment's cluster: the ``ray_default`` connection's dashboard (what
    ``ray_conn_id`` defaults to; its extra ``dashboard_url`` when set), as the MLflow links take the ``mlflow_default``
    connection's. The XCom supplies the job's id only (a URL it names is never linked); None without a connection."""
    from airflow_tune.hooks.ray import RayHook

    if not isinstance(job_id, str) or not RAY_JOB_ID.match(job_id):
        return None
    try:
        return RayHook().job_url(job_id)
    except Exception:  # no such connection, or one the hook refuses: no link
        return None


def lookup_task(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int) -> TaskFacts:
    """What the view needs to know about one task instance, from Airflow's database."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    facts = TaskFacts(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index)
    ti = session.scalar(
        select(TaskInstance).where(
            TaskInstance.dag_id == dag_id,
            TaskInstance.run_id == run_id,
            TaskInstance.task_id == task_id,
            TaskInstance.map_index == map_index,
        )
    )
    if ti is None:
        facts.found = False
        return facts
    facts.state = str(ti.state.value if hasattr(ti.state, "value") else ti.state) if ti.state else None
    facts.operator = ti.operator
    dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    task = _serialized_task(session, dag_run, task_id)
    facts.is_tune = _kind(task, ti.operator, TUNE_FIELDS, TUNE_OPERATOR)
    if not facts.is_tune:
        return facts
    result = _xcom(session, dag_id, run_id, task_id, map_index, "return_value")
    rendered = _rendered(session, dag_id, run_id, task_id, map_index)
    facts.experiment_uri, facts.experiment_source = _experiment_uri(facts, result, rendered, task)
    facts.ray_job_url = ray_job_link(result.get("job_id") if isinstance(result, dict) else None)
    facts.mlflow_server = mlflow_server() if facts.experiment_uri else None
    if facts.experiment_uri and dag_run is not None:
        try:
            dag = _dag_bag().get_dag_for_run(dag_run, session=session)
        except Exception:
            dag = None
        facts.promotion = _promotion(session, facts, dag)
    return facts


def task_facts(
    session: SessionDep,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: Annotated[str | None, Query()] = None,
) -> TaskFacts:
    """FastAPI dependency: the task instance named by the query (tests override it with facts of their own)."""
    return lookup_task(session, dag_id, run_id, task_id, parse_map_index(map_index))


# -- the app -------------------------------------------------------------------------------------------------------
def create_app() -> FastAPI:
    app = FastAPI(
        title="airflow-tune Experiment view",
        description="The Experiment tab of RayTuneOperator task instances.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.get("/experiment", response_class=HTMLResponse, dependencies=[read_task_instances])
    def experiment_page(dag_id: str, run_id: str, task_id: str, map_index: str | None = None) -> HTMLResponse:
        """The page; it fetches ``experiment/data`` with the same query."""
        return HTMLResponse(PAGE_FILE.read_text(), headers=NO_STORE)

    @app.get("/experiment/data", dependencies=[read_task_instances, read_xcoms])
    def experiment_data(facts: Annotated[TaskFacts, Depends(task_facts)]) -> JSONResponse:
        """The view's data: always 200 with a plain sentence when there is nothing to show (``message``)."""
        return JSONResponse(build_view(facts), headers=NO_STORE)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


@functools.cache
def get_app() -> FastAPI:
    return create_app()
