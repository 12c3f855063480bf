"""Fail clearly when trials ask for resources no node of the cluster has, instead of waiting forever.

Tune 2.60 only prints a warning for a trial no node can host (a GPU on a CPU-only cluster, 64 CPUs on 2) and waits;
only the task's ``execution_timeout`` would end it. This Tune callback compares each pending trial's placement group
with the capacity of the cluster's alive nodes and, once a trial has been infeasible for ``wait_s`` (give an
autoscaling cluster time to add nodes), raises, which ends the experiment (and the job) with the reason.

A trial whose trainable runs a Ray Train trainer also needs the trainer's workers, which Train V2 places in a
placement group of its own, outside the trial's (Tune never sees them, and Train waits for them forever when no node
set can hold them). The workers the spec declares (``resources.train_workers``) are counted with each pending or
running trial (its workers are asked for once it runs): the trial's group and the workers' group must each fit, and
both together in the cluster's total.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ray import tune

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.common.spec.train_workers import worker_group

#: How often the cluster's nodes are asked for, at most.
CHECK_EVERY_S = 2.0


class InfeasibleResourcesError(RuntimeError):
    """A trial asks for resources that no node of the cluster offers."""


def fits(bundles: Sequence[Mapping[str, float]], strategy: str, nodes: Sequence[Mapping[str, float]]) -> bool:
    """Whether a placement group of ``bundles`` could ever be placed on ``nodes`` (their total resources)."""

    def on(node: Mapping[str, float], need: Mapping[str, float]) -> bool:
        return all(node.get(name, 0.0) >= amount for name, amount in need.items() if amount)

    if not bundles:
        return True
    if strategy == "STRICT_PACK":
        total: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return any(on(node, total) for node in nodes)
    if not all(any(on(node, bundle) for node in nodes) for bundle in bundles):
        return False
    if strategy == "STRICT_SPREAD":
        return sum(1 for node in nodes if any(on(node, b) for b in bundles)) >= len(bundles)
    return True


def fits_with_workers(
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
    workers: tuple[Sequence[Mapping[str, float]], str] | None,
    nodes: Sequence[Mapping[str, float]],
) -> bool:
    """Whether a trial's placement group and the Train workers' (a separate group, or None) could both be placed."""
    if not fits(bundles, strategy, nodes):
        return False
    if workers is None:
        return True
    worker_bundles, worker_strategy = workers
    if not fits(worker_bundles, worker_strategy, nodes):
        return False
    need: dict[str, float] = {}
    for bundle in [*bundles, *worker_bundles]:
        for name, amount in bundle.items():
            need[name] = need.get(name, 0.0) + amount
    return all(sum(node.get(name, 0.0) for node in nodes) >= amount for name, amount in need.items() if amount)


def alive_node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")]


def describe_nodes(nodes: Sequence[Mapping[str, float]]) -> str:
    shown = []
    for node in nodes:
        kept = {k: v for k, v in sorted(node.items()) if not k.startswith(("node:", "object_store_memory"))}
        if "memory" in kept:
            kept["memory"] = f"{kept['memory'] / 2**30:.1f} GiB"  # type: ignore[assignment]
        shown.append(str(kept))
    return "; ".join(shown) or "no alive node"


class FeasibilityCallback(tune.Callback):
    """Raise :class:`InfeasibleResourcesError` once a pending trial has asked ``wait_s`` for what no node has.

    :param wait_s: how long a trial may be infeasible before the experiment fails (time for an autoscaler).
    :param train_workers: the Train workers each trial starts, as their placement group's bundles and strategy
        (:func:`airflow_tune.common.spec.train_workers.worker_group`), or None.
    :param nodes: the alive nodes' total resources (for tests); by default read from Ray.
    :param clock: seconds, monotonic (for tests).
    """

    def __init__(
        self,
        wait_s: float = 0.0,
        *,
        train_workers: tuple[list[dict[str, float]], str] | None = None,
        nodes: Callable[[], list[dict[str, float]]] = alive_node_resources,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.wait_s = wait_s
        self.train_workers = train_workers
        self.nodes = nodes
        self.clock = clock
        self._checked_at = -float("inf")
        self._infeasible_since: float | None = None

    @classmethod
    def for_spec(cls, spec: ExperimentSpec) -> FeasibilityCallback:
        """The check of ``spec``: its ``infeasible_wait_s`` and the Train workers it declares."""
        workers = spec.resources.train_workers if spec.resources is not None else None
        return cls(spec.infeasible_wait_s, train_workers=worker_group(workers))

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        now = self.clock()
        if now - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = now
        # A trial whose own resources fit starts at once: with Train workers declared, a running one is checked too,
        # since its workers (asked for after it starts) may never fit.
        watched = ("PENDING", "RUNNING") if self.train_workers is not None else ("PENDING",)
        waiting = [t for t in trials if t.status in watched]
        if not waiting:
            self._infeasible_since = None
            return
        nodes = self.nodes()
        stuck = []
        for trial in waiting:
            pgf = trial.placement_group_factory
            if not fits_with_workers(pgf.bundles, pgf.strategy, self.train_workers, nodes):
                stuck.append((trial, pgf))
        if not stuck:
            self._infeasible_since = None
            return
        if self._infeasible_since is None:
            self._infeasible_since = now
        if now - self._infeasible_since < self.wait_s:
            return
        trial, pgf = stuck[0]
        asked = pgf.bundles if len(pgf.bundles) > 1 else pgf.bundles[0]
        workers, offers, which = "", "which no node of the cluster offers", "pending trial(s) cannot run"
        if self.train_workers is not None:
            worker_bundles, worker_strategy = self.train_workers
            workers = (
                f" and its {len(worker_bundles)} Train workers {worker_bundles[0]} each ({worker_strategy}, a "
                "placement group of their own: resources_per_trial.train_workers)"
            )
            offers, which = "which the cluster's nodes cannot hold", "trial(s) cannot run with their Train workers"
        raise InfeasibleResourcesError(
            f"trial {trial.trial_id} asks for {asked} ({pgf.strategy}){workers}, {offers} (nodes: "
            f"{describe_nodes(nodes)}); {len(stuck)} {which}. Ask for less in "
            "resources_per_trial (or the trainable's default_resource_request), add such nodes, or, on an "
            "autoscaling cluster, give it time with infeasible_wait_s"
        )
