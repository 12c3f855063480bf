"""What needs Ray on the Airflow side, and the refusal when it is missing.

With code that lives on the cluster (import paths, remote ``py_modules``/``working_dir`` URIs) the provider needs no
Ray here: it talks REST to the dashboard and ships its own engine package (:mod:`airflow_tune.hooks.packages`).
Shipping code from this side needs the ``ray`` extra: a trainable pickled by value (``ray.cloudpickle``), a local
``working_dir`` or ``py_modules`` folder (Ray's packing rules), and :func:`airflow_tune.checkpoints.load_checkpoint`.
Using one without it fails in the task, before anything is written or submitted; DAG parsing never needs Ray.

A trainable pickled by value loads on a cluster of another Ray release when both run the same Python minor version
(code objects are rebuilt from their bytecode) and the cluster's ``ray.cloudpickle`` has every reconstructor the
pickle names. Every release from 2.43 to 2.60 pickles with protocol 5 (``pickle.HIGHEST_PROTOCOL``) and has the same
reconstructors (``_make_function``, ``_make_skeleton_class``, ``_make_skeleton_enum``, ``_function_setstate``,
``_class_setstate``, ``_builtin_type``, ``_make_cell``, ...): 2.43 to 2.50 vendor cloudpickle 3.0's code (labelled
2.0.0 in 2.43), 2.60 cloudpickle 3.1.2. So within the supported range both ways load (tests/compat prove
2.43 -> 2.60 and 2.60 -> 2.43/2.50.1); outside it nothing is promised and :func:`by_value_problem` refuses.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Iterable
from typing import Any

from airflow_tune.exceptions import AirflowTuneException

RAY_EXTRA = 'pip install "airflow-tune[ray]"'


class RayExtraMissing(AirflowTuneException):
    """Something shipped from this side needs Ray here, and Ray is not installed (the ``ray`` extra).

    :param what: what needed it, e.g. "a trainable pickled by value".
    """

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} needs Ray on the Airflow side, which is not installed: install the provider's 'ray' extra "
            f"({RAY_EXTRA}, a Ray release from 2.43 to 2.60), or give code that lives on the cluster (an import path "
            "'package.module:name' with a remote py_modules/working_dir URI such as s3://..., or the cluster "
            "image's own packages). Nothing was written or submitted."
        )


def ray_installed() -> bool:
    """Whether Ray is importable here (without importing it)."""
    return importlib.util.find_spec("ray") is not None


@functools.cache
def installed_ray_version() -> str | None:
    """This side's Ray version, read from its distribution's metadata (no Ray import); None without Ray."""
    from importlib.metadata import PackageNotFoundError, version

    if not ray_installed():
        return None
    try:
        return version("ray")
    except PackageNotFoundError:  # pragma: no cover - an unpackaged checkout of Ray
        import ray

        return str(ray.__version__)


def is_local_path(entry: Any) -> bool:
    """Whether a ``py_modules``/``working_dir`` entry is a path on this machine, not a URI the cluster fetches
    (``s3://``, ``gs://``, ``gcs://``, ``https://``, ``file://`` on the nodes, ...)."""
    return not (isinstance(entry, str) and "://" in entry)


def requirement_files(runtime_env: dict[str, Any]) -> list[str]:
    """The local requirements files of a runtime_env (``pip``/``uv`` as a path, ``conda`` as a .yaml path), which
    Ray's client reads on this side."""
    found = [f"{key}={runtime_env[key]!r}" for key in ("pip", "uv") if isinstance(runtime_env.get(key), str)]
    conda = runtime_env.get("conda")
    if isinstance(conda, str) and conda.endswith((".yaml", ".yml")):
        found.append(f"conda={conda!r}")
    return found


def needs_ray(working_dir: Any, py_modules: Iterable[Any] | None, runtime_env: Any, pip: Any = None) -> list[str]:
    """What in a job's code settings must be shipped from this side by Ray's client: local paths (the engine
    aside, which the provider ships itself) and local requirements files.

    :param working_dir: the operator's ``working_dir``.
    :param py_modules: the operator's ``py_modules``.
    :param runtime_env: the operator's ``runtime_env``, a dict or its JSON (its ``working_dir``, ``py_modules``,
        ``pip``, ``uv`` and ``conda`` count too).
    :param pip: the operator's ``pip``.
    """
    from airflow_tune.trust.rendered import coerce_rendered

    env = coerce_rendered("runtime_env", runtime_env) if runtime_env else {}
    env = env if isinstance(env, dict) else {}
    found = [f"working_dir={w!r}" for w in (working_dir, env.get("working_dir")) if w and is_local_path(w)]
    modules = [*list(env.get("py_modules") or []), *list(py_modules or [])]
    found += [f"py_modules entry {m!r}" for m in modules if is_local_path(m)]
    return found + requirement_files({**env, **({"pip": pip} if pip else {})})


def refuse_without_ray(working_dir: Any, py_modules: Iterable[Any] | None, runtime_env: Any, pip: Any = None) -> None:
    """Raise :class:`RayExtraMissing` when the job ships local code and Ray is not installed here."""
    if ray_installed():
        return
    found = needs_ray(working_dir, py_modules, runtime_env, pip)
    if found:
        raise RayExtraMissing("shipping local code with the job (" + ", ".join(found) + ")")


def by_value_problem(here_ray: str | None, cluster_ray: str, cluster_python: str | None = None) -> str | None:
    """Why a trainable pickled by value with Ray ``here_ray`` on this Python may not load on a cluster of Ray
    ``cluster_ray`` and Python ``cluster_python``, or None when it loads (see the module's docstring: any two releases
    of the supported range, on the same Python minor: pickled code objects are bytecode of one minor).

    :param here_ray: this side's Ray version (None: no Ray here, nothing can be pickled).
    :param cluster_ray: the cluster's Ray version, as its dashboard says.
    :param cluster_python: the cluster's Python version, as its dashboard says (None: not known here; the shipped
        package then refuses to load on another minor, on the cluster).
    """
    from airflow_tune.common.versions import describe_supported_ray, python_minor, ray_version_problem

    if here_ray is None:
        return f"Ray is not installed on the Airflow side ({RAY_EXTRA})"
    here_python = "{}.{}".format(*sys.version_info[:2])
    there = python_minor(cluster_python) if cluster_python else None
    if there is not None and there != tuple(sys.version_info[:2]):
        return (
            f"it is pickled on Python {here_python} (this Airflow worker) and the cluster runs Python "
            f"{cluster_python}: pickled code loads only on the Python minor it was pickled on. Run Python "
            f"{there[0]}.{there[1]} on the Airflow workers (or {here_python} on the cluster), or ship the trainable by "
            "import path (trainable='package.module:name' with py_modules=), which works across Python versions"
        )
    if ray_version_problem(here_ray) is None and ray_version_problem(cluster_ray) is None:
        return None
    return (
        f"it is pickled with Ray {here_ray}'s cloudpickle on the Airflow side and the cluster runs Ray "
        f"{cluster_ray}; airflow-tune tests pickles between the releases of {describe_supported_ray()} only: run one "
        "of them on both sides, or ship the trainable by import path"
    )


def refuse_by_value(source: str, cluster_ray: str, cluster_python: str | None = None) -> None:
    """Raise when a trainable pickled by value here may not load on a cluster of Ray ``cluster_ray`` and Python
    ``cluster_python``.

    :param source: the trainable, ``module:qualname``.
    :param cluster_ray: the cluster's Ray version.
    :param cluster_python: the cluster's Python version (None: unknown).
    """
    from airflow_tune.exceptions import RayConnectionError

    problem = by_value_problem(installed_ray_version(), cluster_ray, cluster_python)
    if problem:
        raise RayConnectionError(
            f"The trainable {source} is shipped by value, but {problem}. Nothing was written or submitted."
        )
