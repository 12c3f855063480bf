"""A custom Tune stopper named by import path (``"tune_testkit.stoppers:StopKindAt"``), as a DAG file writes one."""

from __future__ import annotations

from typing import Any

from ray.tune.stopper import Stopper


class StopKindAt(Stopper):
    """Stops the trials that report ``kind`` once they reach ``after`` iterations."""

    def __init__(self, kind: str, after: int) -> None:
        self.kind = kind
        self.after = after

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return result.get("kind") == self.kind and result["training_iteration"] >= self.after

    def stop_all(self) -> bool:
        return False
