"""Tune's own sample objects in a DAG file's param_space become the spec's JSON form (same spec, same fingerprint, the
same domain back in the engine); what a JSON spec cannot carry is refused before submission, naming the field, the
value's type and what to write instead."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from ray import tune
from ray.tune.search import sample

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.common.spec.tune_objects import is_tune_object, not_carried, space_from_tune
from airflow_tune.engine import build

BASE = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}


def _spec(space) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, "param_space": space})


def _quiet(make):
    """Build a Tune object without Ray 2.60's warning that ``base`` is deprecated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


#: Each of Tune's sample functions, with its arguments, and the spec's JSON form it becomes.
CASES = [
    (lambda: tune.uniform(0, 1), {"uniform": [0, 1]}),
    (lambda: tune.uniform(-1.5, 2.5), {"uniform": [-1.5, 2.5]}),
    (lambda: tune.quniform(0, 1, 0.1), {"quniform": [0, 1, 0.1]}),
    (lambda: tune.loguniform(1e-4, 1e-1), {"loguniform": [1e-4, 1e-1]}),
    (lambda: tune.loguniform(1e-4, 1e-1, base=10), {"loguniform": [1e-4, 1e-1]}),
    (lambda: tune.loguniform(1e-4, 1e-1, 2), {"loguniform": [1e-4, 1e-1]}),
    (lambda: tune.qloguniform(1e-3, 1, 1e-3), {"qloguniform": [1e-3, 1, 1e-3]}),
    (lambda: tune.qloguniform(1e-3, 1, 1e-3, base=2), {"qloguniform": [1e-3, 1, 1e-3]}),
    (lambda: tune.randn(), {"randn": [0.0, 1.0]}),
    (lambda: tune.randn(100, 5), {"randn": [100, 5]}),
    (lambda: tune.randn(sd=5, mean=100), {"randn": [100, 5]}),
    (lambda: tune.qrandn(100, 20, 0.5), {"qrandn": [100, 20, 0.5]}),
    (lambda: tune.randint(1, 10), {"randint": [1, 10]}),
    (lambda: tune.qrandint(0, 100), {"qrandint": [0, 100, 1]}),
    (lambda: tune.qrandint(0, 100, 5), {"qrandint": [0, 100, 5]}),
    (lambda: tune.lograndint(1, 1000), {"lograndint": [1, 1000]}),
    (lambda: tune.lograndint(1, 1000, base=2), {"lograndint": [1, 1000]}),
    (lambda: tune.qlograndint(1, 1024, 2), {"qlograndint": [1, 1024, 2]}),
    (lambda: tune.qlograndint(1, 1024, 2, base=2), {"qlograndint": [1, 1024, 2]}),
    (lambda: tune.choice(["relu", "tanh", 3, None]), {"choice": ["relu", "tanh", 3, None]}),
    (lambda: tune.grid_search([16, 32]), {"grid_search": [16, 32]}),
    (lambda: sample.Categorical([1, 2]).grid(), {"grid_search": [1, 2]}),
    (lambda: sample.Float(0, 1), {"uniform": [0, 1]}),
]


@pytest.mark.parametrize(("make", "form"), CASES, ids=[json.dumps(f) for _, f in CASES])
def test_each_tune_object_becomes_the_specs_json_form(make, form):
    assert space_from_tune({"x": _quiet(make)}) == {"x": form}


@pytest.mark.parametrize(("make", "form"), CASES, ids=[json.dumps(f) for _, f in CASES])
def test_the_engine_builds_the_same_domain_back(make, form):
    """From the spec file (written with sorted keys), the engine builds the domain the DAG file wrote."""
    original = _quiet(make)
    spec = ExperimentSpec.from_json(_spec(space_from_tune({"x": original})).to_json())
    built = build.build_param_space(spec)["x"]
    if isinstance(original, dict):  # grid_search is Tune's own dict
        assert built == original
        return
    if original.is_grid():
        assert built == {"grid_search": original.categories}
        return
    assert type(built) is type(original)

    def parts(domain):
        sampler = domain.get_sampler()
        q = sampler.q if isinstance(sampler, sample.Quantized) else None
        inner = sampler.sampler if q is not None else sampler
        normal = (inner.mean, inner.sd) if hasattr(inner, "sd") else None
        bounds = (domain.lower, domain.upper) if hasattr(domain, "lower") else domain.categories
        return type(inner), q, normal, bounds

    assert parts(built) == parts(original)


def test_a_space_at_any_depth_gives_the_spec_and_fingerprint_of_its_json_form():
    native = {
        "model": {
            "lr": tune.loguniform(1e-4, 1e-1),
            "layers": [tune.randint(1, 4), tune.qrandint(8, 64, 8), 3],
            "act": tune.choice(["relu", {"kind": "leaky", "slope": tune.uniform(0, 0.3)}]),
        },
        "opt": {"momentum": tune.quniform(0, 1, 0.1), "noise": tune.qrandn(100, 20, 0.5), "name": "sgd"},
        "bs": tune.grid_search([16, 32]),
        "steps": np.int64(3),
        "scale": (1, 2),
    }
    written = {
        "model": {
            "lr": {"loguniform": [1e-4, 1e-1]},
            "layers": [{"randint": [1, 4]}, {"qrandint": [8, 64, 8]}, 3],
            "act": {"choice": ["relu", {"kind": "leaky", "slope": {"uniform": [0, 0.3]}}]},
        },
        "opt": {"momentum": {"quniform": [0, 1, 0.1]}, "noise": {"qrandn": [100, 20, 0.5]}, "name": "sgd"},
        "bs": {"grid_search": [16, 32]},
        "steps": 3,
        "scale": [1, 2],
    }
    converted = space_from_tune(native)
    assert converted == written
    assert type(converted["steps"]) is int
    a, b = _spec(converted), _spec(written)
    assert a.to_json() == b.to_json()
    assert a.fingerprint() == b.fingerprint()


def test_numpy_numbers_become_python_numbers_inside_tune_objects_too():
    converted = space_from_tune({"x": tune.choice(np.arange(3)), "y": tune.uniform(np.float32(0.5), np.int64(2))})
    assert converted == {"x": {"choice": [0, 1, 2]}, "y": {"uniform": [0.5, 2]}}
    assert [type(v) for v in converted["x"]["choice"]] == [int, int, int]
    assert type(converted["y"]["uniform"][1]) is int


def test_strings_and_json_stay_as_they_are():
    assert space_from_tune("{{ params.space | tojson }}") == "{{ params.space | tojson }}"
    assert space_from_tune(None) is None
    json_space = {"lr": {"loguniform": [1e-4, 1e-1]}, "x": {"sample_from": "pkg.mod:fn"}, "name": "a"}
    assert space_from_tune(json_space) == json_space


def _refusal(space) -> str:
    with pytest.raises(ValueError) as info:  # a SpecError is a ValueError
        _spec(space_from_tune(space))
    assert isinstance(info.value, SpecError)
    return str(info.value)


def _in_my_module(config):
    return 1


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (np.array([1.0, 2.0]), ["param_space.model.lr = ", "numpy.ndarray", "value.tolist()"]),
        (object(), ["param_space.model.lr = ", "a value of type object is not JSON", "write the value as JSON"]),
        ({1, 2}, ["param_space.model.lr = ", "type set", "a list for a set"]),
        (
            tune.sample_from(lambda config: 1),
            ["param_space.model.lr = ", "sample.Function", '{"sample_from": "package.module:function"}'],
        ),
        (
            tune.sample_from(_in_my_module),
            ["ray.tune.search.sample.Function", f'{{"sample_from": "{__name__}:_in_my_module"}}'],
        ),
        (
            sample.Float(0, 1).normal(0, 1),
            ["param_space.model.lr = ", "ray.tune.search.sample.Float sampled by Float._Normal", "no form for"],
        ),
    ],
    ids=["ndarray", "object", "set", "lambda", "function", "bounded-normal"],
)
def test_what_the_spec_cannot_carry_is_refused_naming_field_type_and_fix(value, words):
    text = _refusal({"model": {"lr": value, "depth": 3}})
    for word in words:
        assert word in text, text


def test_a_tune_domain_it_does_not_know_is_refused():
    class Mine(sample.Domain):
        pass

    text = _refusal({"model": [Mine()]})
    assert "param_space.model[0] = " in text and "no form for" in text


def test_a_tune_object_handed_to_the_spec_directly_is_refused_with_its_json_form():
    (where, _, problem, fix), *_ = not_carried({"lr": tune.loguniform(1e-4, 1e-1)}, "param_space")
    assert where == "param_space.lr"
    assert "ray.tune.search.sample.Float" in problem
    assert '{"loguniform": [0.0001, 0.1]}' in fix


def test_every_problem_is_named_at_once():
    text = _refusal({"a": np.zeros(2), "b": {"c": [object()]}, "d": tune.uniform(0, 1)})
    assert "param_space.a = " in text and "param_space.b.c[0] = " in text and "(2 problems)" in text


def test_a_trial_value_sampled_from_the_converted_space_is_in_range():
    space = build.build_param_space(_spec(space_from_tune({"x": tune.qloguniform(1e-3, 1, 1e-3)})))
    values = [space["x"].sample() for _ in range(200)]
    assert all(1e-3 <= v <= 1 and math.isclose(v / 1e-3, round(v / 1e-3), abs_tol=1e-6) for v in values)


def test_is_tune_object():
    assert is_tune_object(tune.uniform(0, 1)) and not is_tune_object({"uniform": [0, 1]})


def test_converting_a_json_space_imports_no_ray(tmp_path):
    """DAG parsing stays cheap: an operator with a JSON space (and the converter itself) loads no ray."""
    code = (
        "import sys\n"
        "from airflow_tune.operators.tune import RayTuneOperator\n"
        "op = RayTuneOperator(task_id='t', trainable='p.m:f', storage_path='s3://b/e', metric='m', mode='max',\n"
        "                     param_space={'lr': {'loguniform': [1e-4, 0.1]}, 'n': [1, 2]})\n"
        "assert op.param_space == {'lr': {'loguniform': [1e-4, 0.1]}, 'n': [1, 2]}, op.param_space\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_operator_converts_tune_objects_before_reading_code_positions():
    from airflow_tune.operators.tune import RayTuneOperator

    op = RayTuneOperator(
        task_id="t",
        trainable="p.m:f",
        storage_path="s3://b/e",
        metric="m",
        mode="max",
        param_space={"net": {"lr": tune.loguniform(1e-4, 1e-1), "f": tune.choice([{"sample_from": "pkg.mod:fn"}])}},
    )
    assert op.param_space == {
        "net": {"lr": {"loguniform": [1e-4, 1e-1]}, "f": {"choice": [{"sample_from": "pkg.mod:fn"}]}}
    }
    # A sample_from inside a Tune choice is in a code position, as in the JSON form: written in the DAG file.
    assert op.literal_code_references["param_space"] == {"pkg.mod:fn"}


def test_a_module_another_thread_is_still_importing_is_read_only_once_built(tmp_path, monkeypatch):
    """A DAG file's thread may be importing numpy (pyarrow does) while the operator converts a space: the module is
    in sys.modules half-built. The conversion waits for it (the import lock) instead of failing on a missing name."""
    import sys
    import threading
    import time

    from airflow_tune.common.spec import tune_objects

    (tmp_path / "aft_slow_module.py").write_text("import time\ntime.sleep(0.5)\nREADY = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "aft_slow_module", raising=False)
    importer = threading.Thread(target=__import__, args=("aft_slow_module",))
    importer.start()
    deadline = time.monotonic() + 10
    while "aft_slow_module" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        assert tune_objects._loaded("aft_slow_module").READY is True
        assert tune_objects._loaded("aft_module_nobody_imported") is None
    finally:
        importer.join()
