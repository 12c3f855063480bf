"""What an allow-list pattern licenses: a top-level function or class defined in the named module (or a submodule),
never an attribute reached through a module that module imported, and never a ``_``-prefixed name. The Airflow side
refuses what it can see in the path; the engine, which imports the module on the cluster, refuses the rest."""

from __future__ import annotations

import json

import pytest

from airflow_tune.engine.imports import EngineError, resolve_allow_listed
from airflow_tune.trust.code import CodeReferenceError, licensed_by
from tests.unit.trust.test_security import _run_until_submit

PATTERNS = ["my_models.*:*", "shlex:*", "json:*"]


@pytest.mark.parametrize(
    "path",
    [
        "my_models.train:os.popen",  # through a module the named one imported
        "my_models.train:fn.__globals__",
        "my_models.train:_private_helper",
        "my_models._internal:fn",
        "my_models.train:Model.create",  # a dotted path may pass through a module: only the DAG file writes one
    ],
)
def test_a_pattern_does_not_license_dotted_or_underscored_paths_on_the_airflow_side(path):
    assert not licensed_by(path, PATTERNS)


def test_a_pattern_licenses_a_top_level_name_of_a_matching_module():
    assert licensed_by("my_models.train:train_fn", PATTERNS)
    assert licensed_by("my_models.search:Make", PATTERNS)
    assert not licensed_by("other.train:train_fn", PATTERNS)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("shlex:os", "functions and classes defined in the named module"),  # `import os` in shlex
        ("shlex:StringIO", "not in 'shlex'"),  # `from io import StringIO` in shlex
        ("shlex:_find_unsafe", "no '_'-prefixed name"),
        ("shlex:split.__globals__", "no '_'-prefixed name"),
        ("json:decoder.JSONDecoder", "functions and classes defined in the named module"),  # through a submodule object
    ],
)
def test_the_engine_resolves_an_allow_listed_path_only_to_what_the_module_defines(path, why):
    with pytest.raises(EngineError, match=why):
        resolve_allow_listed(path, "trainable")


def test_the_engine_admits_functions_and_classes_of_the_module_and_its_submodules():
    import shlex

    assert resolve_allow_listed("shlex:split", "trainable") is shlex.split
    assert resolve_allow_listed("shlex:shlex", "trainable") is shlex.shlex
    # json re-exports JSONDecodeError from its submodule json.decoder: defined under the named package.
    assert resolve_allow_listed("json:JSONDecodeError", "trainable") is json.JSONDecodeError


def test_the_operator_refuses_an_over_matching_path_naming_the_pattern_rule_and_hands_the_rest_to_the_engine(
    monkeypatch,
):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__ALLOWED_CODE_REFERENCES", "my_models.*:*")
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({"conn_type": "ray", "host": "h"}))
    with pytest.raises(CodeReferenceError, match=r"trainable = 'my_models.train:os.popen': matches an allow-list"):
        _run_until_submit({"t": "my_models.train:os.popen"}, trainable="{{ params.t }}")
    with pytest.raises(CodeReferenceError, match=r"scheduler.factory = 'my_models.train:fn.__globals__'"):
        _run_until_submit({"s": "my_models.train:fn.__globals__"}, scheduler="{{ params.s }}")
    op = _run_until_submit(
        {"t": "my_models.train:fn"}, trainable="{{ params.t }}", scheduler={"factory": "my_models.sched:make"}
    )
    # Only what the allow-list alone admitted is resolved strictly by the engine; the DAG file's own path is not.
    assert op.submitted_spec.allow_listed == ["my_models.train:fn"]


def test_a_node_pin_is_accepted_only_when_the_dag_file_wrote_it():
    pinned = {"cpu": 1, "node:127.0.0.1": 0.01}
    op = _run_until_submit({}, resources_per_trial=pinned)
    assert op.submitted_spec.resources.per_trial == pinned
    op = _run_until_submit({"n": 1}, resources_per_trial='{"cpu": {{ params.n }}, "node:127.0.0.1": 0.01}')
    assert op.submitted_spec.resources.per_trial["node:127.0.0.1"] == 0.01
    with pytest.raises(CodeReferenceError, match=r"resources.node:10.0.0.9 = 'node:10.0.0.9': a node pin"):
        _run_until_submit({"r": {"cpu": 1, "node:10.0.0.9": 0.01}}, resources_per_trial="{{ params.r | tojson }}")
    with pytest.raises(CodeReferenceError, match=r"resources.bundles\[1\].node:10.0.0.9"):
        _run_until_submit(
            {"r": [{"CPU": 1}, {"CPU": 1, "node:10.0.0.9": 0.01}]}, resources_per_trial="{{ params.r | tojson }}"
        )
