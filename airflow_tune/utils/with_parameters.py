"""``tune.with_parameters(fn, **data)`` given as the trainable, taken apart into the wrapped trainable and its
arguments (:class:`~airflow_tune.common.shipped.WithParameters`), which travel pickled by value; the engine wraps them
again in the job's driver (see that module for why the wrapper itself cannot travel).

Tune's wrapper is a function ``with_parameters.<locals>.inner`` (a function trainable) or a class
``with_parameters.<locals>._Inner`` (a ``tune.Trainable`` subclass) whose closure holds the trainable, the argument
names, their registry key prefix and the registry (arguments there until Ray starts in this process, then in the
object store), the same in Ray 2.43 to 2.60.
"""

from __future__ import annotations

import inspect
from typing import Any

from airflow_tune.common.shipped import WithParameters

_MODULE = "ray.tune.trainable.util"
_FUNCTION = "with_parameters.<locals>.inner"
_CLASS = "with_parameters.<locals>._Inner"


def is_with_parameters(obj: Any) -> bool:
    """Whether ``obj`` is what ``tune.with_parameters`` returned."""
    if getattr(obj, "__qualname__", None) not in (_FUNCTION, _CLASS):
        return False
    return getattr(obj, "__module__", None) == _MODULE


def unwrap(obj: Any) -> WithParameters:
    """The trainable ``tune.with_parameters`` wrapped and the arguments it was given.

    :raises TypeError: the wrapper's closure is not the one this module knows (another Ray release).
    """
    closure_of: Any = vars(obj)["setup"] if inspect.isclass(obj) else obj  # _Inner.setup, which reads the registry
    names = inspect.getclosurevars(closure_of).nonlocals
    registry, prefix, keys = names.get("parameter_registry"), names.get("prefix"), names.get("keys")
    trainable = obj.__bases__[0] if inspect.isclass(obj) else names.get("trainable")
    if registry is None or not isinstance(prefix, str) or keys is None or trainable is None:
        raise TypeError(
            "trainable = tune.with_parameters(...): this Ray release keeps its arguments where airflow-tune cannot "
            "read them; pass the function itself with trainable_kwargs={...} (JSON), or ship a module with "
            "py_modules= and load the data in the trainable"
        )
    parameters: dict[str, Any] = {}
    for key in sorted(keys):
        if prefix + key in registry.to_flush:
            parameters[key] = registry.to_flush[prefix + key]
        else:  # Ray was started in this process, which moved the argument into its object store.
            import ray

            parameters[key] = ray.get(registry.references[prefix + key])
    return WithParameters(trainable=trainable, parameters=parameters)
