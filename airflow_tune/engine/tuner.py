"""A Ray Tune ``Tuner`` for an :class:`~airflow_tune.common.spec.ExperimentSpec`, from :mod:`.build`'s parts: new, or
the experiment restored from storage (its state proven, :mod:`.state_seals`) with the spec's current policy applied
(:mod:`.compat_resume`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import tune

from airflow_tune.common import storage
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import compat, compat_resume, compat_state
from airflow_tune.engine.build import (
    build_checkpoint_config,
    build_failure_config,
    build_param_space,
    build_run_config,
    build_trainable,
    build_tune_config,
    concurrency_limit,
    refuse_tune_code,
)
from airflow_tune.engine.callbacks import build_callbacks
from airflow_tune.engine.imports import resolve_allow_listed
from airflow_tune.engine.persisted_names import register_moved_modules
from airflow_tune.engine.state_seals import ProvenState, check_restore_state
from airflow_tune.engine.trial_output import apply_trial_output, with_output_upload


def experiment_state_exists(spec: ExperimentSpec) -> bool:
    """An experiment can be restored when Tune saved both its Tuner and at least one experiment-state snapshot."""
    uri = spec.experiment_uri
    if not storage.exists(f"{uri}/tuner.pkl"):
        return False
    return bool(storage.glob_names(uri, "experiment_state-"))


#: Credentials Ray Tune (2.43 to 2.60) copies from the driver's environment into every trial's runtime_env.
PROPAGATED_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")


def keep_credentials_out_of_trials() -> None:
    """Stop Tune from copying the driver's ``AWS_*`` into each trial's runtime_env.

    Ray's runtime-env agent logs every runtime_env it creates ("Creating runtime env: {...}"), so the copy would put
    the cluster's secret key in a log anyone with the dashboard's log viewer can read. Trials take credentials from
    their node instead, as the driver does (instance role, web identity, or the node's environment).
    """
    compat.stop_propagating(PROPAGATED_CREDENTIALS)


def build_tuner(
    spec: ExperimentSpec,
    callbacks: list[Any],
    *,
    proven_state: Mapping[str, str] | None = None,
    earlier: Mapping[str, Any] | None = None,
) -> tuple[tune.Tuner, bool]:
    """A new Tuner, or the experiment restored from storage when its state exists there; and whether restored.

    :param proven_state: the state files the submitter proved this experiment's jobs wrote (``--restore-state``):
        restored only when the folder holds exactly those, byte for byte, and Tune reads only those.
    :param earlier: the spec the experiment's last run recorded (``spec.json``), or None: where its time budget is.
    """
    refuse_tune_code(spec.to_dict())
    for path in spec.allow_listed:
        resolve_allow_listed(path, "allow-listed code reference")
    keep_credentials_out_of_trials()
    compat.read_trial_errors_as_text()
    callbacks = [*callbacks, *build_callbacks(spec)]  # the spec's after the engine's own
    trainable = with_output_upload(build_trainable(spec), spec)
    if experiment_state_exists(spec):
        check_restore_state(spec.experiment_uri, proven_state)
        # Tune reads the state again itself: each of its reads is held to what was just checked.
        proven = ProvenState(spec.experiment_uri, proven_state or {})
        compat_state.hold_state_reads(proven)
        register_moved_modules()
        experiment_path, storage_filesystem = storage.tune_storage(spec.experiment_uri)
        try:
            tuner = tune.Tuner.restore(
                experiment_path,
                trainable,
                storage_filesystem=storage_filesystem,
                resume_unfinished=True,
                resume_errored=spec.errored_trials == "resume",
                restart_errored=spec.errored_trials == "restart",
                param_space=build_param_space(spec),
            )
        except (ImportError, AttributeError) as exc:  # unpickling tuner.pkl: an earlier run's code is not here
            raise compat_resume.unloadable_state(exc, "tuner.pkl", earlier) from exc
        proven.raise_refusal()
        # The restored Tuner keeps its pickled RunConfig, whose callbacks are the first run's: this driver runs new
        # ones, the spec's included.
        _replace_callbacks(tuner, callbacks)
        apply_policy(tuner, spec, earlier)
        apply_trial_output(compat.tuner_run_config(tuner), compat.tuner_tune_config(tuner), spec)
        return tuner, True
    run_config, tune_config = build_run_config(spec, []), build_tune_config(spec)
    apply_trial_output(run_config, tune_config, spec)
    tuner = tune.Tuner(trainable, param_space=build_param_space(spec), tune_config=tune_config, run_config=run_config)
    # Given after Tune pickled the configs into tuner.pkl: a retry that drops a callback need not import its module
    # to load the experiment (a restore replaces them all, above).
    _replace_callbacks(tuner, callbacks)
    return tuner, False


def _replace_callbacks(tuner: tune.Tuner, callbacks: list[Any]) -> None:
    """Every pickled callback is one the engine built (its own and the spec's): replace them all."""
    compat.tuner_run_config(tuner).callbacks = list(callbacks)


def restored_concurrency(spec: ExperimentSpec) -> int | None:
    """The concurrency limit :func:`build_search` gives the search algorithm (random/grid: its ``max_concurrent``
    argument when the spec gives one)."""
    limit = concurrency_limit(spec)
    if not spec.search.factory and str(spec.search.name).lower() in ("random", "grid"):
        given = spec.search.args.get("max_concurrent")
        return int(given) if given else limit
    return limit


def apply_policy(tuner: tune.Tuner, spec: ExperimentSpec, earlier: Mapping[str, Any] | None) -> None:
    """The spec's failure, checkpoint, budget and concurrency policy on a restored experiment.

    ``Tuner.restore`` keeps the RunConfig and TuneConfig pickled in ``tuner.pkl`` by the first run, and Tune's resume
    puts back the policy its experiment state saved (see :func:`.compat_resume.apply_policy_on_resume`): set here on the
    restored Tuner's configs (what ``tune.run`` is given) and put back after Tune's resume. What a restored
    experiment cannot change is refused before this (:func:`airflow_tune.common.spec.restore_conflicts`).
    """
    run_config, tune_config = compat.tuner_run_config(tuner), compat.tuner_tune_config(tuner)
    run_config.failure_config = build_failure_config(spec)
    run_config.checkpoint_config = build_checkpoint_config(spec)
    tune_config.time_budget_s = spec.time_budget_s
    tune_config.reuse_actors = spec.reuse_actors
    compat_resume.apply_policy_on_resume(
        max_failures=spec.failure.max_failures,
        max_concurrent=restored_concurrency(spec),
        time_budget_s=spec.time_budget_s,
        earlier_budget=bool(earlier and earlier.get("time_budget_s")),
        earlier_spec=earlier,
    )
