"""The Ray releases a cluster may run: the engine (``airflow_tune.engine``, run there by the cluster's Python with
the cluster's Ray) is tested on each of them, and the Pythons it runs on. Imports no Ray, and nothing but the
standard library at import: the engine checks a cluster's Python with it first, on any Python."""

from __future__ import annotations

__all__ = [
    "SUPPORTED_PYTHON",
    "SUPPORTED_RAY",
    "describe_supported_ray",
    "python_minor",
    "python_version_problem",
    "ray_version_problem",
]

#: Ray on the cluster: at least the first (inclusive), below the second (exclusive). 2.43 is the first release whose
#: ``ray.tune`` exports ``RunConfig``, ``CheckpointConfig`` and ``get_checkpoint``; 2.60 the last one tested.
SUPPORTED_RAY = ("2.43.0", "2.61")


def describe_supported_ray() -> str:
    """The supported range in words, e.g. ``Ray 2.43.0 to 2.60.x (>=2.43.0,<2.61)``."""
    from packaging.version import Version

    low, high = SUPPORTED_RAY
    top = Version(high)
    last = f"{top.major}.{top.minor - 1}.x" if top.minor else f"below {high}"
    return f"Ray {low} to {last} (>={low},<{high})"


def ray_version_problem(version: str) -> str | None:
    """Why a cluster running Ray ``version`` cannot run the engine, or None when the version is supported.

    The range reads as pip reads ``>=2.43.0,<2.61``: a pre-release of a supported release is in it (``2.50.0rc1``),
    but not ``2.43.0rc1`` (before 2.43.0) nor ``2.61.0rc1`` (a pre-release of the excluded 2.61); nor a nightly
    build (``3.0.0.dev0``).
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    low, high = SUPPORTED_RAY
    try:
        parsed = Version(str(version).strip())
    except InvalidVersion:
        return f"its Ray version {version!r} is not a version number; airflow-tune supports {describe_supported_ray()}"
    if SpecifierSet(f">={low},<{high}").contains(parsed, prereleases=True):
        return None
    side = "older" if parsed < Version(low) else "newer"
    return f"Ray {version} is {side} than airflow-tune supports ({describe_supported_ray()})"


#: Python on the cluster, as on the Airflow side (pyproject's requires-python): the first minor (inclusive) to the
#: second (exclusive). The engine's spec classes need 3.10 (``dataclass(kw_only=True)``); 3.13 is the last tested.
SUPPORTED_PYTHON = ((3, 10), (3, 14))


def python_minor(version: str) -> tuple[int, int] | None:
    """``(3, 13)`` of ``"3.13.1"``, or None when ``version`` does not start with two numbers."""
    parts = str(version).strip().split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def python_version_problem(version: str) -> str | None:
    """Why a cluster running Python ``version`` cannot run the engine, or None when it can."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_PYTHON
    supported = f"Python {low_major}.{low_minor} to {high_major}.{high_minor - 1}"
    minor = python_minor(version)
    if minor is None:
        return f"its Python version {version!r} is not a version number; airflow-tune's engine runs on {supported}"
    if SUPPORTED_PYTHON[0] <= minor < SUPPORTED_PYTHON[1]:
        return None
    return f"Python {version} is outside what airflow-tune's engine runs on ({supported})"
