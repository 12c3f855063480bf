"""The engine: the driver of one experiment, run on the cluster by the cluster's Python with the cluster's Ray.

Importing it first checks that Python and Ray, before any module that needs them is imported (the spec's classes
need Python 3.10; :mod:`airflow_tune.common.versions` needs only the standard library to say so), so a cluster the
engine cannot run on fails at once, saying what it needs, on the line the Airflow side shows first.
"""

from __future__ import annotations

import sys


def runtime_problem() -> str | None:
    """Why this Python (or its Ray) cannot run the engine, or None when it can."""
    from importlib.metadata import PackageNotFoundError, version

    from airflow_tune.common.versions import describe_supported_ray, python_version_problem, ray_version_problem

    python = "{}.{}.{}".format(*sys.version_info[:3])
    problem = python_version_problem(python)
    if problem:
        return (
            f"on this Ray node, {problem}: run the cluster's Ray on one of those (Ray's images have a tag for each, "
            "e.g. rayproject/ray:2.60.0-py313); airflow-tune's spec classes need Python 3.10"
        )
    try:
        ray = version("ray")
    except PackageNotFoundError:
        return f"Ray is not installed in this Python ({sys.executable}); install one of {describe_supported_ray()}"
    problem = ray_version_problem(ray)
    return f"on this Ray node, {problem}" if problem else None


_PROBLEM = runtime_problem()
if _PROBLEM:
    from airflow_tune.common.contract import VERDICT
    from airflow_tune.engine.log_lines import emit

    emit(f"{VERDICT}airflow-tune's engine cannot run here: {_PROBLEM}")
    raise ImportError(f"airflow-tune's engine cannot run here: {_PROBLEM}")
