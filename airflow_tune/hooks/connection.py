"""A Ray connection (type ``ray_tune``, or ``ray`` as airflow-tune registered before) resolved into an endpoint: the
dashboard URLs (the API's and the browser's), TLS, headers and the job defaults.

The fields are read whatever the connection's type, so connections of the earlier ``ray`` type keep working. One
written for astro-provider-ray (which registers ``ray`` too) is refused with what to write instead: its ``address``
extra is a Ray Client or dashboard address the hook does not read, and its Kubernetes extras mean nothing here.

Pure functions of the connection's fields and extras (like the Amazon provider's ``utils/connection_wrapper.py``): no
I/O, so they are tested without a cluster and called wherever a hook needs its endpoint.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from airflow_tune.exceptions import RayConnectionError

if TYPE_CHECKING:
    from airflow.sdk import Connection

DEFAULT_PORT = 8265
DEFAULT_SCHEME = "http"


def build_dashboard_url(host: str | None, port: int | None = None, schema: str | None = None) -> str:
    """Return the dashboard base URL (no trailing slash) of a connection's host, port and schema.

    :param host: a host name or address, ``host:port``, or a full URL such as ``https://ray.example.com/ray``.
    :param port: the dashboard port; a port in ``host`` wins. Default 8265, but a full URL keeps its scheme's default.
    :param schema: ``http`` or ``https`` (default ``http``); ignored when ``host`` is a full URL.
    """
    host = (host or "").strip()
    if not host:
        raise RayConnectionError(
            "The Ray connection has no host: set the dashboard host (e.g. 127.0.0.1) or a full URL "
            "(e.g. http://ray-head:8265)."
        )
    if "://" in host:
        parts = urlsplit(host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RayConnectionError(
                f"The Ray connection's host {host!r} is not an http(s) URL: use e.g. http://ray-head:8265."
            )
        if parts.username or parts.password:
            raise RayConnectionError(
                "The Ray connection's host URL holds credentials: remove them and put the token in the password."
            )
        netloc = parts.netloc
        if parts.port is None and port:
            netloc = f"{netloc}:{port}"
        return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    scheme = (schema or DEFAULT_SCHEME).strip().lower()
    if scheme not in ("http", "https"):
        raise RayConnectionError(
            f"The Ray connection's schema is {schema!r}: use 'http' or 'https', or leave it empty for http."
        )
    name, sep, host_port = host.rpartition(":")
    if sep and host.count(":") == 1 and host_port.isdigit():
        host, port = name, int(host_port)
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal needs brackets in a URL
    return f"{scheme}://{host.rstrip('/')}:{port or DEFAULT_PORT}"


def _masked(text: str) -> str:
    return re.sub(r"//[^/]*@", "//***@", text)  # user:password@ is a secret: never echo it


#: The extra naming the dashboard as a browser opens it, when that differs from the host the API calls go to.
BROWSER_URL_OPTION = "dashboard_url"
_BROWSER_URL_FIX = (
    "give the dashboard's address as a browser opens it, e.g. http://127.0.0.1:8265 or https://ray.example.com/ray, "
    "or leave it empty to link to the host"
)


def parse_browser_url(value: Any, token: str | None = None) -> str | None:
    """Return the extra ``dashboard_url`` as a base URL (no trailing slash), or None when it is unset.

    Links built on it open in a browser, so it must be a plain http(s) address: no credentials, query, fragment,
    escapes or dot segments that could make the link open something else, and never the connection's token.

    :param value: the extra's value.
    :param token: the connection's password, which must not appear in the URL.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    name = f"The Ray connection's extra {BROWSER_URL_OPTION!r}"
    if not isinstance(value, str):
        raise RayConnectionError(f"{name} is a {type(value).__name__}, not a URL: {_BROWSER_URL_FIX}.")
    text = value.strip()
    if token and token in text:
        raise RayConnectionError(f"{name} holds the connection's token: remove it; {_BROWSER_URL_FIX}.")
    problem = _browser_url_problem(text)
    if problem:
        raise RayConnectionError(f"{name} = {_masked(text)!r} {problem}: {_BROWSER_URL_FIX}.")
    parts = urlsplit(text)
    return urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/"), "", ""))


def _browser_url_problem(text: str) -> str | None:
    if not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        return "holds spaces, control or non-ASCII characters (write a host in its xn-- form)"
    if "\\" in text or "%" in text:
        return "holds a backslash or a %-escape, which browsers may read as another address"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme.lower() not in ("http", "https") or not text.lower().startswith(f"{parts.scheme.lower()}://"):
        return "is not an http(s) URL"
    if "@" in parts.netloc:
        return "holds credentials (user:password@); the dashboard link must carry none"
    if not parts.hostname:
        return "has no host"
    if "?" in text or "#" in text:
        return "has a query or a fragment; give only the dashboard's base address"
    segments = parts.path.rstrip("/").split("/")[1:]
    if any(segment in ("", ".", "..") for segment in segments):
        return "has an empty, '.' or '..' path segment"
    return None


#: The connection types whose fields the hook reads: its own, and ``ray``, which it registered before
#: (astro-provider-ray registers ``ray`` too, so airflow-tune no longer does; connections of that type keep working).
CONN_TYPE = "ray_tune"
LEGACY_CONN_TYPES = ("ray",)
#: astro-provider-ray's connection form: the Ray address (a ``ray://`` Ray Client address or a dashboard URL) and the
#: Kubernetes settings of its cluster-creating operators; host, port, schema and password are hidden there.
ASTRO_ADDRESS_FIELD = "address"
ASTRO_ONLY_FIELDS = (
    "kube_config_path",
    "kube_config",
    "namespace",
    "cluster_context",
    "disable_verify_ssl",
    "disable_tcp_keepalive",
)
_EXAMPLE_DASHBOARD = "http://ray-head:8265"
_RAY_CLIENT = (
    "a Ray Client address (ray://, port 10001 by default), which airflow-tune does not use: it calls the Jobs API of "
    "the Ray dashboard (port 8265 of the head node by default)"
)


def _named(conn: Any) -> str:
    conn_id = getattr(conn, "conn_id", None)
    return f"The Ray connection {conn_id!r}" if conn_id else "The Ray connection"


def astro_connection_problem(conn: Any, extra: Mapping[str, Any]) -> str | None:
    """Say why a connection written for astro-provider-ray cannot be read here, and what to write; None otherwise.

    A ``ray://`` host is a Ray Client address. With no host, an ``address`` extra (astro-provider-ray's one address
    field) or its Kubernetes extras mark the connection as astro-provider-ray's; with a host, those extras are
    ignored (a connection may serve both providers: the host for airflow-tune, ``address`` for astro-provider-ray).

    :param conn: the Airflow connection.
    :param extra: the connection's extra as a dict.
    """
    host = (conn.host or "").strip()
    address = _extra_value(extra, ASTRO_ADDRESS_FIELD)
    example = _EXAMPLE_DASHBOARD
    if isinstance(address, str) and address.strip().lower().startswith(("http://", "https://")):
        example = _masked(address.strip().rstrip("/"))  # astro-provider-ray's address may be the dashboard's URL
    fix = (
        f"write the Ray dashboard's URL in the connection's host (e.g. {example}, or host ray-head and port 8265) and "
        f"choose the connection type {CONN_TYPE!r} (Ray Tune (airflow-tune)); while astro-provider-ray's tasks still "
        "use this connection, give airflow-tune a connection of its own and pass its id as ray_conn_id"
    )
    if host.lower().startswith("ray://"):
        return f"{_named(conn)} has the host {_masked(host)!r}, {_RAY_CLIENT}: {fix}."
    if host:
        return None
    others = [name for name in ASTRO_ONLY_FIELDS if _extra_value(extra, name) not in (None, False)]
    if address is None and not others:
        return None
    said = [f"{_named(conn)} has no host"]
    if isinstance(address, str) and address.strip().lower().startswith("ray://"):
        said.append(f"its extra {ASTRO_ADDRESS_FIELD!r} = {_masked(address.strip())!r} is {_RAY_CLIENT}")
    elif address is not None:
        shown = _masked(address.strip()) if isinstance(address, str) else address
        said.append(f"its extra {ASTRO_ADDRESS_FIELD!r} = {shown!r} is astro-provider-ray's field, not read here")
    if others:
        names, plural = ", ".join(repr(name) for name in others), len(others) > 1
        said.append(
            f"its extra{'s' if plural else ''} {names} {'are' if plural else 'is'} astro-provider-ray's Kubernetes "
            f"setting{'s' if plural else ''}, not used here"
        )
    return (
        f"{'; '.join(said)}. It looks like a connection written for astro-provider-ray (which registers the 'ray' "
        f"connection type and the same default id, ray_default): {fix}."
    )


def merge_runtime_env(default: Mapping[str, Any] | None, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return ``given`` laid over ``default``: top-level keys of ``given`` win, ``env_vars`` merge key by key.

    :param default: the connection's default runtime_env.
    :param given: the job's own runtime_env.
    """
    merged: dict[str, Any] = copy.deepcopy(dict(default or {}))
    for key, value in (given or {}).items():
        if key == "env_vars" and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **copy.deepcopy(dict(value))}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def stringify_metadata(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """Return metadata with string values, as Ray stores them (``Dict[str, str]``).

    :param metadata: keys and values; non-string values are converted with ``str``.
    """
    return {str(k): v if isinstance(v, str) else str(v) for k, v in (metadata or {}).items()}


def _extra_value(extra: Mapping[str, Any], name: str) -> Any:
    # Older connection forms stored form fields as "extra__<conn_type>__<name>", of either type.
    value = extra.get(name)
    for conn_type in (CONN_TYPE, *LEGACY_CONN_TYPES):
        if value is None:
            value = extra.get(f"extra__{conn_type}__{name}")
    return None if value == "" else value


def _extra_dict(extra: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = _extra_value(extra, name)
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise RayConnectionError(f"The Ray connection's extra {name!r} must be a JSON object.")
    return value


def _extra_patterns(extra: Mapping[str, Any]) -> tuple[str, ...]:
    from airflow_tune.trust.code import ALLOW_LIST_OPTION, parse_patterns

    try:
        return tuple(parse_patterns(_extra_value(extra, ALLOW_LIST_OPTION)))
    except TypeError as exc:
        raise RayConnectionError(f"The Ray connection's extra: {exc}") from None


def _extra_roots(extra: Mapping[str, Any]) -> tuple[str, ...]:
    from airflow_tune.trust.roots import ROOTS_OPTION, parse_roots

    try:
        return tuple(parse_roots(_extra_value(extra, ROOTS_OPTION)))
    except TypeError as exc:
        raise RayConnectionError(f"The Ray connection's extra: {exc}") from None


def _extra_verify(extra: Mapping[str, Any]) -> bool | str:
    value = _extra_value(extra, "verify")
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        return value.strip()
    raise RayConnectionError("The Ray connection's extra 'verify' must be true, false or a CA bundle path.")


@dataclass(frozen=True, repr=False)
class RayEndpoint:
    """Where and how to reach a Ray dashboard, resolved from an Airflow connection.

    :param url: dashboard base URL the API calls go to, no trailing slash.
    :param browser_url: the dashboard's base URL as a browser opens it (the extra ``dashboard_url``), when it
        differs from ``url``; see :attr:`dashboard_url`.
    :param headers: HTTP headers for every request, including ``Authorization`` when the connection has a token.
    :param cookies: cookies for every request.
    :param verify: verify TLS (bool) or the path of a CA bundle.
    :param runtime_env: default runtime_env merged under each job's.
    :param metadata: default metadata added to each job's.
    :param allowed_code_references: import-path patterns this deployment lets rendered values name (see
        :mod:`airflow_tune.trust.code`).
    :param allowed_storage_roots: storage URIs under which rendered storage paths may lie (see
        :mod:`airflow_tune.trust.roots`); checked when used.
    """

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    verify: bool | str = True
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    allowed_code_references: tuple[str, ...] = ()
    allowed_storage_roots: tuple[str, ...] = ()
    browser_url: str | None = None

    def __repr__(self) -> str:
        # Headers and cookies carry credentials: show only their names.
        return (
            f"RayEndpoint(url={self.url!r}, dashboard_url={self.dashboard_url!r}, headers={sorted(self.headers)}, "
            f"cookies={sorted(self.cookies)}, verify={self.verify!r})"
        )

    @property
    def dashboard_url(self) -> str:
        """The dashboard's base URL for links a person opens: the extra ``dashboard_url``, else :attr:`url`."""
        return self.browser_url or self.url

    @property
    def credentials_key(self) -> str:
        """A digest of the credentials, so callers with different credentials never share a cached answer."""
        blob = json.dumps([sorted(self.headers.items()), sorted(self.cookies.items())])
        return hashlib.sha256(blob.encode()).hexdigest()

    @classmethod
    def from_connection(cls, conn: Connection, extra: Mapping[str, Any]) -> RayEndpoint:
        """Resolve a connection and its parsed extra.

        :param conn: the Airflow connection (type ``ray_tune``, or ``ray``: the fields are read whatever the type).
        :param extra: the connection's extra as a dict.
        """
        problem = astro_connection_problem(conn, extra)
        if problem:
            raise RayConnectionError(problem)
        url = build_dashboard_url(conn.host, conn.port, conn.schema)
        headers = {str(k): str(v) for k, v in _extra_dict(extra, "headers").items()}
        if conn.password:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            headers["Authorization"] = f"Bearer {conn.password}"
        return cls(
            url=url,
            headers=headers,
            cookies={str(k): str(v) for k, v in _extra_dict(extra, "cookies").items()},
            verify=_extra_verify(extra),
            runtime_env=_extra_dict(extra, "runtime_env"),
            metadata=stringify_metadata(_extra_dict(extra, "metadata")),
            allowed_code_references=_extra_patterns(extra),
            allowed_storage_roots=_extra_roots(extra),
            browser_url=parse_browser_url(_extra_value(extra, BROWSER_URL_OPTION), conn.password),
        )
