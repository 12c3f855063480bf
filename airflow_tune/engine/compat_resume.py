"""The part of :mod:`.compat` (the one place that knows Ray Tune's internals and release differences) that puts a
retry's policy onto a restored experiment: what ``TuneController`` takes back from the experiment state on resume
(the same in every supported release, 2.43 to 2.60), and how the spec's values are put back over it.
"""

from __future__ import annotations

from typing import Any

from airflow_tune.engine.compat import ray_version
from airflow_tune.engine.imports import EngineError

#: What ``TuneController.__setstate__`` takes back from the experiment state on resume (its ``runner_data``) over
#: what ``tune.run`` gave the controller: the failure, actor-reuse and trial-checkpoint policy (every supported
#: release).
RESUMED_POLICY = ("_fail_fast", "_reuse_actors", "_trial_checkpoint_config")


def apply_policy_on_resume(
    *, max_failures: int, max_concurrent: int | None, time_budget_s: float | None, earlier_budget: bool
) -> None:
    """Have a restored experiment run with this driver's policy, not the one its first run saved.

    Tune (2.43 to 2.60) builds the TuneController from the restored Tuner's RunConfig and TuneConfig, then
    ``TuneController.resume`` puts back what the experiment state saved (``__setstate__(runner_data)``: ``fail_fast``,
    ``reuse_actors``, the trial checkpoint config, the stopper holding the time budget), the search algorithm's state
    (``restore_from_dir``: its concurrency limit) and each trial as pickled (its ``max_failures`` and its checkpoint
    manager's config). After Tune's ``resume``, this puts back what ``tune.run`` gave the controller (
    :data:`RESUMED_POLICY`), the time budget (``time_budget_s`` in all, the time the earlier tries spent counted: the
    restored budget stopper's spent seconds; ``earlier_budget`` says whether the earlier run had one), the concurrency
    limit, and each trial's ``max_failures`` and checkpoint config, for the restored trials and every new one
    (``add_trial``). A failure to apply fails the run: Tune starts the experiment over when a resume raises, unless
    it fails fast, so the controller is made to fail fast first.
    """
    from ray.tune.execution.tune_controller import TuneController

    original_resume, original_add = TuneController.resume, TuneController.add_trial
    if getattr(original_resume, "_airflow_tune_policy", False):
        return
    given: dict[str, Any] = {}

    def resume(self: Any, resume_config: Any) -> Any:
        given.update({name: getattr(self, name) for name in RESUMED_POLICY})
        out = original_resume(self, resume_config)
        try:
            for name, value in given.items():
                setattr(self, name, value)
            self._stopper = _with_budget(self._stopper, time_budget_s, earlier_budget)
            _set_concurrency(self._search_alg, max_concurrent)
            self.update_max_pending_trials()
        except Exception as exc:
            self._fail_fast = True
            raise EngineError(
                f"cannot apply the spec's policy to the restored experiment on Ray {ray_version()} ({exc}): run a "
                "Ray release airflow-tune supports"
            ) from exc
        return out

    def add_trial(self: Any, trial: Any) -> Any:
        if given:
            try:
                _trial_policy(trial, max_failures, given["_trial_checkpoint_config"])
            except Exception as exc:
                self._fail_fast = True
                raise EngineError(
                    f"cannot apply the spec's policy to trial {trial} on Ray {ray_version()} ({exc}): run a Ray "
                    "release airflow-tune supports"
                ) from exc
        return original_add(self, trial)

    resume._airflow_tune_policy = True  # type: ignore[attr-defined]
    setattr(TuneController, "resume", resume)  # noqa: B010 - patching a class
    setattr(TuneController, "add_trial", add_trial)  # noqa: B010 - patching a class


def _trial_policy(trial: Any, max_failures: int, checkpoint_config: Any) -> None:
    """A trial's ``max_failures`` and its checkpoint manager's config (``num_to_keep``, score, frequency, at end),
    with the checkpoints it kept ordered by the (new) score, as the manager keeps them."""
    trial.max_failures = max_failures
    manager = trial.run_metadata.checkpoint_manager
    if not hasattr(manager, "_checkpoint_config") or not isinstance(manager._checkpoint_results, list):
        raise AttributeError("the trial's checkpoint manager has no _checkpoint_config/_checkpoint_results")
    manager._checkpoint_config = checkpoint_config
    if checkpoint_config.checkpoint_score_attribute is not None:
        manager._checkpoint_results.sort(key=manager._get_checkpoint_score)


def _with_budget(stopper: Any, budget_s: float | None, earlier_budget: bool) -> Any:
    """The restored experiment stopper with its time budget (Tune's ``TimeoutStopper``, which ``Experiment`` adds
    alone or as the last of ``CombinedStopper(stop, budget)``) made ``budget_s`` in all, or removed."""
    from ray.tune.stopper import CombinedStopper, NoopStopper, TimeoutStopper

    rest, spent, old_total = stopper, 0.0, None
    if earlier_budget:
        if isinstance(stopper, TimeoutStopper):
            rest, old = None, stopper
        elif isinstance(stopper, CombinedStopper) and isinstance(stopper._stoppers[-1], TimeoutStopper):
            rest, old = stopper._stoppers[0], stopper._stoppers[-1]
            if len(stopper._stoppers) != 2:
                raise AttributeError(f"the restored stopper {stopper!r} is not Tune's (stop, time budget) pair")
        else:
            old = None
        if old is not None:
            old_total = float(old._timeout_seconds)
            spent = old_total - float(old._budget)
    if old_total == budget_s and budget_s is not None:
        return stopper
    if isinstance(rest, NoopStopper):
        rest = None
    if budget_s is None:
        return rest if rest is not None else NoopStopper()
    budget = TimeoutStopper(budget_s)
    budget._budget = float(budget_s) - spent
    return CombinedStopper(rest, budget) if rest is not None else budget


def _set_concurrency(search_alg: Any, limit: int | None) -> None:
    """The concurrency limit of the restored search algorithm: a ``BasicVariantGenerator``'s ``max_concurrent`` (0
    is none), or the ``ConcurrencyLimiter`` a searcher was wrapped in. A searcher the first run did not limit takes
    no limit now (the spec refuses adding one on restore)."""
    import sys

    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if isinstance(search_alg, BasicVariantGenerator):
        search_alg.max_concurrent = limit or 0
        return
    searcher = getattr(search_alg, "searcher", None)
    while searcher is not None:
        if isinstance(searcher, ConcurrencyLimiter):
            searcher.max_concurrent = limit or sys.maxsize
            return
        searcher = getattr(searcher, "searcher", None)
    if limit:
        raise AttributeError(f"{type(search_alg).__name__} has no concurrency limit to change")
