"""Marker files: each trainable event writes one small JSON file into ``config["marker_dir"]`` (a local folder: the
test cluster is this machine), so tests can count runs, see which process ran them and in what order."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any


def mark(config: dict, event: str, **data: Any) -> None:
    marker_dir = config.get("marker_dir")
    if not marker_dir:
        return
    os.makedirs(marker_dir, exist_ok=True)
    record = {"event": event, "x": config.get("x"), "pid": os.getpid(), "time": time.time(), **data}
    name = f"{event}-{json.dumps(config.get('x'))}-{uuid.uuid4().hex[:8]}.json"
    tmp = os.path.join(marker_dir, "." + name)
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.path.join(marker_dir, name))


def read_markers(marker_dir: str, event: str | None = None) -> list[dict]:
    """Every marker in ``marker_dir`` (optionally only ``event``), oldest first."""
    if not os.path.isdir(marker_dir):
        return []
    out = []
    for name in os.listdir(marker_dir):
        if name.startswith(".") or not name.endswith(".json"):
            continue
        with open(os.path.join(marker_dir, name)) as fh:
            record = json.load(fh)
        if event is None or record["event"] == event:
            out.append(record)
    return sorted(out, key=lambda r: r["time"])
