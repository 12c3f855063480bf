"""Tune's code objects written in the DAG file besides the trainable (a Stopper object or class, a stop function,
``tune.sample_from(fn)``, PBT's function mutations, ``tune.with_parameters``): their spec forms, how they travel,
and how the engine builds them back. The DAG file is loaded as Airflow loads one, under a generated module name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG
from ray import tune

from airflow_tune.common.shipped import WithParameters
from airflow_tune.common.spec import ExperimentSpec, code_references
from airflow_tune.engine import build
from airflow_tune.engine.stopping import build_stop
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.utils import shipped_objects
from airflow_tune.utils.shipping import SHIPPED_PACKAGE, shipped_package
from tests.support.dag_files import (
    forget_dag_modules,  # noqa: F401  (autouse: the DAG-file modules leave after each test)
    load_dag_file,
)
from tests.support.tune_testkit.stoppers import StopKindAt as ImportableStopper

pytestmark = pytest.mark.unit

DAG_FILE = """
from ray.tune.stopper import Stopper

class AfterN(Stopper):
    def __init__(self, n):
        self.n = n

    def __call__(self, trial_id, result):
        return result["training_iteration"] >= self.n

    def stop_all(self):
        return False

def stop_fn(trial_id, result):
    return result["training_iteration"] >= {after}

def double(spec):
    return spec.config.x * 2

def train(config, data=None):
    return {{"loss": config["x"] + len(data)}}
"""
BASE = {"trainable": "pkg.mod:train", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}


def _load(tmp_path: Path, folder: str = "a", after: int = 3):
    return load_dag_file(tmp_path, folder, DAG_FILE.format(after=after))


def test_code_objects_become_their_json_form_naming_shipped_or_own_import_paths(tmp_path):
    dag = _load(tmp_path)
    space, scheduler, stop, objects = shipped_objects.code_in_arguments(
        {
            "x": tune.uniform(0, 1),
            "y": tune.sample_from(dag.double),
            "c": tune.choice([1, tune.sample_from(dag.double)]),
        },
        {"name": "pbt", "args": {"hyperparam_mutations": {"x": tune.uniform(0, 2), "z": lambda: 3}}},
        [dag.AfterN(2), dag.stop_fn, ImportableStopper, {"metric": "loss", "below": 0.1}],
    )
    shipped_y = space["y"]["sample_from"]
    assert (
        shipped_y.startswith(f"{SHIPPED_PACKAGE}:sample_from_") and space["c"]["choice"][1]["sample_from"] == shipped_y
    )
    assert space["x"] == {"uniform": [0, 1]}
    mutations = scheduler["args"]["hyperparam_mutations"]
    assert mutations["x"] == {"uniform": [0, 2]} and mutations["z"]["sample_from"].startswith(
        f"{SHIPPED_PACKAGE}:mutation_"
    )
    instance, function, by_path, threshold = stop
    assert instance["factory"].startswith(f"{SHIPPED_PACKAGE}:stop_") and instance["args"] == {}
    assert function["factory"].startswith(f"{SHIPPED_PACKAGE}:stop_") and function["factory"] != instance["factory"]
    assert by_path == {"factory": "tests.support.tune_testkit.stoppers:StopKindAt", "args": {}}
    assert threshold == {"metric": "loss", "below": 0.1}
    assert set(objects) == {
        shipped_y,
        mutations["z"]["sample_from"],
        instance["factory"],
        function["factory"],
        by_path["factory"],
    }
    # A stop function alone is a list of one custom stopper, as Tune's RunConfig(stop=fn) is one stopper.
    assert shipped_objects.code_in_arguments(None, None, dag.stop_fn)[2] == [function]
    # Every path is one the spec takes and names as code.
    spec = ExperimentSpec.from_dict({**BASE, "param_space": space, "scheduler": scheduler, "stop": stop})
    assert {path for _, path in code_references(spec)} == {"pkg.mod:train", *objects}


def test_the_shipped_name_changes_with_the_code_and_the_state_and_only_with_them(tmp_path):
    one, same, edited = _load(tmp_path, "a"), _load(tmp_path, "b"), _load(tmp_path, "c", after=4)
    path = shipped_objects.object_path
    assert path(one.stop_fn, "stop") == path(same.stop_fn, "stop") != path(edited.stop_fn, "stop")
    assert path(one.AfterN(2), "stop") == path(same.AfterN(2), "stop") != path(one.AfterN(3), "stop")


def test_an_object_form_the_cluster_imports_by_name_gives_the_json_forms_spec_and_fingerprint():
    _, _, stop, _ = shipped_objects.code_in_arguments(None, None, [ImportableStopper])
    objects = ExperimentSpec.from_dict({**BASE, "stop": stop})
    written = ExperimentSpec.from_dict({**BASE, "stop": "tests.support.tune_testkit.stoppers:StopKindAt"})
    assert objects == written and objects.fingerprint() == written.fingerprint()


def test_tunes_own_stopper_objects_give_their_json_forms_spec_and_fingerprint(tmp_path):
    from ray.tune import stopper

    dag = _load(tmp_path)
    objects = [
        stopper.MaximumIterationStopper(3),
        stopper.CombinedStopper(
            stopper.TimeoutStopper(60),
            stopper.ExperimentPlateauStopper("loss", top=3),
            stopper.FunctionStopper(dag.stop_fn),
        ),
        stopper.TrialPlateauStopper("loss", std=0.01, num_results=4),
    ]
    _, _, stop, shipped = shipped_objects.code_in_arguments(None, None, objects)
    (function_path,) = shipped
    written = [
        {"name": "maximum_iteration", "args": {"max_iter": 3}},
        {"name": "timeout", "args": {"timeout": 60}},
        {
            "name": "experiment_plateau",
            "args": {"metric": "loss", "std": 0.001, "top": 3, "mode": "min", "patience": 0},
        },
        {"factory": function_path, "args": {}},
        {
            "name": "trial_plateau",
            "args": {
                "metric": "loss",
                "std": 0.01,
                "num_results": 4,
                "grace_period": 4,
                "metric_threshold": None,
                "mode": None,
            },
        },
    ]
    assert stop == written and shipped[function_path] is dag.stop_fn
    as_objects, as_json = (ExperimentSpec.from_dict({**BASE, "stop": s}) for s in (stop, written))
    assert as_objects == as_json and as_objects.fingerprint() == as_json.fingerprint()

    # A subclass of one of Tune's stoppers may behave otherwise: it travels as code.
    class Longer(stopper.MaximumIterationStopper):
        pass

    assert shipped_objects.code_in_arguments(None, None, Longer(3))[2][0]["factory"].startswith(SHIPPED_PACKAGE)


def test_shipped_objects_load_in_a_python_that_cannot_import_the_dag_file(tmp_path):
    dag = _load(tmp_path)
    _, _, stop, objects = shipped_objects.code_in_arguments(None, None, [dag.AfterN(2), dag.stop_fn])
    wrapped = shipped_objects.trainable_code_of(tune.with_parameters(dag.train, data=[1, 2, 3]))
    assert wrapped.by_value and wrapped.import_path == f"{SHIPPED_PACKAGE}:train" and wrapped.digest
    codes = [shipped_objects.object_code(obj, p) for p, obj in objects.items()]
    with shipped_package(wrapped, *codes) as folder:
        code = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(folder).parent)!r})
            import {SHIPPED_PACKAGE} as shipped
            stopper, function = getattr(shipped, {stop[0]["factory"].partition(":")[2]!r}), getattr(
                shipped, {stop[1]["factory"].partition(":")[2]!r})
            print(stopper("t", {{"training_iteration": 2}}), function("t", {{"training_iteration": 2}}),
                  type(shipped.train).__name__, shipped.train.parameters, shipped.train.trainable({{"x": 1}}, data=[0]))
            """
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "True False WithParameters {'data': [1, 2, 3]} {'loss': 2}"


def test_with_parameters_data_is_part_of_the_digest_and_an_unpicklable_argument_is_named(tmp_path):
    dag = _load(tmp_path)
    one = shipped_objects.trainable_code_of(tune.with_parameters(dag.train, data=[1, 2]))
    other = shipped_objects.trainable_code_of(tune.with_parameters(dag.train, data=[1, 3]))
    assert one.digest != other.digest
    assert shipped_objects.describe(tune.with_parameters(dag.train, data=[1])) == (
        "tune.with_parameters(unusual_prefix_a_my_dag:train, data)"
    )
    with pytest.raises(TypeError, match=r"argument lock= \(a lock\) cannot be pickled.*a URI"):
        shipped_objects.trainable_code_of(tune.with_parameters(dag.train, data=[1], lock=threading.Lock()))


def test_the_engine_wraps_the_shipped_trainable_with_its_arguments_again(monkeypatch):
    seen = {}

    def train(config, data=None, extra=None):
        seen.update(data=data, extra=extra)

    monkeypatch.setattr(build, "import_path", lambda path, what: WithParameters(train, {"data": [5, 6]}))
    trainable = build.build_trainable(ExperimentSpec.from_dict({**BASE, "trainable_kwargs": {"extra": "e"}}))
    trainable({"x": 1})
    assert seen == {"data": [5, 6], "extra": "e"}


class _Stop(tune.Stopper):
    def __init__(self, n: int = 1) -> None:
        self.n = n

    def __call__(self, trial_id, result):
        return result["training_iteration"] >= self.n

    def stop_all(self):
        return False


def test_the_engine_builds_each_kind_of_custom_stopper(monkeypatch):
    from airflow_tune.engine import stopping

    found = {"m:Stop": _Stop, "m:instance": _Stop(4), "m:fn": lambda trial_id, result: True, "m:three": 3}
    monkeypatch.setattr(stopping, "import_path", lambda path, what: found[path])

    def built(stop):
        return build_stop(ExperimentSpec.from_dict({**BASE, "stop": stop}))

    assert built("m:Stop").n == 1
    assert built([{"factory": "m:Stop", "args": {"n": 7}}]).n == 7
    assert built(["m:instance"]) is found["m:instance"]
    assert isinstance(built("m:fn"), tune.stopper.FunctionStopper)
    combined = built([{"metric": "loss", "below": 1}, "m:fn"])
    assert type(combined).__name__ == "CombinedStopper"
    with pytest.raises(build.EngineError, match="only a tune.Stopper subclass is called with args"):
        built([{"factory": "m:fn", "args": {"n": 1}}])
    with pytest.raises(build.EngineError, match="a stopper is a tune.Stopper subclass or object, or a function"):
        built("m:three")


def test_pbt_takes_a_function_mutation_itself_as_tune_does(monkeypatch):
    def mutate():
        return 0.5

    monkeypatch.setattr(build, "import_path", lambda path, what: mutate)
    mutations = {"lr": {"sample_from": "m:mutate"}, "opt": {"m": {"sample_from": "m:mutate"}}}
    spec = ExperimentSpec.from_dict({**BASE, "scheduler": {"name": "pbt", "args": {"hyperparam_mutations": mutations}}})
    pbt = build.build_scheduler(spec)
    assert pbt._hyperparam_mutations["lr"] is mutate  # PBT refuses a tune.sample_from here; it calls a function
    assert pbt._hyperparam_mutations["opt"]["m"].sample(None) == 0.5


def test_stop_written_as_code_is_a_stopper_spec_and_not_json_is_refused():
    spec = ExperimentSpec.from_dict({**BASE, "stop": ["pkg.mod:MyStopper", {"metric": "loss", "below": 1}]})
    assert spec.stop == [{"factory": "pkg.mod:MyStopper", "args": {}}, {"metric": "loss", "below": 1}]
    assert ("stop[0].factory", "pkg.mod:MyStopper") in code_references(spec)
    with pytest.raises(ValueError) as refused:
        ExperimentSpec.from_dict({**BASE, "stop": [{"factory": "not a path"}, {"args": {}}]})
    assert "stop[0].factory = 'not a path': not a stopper's import path" in str(refused.value)
    assert "stop[1] = " in str(refused.value) and '{"factory": "pkg.mod:MyStopper", "args": {...}}' in str(
        refused.value
    )


def _ti(dag_id: str, task_id: str):
    return SimpleNamespace(dag_id=dag_id, task_id=task_id, map_index=-1, try_number=1)


def test_the_operator_keeps_code_out_of_its_templated_arguments_and_counts_it_as_written(tmp_path):
    dag_module = _load(tmp_path)
    with DAG("code_dag", schedule=None) as dag:
        op = RayTuneOperator(
            task_id="tune",
            trainable=tune.with_parameters(dag_module.train, data=[1]),
            storage_path="s3://bucket/x",
            metric="loss",
            mode="min",
            param_space={"x": tune.sample_from(dag_module.double)},
            stop=dag_module.stop_fn,
            trainable_kwargs={"data": 2},
        )
    assert not callable(op.stop) and not any(callable(entry) for entry in op.stop)
    ti = _ti(dag.dag_id, op.task_id)
    context = {"params": {}, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]  # nothing callable is called with context=
    with pytest.raises(ValueError, match=r"trainable_kwargs = \['data'\]: data also given to tune.with_parameters"):
        op.build_spec(context)  # type: ignore[arg-type]
    op.trainable_kwargs = {}
    spec = op.build_spec(context)  # type: ignore[arg-type]
    assert spec.stop == op.stop and spec.param_space == op.param_space
    assert spec.trainable == f"{SHIPPED_PACKAGE}:train" and spec.trainable_digest
    assert {code.import_path for _, code in op.shipped_codes() if code.by_value} == {
        spec.trainable,
        spec.stop[0]["factory"],
        spec.param_space["x"]["sample_from"],
    }


def test_with_parameters_data_holding_a_set_digests_alike_under_every_hash_seed():
    """A set's order follows the process's hash seed; its digest must not (else a retry's spec would differ)."""
    code = (
        "from airflow_tune.utils.shipped_objects import _data_digest\n"
        "print(_data_digest({'vocab': {'alpha', 'beta', 'gamma', 'delta'}, 'n': 3}))\n"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2", "3", "4")
    }
    assert len(digests) == 1, digests
