"""The driver of one experiment: ``python -m airflow_tune.engine [--spec FILE_OR_URI]``.

The spec comes from ``--spec`` (a file or a storage URI) or the ``AIRFLOW_TUNE_SPEC`` environment variable (JSON).
Starts the experiment, or restores it when its state already exists in storage; never both. On SIGINT, SIGUSR1 or
SIGTERM Tune saves the experiment state and the driver exits with code 130, so a rerun resumes it. An experiment Tune
ends itself (a spent time budget, ``fail_fast``) ends as plain Tune ends it: with a result, failed or not.

Exit codes: 0 finished (``result.json`` written), 1 the experiment failed, 2 bad spec or setup, 130 interrupted.
The last log lines say why.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from typing import Any

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.contract import (
    DEBUG_IMPORTS_ENV,
    EXIT_BAD_SPEC,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    JOB_ID_ENV,
    RESTORE_AFTER,
    RESTORE_STATE,
    RESULT_FILE,
    SPEC_ENV,
    SPEC_FILE,
    TRIALS_FILE,
    VERDICT,
    describe_owner,
    digest_of,
    manifest_uri,
    owner_differs,
    result_mismatch,
    result_succeeded,
)
from airflow_tune.common.spec import ExperimentSpec, SpecError, fingerprint_of, identity_differences, restore_conflicts
from airflow_tune.engine.compat import leave_working_dir_package
from airflow_tune.engine.log_lines import emit, guard_output


def say(line: str) -> None:
    emit(line)


def say_spec_error(exc: SpecError) -> None:
    """A bad spec's problems, one line each."""
    say(f"invalid experiment spec ({len(exc.errors)} problem{'s' if len(exc.errors) != 1 else ''}):")
    for problem in exc.errors:
        say(f"  - {problem}")


def verdict(text: str) -> None:
    """The engine's last word on a run that did not finish, on one line the Airflow side shows first."""
    say(VERDICT + " ".join(part.strip() for part in text.splitlines() if part.strip()))


def load_spec(source: str | None, digest: str | None = None) -> ExperimentSpec:
    """The spec from ``source`` (a file or a storage URI), believed only when its bytes have ``digest``: the digest
    comes in the entrypoint, which whoever can write to storage cannot change. Without ``source``, the spec's JSON
    from the environment (which, like the entrypoint, only the job's submitter sets)."""
    if source:
        if not digest:
            raise SpecError([f"--spec {source} without --spec-digest: a spec read from storage needs its digest"])
        try:
            data = storage.read_bytes(source)
        except OSError as exc:
            raise SpecError(
                [f"cannot read the spec at {source}: {exc}; check the cluster's access to storage"]
            ) from None
        if digest_of(data) != digest:
            raise SpecError(
                [
                    f"the spec at {source} is not the one submitted (its digest is {digest_of(data)}, the job was "
                    f"submitted with {digest}): something changed it in storage after submission; refusing to run it"
                ]
            )
        text = data.decode()
    else:
        text = os.environ.get(SPEC_ENV, "")
        if not text:
            raise SpecError([f"no spec given: pass --spec FILE_OR_URI or set {SPEC_ENV} to the spec's JSON"])
    return ExperimentSpec.from_json(text)


def check_spec_unchanged(spec: ExperimentSpec) -> bool:
    """Refuse a spec that asks another question than the one recorded for the same experiment (Tune cannot change
    the search space on restore, and a finished experiment's result answers its own question), or whose experiment
    belongs to another task. Return whether a spec was recorded."""
    previous = storage.read_json_or_none(manifest_uri(spec.experiment_uri, SPEC_FILE))
    if previous is None:
        return False
    theirs = previous.get("owner") if isinstance(previous, dict) else None
    if owner_differs(theirs, spec.owner):
        raise SpecError(
            [
                f"experiment {spec.name!r} in {spec.experiment_uri} belongs to {describe_owner(theirs)}, not to this "
                "task: give this task its own experiment_name (or leave it unset)"
            ]
        )
    if fingerprint_of(previous) != spec.fingerprint():
        differences = "; ".join(identity_differences(previous, spec.to_dict()))
        raise SpecError(
            [
                f"experiment {spec.name!r} already exists in {spec.experiment_uri} with another spec ({differences}); "
                "one experiment name answers one question: give this run another experiment_name"
            ]
        )
    return True


def refuse_restore_conflicts(spec: ExperimentSpec, earlier: Any) -> None:
    """Refuse what the restored experiment cannot take from a changed spec (the operator refuses it before
    submission too): never accepted and ignored."""
    conflicts = restore_conflicts(earlier, spec.to_dict()) if isinstance(earlier, dict) else []
    if conflicts:
        raise SpecError(
            [
                f"experiment {spec.name!r} in {spec.experiment_uri} is restored from Tune's saved state, which cannot "
                f"take this change ({'; '.join(conflicts)}): keep the earlier value, or give this run another "
                "experiment_name"
            ]
        )


def record_spec(spec: ExperimentSpec) -> None:
    """Keep the spec beside the experiment; refuse a changed search space on restore (Tune cannot change it)."""
    from airflow_tune.engine.build import EngineError

    check_spec_unchanged(spec)
    uri = manifest_uri(spec.experiment_uri, SPEC_FILE)
    try:
        storage.write_json(uri, spec.to_dict())
    except OSError as exc:
        raise EngineError(
            f"cannot write to the storage path {spec.storage_path} ({exc}); check that the bucket exists and that the "
            "cluster's nodes have credentials for it"
        ) from exc


#: Signals the driver forwarded to Tune as SIGUSR1, so that the verdict names the one that came.
_forwarded: list[int] = []


def _forward_to_tune(signum: int, frame: Any) -> None:
    # Ray's job stop sends SIGTERM by default; Tune saves its state only on SIGINT/SIGUSR1.
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, signal.SIG_IGN, None):
        # Tune is not running yet (its handler is installed by fit()): nothing to save.
        say("stopped before the experiment started")
        raise SystemExit(EXIT_INTERRUPTED)
    _forwarded.append(signum)
    os.kill(os.getpid(), signal.SIGUSR1)


def refuse_unlicensed_restore(spec: ExperimentSpec, restore_after: str | None) -> None:
    """``Tuner.restore`` unpickles ``tuner.pkl``: only state an earlier job of this experiment wrote is restored, and
    only the submitter, which sees Ray's job list and its task's own records, can say there was one (its
    entrypoint's ``--restore-after``, which nobody who can write storage can change)."""
    from airflow_tune.engine.build import EngineError

    if restore_after:
        say(f"restoring the state that job {restore_after} of this experiment saved")
        return
    raise EngineError(
        f"Tune state (tuner.pkl) exists at {spec.experiment_uri}, but no earlier job of this experiment is known to "
        "have written it: refusing to unpickle it. Give this task another experiment_name (or storage_path), or "
        "remove that folder if it is this task's own experiment"
    )


def run(spec: ExperimentSpec, *, restore_after: str | None = None, restore_state: str | None = None) -> int:
    import ray

    from airflow_tune.engine import compat
    from airflow_tune.engine.experiment_sync import upload_experiment_changes
    from airflow_tune.engine.feasibility import FeasibilityCallback
    from airflow_tune.engine.history import HistoryCallback
    from airflow_tune.engine.outcome import StopSignals, failure_reason, interrupted, stop_reason
    from airflow_tune.engine.progress import ProgressCallback
    from airflow_tune.engine.result_manifest import bounded_result, build_result_manifest
    from airflow_tune.engine.sealing import record_checkpoint_digests, write_sealed
    from airflow_tune.engine.state_seals import StateSealer, parse_restore_state, seal_tune_state
    from airflow_tune.engine.tuner import build_tuner, experiment_state_exists

    result_uri = manifest_uri(spec.experiment_uri, RESULT_FILE)
    check_spec_unchanged(spec)
    existing = storage.read_json_or_none(result_uri)
    if existing is not None and result_succeeded(existing):
        mismatch = result_mismatch(existing, spec)
        if mismatch:
            raise SpecError([f"the result at {result_uri} is not this experiment's: {mismatch}; refusing it"])
        say(f"experiment {spec.name} already finished; result at {result_uri}")
        say("result " + jsonsafe.dumps({k: v for k, v in existing.items() if k != "trials"}))
        return EXIT_OK
    proven_state = parse_restore_state(restore_state)
    earlier = storage.read_json_or_none(manifest_uri(spec.experiment_uri, SPEC_FILE))
    if experiment_state_exists(spec):
        refuse_unlicensed_restore(spec, restore_after)
        refuse_restore_conflicts(spec, earlier)
    record_spec(spec)
    tracking = None
    if spec.mlflow is not None:
        from airflow_tune.engine.mlflow_tracking import MLflowTracking

        # Before any trial: a server the cluster cannot use fails the job here, naming it (see the module).
        tracking = MLflowTracking(spec)
        tracking.start()
    ray.init(log_to_driver=True)
    # ray.init() installs its own SIGTERM handler (sys.exit) on the driver: forward SIGTERM to Tune after it.
    signal.signal(signal.SIGTERM, _forward_to_tune)
    callback, signals = ProgressCallback(spec, tracking=tracking), StopSignals()
    callbacks = [callback, HistoryCallback(spec), FeasibilityCallback.for_spec(spec), signals]
    if tracking is not None:
        callbacks.insert(0, tracking)
    # Every version of Tune's state this job writes is vouched for in its log before it reaches storage.
    seal_tune_state(StateSealer())
    # Tune uploads its whole experiment folder at each snapshot, a file at a time: only what changed, several at once.
    upload_experiment_changes()
    compat.count_callbacks_by_name()
    tuner, restored = build_tuner(
        spec, callbacks, proven_state=proven_state, earlier=earlier if isinstance(earlier, dict) else None
    )
    say(f"{'restored' if restored else 'started'} experiment {spec.name} at {spec.experiment_uri}")
    started = time.monotonic()
    try:
        grid = tuner.fit()
    except BaseException:
        if tracking is not None:
            tracking.abandon()
        raise
    # Trials Tune stopped without telling callbacks: an interruption's, or a time budget's or fail_fast's.
    unfinished = callback.unfinished_trials(compat.tuner_trials(tuner))
    shown = ", ".join(unfinished[:10]) + (f" and {len(unfinished) - 10} more" if len(unfinished) > 10 else "")
    if interrupted(signals, unfinished):
        if tracking is not None:
            tracking.finish(unfinished=unfinished, interrupted=True, manifest=None, failed=False)
        name = signal.Signals(_forwarded[0]).name if _forwarded else signals.signal_name
        by = f" by {name}" if signals.signal is not None else ""
        verdict(
            f"interrupted{by} after {time.monotonic() - started:.0f}s with {len(unfinished)} unfinished trials"
            f"{f' ({shown})' if shown else ''}; state saved, a rerun resumes"
        )
        return EXIT_INTERRUPTED
    manifest = build_result_manifest(spec, grid, job_id=os.environ.get(JOB_ID_ENV))
    record_checkpoint_digests(manifest)
    if unfinished:
        say(f"Tune ended the experiment ({stop_reason(spec, manifest)}) and stopped {len(unfinished)} trials: {shown}")
    failure = failure_reason(spec, manifest)
    # A failed manifest is kept for diagnosis but is not a result: a rerun restores and retries the trials.
    manifest["status"] = "failed" if failure else "succeeded"
    manifest["mlflow"] = None
    if tracking is not None:
        tracking.finish(unfinished=unfinished, interrupted=False, manifest=manifest, failed=bool(failure))
        manifest["mlflow"] = tracking.summary()
        for trial in manifest["trials"]:
            trial["mlflow_run_id"] = manifest["mlflow"]["runs"].get(trial["trial_id"])
    # Every row first, then the bounded result: result.json is what says the experiment finished.
    storage.write_json(manifest_uri(spec.experiment_uri, TRIALS_FILE), {"trials": manifest["trials"]})
    write_sealed(result_uri, RESULT_FILE, bounded_result(spec, manifest))
    for trial in manifest["trials"]:
        if trial["error"]:
            where = f" (full text: {trial['path']}/error.txt)" if trial.get("path") else ""
            say(f"trial {trial['trial_id']} errored: {trial['error_summary']}{where}")
    say("result " + jsonsafe.dumps({k: v for k, v in manifest.items() if k != "trials"}))
    if failure:
        verdict(failure)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_tune.engine", description=__doc__)
    parser.add_argument("--spec", help="spec file or URI (default: the AIRFLOW_TUNE_SPEC environment variable)")
    parser.add_argument("--spec-digest", help="sha256:<hex> of the spec file's bytes; required with --spec")
    parser.add_argument(
        RESTORE_AFTER,
        dest="restore_after",
        help="the earlier job of this experiment whose saved Tune state may be restored (default: never restore)",
    )
    parser.add_argument(
        RESTORE_STATE,
        dest="restore_state",
        help="with --restore-after: the state files the submitter proved, as JSON {file name: sha256:<hex>}",
    )
    args = parser.parse_args(argv)
    # Before anything prints: only the engine starts a line of the job log with the mark (see engine/log_lines.py).
    guard_output()
    # Before ray.init(): another node's runtime env agent may delete the working_dir package the driver starts in.
    leave_working_dir_package()
    try:
        spec = load_spec(args.spec, args.spec_digest)
    except SpecError as exc:
        say_spec_error(exc)
        verdict(str(exc))
        return EXIT_BAD_SPEC
    signal.signal(signal.SIGTERM, _forward_to_tune)
    try:
        return run(spec, restore_after=args.restore_after, restore_state=args.restore_state)
    except SpecError as exc:
        say_spec_error(exc)
        verdict(str(exc))
        return EXIT_BAD_SPEC
    except Exception as exc:
        from airflow_tune.engine.build import EngineError

        traceback.print_exc()
        if _metric_missing(exc):
            verdict(
                f"experiment {spec.name} failed: a trial's result has no metric {_metric_names(spec)} (the spec's); "
                "report it with tune.report({...}) or return a dict holding it. A trainable that returns a plain "
                "number reports it as '_metric': set the spec's metric to '_metric' for such a trainable"
            )
            return EXIT_BAD_SPEC
        verdict(f"experiment {spec.name} failed: {type(exc).__name__}: {_last_line(exc)}")
        return EXIT_BAD_SPEC if isinstance(exc, EngineError) else EXIT_FAILED


def _metric_names(spec: ExperimentSpec) -> str:
    """The spec's metric, or its objectives' metrics (each is required in every result: Tune's strict check)."""
    names = [o["metric"] for o in spec.objectives or [{"metric": spec.metric}]]
    return repr(names[0]) if len(names) == 1 else f"among {names!r}"


def _metric_missing(exc: BaseException) -> bool:
    """Tune's strict metric check failed: the spec's metric is not in what the trainable reports."""
    return "did not include the specified metric" in str(exc)


def _last_line(exc: BaseException) -> str:
    """The gist of an error: Tune wraps trial errors in a whole traceback; keep its last line."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1][:1000] if lines else type(exc).__name__


if __name__ == "__main__":
    code = main()
    if os.environ.get(DEBUG_IMPORTS_ENV):
        say(f"airflow imported: {'airflow' in sys.modules}")
    sys.exit(code)
