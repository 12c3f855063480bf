"""Local folders of a job's runtime_env made into packages on the cluster, as Ray's client makes them.

The engine (this ``airflow_tune`` package) travels with every job as a ``py_modules`` entry. This module ships it
without Ray: it zips the folder as Ray packs a ``py_modules`` directory (the folder itself at the top of the zip,
empty folders kept; ``__pycache__`` and ``*.pyc`` left out), names the zip by its content
(``gcs://_ray_pkg_<hash>.zip``, the form of Ray's content-addressed packages) and uploads it through the dashboard
(``GET``/``PUT /api/packages/gcs/<name>``, the same from Ray 2.43 to 2.60) only when the cluster does not hold it yet.

Ray names a package by the XOR of the SHA-1s of its files, cut to 8 bytes; here it is a SHA-256 over the sorted
paths and contents (32 hex digits kept): one name is one content, which no chosen set of files can imitate.

Any other local folder or file (a ``working_dir``, a user's ``py_modules``, a by-value trainable) is shipped by Ray's
own client, which honours ``.gitignore``/``.rayignore``, ``excludes``, wheels and zip files: that needs Ray on this
side (the provider's ``ray`` extra; see :mod:`airflow_tune.hooks.ray_extra`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_tune.hooks.ray_extra import RayExtraMissing, is_local_path, ray_installed, requirement_files

if TYPE_CHECKING:
    from airflow_tune.hooks.jobs_client import JobsClient

PACKAGE_PREFIX = "_ray_pkg_"
_SKIPPED_DIRS = frozenset({"__pycache__"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
# One upload at a time in this process: two tasks shipping the same engine upload it once.
_LOCK = threading.Lock()


def engine_dir() -> str:
    """The engine package's folder (this installed ``airflow_tune``)."""
    import airflow_tune

    return str(Path(airflow_tune.__file__).resolve().parent)


def package_entries(folder: str | os.PathLike[str]) -> list[tuple[str, Path | None]]:
    """The zip's entries for ``folder``, sorted: (name inside the zip, file or None for an empty folder).

    :param folder: the package folder; its own name is the zip's top folder, as Ray's ``include_parent_dir``.
    """
    root = Path(folder).resolve()
    if not root.is_dir():
        raise ValueError(f"py_modules entry {str(folder)!r} is not a folder")
    entries: list[tuple[str, Path | None]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
        here = Path(dirpath)
        files = sorted(f for f in filenames if not f.endswith(_SKIPPED_SUFFIXES))
        rel = here.relative_to(root.parent).as_posix()
        if not files and not dirnames:
            entries.append((rel + "/", None))
        entries.extend((f"{rel}/{name}", here / name) for name in files)
    return sorted(entries, key=lambda entry: entry[0])


def build_package(folder: str | os.PathLike[str]) -> tuple[str, bytes]:
    """Zip ``folder`` as Ray packs a ``py_modules`` folder; return (package name, zip bytes).

    The name is a digest of every entry's name and content, so the same content always has the same name (the zip
    itself is built with fixed dates and order, so its bytes are the same too).
    """
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, path in package_entries(folder):
            data = b"" if path is None else path.read_bytes()
            digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.external_attr = (0o40755 << 16) | 0x10 if path is None else 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return f"{PACKAGE_PREFIX}{digest.hexdigest()[:32]}.zip", buffer.getvalue()


def ensure_package(client: JobsClient, folder: str | os.PathLike[str]) -> str:
    """The ``gcs://`` URI of ``folder`` on the cluster, uploading it only when the cluster does not hold it.

    :param client: the dashboard's Jobs client.
    :param folder: a package folder (``py_modules`` form: its name is the package's).
    """
    name, data = build_package(folder)
    with _LOCK:
        if not client.package_exists(name):
            client.upload_package(name, data)
    return f"gcs://{name}"


def ship_local_paths(
    client: JobsClient, runtime_env: dict[str, Any], *, engine_dir: str, request_timeout: float
) -> dict[str, Any]:
    """``runtime_env`` with its local ``py_modules``/``working_dir`` replaced by ``gcs://`` URIs, before submitting.

    The engine folder is shipped here; any other local path by Ray's client (it needs the ``ray`` extra); URIs
    (``s3://``, ``gcs://``, ``https://``...) pass through.

    :param client: the dashboard's Jobs client.
    :param runtime_env: the job's runtime_env (not changed).
    :param engine_dir: the engine package's folder.
    :param request_timeout: seconds for each of Ray's upload requests.
    """
    env = dict(runtime_env)
    engine = os.path.realpath(engine_dir)
    modules = list(env.get("py_modules") or [])
    for index, entry in enumerate(modules):
        if isinstance(entry, (str, os.PathLike)) and is_local_path(entry) and os.path.realpath(entry) == engine:
            modules[index] = ensure_package(client, engine)
    if modules:
        env["py_modules"] = modules
    rest = [m for m in modules if not isinstance(m, str) or is_local_path(m)]
    working_dir = env.get("working_dir")
    local_dir = isinstance(working_dir, str) and is_local_path(working_dir)
    if not ray_installed():
        shown = [str(m) for m in rest] + ([f"working_dir={working_dir!r}"] if local_dir else [])
        shown += requirement_files(env)
        if shown:
            raise RayExtraMissing(f"shipping local code with the job ({', '.join(shown)})")
        return env  # the head validates the runtime_env when the job is submitted
    if rest or local_dir:
        env = _upload_with_ray(client.endpoint, env, request_timeout)
    # As Ray's client does before it submits: validate, read local requirements files, refuse other local paths.
    from ray.runtime_env import RuntimeEnv

    try:
        return dict(RuntimeEnv(**env).to_dict())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"runtime_env is not one Ray accepts: {exc}") from exc


def _upload_with_ray(endpoint: Any, runtime_env: dict[str, Any], request_timeout: float) -> dict[str, Any]:
    """Ray's client packs and uploads the remaining local paths, with Ray's rules for them."""
    import copy

    from airflow_tune.hooks.transport import translate_error

    env = copy.deepcopy(runtime_env)
    try:
        client = bounded_ray_client(endpoint, request_timeout)
        client._upload_working_dir_if_needed(env)
        client._upload_py_modules_if_needed(env)
    except Exception as exc:
        raise translate_error(exc, url=endpoint.url, action="upload the job's local code") from exc
    return env


# -- Ray's own client, for what only it ships (local folders other than the engine) --------------------------------

_ADDRESS_ENV_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def ray_address_env_ignored() -> Iterator[None]:
    """Hide RAY_API_SERVER_ADDRESS / RAY_ADDRESS: Ray lets them override an explicit address; the connection wins."""
    with _ENV_LOCK:
        saved = {name: os.environ.pop(name) for name in _ADDRESS_ENV_VARS if name in os.environ}
        try:
            yield
        finally:
            os.environ.update(saved)


def bounded_ray_client(endpoint: Any, request_timeout: float) -> Any:
    """Ray's ``JobSubmissionClient`` for ``endpoint`` with a timeout on every request (Ray sets none)."""
    from ray.job_submission import JobSubmissionClient

    from airflow_tune.hooks.transport import CONNECT_TIMEOUT

    class _BoundedClient(JobSubmissionClient):  # type: ignore[misc]
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:  # type: ignore[override]
            kwargs.setdefault("timeout", (CONNECT_TIMEOUT, request_timeout))
            return super()._do_request(method, endpoint, **kwargs)

    with ray_address_env_ignored():
        return _BoundedClient(
            endpoint.url,
            headers=dict(endpoint.headers),
            cookies=dict(endpoint.cookies) or None,
            verify=endpoint.verify,
        )
