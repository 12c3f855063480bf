"""The spec's ``callbacks`` as Tune callbacks (see :mod:`airflow_tune.common.spec.callbacks`), added after the
engine's own.

Tune adds its CSV, JSON and TensorBoardX loggers by itself unless the run already has one of each kind (or
``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``): naming one configures that one. A logger whose package the cluster lacks,
and a custom callback that cannot be imported or is no ``tune.Callback``, fail the setup naming what to fix.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ray import tune

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.common.spec.callbacks import LOGGERS, WANDB_INIT_ARGS, logger_name, normalize_callback
from airflow_tune.engine import compat
from airflow_tune.engine.imports import EngineError, import_path


def build_callbacks(spec: ExperimentSpec) -> list[Any]:
    """The spec's callbacks, in its order, each a new object."""
    return [
        build_callback(normalize_callback(entry), f"callbacks[{i}]") for i, entry in enumerate(spec.callbacks or [])
    ]


def build_callback(entry: dict[str, Any], where: str) -> Any:
    args = dict(entry.get("args") or {})
    if entry.get("factory"):
        path = entry["factory"]
        factory = import_path(path, f"{where}.factory")
        try:
            callback = factory(**args)
        except ImportError as exc:
            missing = getattr(exc, "name", None) or str(exc)
            raise EngineError(
                f"{where}.factory {path!r} needs the package {missing!r}, which is not installed on the cluster "
                f"({exc}): add it to the operator's pip=[...] or to the cluster image"
            ) from exc
        if not isinstance(callback, tune.Callback):
            raise EngineError(
                f"{where}.factory {path!r} gave a {type(callback).__name__}, not a ray.tune.Callback: name a "
                "tune.Callback subclass, or a function that returns an instance of one"
            )
        return callback
    name = logger_name(entry["name"])
    path, package, _ = LOGGERS[name]
    if package is not None and importlib.util.find_spec(package[0]) is None:
        raise EngineError(
            f"{where}: the {name} logger needs the package {package[1]!r}, which is not installed on the cluster: add "
            "it to the operator's pip=[...] or to the cluster image"
        )
    cls = import_path(path, where)
    # W&B hands what its signature does not name to wandb.init (**kwargs); the rest must be the cluster's Ray's own.
    own = {k: v for k, v in args.items() if not (name == "wandb" and k in WANDB_INIT_ARGS)}
    compat.check_arguments(cls, own, f"{where} ({path.rpartition(':')[2]})", named=True)
    return cls(**args)
