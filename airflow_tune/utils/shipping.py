"""How code written in the DAG file reaches the cluster: by import path when the cluster can import it by name, else
pickled by value with cloudpickle in a small generated package shipped with the job (``py_modules``).

A trainable in the DAG file (which Airflow loads under a generated module name), a lambda or a closure cannot be
imported by name on the cluster. What may be shipped at all is :mod:`airflow_tune.trust.code`'s rule.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_tune.common.contract import SHIPPED_PACKAGE


def _importable_by_name(module_name: str) -> bool:
    """Whether ``module_name`` names a module on the path, not just one in ``sys.modules`` under a made-up name.

    Airflow loads each DAG file as ``unusual_prefix_<hash>_<file>``; such a module is in ``sys.modules`` (so
    ``importlib.util.find_spec`` finds it) but no other process can import it by that name.
    """
    if module_name == "__main__":
        return False
    top = module_name.partition(".")[0]
    if top in sys.builtin_module_names:
        return True
    try:
        return importlib.machinery.PathFinder.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class TrainableCode:
    """How a trainable given as a Python object reaches the cluster.

    :param source: ``module:qualname`` as the DAG file has it, for messages and the UI.
    :param import_path: the path the engine imports: the object's own, or the shipped package's.
    :param payload: the cloudpickle bytes when shipped by value, else None.
    :param digest: when shipped by value, a digest of its code (see :func:`code_digest`), part of the experiment's
        identity: two DAG files' ``train`` functions, or an edited one, are different trainables.
    """

    source: str
    import_path: str
    payload: bytes | None = None
    digest: str | None = None

    @property
    def by_value(self) -> bool:
        return self.payload is not None


def describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def trainable_code(obj: Any, *, attr: str | None = None, what: str = "trainable") -> TrainableCode:
    """Decide how ``obj`` travels: by import path when the cluster can import it by name, else by value.

    :param attr: the name it takes in the shipped package when it travels by value (default: its own name).
    :param what: the argument it was given as, for messages.
    :raises TypeError: ``obj`` is not a function or class, or cloudpickle cannot pickle it.
    """
    if not callable(obj):
        kinds = "a function, a tune.Trainable subclass" if what == "trainable" else "a function"
        raise TypeError(f"{what} = {obj!r}: give {kinds}, or an import path 'package.module:name'")
    source = describe(obj)
    module_name = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", "") or ""
    nested = "<locals>" in qualname or "<lambda>" in qualname
    if module_name and not nested and _importable_by_name(module_name):
        return TrainableCode(source=source, import_path=f"{module_name}:{qualname}")
    payload = _pickle_by_value(obj, module_name, source, what)
    name = getattr(obj, "__name__", "")
    attr = attr or (name if name.isidentifier() and not name.startswith("_") else "trainable")
    return TrainableCode(
        source=source, import_path=f"{SHIPPED_PACKAGE}:{attr}", payload=payload, digest=code_digest(obj, payload)
    )


def code_digest(obj: Any, payload: bytes | None = None) -> str:
    """A digest of a by-value trainable's code: its source and the source of every function and class of its own
    module that it refers to by name, transitively (helpers in the DAG file). The same in every try (pickled bytes
    are not: they may order sets by the process's hash seed); the pickled bytes only when a source is unavailable
    (pickled here when not given)."""
    import hashlib
    import inspect

    module_name = getattr(obj, "__module__", None)
    namespace = vars(sys.modules[module_name]) if module_name in sys.modules else {}
    texts: list[str] = []
    seen: set[int] = set()
    pending = [obj]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        try:
            texts.append(inspect.getsource(item))
        except (OSError, TypeError):
            if payload is None:
                payload = _pickle_by_value(obj, str(module_name or ""), describe(obj))
            return "sha256:" + hashlib.sha256(payload).hexdigest()
        for name in sorted(_global_names(item)):
            ref = getattr(item, "__globals__", namespace).get(name)
            if (inspect.isfunction(ref) or inspect.isclass(ref)) and getattr(ref, "__module__", None) == module_name:
                pending.append(ref)
    return "sha256:" + hashlib.sha256("\n\x00".join(texts).encode()).hexdigest()


def _global_names(obj: Any) -> set[str]:
    """The global names a function's (or a class's methods') code refers to, nested functions included."""
    import inspect
    import types

    codes = []
    if inspect.isfunction(obj):
        codes.append(obj.__code__)
    elif inspect.isclass(obj):
        for value in vars(obj).values():
            func = getattr(value, "__func__", value)
            if inspect.isfunction(func):
                codes.append(func.__code__)
    names: set[str] = set()
    while codes:
        code_object = codes.pop()
        names.update(code_object.co_names)
        codes.extend(c for c in code_object.co_consts if isinstance(c, types.CodeType))
    return names


def _pickle_by_value(obj: Any, module_name: str, source: str, what: str = "trainable") -> bytes:
    from airflow_tune.hooks.ray_extra import RayExtraMissing, ray_installed

    if not ray_installed():
        raise RayExtraMissing(f"pickling the {what} {source} by value (the cluster cannot import it by name)")
    from ray import cloudpickle

    module = sys.modules.get(module_name)
    register = module is not None and module_name != "__main__" and not _importable_by_name(module_name)
    if register:
        cloudpickle.register_pickle_by_value(module)
    try:
        return bytes(cloudpickle.dumps(obj))
    except Exception as exc:
        raise TypeError(
            f"{what} {source} cannot be pickled to ship it with the job ({type(exc).__name__}: {exc}); it "
            "probably holds something that cannot travel (a lock, a connection, the DAG itself). Define it at module "
            "level without such references, or put it in a module shipped with py_modules= and pass "
            "'package.module:name'"
        ) from exc
    finally:
        if register:
            cloudpickle.unregister_pickle_by_value(module)


_SHIPPED_INIT = '''"""Code from an Airflow DAG file, shipped by value by airflow-tune. Generated for one job."""

import pickle
import sys
from pathlib import Path

SOURCE = {source!r}  # the first object's, for the message below
PICKLED_ON = {python!r}

if tuple(sys.version_info[:2]) != tuple(PICKLED_ON):
    raise ImportError(
        f"{{SOURCE}}, from the DAG file, was pickled by value on Python {{PICKLED_ON[0]}}.{{PICKLED_ON[1]}} (the "
        f"Airflow worker) and this Ray node runs Python {{sys.version_info[0]}}.{{sys.version_info[1]}}: run the same "
        "Python minor version on both sides, or ship it by import path ('package.module:name' with py_modules=)"
    )

'''
_SHIPPED_OBJECT = "{attr} = pickle.loads((Path(__file__).parent / {pickle_file!r}).read_bytes())\n"


@contextlib.contextmanager
def shipped_package(*codes: TrainableCode) -> Iterator[str]:
    """A folder holding the by-value code (the trainable, the trial name creators) as the package
    :data:`SHIPPED_PACKAGE`, each object under its own name, for ``py_modules``.

    The folder exists only while the job is submitted (Ray uploads it then); it is removed on exit.
    """
    attrs = [code.import_path.partition(":")[2] for code in codes]
    for code in codes:
        if code.payload is None:
            raise ValueError(f"{code.source} is shipped by import path, not by value")
    if len(set(attrs)) != len(attrs):
        raise ValueError(f"two objects shipped by value under one name: {attrs}")
    root = Path(tempfile.mkdtemp(prefix="aft-shipped-"))
    try:
        package = root / SHIPPED_PACKAGE
        package.mkdir()
        text = _SHIPPED_INIT.format(source=codes[0].source, python=list(sys.version_info[:2]))
        for code, attr in zip(codes, attrs, strict=True):
            pickle_file = f"{attr}.pkl"
            (package / pickle_file).write_bytes(code.payload or b"")
            text += _SHIPPED_OBJECT.format(attr=attr, pickle_file=pickle_file)
        (package / "__init__.py").write_text(text)
        yield str(package)
    finally:
        shutil.rmtree(root, ignore_errors=True)
