"""engine/compat.py, pure logic: the differences between the Ray releases the engine runs on, each against a fake of
the behaviour of the releases concerned (the compat tier runs the engine on real 2.43 and 2.50 clusters)."""

from __future__ import annotations

import importlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.engine import compat, progress
from airflow_tune.engine.imports import EngineError


def _spec() -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bkt/exp", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, "progress_interval_s": 10})


class _ActorId:
    def hex(self) -> str:
        return "actor-a"


class _Tune:
    """Tune's driver loop as 2.43/2.50 (callbacks get a copy of the result) or 2.60 (the result itself) run it."""

    def __init__(self, copies: bool) -> None:
        self.copies = copies

    def report(self, cb: progress.ProgressCallback, trial: SimpleNamespace, result: dict) -> None:
        cb.on_trial_result(0, [trial], trial, result.copy() if self.copies else result)
        trial.last_result = result


@pytest.mark.parametrize("copies", [True, False], ids=["2.43-2.50-copy", "2.60-in-place"])
@pytest.mark.parametrize("ending", ["complete", "error"])
def test_the_node_id_reaches_the_last_result_whether_callbacks_get_a_copy_or_not(monkeypatch, copies, ending):
    monkeypatch.setattr(progress, "actor_node_id", lambda actor_id: "node-1")
    cb = progress.ProgressCallback(_spec(), out=io.StringIO(), clock=lambda: 0.0)
    monkeypatch.setattr(cb, "write_progress", lambda trials, snap=None: None)
    trial = SimpleNamespace(
        trial_id="t1", status="RUNNING", last_result={}, config={}, path=None,
        temporary_state=SimpleNamespace(ray_actor=SimpleNamespace(_actor_id=_ActorId())),
    )  # fmt: skip
    tune = _Tune(copies)
    tune.report(cb, trial, {"loss": 1.0})
    for lookup in cb._actor_nodes.values():
        lookup.result(timeout=10)
    tune.report(cb, trial, {"loss": 0.5})
    tune.report(cb, trial, {"loss": 0.2, "done": True})
    assert trial.last_result.get(progress.NODE_ID) == (None if copies else "node-1")  # what Tune alone keeps
    if ending == "complete":
        cb.on_trial_complete(0, [trial], trial)
    else:
        trial.temporary_state.ray_actor = None  # Tune stops an errored trial's actor before on_trial_error
        trial.status = "ERROR"
        cb.on_trial_error(0, [trial], trial)
    assert trial.last_result == {"loss": 0.2, "done": True, progress.NODE_ID: "node-1"}


def test_an_argument_the_clusters_class_does_not_take_is_refused_naming_it_and_the_ray_version():
    class OldSearch:  # BayesOptSearch before 2.60 had no repeat_float_precision
        def __init__(self, space=None, metric=None, random_state=42):
            pass

    compat.check_arguments(OldSearch, {"random_state": 1}, "search 'bayesopt'")
    with pytest.raises(EngineError) as caught:
        compat.check_arguments(OldSearch, {"random_state": 1, "repeat_float_precision": 3}, "search 'bayesopt'")
    message = str(caught.value)
    assert "search 'bayesopt': 'repeat_float_precision' not taken by OldSearch of the cluster's Ray" in message
    assert compat.ray_version() in message and "space, metric, random_state" in message
    assert "drop it from the args, or run a newer Ray on the cluster" in message


def test_a_class_taking_any_keyword_checks_its_own():
    class Open:
        def __init__(self, **kwargs):
            pass

    compat.check_arguments(Open, {"anything": 1}, "scheduler.factory")


def test_the_log_base_is_dropped_from_every_log_primitive_and_only_there():
    assert compat.log_domain_args("loguniform", [1e-4, 1e-1, 2]) == [1e-4, 1e-1]
    assert compat.log_domain_args("qloguniform", [1e-4, 1e-1, 1e-4, 10]) == [1e-4, 1e-1, 1e-4]
    assert compat.log_domain_args("lograndint", [1, 100]) == [1, 100]
    assert compat.log_domain_args("qlograndint", [1, 100, 2, 10]) == [1, 100, 2]
    assert compat.log_domain_args("quniform", [0, 1, 0.5]) == [0, 1, 0.5]


def test_tune_internals_that_are_missing_fail_clearly_naming_the_ray_version(monkeypatch):
    with pytest.raises(EngineError, match=rf"restored experiment on Ray {compat.ray_version()}"):
        compat.tuner_run_config(SimpleNamespace())
    run_config = SimpleNamespace(callbacks=[])
    assert compat.tuner_run_config(SimpleNamespace(_local_tuner=SimpleNamespace(_run_config=run_config))) is run_config
    tuner = SimpleNamespace(get_results=lambda: SimpleNamespace())
    assert compat.tuner_trials(tuner) is None
    from ray.tune.execution import class_cache

    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", ("AWS_SECRET_ACCESS_KEY",))
    with pytest.raises(EngineError, match="credentials out of the trials' runtime_env"):
        compat.stop_propagating(("AWS_SECRET_ACCESS_KEY",))


def test_the_propagated_credentials_are_removed(monkeypatch):
    from ray.tune.execution import class_cache

    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", {"AWS_SECRET_ACCESS_KEY", "RAY_CHDIR_TO_TRIAL_DIR"})
    compat.stop_propagating(("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
    assert class_cache.ENV_VARS_TO_PROPAGATE == {"RAY_CHDIR_TO_TRIAL_DIR"}


# --- the driver's working directory (a working_dir package another node's agent unpacks again) -----------------------
def _unpack(package: Path, value: str) -> None:
    """What ``download_and_unpack_package(..., overwrite=True)`` leaves at the package's path: the package's files."""
    (package / "data").mkdir(parents=True)
    (package / "data" / "x.txt").write_text(value)
    (package / "wd_probe_mod.py").write_text(f"VALUE = {value!r}\n")


def _replace(package: Path, value: str = "same") -> None:
    """Ray's replacement of an unpacked package: the folder deleted (shutil.rmtree), unpacked again there."""
    shutil.rmtree(package)
    _unpack(package, value)


@pytest.fixture
def package(tmp_path, monkeypatch):
    folder = tmp_path / "session_1" / "runtime_resources" / compat.WORKING_DIR_PACKAGES / "_ray_pkg_0123abcd"
    _unpack(folder, "same")
    monkeypatch.chdir(folder)
    # As ``python -m airflow_tune.engine`` started there has it: the start folder first on sys.path, absolute.
    monkeypatch.setattr(sys, "path", [str(folder), *sys.path])
    monkeypatch.delitem(sys.modules, "wd_probe_mod", raising=False)
    yield folder
    sys.modules.pop("wd_probe_mod", None)


def test_a_driver_in_a_replaced_package_loses_its_working_directory(package):
    """The failure on Ray 2.43/2.50 without the move: the cwd is the deleted folder, though its path is back."""
    _replace(package)
    assert package.is_dir()
    with pytest.raises(FileNotFoundError):
        os.getcwd()
    with pytest.raises(FileNotFoundError):  # what Tune's _list_at_fs_path does at the experiment's end
        os.path.relpath("bucket/experiments/e/trial_1", start="bucket/experiments/e")


def test_the_driver_moves_into_a_copy_of_its_own_that_survives_the_replacement(package):
    copy = compat.leave_working_dir_package()
    assert copy is not None and copy.name == package.name and compat.WORKING_DIR_PACKAGES not in str(copy)
    assert os.getcwd() == str(copy) and sys.path[0] == str(copy)
    assert Path("data/x.txt").read_text() == "same"  # a relative read, as user code in the driver may do
    shutil.rmtree(package)  # the agent's deletion; the import comes while the package is not back yet
    assert importlib.import_module("wd_probe_mod").VALUE == "same"
    _unpack(package, "again")
    assert os.getcwd() == str(copy)
    assert os.path.relpath("bucket/experiments/e/trial_1", start="bucket/experiments/e") == "trial_1"
    assert Path("data/x.txt").read_text() == "same"


def test_the_copy_is_of_hard_links_where_the_filesystem_allows_and_copied_files_otherwise(package, monkeypatch):
    original = package / "data" / "x.txt"
    copy = compat.leave_working_dir_package()
    assert copy is not None
    if os.stat(copy).st_dev == os.stat(package).st_dev:
        assert os.path.samefile(copy / "data" / "x.txt", original)
    monkeypatch.chdir(package)

    def refused(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refused)
    copied = compat.leave_working_dir_package()
    assert copied is not None and copied != copy
    assert (copied / "data" / "x.txt").read_text() == "same" and not os.path.samefile(
        copied / "data" / "x.txt", original
    )


def test_the_packages_import_paths_absolute_or_relative_and_pythonpath_name_the_copy(package, monkeypatch):
    elsewhere = str(package.parent.parent / "py_modules_files" / "_ray_pkg_engine")
    monkeypatch.setattr(sys, "path", [str(package), str(package / "src"), "", "lib", elsewhere, *sys.path[1:]])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(package), "src", elsewhere]))
    copy = compat.leave_working_dir_package()
    assert sys.path[:5] == [str(copy), str(copy / "src"), str(copy) + os.sep, str(copy / "lib"), elsewhere]
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(copy), str(copy / "src"), elsewhere]


def test_a_driver_outside_a_package_folder_stays_where_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = list(sys.path)
    assert compat.leave_working_dir_package() is None
    assert os.getcwd() == str(tmp_path) and sys.path == path


def test_a_driver_whose_package_was_replaced_before_it_started_moves_by_its_pwd(package, monkeypatch):
    _replace(package)
    monkeypatch.setenv("PWD", str(package))
    copy = compat.leave_working_dir_package()
    assert copy is not None and os.getcwd() == str(copy) and Path("data/x.txt").read_text() == "same"


def test_a_package_that_cannot_be_copied_leaves_the_driver_where_it_is(package, monkeypatch, capsys):
    def fails(*args, **kwargs):
        raise shutil.Error([("a", "b", "gone")])

    monkeypatch.setattr(shutil, "copytree", fails)
    assert compat.leave_working_dir_package() is None
    assert os.getcwd() == str(package) and sys.path[0] == str(package)
    assert f"the driver stays in its working_dir {package}" in capsys.readouterr().err


def test_the_driver_leaves_the_package_before_anything_else(monkeypatch):
    from airflow_tune.engine import __main__ as engine

    calls: list[str] = []

    def load_spec(*args):
        calls.append("spec")
        raise SpecError(["no spec"])

    monkeypatch.setattr(engine, "guard_output", lambda: calls.append("guard"))
    monkeypatch.setattr(engine, "leave_working_dir_package", lambda: calls.append("leave"))
    monkeypatch.setattr(engine, "load_spec", load_spec)
    assert engine.main([]) == engine.EXIT_BAD_SPEC
    assert calls == ["guard", "leave", "spec"]


def test_callbacks_are_counted_as_ray_counts_them_without_importing_its_integrations():
    script = """
import sys
from ray.tune import Callback
from ray.tune.logger import CSVLoggerCallback, LoggerCallback
from ray.air._internal import usage
from airflow_tune.engine import compat

class Mine(Callback): pass
class MyLogger(LoggerCallback): pass

callbacks = [Mine(), Mine(), MyLogger(), CSVLoggerCallback(), object()]
compat.count_callbacks_by_name()
ours = dict(usage._count_callbacks(callbacks))
print("mlflow" in sys.modules, "wandb" in sys.modules)
from ray.air._internal.usage import tag_callbacks
import importlib
importlib.reload(usage)
print(ours == dict(usage._count_callbacks(callbacks)), ours)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "False False", out
    assert out[1].startswith("True "), out
    assert "'CustomCallback': 2" in out[1] and "'CustomLoggerCallback': 1" in out[1] and "CSVLoggerCallback" in out[1]
