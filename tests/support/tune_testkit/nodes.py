"""A trainable for the multi-node cluster tests (shipped to the cluster with py_modules).

Its markers are small JSON objects under ``config["marker_uri"]`` in S3, not files in a local folder: the cluster's
nodes share nothing with each other or with the tests but S3. Each marker says which Ray node wrote it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from typing import Any

import ray
from ray import tune


def mark(config: dict, event: str, **data: Any) -> None:
    uri = config.get("marker_uri")
    if not uri:
        return
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    record = {
        "event": event,
        "x": config.get("x"),
        "node_id": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "time": time.time(),
        **data,
    }
    with fs.open_output_stream(f"{path}/{event}-{json.dumps(config.get('x'))}-{uuid.uuid4().hex[:8]}.json") as out:
        out.write(json.dumps(record).encode())


def _per_x(config: dict, key: str, default: float) -> float:
    """``config[key]`` is a number, or a JSON object keyed by ``str(x)`` (so trials of one grid can differ)."""
    value = config.get(key, default)
    if isinstance(value, dict):
        value = value.get(str(config.get("x")), default)
    return float(value)


def checkpointing(config: dict) -> None:
    """One step per ``sleep`` seconds, a checkpoint (``state.json``) reported with every step; resumes from
    ``tune.get_checkpoint()``, which on another node can only come from storage.

    Markers: ``start`` (from scratch) or ``resume`` (with the step it resumes at), ``step`` after each checkpointed
    report returned, ``end``.
    """
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as fh:
                start = json.load(fh)["step"] + 1
        mark(config, "resume", step=start)
    else:
        mark(config, "start")
    steps = int(_per_x(config, "steps", 5))
    for step in range(start, steps):
        time.sleep(_per_x(config, "sleep", 0.0))
        loss = (config["x"] - 3) ** 2 + 1.0 / (step + 1)
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as fh:
                json.dump({"step": step, "x": config["x"]}, fh)
            tune.report({"loss": loss, "step": step}, checkpoint=tune.Checkpoint.from_directory(folder))
        mark(config, "step", step=step)
    mark(config, "end")
