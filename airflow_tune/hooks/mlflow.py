"""Hook for an MLflow tracking server and its Model Registry, reached through an Airflow connection.

The connection (any type; ``http`` in the local stack's ``mlflow_default``) gives the tracking URI as a full URL in
host (``http://mlflow:5000``) or as host, port and schema; the login and password as HTTP basic auth, or the password
alone as a bearer token (extra ``{"auth": "token"}``); extra ``ui_url``: the server as a browser opens it, for links.

The credentials stay on this side: they are never written into a spec, a job's runtime env or its metadata. The
cluster's Tune callback authenticates with the cluster's own environment (``MLFLOW_TRACKING_TOKEN``, ...).

``requests`` (preflight) and ``mlflow`` (the client, the ``mlflow`` extra) are imported inside the methods that need
them, so importing this module (DAG parsing) stays cheap.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

from airflow.sdk import BaseHook

from airflow_tune.exceptions import MLflowError

if TYPE_CHECKING:
    from mlflow import MlflowClient

_CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
PREFLIGHT_TIMEOUT_S = 10.0


def tracking_uri_of(host: str | None, port: int | None = None, schema: str | None = None, *, conn_id: str) -> str:
    """The tracking URI (no trailing slash) of a connection's host, port and schema; refuses credentials in it."""
    host = (host or "").strip()
    if not host:
        raise MLflowError(
            f"the MLflow connection {conn_id!r} has no host: set the tracking server's URL, e.g. http://mlflow:5000"
        )
    if "://" not in host:
        scheme = (schema or "http").strip().lower()
        host = f"{scheme}://{host}"
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MLflowError(
            f"the MLflow connection {conn_id!r} has host {host!r}: give an http(s) tracking server URL, e.g. "
            "http://mlflow:5000"
        )
    if parts.username or parts.password:
        raise MLflowError(
            f"the MLflow connection {conn_id!r} holds credentials in its host: move them to the login and password"
        )
    netloc = parts.netloc
    if parts.port is None and port:
        netloc = f"{netloc}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


class MLflowHook(BaseHook):
    """Talk to an MLflow tracking server and its Model Registry.

    :param mlflow_conn_id: the Airflow connection of the tracking server.
    """

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "http"
    hook_name = "MLflow"

    def __init__(self, mlflow_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id
        self._resolved: tuple[str, str | None, str | None, str | None, str | None] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mlflow_conn_id={self.mlflow_conn_id!r})"

    # -- connection -----------------------------------------------------------------------------------------------
    def _resolve(self) -> tuple[str, str | None, str | None, str | None, str | None]:
        if self._resolved is None:
            conn = self.get_connection(self.mlflow_conn_id)
            extra = conn.extra_dejson or {}
            uri = tracking_uri_of(conn.host, conn.port, conn.schema, conn_id=self.mlflow_conn_id)
            ui_url = str(extra.get("ui_url") or "").strip().rstrip("/") or None
            if ui_url:
                ui_url = tracking_uri_of(ui_url, conn_id=self.mlflow_conn_id)
            if str(extra.get("auth") or "").lower() == "token":
                self._resolved = (uri, ui_url, None, None, conn.password or None)
            else:
                self._resolved = (uri, ui_url, conn.login or None, conn.password or None, None)
        return self._resolved

    @property
    def tracking_uri(self) -> str:
        """The tracking server's URL (looks the connection up once)."""
        return self._resolve()[0]

    @property
    def ui_url(self) -> str:
        """The server as a browser opens it: the extra ``ui_url``, else the tracking URI."""
        uri, ui_url, *_ = self._resolve()
        return ui_url or uri

    def _auth(self) -> Any:
        _, _, login, password, token = self._resolve()
        if token:
            return {"Authorization": f"Bearer {token}"}, None
        if login:
            return {}, (login, password or "")
        return {}, None

    # -- preflight ------------------------------------------------------------------------------------------------
    def preflight(self) -> None:
        """Fail now, naming the server and the cause, when it does not answer or refuses the credentials.

        One read every tracking server serves (``experiments/search``), so nothing is created.
        """
        import requests

        uri = self.tracking_uri
        headers, auth = self._auth()
        url = f"{uri}/api/2.0/mlflow/experiments/search"
        try:
            response = requests.get(
                url, params={"max_results": 1}, headers=headers, auth=auth, timeout=PREFLIGHT_TIMEOUT_S
            )
        except requests.RequestException as exc:
            raise MLflowError(
                f"the MLflow tracking server {uri} (connection {self.mlflow_conn_id!r}) does not answer: "
                f"{type(exc).__name__}: {str(exc)[:300]}; start it or fix the connection's host"
            ) from None
        if response.status_code in (401, 403):
            raise MLflowError(
                f"the MLflow tracking server {uri} (connection {self.mlflow_conn_id!r}) refuses the credentials "
                f"(HTTP {response.status_code}): fix the connection's login/password or token"
            )
        if response.status_code != 200:
            raise MLflowError(
                f"the MLflow tracking server {uri} (connection {self.mlflow_conn_id!r}) answers HTTP "
                f"{response.status_code} to {url}: {response.text[:300]!r}; is it an MLflow server?"
            )

    def test_connection(self) -> tuple[bool, str]:
        """The connection test of Airflow's UI."""
        try:
            self.preflight()
        except Exception as exc:
            return False, str(exc)
        return True, f"MLflow tracking server {self.tracking_uri} answers"

    # -- client ---------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def client(self) -> Iterator[MlflowClient]:
        """An ``MlflowClient`` on the connection's server (tracking and registry), its credentials set only while
        the block runs (the client reads them from the environment at each request)."""
        try:
            from mlflow import MlflowClient
        except ImportError:
            raise MLflowError(
                "the MLflow client is not installed on the Airflow side: pip install 'airflow-tune[mlflow]'"
            ) from None
        uri = self.tracking_uri
        _, _, login, password, token = self._resolve()
        values = {
            "MLFLOW_TRACKING_USERNAME": login,
            "MLFLOW_TRACKING_PASSWORD": password if login else None,
            "MLFLOW_TRACKING_TOKEN": token,
        }
        saved = {name: os.environ.get(name) for name in _CREDENTIAL_ENV}
        try:
            for name, value in values.items():
                if value:
                    os.environ[name] = value
                else:
                    os.environ.pop(name, None)
            yield MlflowClient(tracking_uri=uri, registry_uri=uri)
        finally:
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old

    # -- links ----------------------------------------------------------------------------------------------------
    def experiment_url(self, experiment_id: str) -> str:
        return f"{self.ui_url}/#/experiments/{quote(str(experiment_id), safe='')}"

    def run_url(self, experiment_id: str, run_id: str) -> str:
        return f"{self.experiment_url(experiment_id)}/runs/{quote(str(run_id), safe='')}"

    def model_version_url(self, name: str, version: str | int) -> str:
        return f"{self.ui_url}/#/models/{quote(str(name), safe='')}/versions/{quote(str(version), safe='')}"
