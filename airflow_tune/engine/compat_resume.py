"""The part of :mod:`.compat` (the one place that knows Ray Tune's internals and release differences) that puts a
retry's policy onto a restored experiment: what ``TuneController`` takes back from the experiment state on resume
(the same in every supported release, 2.43 to 2.60), and how the spec's values are put back over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_tune.common.spec.trust import CODE_FIELDS, field_code_references
from airflow_tune.engine.compat import ray_version
from airflow_tune.engine.imports import EngineError
from airflow_tune.engine.trial_creators import put_creators

#: What ``TuneController.__setstate__`` takes back from the experiment state on resume (its ``runner_data``) over
#: what ``tune.run`` gave the controller: the failure, actor-reuse and trial-checkpoint policy (every supported
#: release).
RESUMED_POLICY = ("_fail_fast", "_reuse_actors", "_trial_checkpoint_config")


def apply_policy_on_resume(
    *,
    max_failures: int,
    max_concurrent: int | None,
    time_budget_s: float | None,
    earlier_budget: bool,
    earlier_spec: Mapping[str, Any] | None = None,
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
    (``add_trial``), and this driver's trial name creators (:func:`.trial_creators.put_creators`). A failure to load
    or apply fails the run: Tune starts the experiment over when a resume raises, unless it fails fast, so the
    controller is made to fail fast first (``earlier_spec``, the spec the earlier run recorded, names the code a
    saved state that cannot be loaded refers to).
    """
    from ray.tune.execution.tune_controller import TuneController

    original_resume, original_add = TuneController.resume, TuneController.add_trial
    if getattr(original_resume, "_airflow_tune_policy", False):
        return
    given: dict[str, Any] = {}

    def resume(self: Any, resume_config: Any) -> Any:
        given.update({name: getattr(self, name) for name in RESUMED_POLICY})
        try:
            out = original_resume(self, resume_config)
        except EngineError:  # the engine's own refusal (a read of unproven state): already says what and why
            self._fail_fast = True
            raise
        except Exception as exc:
            self._fail_fast = True
            raise unloadable_state(exc, "its experiment and search state", earlier_spec) from exc
        try:
            for name, value in given.items():
                setattr(self, name, value)
            self._stopper = _with_budget(self._stopper, time_budget_s, earlier_budget)
            _set_concurrency(self._search_alg, max_concurrent)
            put_creators(self._search_alg, self._trials)
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


def unloadable_state(exc: BaseException, what: str, earlier_spec: Mapping[str, Any] | None) -> EngineError:
    """Why a restored experiment's saved Tune state (``what``) cannot be loaded, naming the code of the earlier run's
    spec that lives in the module that is missing, and the fix; on one line. Any other failure is named as it is."""
    missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    found = [
        f"{where} {path!r}"
        for field in CODE_FIELDS
        for where, path in field_code_references(field, (earlier_spec or {}).get(field))
        if missing and isinstance(path, str) and path.partition(":")[0].split(".")[0] == missing.split(".")[0]
    ]
    named = f" (the earlier run's {', '.join(found)})" if found else ""
    head = f"cannot load the restored experiment's saved Tune state ({what}, written by an earlier run): "
    if not isinstance(exc, (ImportError, AttributeError)):
        return EngineError(
            f"{head}{type(exc).__name__}: {exc}; stopping here rather than starting the experiment over, as Tune "
            "would: retry the task, or give this run another experiment_name to start afresh"
        )
    return EngineError(
        f"{head}{type(exc).__name__}: {exc}{named}. Tune keeps the code an experiment was started with (by import "
        "path, unless shipped by value) and loads it before this run's takes its place, so that code must still be "
        "importable on the cluster: ship its module with the job as the earlier run did (py_modules=, pip= or the "
        "cluster image), or give this run another experiment_name to start afresh"
    )


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
