"""The Experiment view's bounds: how long any text, how many keys, rows, curves and points, how large any file; and
the functions that hold every value read from storage to them (a number, a cut text, a flat config, counts, the
owner). Pure logic: imports neither airflow nor ray nor pyarrow.

Whatever an experiment's files hold, a value that passed through here is small: :func:`cut` text is at most its
limit (control characters and lone surrogates replaced), :func:`flat_config` gives at most :data:`CONFIG_KEYS` keys,
:func:`counts_of` at most :data:`MAX_COUNTS` whole numbers, :func:`owner_of` the owner's shape or None. The page's
whole response is then held under :data:`MAX_RESPONSE_BYTES` (:func:`fit`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from itertools import islice
from typing import Any
from urllib.parse import quote, urlsplit

from airflow_tune.common import jsonsafe
from airflow_tune.common.contract import HISTORY_FILE, PROGRESS_FILE, RESULT_FILE

TABLE_ROWS = 100
RUNNING_ROWS = 20
ERRORED_ROWS = 20
CONFIG_COLUMNS = 12
#: Flat keys kept of one trial's config, and JSON values walked to find them.
CONFIG_KEYS, CONFIG_NODES, CONFIG_DEPTH = 64, 400, 8
TEXT_CHARS = 80  # a table cell, a status, a job id
ID_CHARS = 64  # a trial id, a key of counts
KEY_CHARS = 40  # a config key: a column name
NAME_CHARS = 250  # an experiment or metric name, a DAG/task/run id (Airflow's own limit)
URI_CHARS = 1024
ERROR_CHARS = 400
CONFIG_TEXT_CHARS = 600  # the best trial's config as JSON text
MAX_CURVES = 20
MAX_POINTS = 200
#: Curves read from one history.json (the engine writes at most 20).
HISTORY_TRIALS = 100
MAX_COUNTS, MAX_COUNT = 12, 10**12
MAX_PROBLEMS = 5  # per file
MIB = 1024 * 1024
#: The page's JSON response, whatever the files hold (UTF-8 bytes, as the API server sends it).
MAX_RESPONSE_BYTES = 1 * MIB
#: Files larger than these are not fetched (the engine's own are far smaller: see docs/benchmarks.rst).
MAX_FILE_BYTES = {PROGRESS_FILE: 2 * MIB, HISTORY_FILE: 4 * MIB, RESULT_FILE: 16 * MIB}

#: MLflow's ids as its servers make them: an experiment id is a whole number, a run id a UUID's 32 hex digits.
MLFLOW_EXPERIMENT_ID = re.compile(r"[0-9]{1,20}\Z")
MLFLOW_RUN_ID = re.compile(r"[0-9a-f]{32}\Z")
#: A Ray job's submission id as the operator names them (``<experiment>-<attempt>``) or Ray does (``raysubmit_...``).
RAY_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,299}\Z")

#: Characters no page should receive: control characters, and lone surrogates (no UTF-8 response can carry them).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


# -- values --------------------------------------------------------------------------------------------------------
def number(value: Any) -> float | None:
    """A finite metric value, or None (missing, not a number, NaN, infinite, too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        as_float = float(value)
    except OverflowError:
        return None
    return as_float if math.isfinite(as_float) else None


def scalar_number(value: Any) -> int | float | None:
    """A number as the page shows it: an int of at most 2**53 as it is, any other finite number as a float."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**53:
        return value
    return number(value)


def shown_value(value: Any) -> int | float | str | None:
    """A metric as the view shows it: a finite number, or the text of a non-finite one ("NaN")."""
    if isinstance(value, float) and not math.isfinite(value):
        return jsonsafe.encode_float(value)
    if value in (jsonsafe.NAN, jsonsafe.POS_INF, jsonsafe.NEG_INF):
        return str(value)
    return scalar_number(value)


def prune(value: Any, nodes: int = CONFIG_NODES, depth: int = CONFIG_DEPTH) -> Any:
    """A copy of a JSON value of at most ``nodes`` values and ``depth`` levels, keys and strings cut."""
    budget = [nodes]

    def walk(item: Any, level: int) -> Any:
        budget[0] -= 1
        if item is None or isinstance(item, (bool, str)):
            return item[:CONFIG_TEXT_CHARS] if isinstance(item, str) else item
        if isinstance(item, (int, float)):
            return scalar_number(item) if number(item) is not None else jsonsafe.strict(item)
        if level >= depth or not isinstance(item, (Mapping, list)):
            return "…"
        entries = item.items() if isinstance(item, Mapping) else enumerate(item)
        out: dict[str, Any] = {}
        for key, child in entries:
            if budget[0] <= 0:
                out["…"] = "…"
                break
            out[str(key)[:KEY_CHARS]] = walk(child, level + 1)
        return out if isinstance(item, Mapping) else list(out.values())

    return walk(value, 0)


def cut(value: Any, limit: int) -> str:
    """Text of at most ``limit`` characters (a value that is not a string as the JSON of its pruned form), with
    control characters and lone surrogates replaced."""
    text = value if isinstance(value, str) else jsonsafe.dumps(prune(value), sort_keys=True)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _UNSAFE.sub("\ufffd", text)


def ident(value: Any, limit: int = ID_CHARS) -> str:
    """An id as text (``str`` of a scalar, as the files' ids are compared), cut."""
    return cut(value if isinstance(value, (str, dict, list)) else str(value), limit)


def key_text(key: Any) -> str:
    """A config key of at most :data:`KEY_CHARS`: its head and its tail (long keys often differ only at the end)."""
    text = key if isinstance(key, str) else str(key)
    return cut(text if len(text) <= KEY_CHARS else f"{text[: KEY_CHARS - 12]}…{text[-11:]}", KEY_CHARS)


def leaf(value: Any) -> Any:
    """A config value for a table cell: null, a bool, a number, or text of at most :data:`TEXT_CHARS`."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and number(value) is not None:
        return scalar_number(value)
    return cut(value, TEXT_CHARS)


def flat_config(config: Any) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: at most :data:`CONFIG_KEYS` keys of at most :data:`KEY_CHARS`, found
    in at most :data:`CONFIG_NODES` values and :data:`CONFIG_DEPTH` levels; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    if not isinstance(config, Mapping):
        return out
    budget = [CONFIG_NODES]

    def walk(mapping: Mapping[Any, Any], prefix: str, level: int) -> None:
        for key, value in mapping.items():
            budget[0] -= 1
            if budget[0] < 0 or len(out) >= CONFIG_KEYS:
                return
            name = f"{prefix}.{key_text(key)}" if prefix else key_text(key)
            if isinstance(value, Mapping) and value and level < CONFIG_DEPTH:
                walk(value, name, level + 1)
            else:
                out.setdefault(key_text(name), leaf(value))

    walk(config, "", 1)
    return out


def kind(value: Any) -> str:
    """What a JSON value is, for a problem sentence."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "null" if value is None else "a number"


def count(value: Any) -> int | None:
    """A whole number of trials from 0 to :data:`MAX_COUNT`, or None."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return value


def counts_of(value: Any, where: str, problems: list[str]) -> dict[str, int]:
    """Trial counts by state: at most :data:`MAX_COUNTS` keys of at most :data:`ID_CHARS`, whole numbers only."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        note(problems, f"{where}: counts is {kind(value)}, not an object: not shown")
        return {}
    out: dict[str, int] = {}
    bad = 0
    for key, raw in islice(value.items(), 4 * MAX_COUNTS):
        n = count(raw)
        if n is None:
            bad += 1
        elif n and (len(out) < MAX_COUNTS or ident(key) in out):
            out[ident(key)] = min(MAX_COUNT, out.get(ident(key), 0) + n)
    if bad:
        note(problems, f"{where}: {bad} of the counts are not whole numbers from 0 to {MAX_COUNT}: not shown")
    if len(value) > MAX_COUNTS:
        note(problems, f"{where}: counts has {len(value)} states; at most {MAX_COUNTS} are shown")
    return out


def note(problems: list[str], text: str) -> None:
    if len(problems) < MAX_PROBLEMS:
        problems.append(cut(text, ERROR_CHARS))


def owner_of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner a file records, ``{"dag_id", "task_id", "map_index", "run_id"}``, when it has the shape the engine
    writes; None otherwise (no owner, or a malformed one: treated alike)."""
    owner = doc.get("owner")
    if not isinstance(owner, Mapping):
        return None
    dag_id, task_id, map_index, run_id = (owner.get(k) for k in ("dag_id", "task_id", "map_index", "run_id"))
    if not all(isinstance(v, str) and 0 < len(v) <= NAME_CHARS for v in (dag_id, task_id)):
        return None
    if isinstance(map_index, bool) or not isinstance(map_index, int) or not -1 <= map_index <= MAX_COUNT:
        return None
    if run_id is not None and not (isinstance(run_id, str) and len(run_id) <= NAME_CHARS):
        return None
    return {"dag_id": dag_id, "task_id": task_id, "map_index": map_index, "run_id": run_id}


# -- the response ------------------------------------------------------------------------------------------------
def response_bytes(view: Mapping[str, Any]) -> int:
    """The size of ``view`` as the API server sends it (FastAPI's JSONResponse: UTF-8, no spaces)."""
    return len(json.dumps(view, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode())


def fit(view: dict[str, Any], limit: int = MAX_RESPONSE_BYTES) -> dict[str, Any]:
    """``view`` under ``limit`` bytes: halves its rows and curves until it fits. The bounds on every text keep an
    ordinary view far below :data:`MAX_RESPONSE_BYTES` (2,000 trials: 61 KiB); every limit reached at once in 4-byte
    characters comes to about 1 MiB, and this holds even that under the bound."""
    cut_down = False
    while response_bytes(view) > limit and (view["table"]["rows"] or view["curves"]):
        table = view["table"]
        table["rows"] = table["rows"][: len(table["rows"]) // 2]
        table["shown"] = len(table["rows"])
        view["curves"] = view["curves"][: len(view["curves"]) // 2]
        cut_down = True
    if cut_down:
        view["problems"] = view["problems"][:4] + [
            f"Rows and curves were cut to keep this page under {limit // 1024} KiB."
        ]
    return view


def safe_link(url: Any) -> str | None:
    """Only http(s) links to a host reach the page, without userinfo (a ``javascript:`` URL in an XCom must not
    become a link, nor ``https://trusted.example@evil.example/`` nor a URL carrying a password)."""
    if not isinstance(url, str) or len(url) > URI_CHARS or _UNSAFE.search(url) or any(c.isspace() for c in url):
        return None
    if not url.startswith(("http://", "https://")):
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return None
    return url if parts.hostname and "@" not in parts.netloc else None


def mlflow_id(value: Any, shape: re.Pattern[str]) -> str | None:
    """``value`` when it is an MLflow id of ``shape`` (:data:`MLFLOW_EXPERIMENT_ID`, :data:`MLFLOW_RUN_ID`)."""
    return value if isinstance(value, str) and shape.match(value) else None


def tracking_links(tracking: Mapping[str, Any] | None, server: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Links to the MLflow experiment, its parent run and each listed trial's run
    (``<ui_url>/#/experiments/<id>/runs/<run_id>``), or None.

    The base of every link is the deployment's: ``server`` is the MLflow connection's ``tracking_uri`` and ``ui_url``
    (:func:`airflow_tune.plugins.experiment_app.mlflow_server`). The experiment's files (``tracking``, reduced by
    :func:`~airflow_tune.plugins.experiment_files.reduce_tracking`) supply only ids, each linked only when it has
    MLflow's shape (an experiment id is a whole number, a run id 32 hex digits) and URL-quoted; their own URLs are
    never linked, and a file whose ``tracking_uri`` is not the connection's (tracked on another server) gets none.
    """
    if not tracking or not server or safe_link(server.get("ui_url")) is None:
        return None
    recorded, own = tracking.get("tracking_uri"), server.get("tracking_uri")
    if not isinstance(recorded, str) or not isinstance(own, str) or recorded.rstrip("/") != own.rstrip("/"):
        return None
    experiment_id = mlflow_id(tracking.get("experiment_id"), MLFLOW_EXPERIMENT_ID)
    if experiment_id is None:
        return None
    experiment = f"{str(server['ui_url']).rstrip('/')}/#/experiments/{quote(experiment_id, safe='')}"

    def run(run_id: Any) -> str | None:
        run_id = mlflow_id(run_id, MLFLOW_RUN_ID)
        return safe_link(f"{experiment}/runs/{quote(run_id, safe='')}") if run_id else None

    return {
        "experiment_url": safe_link(experiment),
        "parent_run_url": run(tracking.get("parent_run_id")),
        "runs": {trial_id: run(run_id) for trial_id, run_id in tracking.get("runs", {}).items()},
        "errors": tracking.get("errors", 0),
        "last_error": tracking.get("last_error"),
    }
