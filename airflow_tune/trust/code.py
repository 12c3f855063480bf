"""What counts as code in an experiment, and where it may come from (the Airflow side's security rule).

Who may trigger a DAG and who may write one are different roles in Airflow. Anything that reaches the operator
through rendering (a template, a Param, a trigger conf, an XCom, a macro) is data. Code is what the cluster imports
and runs: the trainable, a scheduler or searcher factory, a custom callback, a ``sample_from`` function. An import
path is accepted only when it was written in the DAG file in a code position of the same argument, that is, present
there in the operator's arguments before rendering (:mod:`airflow_tune.trust.literal_code`), or when the deployment
allow-lists it (the ``[airflow_tune] allowed_code_references`` option or the ``ray`` connection's extra of the same
name; no DAG run can change either).

A trainable passed as a Python object is code the DAG author wrote; how it travels is
:mod:`airflow_tune.utils.shipping`'s.
"""

from __future__ import annotations

import fnmatch
import inspect
import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_tune.common.spec.trust import CODE_FIELDS
from airflow_tune.exceptions import AirflowTuneException
from airflow_tune.trust.literal_code import JINJA_BLOCK as _JINJA_BLOCK
from airflow_tune.trust.literal_code import literal_import_paths as literal_import_paths
from airflow_tune.trust.literal_code import wrote_in

if TYPE_CHECKING:
    from airflow_tune.common.spec import ExperimentSpec

#: Operator arguments whose import paths the cluster runs, and the spec fields each one fills.
CODE_ARGUMENTS = CODE_FIELDS

#: The arguments that choose code the cluster or a model's server runs, or where the cluster sends its data and
#: credentials, with what each chooses (said in a refusal). No rendered value may set them: none is a template
#: field, and one that ``expand()``/``expand_kwargs()`` maps from an XCom is refused (:func:`refuse_mapped_code`).
#: A new such argument is one line here. Arguments whose rendered values have a rule of their own (the import paths
#: of :data:`CODE_ARGUMENTS`, node pins, loggers' URLs, ``storage_path``, ``warm_start``, ``registry_uri``, ``gate``)
#: read a mapped value as rendered instead. RayTuneSensor has none: what it is given is data, believed only with its
#: job's proof.
TUNE_CODE_ARGUMENTS: Mapping[str, str] = {
    "pip": "what the cluster pip-installs",
    "working_dir": "the code uploaded as the job's working directory",
    "py_modules": "the packages the job imports",
    "runtime_env": (
        "the job's packages, container and env_vars (MLFLOW_TRACKING_URI, AWS_ENDPOINT_URL: where the cluster sends "
        "its data and credentials)"
    ),
    "ship_engine": "whether the cluster runs the engine shipped from here or one it has",
    "restore_unproven_state": "whether saved state no job proves is unpickled",
}
PROMOTE_CODE_ARGUMENTS: Mapping[str, str] = {
    "model_loader": "the loader a deploy unpickles and runs",
    "model_requirements": "what a model's server pip-installs",
    "registry_dags": "which DAGs may use the registry this task promotes into",
}
ALLOW_LIST_OPTION = "allowed_code_references"
CONFIG_SECTION = "airflow_tune"
NODE_PIN_PREFIX = "node:"
_QUOTED = re.compile(r"\"([^\"]*)\"|'([^']*)'")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"']*\Z")


class CodeReferenceError(ValueError):
    """An import path that did not come from the DAG file or the deployment's allow-list."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"refused {len(problems)} code reference{'s' if len(problems) > 1 else ''} that came from rendering "
            f"(a Param, a trigger conf, an XCom or a macro); import paths are code:\n{lines}\n"
            "Write the import path in the DAG file, or have the deployment allow-list it: "
            f"[{CONFIG_SECTION}] {ALLOW_LIST_OPTION} in airflow.cfg, or the ray connection's extra "
            f'"{ALLOW_LIST_OPTION}" (patterns such as "my_models.*:*").'
        )

    def __reduce__(self) -> tuple[type[CodeReferenceError], tuple[list[str]]]:
        return (type(self), (self.problems,))


class MappedCodeError(AirflowTuneException, ValueError):
    """An argument that chooses code or a destination, mapped from an XCom by ``expand()``/``expand_kwargs()``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"refused {len(problems)} argument{'s' if len(problems) > 1 else ''} mapped from an XCom through expand() "
            f"or expand_kwargs(): an XCom is data, and these choose code or where data goes:\n{lines}\n"
            "Write them in the DAG file: in partial(), as the operator's argument, or as a literal list given to "
            "expand()."
        )

    def __reduce__(self) -> tuple[type[MappedCodeError], tuple[list[str]]]:
        return (type(self), (self.problems,))


# -- literal import paths -----------------------------------------------------------------------------------------
def literal_strings(value: Any) -> set[str]:
    """The strings written literally in an argument as the DAG file gives it (before any rendering).

    A whole string with no Jinja block counts, and so does a quoted one inside a JSON string, outside any Jinja
    block. Text a template renders is not looked at: it is data. Each Jinja block is cut out with a separator that
    cannot join the text on its two sides into one string.
    """
    found: set[str] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if not _JINJA_BLOCK.search(node):
                found.add(node)
            for match in _QUOTED.finditer(_JINJA_BLOCK.sub("\x00", node)):
                token = match.group(1) if match.group(1) is not None else match.group(2)
                if "\x00" not in token:  # a quoted string a template completes is data
                    found.add(token)
        elif isinstance(node, Mapping):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return found


def literal_destinations(callbacks: Any) -> set[str]:
    """The URLs among the :func:`literal_strings` of ``callbacks``: a logger's ``tracking_uri`` chooses where the
    cluster sends data, so only one of these (or a connection's) is accepted."""
    return {s for s in literal_strings(callbacks) if _URL.match(s)}


def literal_node_pins(value: Any) -> set[str]:
    """The ``node:<address>`` resource names written literally in ``resources_per_trial`` as the DAG file gives it:
    keys of a dict or of a list of bundles, or quoted names in a JSON string outside any Jinja block."""
    if isinstance(value, str):
        return {s for s in literal_strings(value) if s.startswith(NODE_PIN_PREFIX)}
    found: set[str] = set()
    for bundle in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(bundle, Mapping):
            found.update(k for k in bundle if isinstance(k, str) and k.startswith(NODE_PIN_PREFIX))
    return found


def arguments_mapped_from_data(task: Any, arguments: Iterable[str]) -> set[str]:
    """Of ``arguments``, those a mapped task receives through ``expand()`` from an XCom rather than from the DAG file.

    A mapped task's operator is built at run time with the expanded values as its arguments, so they look written by
    the DAG file; ``task`` (the DAG's mapped task) says where they came from. Literal lists given to ``expand()``
    stay code; a value with an XCom in it is data, and with ``expand_kwargs()`` over an XCom every argument not in
    ``partial()`` is.
    """
    expand_input = getattr(task, "expand_input", None)
    if expand_input is None:
        return set()
    from airflow.sdk.definitions.xcom_arg import XComArg

    def from_xcom(value: Any) -> bool:
        return next(iter(XComArg.iter_xcom_references(value)), None) is not None

    value = getattr(expand_input, "value", None)
    if isinstance(value, Mapping):
        return {name for name in arguments if name in value and from_xcom(value[name])}
    if from_xcom(value):
        partial = getattr(task, "partial_kwargs", {}) or {}
        return {name for name in arguments if name not in partial}
    return set()


def refuse_mapped_code(task: Any, arguments: Mapping[str, str]) -> None:
    """Refuse each of ``arguments`` (name -> what it chooses) that the running ``task`` got from an XCom through
    ``expand()``/``expand_kwargs()`` and that is not left at its default (``expand_kwargs()`` maps every argument
    that ``partial()`` does not give, and one an XCom left unset chooses nothing).

    :raises MappedCodeError: naming each argument, what it chooses and the fix.
    """
    mapped_task = task.dag.task_dict.get(task.task_id) if task.has_dag() else None
    mapped = arguments_mapped_from_data(mapped_task, arguments)
    if not mapped:
        return
    problems = []
    for name, chooses in arguments.items():
        value = getattr(task, name, None)
        default = _default(type(task), name)
        if name in mapped and not (value == default or (not value and not default)):
            problems.append(f"{name} = {_shown(value)}: chooses {chooses}")
    if problems:
        raise MappedCodeError(problems)


def _default(cls: type, name: str) -> Any:
    """The default of the argument ``name`` as the first ``__init__`` along ``cls``'s MRO that declares it gives it (a
    subclass's ``__init__(**kwargs)`` passes it on)."""
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        parameter = inspect.signature(init).parameters.get(name)
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return None


def _shown(value: Any) -> str:
    """A mapped value for a refusal: a mapping (or its JSON) by its keys only (``env_vars`` may hold secrets), the rest
    cut short."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return "a string that is not JSON"
    if isinstance(value, Mapping):
        keys = sorted(str(k) for k in value)
        env = value.get("env_vars")
        named = f", env_vars {sorted(str(k) for k in env)}" if isinstance(env, Mapping) else ""
        return f"a dict with keys {keys}{named}"
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}..."


def argument_of(field_path: str) -> str:
    """The operator argument a spec field comes from (``scheduler.factory`` -> ``scheduler``)."""
    head = re.split(r"[.\[]", field_path, maxsplit=1)[0]
    return head if head in CODE_ARGUMENTS else field_path


def allowed_patterns(connection_patterns: Iterable[str] = ()) -> list[str]:
    """The deployment's allow-list: the Airflow config option plus the ``ray`` connection's extra."""
    from airflow.configuration import conf

    configured = conf.get(CONFIG_SECTION, ALLOW_LIST_OPTION, fallback="") or ""
    return [p.strip() for p in [*configured.split(","), *connection_patterns] if p and p.strip()]


def parse_patterns(value: Any) -> list[str]:
    """Allow-list patterns from a connection extra: a list, or a comma-separated string."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
        return [p.strip() for p in value if p.strip()]
    raise TypeError(f"{ALLOW_LIST_OPTION} must be a list of patterns or a comma-separated string, got {value!r}")


def licensed_by(path: str, patterns: Iterable[str]) -> bool:
    """Whether an allow-list pattern licenses ``path``: it matches, and the path names a top-level function or class
    (one attribute, never ``mod:obj.attr``, which may reach through an imported module) with no ``_``-prefixed name
    (``__globals__``, private helpers). The engine checks on the cluster that the object is defined in that module."""
    module_name, _, attr = path.partition(":")
    if "." in attr or any(name.startswith("_") for name in [*module_name.split("."), attr]):
        return False
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def review_references(
    spec: ExperimentSpec, literal: Mapping[str, set[str]], patterns: Iterable[str] = ()
) -> tuple[list[tuple[str, str]], list[str]]:
    """The (field, import path) pairs of ``spec`` that neither the DAG file wrote in a code position of the field's
    argument (``literal``: :func:`literal_import_paths` of each) nor the allow-list licenses, and the import paths
    only the allow-list licensed (the engine resolves those strictly)."""
    from airflow_tune.common.spec import code_references

    patterns = list(patterns)
    refused: list[tuple[str, str]] = []
    allow_listed: list[str] = []
    for field_path, path in code_references(spec):
        if wrote_in(path, argument_of(field_path), literal):
            continue
        if licensed_by(path, patterns):
            if path not in allow_listed:
                allow_listed.append(path)
            continue
        refused.append((field_path, path))
    return refused, allow_listed


def unapproved_references(
    spec: ExperimentSpec, literal: Mapping[str, set[str]], patterns: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """The (field, import path) pairs of ``spec`` that neither the DAG file wrote nor the allow-list licenses."""
    return review_references(spec, literal, patterns)[0]


def refusal(refused: list[tuple[str, str]], patterns: Iterable[str] = ()) -> CodeReferenceError:
    patterns = list(patterns)

    def why(path: str) -> str:
        if any(fnmatch.fnmatchcase(path, p) for p in patterns):
            return (
                "matches an allow-list pattern, but a pattern licenses only a top-level function or class of the "
                "module (one name after ':', none starting with '_')"
            )
        return "not written in the DAG file and not allow-listed"

    return CodeReferenceError([f"{field_path} = {path!r}: {why(path)}" for field_path, path in refused])
