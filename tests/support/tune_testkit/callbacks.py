"""Custom Tune callbacks that a spec names by import path (``tune_testkit.callbacks:Evidence``): each leaves evidence
that it ran in the driver, written to storage when the experiment ends."""

from __future__ import annotations

from typing import Any

from ray import tune


class Evidence(tune.Callback):
    """Records the trials it saw end (id, config ``x``, last ``training_iteration``) and writes them, with its
    arguments, to ``uri`` (JSON) at the end of the experiment."""

    def __init__(self, uri: str, tag: str = "") -> None:
        self.uri = uri
        self.tag = tag
        self.completed: list[dict[str, Any]] = []
        self.set_up = False

    def setup(self, **info: Any) -> None:
        self.set_up = True

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        self.completed.append(
            {
                "trial_id": trial.trial_id,
                "x": trial.config.get("x"),
                "training_iteration": last.get("training_iteration"),
                "loss": last.get("loss"),
            }
        )

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        from airflow_tune.common import storage

        storage.write_json(self.uri, {"tag": self.tag, "set_up": self.set_up, "completed": self.completed})


def make_evidence(uri: str, tag: str = "") -> Evidence:
    """A factory function: the callback built by a function rather than named as a class."""
    return Evidence(uri, tag=f"made:{tag}")


def not_a_callback(**kwargs: Any) -> dict[str, Any]:
    return dict(kwargs)


def needs_a_missing_package() -> Any:
    import airflow_tune_no_such_package  # noqa: F401

    raise AssertionError("unreachable")


class HoldAtEnd(tune.Callback):
    """Holds the driver at the end of the experiment, after Tune's last upload of the experiment's files and before
    it reads them back into the results: writes ``ready_uri``, then waits until ``go_uri`` exists (a test writes it
    once it has done what it does at that point, e.g. change a file in storage as any of its writers could)."""

    def __init__(self, ready_uri: str, go_uri: str, timeout_s: float = 120.0) -> None:
        self.ready_uri = ready_uri
        self.go_uri = go_uri
        self.timeout_s = timeout_s

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        import time

        from airflow_tune.common import storage

        storage.write_json(self.ready_uri, {"trials": [t.trial_id for t in trials]})
        deadline = time.monotonic() + self.timeout_s
        while not storage.exists(self.go_uri):
            if time.monotonic() > deadline:
                raise TimeoutError(f"nobody wrote {self.go_uri} in {self.timeout_s}s")
            time.sleep(0.2)
