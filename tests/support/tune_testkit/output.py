"""A trainable that prints to stdout and stderr, writes a file in its working directory and may fail, with trial name
creators: what a trial's output in storage and in the task log is shown with."""

from __future__ import annotations

import sys

from ray import tune


def chatty(config: dict) -> None:
    """Prints a line to each stream and writes ``artifact.txt`` in its working directory; the trial whose ``x`` is
    ``fail_at`` prints one more line and raises."""
    x = config["x"]
    print(f"stdout of trial x={x}")
    print(f"stderr of trial x={x}", file=sys.stderr)
    with open("artifact.txt", "w") as out:  # Tune runs the trial in its working directory
        out.write(f"artifact of trial x={x}\n")
    if x == config.get("fail_at"):
        print(f"last words of trial x={x}")  # never flushed by the trial itself: it raises next
        raise RuntimeError(f"trial x={x} fails on purpose")
    tune.report({"loss": float(x)})


def trial_name(trial) -> str:
    return f"named_x{trial.config['x']}"


def trial_dirname(trial) -> str:
    return f"dir_x{trial.config['x']}_{trial.trial_id}"
