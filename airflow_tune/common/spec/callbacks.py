"""The spec's ``callbacks``: Tune callbacks added to the run, after the engine's own.

Each entry is one of:

- Tune's own logger by name, with its arguments as JSON: ``"csv"`` or ``{"name": "mlflow", "args": {...}}``
  (:data:`LOGGERS`, read from Ray 2.60's signatures; an argument the cluster's older Ray lacks is refused there);
- a custom ``tune.Callback`` as a code reference: ``"pkg.mod:MyCallback"`` or ``{"factory": "pkg.mod:make",
  "args": {...}}`` (a class or a function returning the callback, called with ``args``). A code reference is code:
  only the DAG file or the deployment's allow-list may name one (:func:`~airflow_tune.common.spec.code_references`).

Credentials never travel in the spec (it is stored beside the experiment and shown as a rendered field): an
argument that names one (``api_key``, ``tracking_token``, a password in a URI) is refused, with the environment
variable to set on the cluster instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow_tune.common.spec.arguments import check_json_args, check_named_args
from airflow_tune.common.spec.errors import Errors, did_you_mean, is_int
from airflow_tune.common.spec.space import IMPORT_PATH

#: Tune's logger callbacks by name: the class (``module:name``), the module it needs on the cluster (and its pip
#: name), and the arguments the spec takes with their kind.
LOGGERS: dict[str, tuple[str, tuple[str, str] | None, dict[str, str]]] = {
    "csv": ("ray.tune.logger:CSVLoggerCallback", None, {}),
    "json": ("ray.tune.logger:JsonLoggerCallback", None, {}),
    "tbx": ("ray.tune.logger:TBXLoggerCallback", ("tensorboardX", "tensorboardX"), {}),
    "mlflow": (
        "ray.air.integrations.mlflow:MLflowLoggerCallback",
        ("mlflow", "mlflow"),
        {
            "tracking_uri": "uri",
            "registry_uri": "uri",
            "experiment_name": "text",
            "tags": "tags",
            "save_artifact": "bool",
            "log_params_on_trial_end": "bool",
        },
    ),
    "wandb": (
        "ray.air.integrations.wandb:WandbLoggerCallback",
        ("wandb", "wandb"),
        {
            "project": "text",
            "group": "text",
            "excludes": "texts",
            "log_config": "bool",
            "upload_checkpoints": "bool",
            "save_checkpoints": "bool",
            "upload_timeout": "count",
            "video_kwargs": "object",
            "image_kwargs": "object",
            # Passed on to wandb.init through the callback's **kwargs.
            "entity": "text",
            "tags": "texts",
            "notes": "text",
            "mode": "wandb_mode",
            "job_type": "text",
        },
    ),
}
#: W&B arguments the callback passes on to ``wandb.init`` (its ``**kwargs``), not parameters of its own.
WANDB_INIT_ARGS = ("entity", "tags", "notes", "mode", "job_type")
LOGGER_ALIASES = {
    "tensorboard": "tbx",
    "tensorboardx": "tbx",
    **{path.rpartition(":")[2].lower(): name for name, (path, _, _) in LOGGERS.items()},
}
#: The schemes of an MLflow tracking or registry URI the spec takes: a tracking server's.
TRACKING_SCHEMES = ("http", "https")
#: Loggers that write one file per trial: named twice, two writers would share it.
_SINGLE = ("csv", "json", "tbx")
#: Arguments of Tune's loggers that are credentials, with the variable that carries them on the cluster.
CREDENTIAL_ARGS: dict[str, dict[str, str]] = {
    "mlflow": {"tracking_token": "MLFLOW_TRACKING_TOKEN"},
    "wandb": {"api_key": "WANDB_API_KEY", "api_key_file": "WANDB_API_KEY"},
}
_CREDENTIAL_NAME = re.compile(
    r"(api_?key|apikey|token|secret|password|passwd|credentials?|access_key|private_key)(_file)?\Z", re.IGNORECASE
)
_ENTRY_KEYS = ("name", "factory", "args")
_EXAMPLE = '["csv", {"name": "mlflow", "args": {"experiment_name": "x"}}, {"factory": "pkg.mod:MyCallback"}]'

_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "count": ("an integer >= 0", lambda v: is_int(v) and v >= 0),
    "text": ("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip())),
    "uri": ("a URI string", lambda v: isinstance(v, str) and bool(v.strip())),
    "texts": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "tags": (
        "an object of string tags",
        lambda v: isinstance(v, Mapping) and all(isinstance(x, (str, int, float, bool)) for x in v.values()),
    ),
    "object": ("a JSON object", lambda v: isinstance(v, Mapping)),
    "wandb_mode": ('"online", "offline" or "disabled"', lambda v: v in ("online", "offline", "disabled")),
}


def logger_name(name: Any) -> str:
    low = str(name).lower()
    return LOGGER_ALIASES.get(low, low)


def normalize_callback(entry: Any) -> Any:
    """An entry in its full form ``{"name"|"factory": ..., "args": {...}}``; a string is a name, or a factory when it
    holds ``:``; anything else is returned as it is (and refused by :func:`check_callbacks`)."""
    if isinstance(entry, str):
        return {"factory": entry, "args": {}} if ":" in entry else {"name": entry, "args": {}}
    if isinstance(entry, Mapping):
        return {"args": {}, **entry}
    return entry


def callback_factory(entry: Any) -> str | None:
    """The import path of a custom callback entry, or None."""
    full = normalize_callback(entry)
    factory = full.get("factory") if isinstance(full, Mapping) else None
    return factory if isinstance(factory, str) else None


def callback_destinations(callbacks: Any) -> list[tuple[str, str]]:
    """Every ``(field, URL)`` where a logger of ``callbacks`` sends data or reads from (MLflow's ``tracking_uri`` and
    ``registry_uri``: the arguments of kind ``uri``). A destination is not data: the operator accepts one only when the
    DAG file wrote it. A custom callback's arguments are its own code's to read, so none is named here."""
    found: list[tuple[str, str]] = []
    for i, entry in enumerate(callbacks if isinstance(callbacks, list) else []):
        full = normalize_callback(entry)
        if not isinstance(full, Mapping) or "name" not in full or not isinstance(full.get("args"), Mapping):
            continue
        kinds = LOGGERS.get(logger_name(full["name"]), ("", None, {}))[2]
        for arg, value in full["args"].items():
            if kinds.get(arg) == "uri" and isinstance(value, str):
                found.append((f"callbacks[{i}].args.{arg}", value))
    return found


def check_callbacks(callbacks: Any, errors: Errors) -> None:
    """Every entry of ``callbacks``; every problem is added to ``errors``."""
    if callbacks is None:
        return
    if not isinstance(callbacks, list):
        errors.add("callbacks", callbacks, "must be a list", f"write {_EXAMPLE}")
        return
    seen: set[str] = set()
    for i, entry in enumerate(callbacks):
        where = f"callbacks[{i}]"
        full = normalize_callback(entry)
        if not isinstance(full, Mapping):
            errors.add(where, entry, "must be a name, an import path or an object", f"write {_EXAMPLE}")
            continue
        bad = [k for k in full if k not in _ENTRY_KEYS]
        for k in bad:
            close = did_you_mean(k, _ENTRY_KEYS)
            hint = f"did you mean {close!r}? " if close else ""
            errors.add(f"{where}.{k}", full[k], "unknown key", f"{hint}a callback takes name or factory, and args")
        if bad:
            continue
        if ("name" in full) == ("factory" in full):
            errors.add(where, entry, "needs exactly one of name or factory", f"write {_EXAMPLE}")
            continue
        args = full["args"]
        if not isinstance(args, Mapping):
            errors.add(f"{where}.args", args, "must be a JSON object", "pass keyword arguments as {name: value}")
            continue
        if "factory" in full:
            _check_factory(full["factory"], args, where, errors)
        else:
            name = logger_name(full["name"])
            if name in _SINGLE and name in seen:
                errors.add(f"{where}.name", full["name"], "named twice", "name each of csv, json and tbx once")
            seen.add(name)
            _check_logger(full["name"], args, where, errors)


def _check_factory(factory: Any, args: Mapping[str, Any], where: str, errors: Errors) -> None:
    if not isinstance(factory, str) or not IMPORT_PATH.match(factory):
        errors.add(
            f"{where}.factory",
            factory,
            "not an import path",
            'write "package.module:CallbackClass" or "package.module:make" (importable on the cluster)',
        )
    _refuse_credentials(args, where, {}, errors)
    check_json_args(where, args, errors, code={})


def _check_logger(given: Any, args: Mapping[str, Any], where: str, errors: Errors) -> None:
    name = logger_name(given)
    if name not in LOGGERS:
        close = did_you_mean(given, list(LOGGERS))
        hint = f"did you mean {close!r}? " if close else ""
        errors.add(
            f"{where}.name",
            given,
            "unknown logger",
            f"{hint}use one of {', '.join(LOGGERS)}, or a custom callback's import path as factory",
        )
        return
    path, _, kinds = LOGGERS[name]
    args = _refuse_credentials(args, where, CREDENTIAL_ARGS.get(name, {}), errors)
    check_json_args(where, args, errors, code={})
    cls = path.rpartition(":")[2]
    check_named_args(where, cls, args, errors, set_by_spec={}, code={}, known=dict.fromkeys(kinds), at=f"{where}.args")
    for arg, value in args.items():
        if arg not in kinds:
            continue
        what, ok = _KINDS[kinds[arg]]
        if not ok(value):
            errors.add(f"{where}.args.{arg}", value, f"must be {what}", f"give {what}")
        elif kinds[arg] == "uri" and urlsplit(value).password:
            errors.add(
                f"{where}.args.{arg}",
                "<a URI with a password>",
                "carries a password into the spec, which is stored beside the experiment",
                "drop it from the URI and set the tracking server's credentials in the cluster's environment "
                "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)",
            )
        elif kinds[arg] == "uri" and urlsplit(value).scheme.lower() not in TRACKING_SCHEMES:
            # A path or a database URI is a store MLflow would write on the driver's node: a storage path that
            # data (a rendered template, a conf) could point anywhere on the cluster's filesystem.
            errors.add(
                f"{where}.args.{arg}",
                value,
                "is not a tracking server's URL",
                "give the server's http(s):// URL, or build the callback with a local store in a factory the DAG "
                "file names",
            )


def _refuse_credentials(
    args: Mapping[str, Any], where: str, known: Mapping[str, str], errors: Errors
) -> dict[str, Any]:
    """``args`` without the credentials, each refused (the value is not shown)."""
    kept: dict[str, Any] = {}
    for arg, value in args.items():
        if arg in known or _CREDENTIAL_NAME.search(str(arg)):
            variable = known.get(arg)
            fix = (
                f"set {variable} in the cluster's environment (the node's, not the job's runtime_env, whose env_vars "
                "are visible in the job's metadata)"
                if variable
                else "read it on the cluster from the environment or a secret store, not from the spec"
            )
            errors.add(
                f"{where}.args.{arg}",
                "<not shown>",
                "is a credential, and the spec is stored beside the experiment and shown as a rendered field",
                fix,
            )
        else:
            kept[arg] = value
    return kept
