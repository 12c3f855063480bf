"""Function API trainables. Each records its executions in ``marker_dir`` (a local folder: the cluster is this machine)
so tests can count how often a trial ran."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid

from ray import tune


def _mark(config: dict, event: str) -> None:
    marker_dir = config.get("marker_dir")
    if marker_dir:
        os.makedirs(marker_dir, exist_ok=True)
        name = f"{event}-{json.dumps(config.get('x'))}-{uuid.uuid4().hex[:8]}"
        open(os.path.join(marker_dir, name), "w").close()


def quadratic(config: dict) -> None:
    """Reports every step: loss falls towards (x - 3)^2."""
    _mark(config, "start")
    for step in range(config.get("steps", 5)):
        tune.report({"loss": (config["x"] - 3) ** 2 + 1.0 / (step + 1), "step": step})
        time.sleep(config.get("sleep", 0.0))


def report_at_end(config: dict) -> None:
    _mark(config, "start")
    time.sleep(config.get("sleep", 0.0))
    tune.report({"score": -abs(config["x"] - 2)})


def return_dict(config: dict) -> dict:
    _mark(config, "start")
    return {"score": -abs(config["x"] - 2), "extra": 1}


def return_number(config: dict) -> float:
    _mark(config, "start")
    return float((config["x"] - 1) ** 2)


def checkpointing(config: dict) -> None:
    """Saves a checkpoint every step and resumes from ``tune.get_checkpoint()``."""
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as fh:
                start = json.load(fh)["step"] + 1
        _mark(config, f"resume{start}")
    else:
        _mark(config, "start")
    for step in range(start, config.get("steps", 5)):
        loss = (config["x"] - 3) ** 2 + 1.0 / (step + 1)
        time.sleep(config.get("sleep", 0.0))
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as fh:
                json.dump({"step": step, "x": config["x"], "loss": loss}, fh)
            tune.report({"loss": loss, "step": step}, checkpoint=tune.Checkpoint.from_directory(folder))


def failing(config: dict) -> None:
    tune.report({"loss": 1.0})
    raise ValueError(f"boom: bad x={config.get('x')}")


def with_kwargs(config: dict, offset: float = 0.0, data: list | None = None) -> None:
    tune.report({"loss": abs(config["x"] - offset) + len(data or [])})
