"""Only a string the DAG file wrote in a code position licenses code: the trainable, a ``sample_from`` (in the space,
inside a ``choice`` or ``grid_search``, or in PBT's mutations), a scheduler's or searcher's ``factory``, a callback's
class path or factory. The same string written as a value (a ``choice`` of model names, a logger's argument, a
parameter that happens to be called ``factory``) is data, and a path a conf renders is refused when the DAG file
wrote it only there.

Every case runs the operator as a task runs it (rendered by Airflow, then executed until its first call to the
cluster), so a refusal here happens before any Ray job exists.
"""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec, code_references
from airflow_tune.trust.code import CodeReferenceError, literal_import_paths, review_references
from tests.unit.trust.test_security import _execute, _run_until_submit

A, B = "my_models.zoo:Small", "my_models.zoo:Large"
CHOICE = {"choice": [A, B]}


def _t(text: str) -> str:
    """``text`` with ``@A`` and ``@B`` as the two paths (for JSON and Python-literal arguments with templates)."""
    return text.replace("@A", A).replace("@B", B)


@pytest.fixture(autouse=True)
def ray_conn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({"conn_type": "ray", "host": "127.0.0.1"}))


# -- a path written as data licenses nothing ------------------------------------------------------------------------
#: (id, operator arguments the DAG file writes, the conf's params, native rendering, the field the refusal names)
DATA_CASES: list[tuple[str, dict[str, Any], dict[str, Any], bool, str]] = [
    (
        "choice-value-then-sample-from",
        {"param_space": {"model": CHOICE, "extra": "{{ params.extra }}"}},
        {"extra": {"sample_from": A}},
        True,
        f"param_space.extra = {A!r}",
    ),
    (
        "choice-value-in-a-json-template",
        {"param_space": _t('{"model": {"choice": ["@A"]}, "extra": {{ params.extra | tojson }}}')},
        {"extra": {"sample_from": A}},
        False,
        f"param_space.extra = {A!r}",
    ),
    (
        "grid-value-then-sample-from-in-choice",
        {"param_space": {"model": {"grid_search": [A]}, "extra": "{{ params.extra }}"}},
        {"extra": {"choice": [{"sample_from": A}]}},
        True,
        "param_space.extra.choice[0]",
    ),
    (
        "const-value-then-sample-from",
        {"param_space": {"model": {"const": {"sample_from": A}}, "extra": "{{ params.extra }}"}},
        {"extra": {"sample_from": A}},
        True,
        f"param_space.extra = {A!r}",
    ),
    (
        "a-parameter-called-factory",  # a top-level key of the space names a parameter, whatever its name
        {"param_space": {"factory": A, "extra": "{{ params.extra }}"}},
        {"extra": {"sample_from": A}},
        True,
        f"param_space.extra = {A!r}",
    ),
    (
        "a-parameter-called-sample-from",  # the space's root is never a primitive: this is a parameter
        {"param_space": {"sample_from": A, "extra": "{{ params.extra }}"}},
        {"extra": {"sample_from": A}},
        True,
        f"param_space.extra = {A!r}",
    ),
    (
        "pbt-mutation-values-then-factory",
        {
            "scheduler": _t(
                '{"factory": {{ params.f | tojson }}, "args": {"hyperparam_mutations": {"model": ["@A", "@B"]}}}'
            )
        },
        {"f": A},
        False,
        f"scheduler.factory = {A!r}",
    ),
    (
        "pbt-mutation-choice-then-mutation-sample-from",
        {
            "scheduler": _t(
                '{"name": "pbt", "args": {"hyperparam_mutations": {"model": {"choice": ["@A"]}, '
                '"opt": {{ params.opt | tojson }}}}}'
            )
        },
        {"opt": {"lr": {"sample_from": A}}},
        False,
        "scheduler.args.hyperparam_mutations.opt.lr",
    ),
    (
        "logger-argument-then-callback",
        {"callbacks": [{"name": "mlflow", "args": {"experiment_name": A}}, "{{ params.cb }}"]},
        {"cb": A},
        False,
        f"callbacks[1].factory = {A!r}",
    ),
    (
        "callback-args-then-callback",
        {"callbacks": [{"factory": B, "args": {"model": A}}, "{{ params.cb }}"]},
        {"cb": A},
        False,
        f"callbacks[1].factory = {A!r}",
    ),
]


@pytest.mark.parametrize(("case", "arguments", "params", "native", "field"), DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_a_path_the_dag_file_wrote_only_as_data_does_not_license_a_rendered_reference(
    case, arguments, params, native, field
):
    with pytest.raises(CodeReferenceError) as info:
        _execute(params, native, **arguments)
    text = str(info.value)
    assert isinstance(info.value, CodeReferenceError) and field in text, text
    assert "allowed_code_references" in text, text


def test_a_string_in_trainable_kwargs_licenses_nothing():
    with pytest.raises(CodeReferenceError, match=rf"param_space.extra = {A!r}"):
        _execute(
            {"extra": {"sample_from": A}},
            True,
            trainable_kwargs={"model": A},
            param_space={"extra": "{{ params.extra }}"},
        )


# -- every code position still licenses ----------------------------------------------------------------------------
#: (id, operator arguments the DAG file writes with a code position holding A and a templated part, the conf)
CODE_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("sample-from", {"param_space": {"model": {"sample_from": A}, "extra": "{{ params.extra }}"}}, {}),
    (
        "sample-from-in-choice",
        {"param_space": {"model": {"choice": [1, {"sample_from": A}]}, "extra": "{{ params.extra }}"}},
        {},
    ),
    (
        "sample-from-in-a-nested-config",
        {"param_space": _t('{"model": {"head": {"sample_from": "@A"}}, "extra": {{ params.extra | tojson }}}')},
        {},
    ),
    (
        "pbt-mutation-sample-from",
        {
            "scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"opt": {"lr": {"sample_from": A}}}}},
            "param_space": {"extra": "{{ params.extra }}"},
        },
        {},
    ),
    ("scheduler-factory", {"scheduler": {"factory": A, "args": {"n": "{{ params.n }}"}}}, {"n": 2}),
    ("scheduler-factory-string", {"scheduler": A, "param_space": {"extra": "{{ params.extra }}"}}, {}),
    ("search-factory-json", {"search": _t('{"factory": "@A", "args": {"n": {{ params.n }}}}')}, {"n": 2}),
    ("callback-class", {"callbacks": [A, "{{ params.log }}"]}, {"log": "csv"}),
    ("callback-factory", {"callbacks": [{"factory": A, "args": {"n": "{{ params.n }}"}}]}, {"n": 2}),
    (
        "callback-factory-python-literal",
        {"callbacks": _t("[{'factory': '@A', 'args': {'n': {{ params.n }}}}]")},
        {"n": 2},
    ),
]


@pytest.mark.parametrize(("case", "arguments", "conf"), CODE_CASES, ids=[c[0] for c in CODE_CASES])
def test_a_path_the_dag_file_wrote_in_a_code_position_is_accepted(case, arguments, conf):
    op = _run_until_submit({"extra": 1, **conf}, **arguments)
    assert A in {path for _, path in code_references(op.submitted_spec)}
    assert op.submitted_spec.allow_listed == []


def test_a_path_written_in_a_code_position_licenses_the_same_path_rendered_in_the_same_argument():
    # The DAG file wrote A as a sample_from inside a choice; a conf may use it as another parameter's sample_from.
    op = _run_until_submit(
        {"extra": {"sample_from": A}},
        param_space=_t('{"model": {"choice": [1, {"sample_from": "@A"}]}, "extra": {{ params.extra | tojson }}}'),
    )
    assert ("param_space.extra", A) in code_references(op.submitted_spec)


# -- the rule itself -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argument", "value", "expected"),
    [
        ("trainable", A, {A}),
        ("trainable", _t('"@A"'), {A}),  # '{{ ... | tojson }}' style JSON string
        ("trainable", "{{ params.t }}", set()),
        ("param_space", {"m": CHOICE, "g": {"grid_search": [A]}, "c": {"const": {"sample_from": A}}}, set()),
        ("param_space", {"factory": A, "sample_from": A, "m": [A]}, set()),
        ("param_space", {"m": {"sample_from": A}, "n": {"choice": [{"sample_from": B}]}}, {A, B}),
        ("param_space", _t('{"m": {"sample_from": "@A"}, "n": {"choice": ["@B"]}}'), {A}),
        ("param_space", _t('{"m": {"sample_from": "@A"}, "n": {{ params.n }}}'), {A}),
        ("param_space", '{"m": {"sample_from": "my_models.{{ params.m }}:f"}}', set()),
        ("param_space", _t('{"m": {"sample_from": "@A"}, {{ params.more }} }'), set()),  # no structure: nothing
        ("scheduler", A, {A}),
        ("scheduler", {"factory": A, "args": {"model": B}}, {A}),
        ("scheduler", {"name": "pbt", "args": {"hyperparam_mutations": {"m": [A], "n": {"choice": [B]}}}}, set()),
        ("scheduler", {"name": "pbt", "args": {"hyperparam_mutations": {"m": {"n": {"sample_from": A}}}}}, {A}),
        ("search", {"name": "optuna", "args": {"study_name": A}}, set()),
        ("search", _t('{"factory": "@A", "args": {"x": "@B"}}'), {A}),
        ("callbacks", [A, {"factory": B, "args": {"x": "other.mod:C"}}], {A, B}),
        ("callbacks", [{"name": "mlflow", "args": {"experiment_name": A}}], set()),
        ("callbacks", _t('["@A", {"name": "csv"}]'), {A}),
        ("stop", {"metric": A}, set()),  # not a code argument at all
    ],
)
def test_the_paths_an_argument_licenses_are_those_in_its_code_positions(argument, value, expected):
    assert literal_import_paths(value, argument) == expected


def test_called_without_the_argument_each_path_carries_the_arguments_whose_code_positions_hold_it():
    # The operator asks per argument value; a parameter called "factory" is a factory only as a scheduler or search.
    written = literal_import_paths({"factory": A, "m": {"sample_from": B}})
    assert written == {A, B}
    by_path = {str(w): w.arguments for w in written}  # type: ignore[attr-defined]
    assert by_path == {A: {"scheduler", "search"}, B: {"param_space"}}
    # They survive the copies a task's operator goes through.
    for copied in (copy.deepcopy(written), pickle.loads(pickle.dumps(written))):
        assert {str(w): w.arguments for w in copied} == by_path  # type: ignore[attr-defined]


def test_review_licenses_a_path_only_for_the_arguments_whose_code_position_held_it():
    spec = ExperimentSpec.from_dict(
        {
            "trainable": "pkg.mod:train",
            "name": "n",
            "storage_path": "s3://bkt/x",
            "metric": "loss",
            "mode": "min",
            "param_space": {"x": {"sample_from": A}},
        }
    )
    written = {"trainable": {"pkg.mod:train"}, "param_space": literal_import_paths({"factory": A})}
    assert review_references(spec, written)[0] == [("param_space.x", A)]
    written["param_space"] = literal_import_paths({"y": {"choice": [{"sample_from": A}]}})
    assert review_references(spec, written)[0] == []
    # A plain string is taken as written in a code position of the argument it is listed under.
    assert review_references(spec, {"trainable": {"pkg.mod:train"}, "param_space": {A}})[0] == []


def test_a_sample_from_inside_a_rendered_tuple_is_reviewed_like_one_in_a_list():
    # Native rendering reads "(...,)" as a tuple; the spec's JSON (what the engine builds) has a list there, so the
    # review must see the sample_from inside it.
    with pytest.raises(CodeReferenceError, match=r"param_space.x\[0\] = 'subprocess:getoutput'"):
        _execute({"x": "({'sample_from': 'subprocess:getoutput'},)"}, True, param_space={"x": "{{ params.x }}"})
    base = {"trainable": "m:f", "name": "n", "storage_path": "s3://bkt/x", "metric": "loss", "mode": "min"}
    spec = ExperimentSpec.from_dict({**base, "param_space": {"x": ({"choice": ({"sample_from": "a.b:c"},)},)}})
    assert code_references(spec) == [("trainable", "m:f"), ("param_space.x[0].choice[0]", "a.b:c")]
