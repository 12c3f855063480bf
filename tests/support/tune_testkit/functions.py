"""Function API trainables. Each records its executions in ``marker_dir`` (see :mod:`tune_testkit.markers`) so tests
can count how often a trial ran."""

from __future__ import annotations

import json
import os
import tempfile
import time

from ray import tune

from .markers import mark


def _mark(config: dict, event: str, **data) -> None:
    mark(config, event, **data)


def quadratic(config: dict) -> None:
    """Reports every step: loss falls towards (x - 3)^2."""
    _mark(config, "start")
    for step in range(config.get("steps", 5)):
        tune.report({"loss": (config["x"] - 3) ** 2 + 1.0 / (step + 1), "step": step})
        time.sleep(config.get("sleep", 0.0))
    _mark(config, "end")


def report_at_end(config: dict) -> None:
    _mark(config, "start")
    time.sleep(config.get("sleep", 0.0))
    tune.report({"score": -abs(config["x"] - 2)})


def return_dict(config: dict) -> dict:
    _mark(config, "start")
    _hold(config, 0)
    return {"score": -abs(config["x"] - 2), "extra": 1}


def return_number(config: dict) -> float:
    _mark(config, "start")
    return float((config["x"] - 1) ** 2)


def forever(config: dict) -> None:
    """Reports without end: only the experiment's ``stop`` ends it."""
    _mark(config, "start")
    step = 0
    while True:
        tune.report({"loss": (config["x"] - 3) ** 2 + 1.0 / (step + 1)})
        step += 1
        time.sleep(config.get("sleep", 0.0))


def checkpointing(config: dict) -> None:
    """Saves a checkpoint every step and resumes from ``tune.get_checkpoint()``.

    The loss is lowest at step ``best_step`` (default: the last), so tests can tell the best checkpoint from the latest.
    """
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as fh:
                start = json.load(fh)["step"] + 1
        _mark(config, f"resume{start}")
    else:
        _mark(config, "start")
    steps = config.get("steps", 5)
    best_step = config.get("best_step", steps - 1)
    crash_at = config.get("crash_at_step")
    for step in range(start, steps):
        if step == crash_at and not _crashed_before(config):
            _mark(config, "crash", step=step)
            raise RuntimeError(f"crash on purpose at step {step}")
        loss = (config["x"] - 3) ** 2 + 0.1 * abs(step - best_step) + 0.01
        time.sleep(config.get("sleep", 0.0))
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as fh:
                json.dump({"step": step, "x": config["x"], "loss": loss}, fh)
            tune.report({"loss": loss, "step": step}, checkpoint=tune.Checkpoint.from_directory(folder))
        _mark(config, "step", step=step)
        _hold(config, step)
    _mark(config, "end")


def _hold(config: dict, step: int) -> None:
    """With ``hold = {"x": x, "step": n, "file": path}`` (or a list of them): trial x waits after its step n while
    the file exists, so a test can interrupt it at a known point whatever the machine's speed."""
    holds = config.get("hold") or []
    for hold in holds if isinstance(holds, list) else [holds]:
        if hold.get("x") == config["x"] and hold.get("step") == step:
            while os.path.exists(hold["file"]):
                time.sleep(0.1)


def _crashed_before(config: dict) -> bool:
    from .markers import read_markers

    return any(m["x"] == config.get("x") for m in read_markers(config["marker_dir"], "crash"))


def failing(config: dict) -> None:
    tune.report({"loss": 1.0})
    raise ValueError(f"boom: bad x={config.get('x')}")


def with_kwargs(config: dict, offset: float = 0.0, data: list | None = None) -> None:
    _mark(config, "start", offset=offset, data=data)
    tune.report({"loss": abs(config["x"] - offset) + len(data or [])})


def fails_first_run(config: dict) -> None:
    """Errors on the experiment's first run (no ``armed`` file yet), succeeds on a rerun: a transient failure."""
    flag = os.path.join(config["marker_dir"], f"armed-{config['x']}")
    tune.report({"loss": float(config["x"])})
    if not os.path.exists(flag):
        open(flag, "w").close()
        raise RuntimeError(f"transient failure of x={config['x']}")
    tune.report({"loss": float(config["x"]) - 1.0})


def non_finite(config: dict) -> None:
    """Reports NaN and infinite metrics beside a finite loss, with a checkpoint (its config holds them too)."""
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "state.json"), "w") as fh:
            json.dump({"x": config["x"]}, fh)
        tune.report(
            {
                "loss": float(config["x"]),
                "diverged": float("nan"),
                "ceiling": float("inf"),
                "floor": float("-inf"),
            },
            checkpoint=tune.Checkpoint.from_directory(folder),
        )


def sample_nan(spec: object) -> float:
    return float("nan")


def sample_inf(spec: object) -> list:
    return [float("inf"), float("-inf")]


def sized(config: dict, blob: str = "") -> dict:
    """Reports how much data its keyword argument carried."""
    return {"loss": float(config["x"]), "blob_len": len(blob)}


def printing(config: dict) -> None:
    """Prints its ``note`` (a string a conf chooses) and reports; waits after that as ``hold`` says (see _hold), then
    raises with the note when ``raise_note`` is set."""
    print(f"note: {config['note']}", flush=True)
    tune.report({"loss": float(config["x"])})
    _mark(config, "step", step=0)
    _hold(config, 0)
    if config.get("raise_note"):
        raise ValueError(f"bad note: {config['note']}")


def failing_for(config: dict) -> None:
    """Reports once; the trial whose ``x`` is ``config["fail_x"]`` then raises, the others end."""
    tune.report({"loss": float(config["x"])})
    if config["x"] == config.get("fail_x"):
        raise ValueError(f"boom: bad x={config['x']}")
