"""Code references as the engine imports them: any import path the spec names, and the stricter resolution of the
paths only the deployment's allow-list admitted. Imports neither airflow nor ray."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

__all__ = ["EngineError", "import_path", "resolve_allow_listed"]


class EngineError(RuntimeError):
    """The spec cannot be turned into a Tune run on this cluster (missing package, bad trainable, ...)."""


def import_path(path: str, what: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineError(
            f"{what} {path!r}: cannot import module {module_name!r} on the cluster ({exc}); ship it with the job "
            "(working_dir / py_modules / pip) or install it on the cluster"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EngineError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def resolve_allow_listed(path: str, what: str) -> Any:
    """Import ``path`` as an allow-list pattern licenses it: a function or class defined in the named module (or a
    submodule of it), reached without passing through another module, with no ``_``-prefixed name on the way.

    ``my_models.*:*`` licenses ``my_models.train:train_fn``, never ``my_models.train:os.popen`` (``os`` came in by
    import), ``my_models.train:popen`` after ``from os import popen`` (defined in ``os``), or ``fn.__globals__``.
    """
    module_name, _, attr = path.partition(":")
    names = [*module_name.split("."), *attr.split(".")]
    if any(name.startswith("_") for name in names):
        raise EngineError(f"{what} {path!r}: an allow-listed import path has no '_'-prefixed name")
    obj = import_path(path.partition(":")[0] + ":" + attr.split(".")[0], what)
    for part in attr.split(".")[1:]:
        if inspect.ismodule(obj):
            break
        obj = getattr(obj, part, None)
    if inspect.ismodule(obj) or not (inspect.isfunction(obj) or inspect.isclass(obj)):
        raise EngineError(
            f"{what} {path!r}: the allow-list licenses functions and classes defined in the named module, and this "
            f"is {type(obj).__name__} {_shown(obj)}; write the import path in the DAG file to run it"
        )
    defined_in = str(getattr(obj, "__module__", "") or "")
    if defined_in != module_name and not defined_in.startswith(module_name + "."):
        raise EngineError(
            f"{what} {path!r}: defined in module {defined_in!r}, not in {module_name!r}; the allow-list licenses what "
            "the named module defines, never what it imported: name the defining module (and allow-list it)"
        )
    return obj


def _shown(obj: Any) -> str:
    return repr(obj)[:80]
