"""ExperimentSpec: every malformed spec is rejected with a message naming the field, the value and the fix; valid
specs round-trip; experiment names are deterministic and always valid; the module imports neither airflow nor ray."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from typing import Any

import pytest

from airflow_tune.common.contract import MANIFEST_DIR, join_uri, manifest_uri
from airflow_tune.common.spec import (
    PRIMITIVES,
    SCHEDULERS,
    SEARCHERS,
    CheckpointSpec,
    ExperimentSpec,
    FailureSpec,
    ResourcesSpec,
    SchedulerSpec,
    SearchSpec,
    SpecError,
    experiment_name_for,
    identity_differences,
    primitive_of,
)

BASE: dict[str, Any] = {
    "trainable": "my_pkg.train:train_fn",
    "name": "exp-1",
    "storage_path": "s3://my-bucket/experiments",
    "metric": "loss",
    "mode": "min",
    "param_space": {"lr": {"loguniform": [1e-4, 1e-1]}, "depth": {"choice": [2, 4, 8]}},
}
DELETE = object()


def make(patch: dict[str, Any] | None = None) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for key, value in (patch or {}).items():
        if value is DELETE:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def space(**params: Any) -> dict[str, Any]:
    return {"param_space": params}


def rejected(data: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        ExperimentSpec.from_dict(data)
    return info.value


# (id, patch, expected field path substring, words the message for that field must contain)
MALFORMED: list[tuple[str, dict[str, Any], str, list[str]]] = [
    # --- wrong types, top level
    ("trainable-int", {"trainable": 5}, "trainable", ["= 5", "not an import path", "package.module:"]),
    ("trainable-code", {"trainable": "lambda c: c"}, "trainable", ["'lambda c: c'", "import path"]),
    ("trainable-no-colon", {"trainable": "my_pkg.train.fn"}, "trainable", ["'my_pkg.train.fn'", "package.module:"]),
    ("trainable-newline", {"trainable": "my_pkg.train:fn\n"}, "trainable", ["not an import path"]),
    ("name-int", {"name": 7}, "name", ["= 7", "not a safe experiment name", "letters, digits"]),
    ("storage-int", {"storage_path": 3}, "storage_path", ["= 3", "must be a string", "s3://"]),
    ("metric-int", {"metric": 1}, "metric", ["= 1", "not a metric name", '"loss"']),
    ("mode-int", {"mode": 1}, "mode", ["= 1", "'min' or 'max'"]),
    ("param-space-list", {"param_space": [1, 2]}, "param_space", ["[1, 2]", "must be a JSON object", "loguniform"]),
    ("trainable-kwargs-list", {"trainable_kwargs": ["a"]}, "trainable_kwargs", ['["a"]', "must be a JSON object"]),
    ("trainable-kwargs-not-json", {"trainable_kwargs": {"s": {1, 2}}}, "trainable_kwargs", ["is not JSON", "JSON"]),
    ("num-samples-zero", {"num_samples": 0}, "num_samples", ["= 0", "integer >= 1", "e.g. 8"]),
    ("num-samples-str", {"num_samples": "8"}, "num_samples", ["'8'", "integer >= 1"]),
    ("num-samples-bool", {"num_samples": True}, "num_samples", ["true", "integer >= 1"]),
    ("num-samples-float", {"num_samples": 2.5}, "num_samples", ["2.5", "integer >= 1"]),
    ("max-concurrent-trials-negative", {"max_concurrent_trials": -1}, "max_concurrent_trials", ["= -1", ">= 0"]),
    ("max-concurrent-trials-str", {"max_concurrent_trials": "4"}, "max_concurrent_trials", ["'4'", "integer"]),
    ("reuse-actors-str", {"reuse_actors": "yes"}, "reuse_actors", ["'yes'", "true or false"]),
    ("time-budget-negative", {"time_budget_s": -5}, "time_budget_s", ["-5", "positive number of seconds", "3600"]),
    ("time-budget-str", {"time_budget_s": "1h"}, "time_budget_s", ["'1h'", "positive number"]),
    ("progress-interval-tiny", {"progress_interval_s": 0.1}, "progress_interval_s", ["0.1", ">= 0.5"]),
    ("stop-list-of-number", {"stop": [10]}, "stop[0]", ["10", "must be an object", '"below"']),
    ("stop-str", {"stop": "10 iterations"}, "stop", ["'10 iterations'", "metric thresholds"]),
    ("stop-empty", {"stop": {}}, "stop", ["{}", "metric thresholds"]),
    ("stop-threshold-str", {"stop": {"training_iteration": "10"}}, "stop.training_iteration", ["'10'", "number"]),
    ("stop-threshold-inf", {"stop": {"loss": float("inf")}}, "stop.loss", ["Infinity", "must be a number"]),
    ("scheduler-int", {"scheduler": 5}, "scheduler", ["= 5", "must be a JSON object", "name, factory, args"]),
    ("search-list", {"search": ["optuna"]}, "search", ['["optuna"]', "must be a JSON object", "max_concurrent"]),
    ("points-str", {"points_to_evaluate": "lr=0.1"}, "points_to_evaluate", ["'lr=0.1'", "list of configs"]),
    ("points-not-dicts", {"points_to_evaluate": [1]}, "points_to_evaluate", ["[1]", "list of configs"]),
    ("resources-int", {"resources": 4}, "resources", ["= 4", "must be a JSON object", "per_trial"]),
    ("checkpoint-str", {"checkpoint": "keep 2"}, "checkpoint", ["'keep 2'", "must be a JSON object", "num_to_keep"]),
    ("failure-list", {"failure": [1]}, "failure", ["[1]", "must be a JSON object", "max_failures"]),
    ("errored-trials-unknown", {"errored_trials": "retry"}, "errored_trials", ["'retry'", "resume, restart, keep"]),
    ("errored-trials-int", {"errored_trials": 1}, "errored_trials", ["= 1", "unknown policy"]),
    ("best-scope-unknown", {"best_scope": "best"}, "best_scope", ["'best'", "last-5-avg"]),
    ("version-99", {"version": 99}, "version", ["99", "unsupported spec version", "version 1"]),
    ("version-str", {"version": "1"}, "version", ["'1'", "unsupported"]),
    ("version-bool", {"version": True}, "version", ["true", "unsupported"]),
    # --- required fields
    ("missing-trainable", {"trainable": DELETE}, "trainable", ["is required", "my_pkg.train:train_fn"]),
    ("missing-name", {"name": DELETE}, "name", ["is required", "experiment name"]),
    ("missing-storage", {"storage_path": DELETE}, "storage_path", ["is required", "s3://my-bucket"]),
    ("missing-metric", {"metric": DELETE}, "metric", ["is required", '"loss"']),
    ("missing-mode", {"mode": DELETE}, "mode", ["is required", '"min" or "max"']),
    ("empty-name", {"name": ""}, "name", ["''", "is required"]),
    ("null-trainable", {"trainable": None}, "trainable", ["null", "is required"]),
    # --- unknown fields
    ("unknown-typo", {"num_sample": 4}, "num_sample", ["= 4", "unknown field", "did you mean 'num_samples'"]),
    ("unknown-case", {"Metric": "acc"}, "Metric", ["'acc'", "did you mean 'metric'"]),
    ("unknown-short", {"storage": "s3://b/x"}, "storage", ["did you mean 'storage_path'"]),
    ("unknown-far", {"colour": "red"}, "colour", ["'red'", "unknown field", "known fields", "num_samples"]),
    ("unknown-part-field", {"scheduler": {"nme": "asha"}}, "scheduler.nme", ["did you mean 'name'", "factory"]),
    ("unknown-ckpt-field", {"checkpoint": {"keep": 2}}, "checkpoint.keep", ["unknown field", "num_to_keep"]),
    # --- search space primitives
    ("uniform-arity", space(x={"uniform": [1]}), "param_space.x", ['{"uniform": [1]}', "lower, upper"]),
    ("uniform-not-list", space(x={"uniform": "0..1"}), "param_space.x", ["list of numbers", "lower, upper"]),
    ("uniform-non-numeric", space(x={"uniform": ["a", 1]}), "param_space.x", ['"a"', "finite numbers"]),
    ("uniform-nan", space(x={"uniform": [0, float("nan")]}), "param_space.x", ["NaN", "finite numbers"]),
    ("uniform-low-eq-high", space(x={"uniform": [1, 1]}), "param_space.x", ["lower bound 1", "swap or widen"]),
    ("uniform-low-gt-high", space(x={"uniform": [2, 1]}), "param_space.x", ["not below upper bound 1"]),
    ("quniform-arity", space(x={"quniform": [0, 1]}), "param_space.x", ["lower, upper, q"]),
    ("quniform-q-zero", space(x={"quniform": [0, 1, 0]}), "param_space.x", ["q must be > 0", "positive"]),
    ("loguniform-zero-low", space(x={"loguniform": [0, 1]}), "param_space.x", ["lower bound > 0", "log scale"]),
    ("loguniform-neg-low", space(x={"loguniform": [-1, 1]}), "param_space.x", ["[-1, 1]", "positive lower"]),
    ("loguniform-base", space(x={"loguniform": [1e-4, 1, 1]}), "param_space.x", ["log base must be > 1"]),
    ("loguniform-arity", space(x={"loguniform": [1, 2, 3, 4]}), "param_space.x", ["lower, upper[, base]"]),
    ("qloguniform-arity", space(x={"qloguniform": [1, 2]}), "param_space.x", ["lower, upper, q[, base]"]),
    ("qloguniform-q-neg", space(x={"qloguniform": [1e-3, 1, -1]}), "param_space.x", ["q must be > 0"]),
    ("qloguniform-base", space(x={"qloguniform": [1e-3, 1, 1e-3, 0.5]}), "param_space.x", ["log base must be > 1"]),
    ("randn-sd-zero", space(x={"randn": [0, 0]}), "param_space.x", ["standard deviation must be > 0"]),
    ("randn-arity", space(x={"randn": [0, 1, 2]}), "param_space.x", ["[mean, sd]"]),
    ("qrandn-arity", space(x={"qrandn": [0, 1]}), "param_space.x", ["mean, sd, q"]),
    ("qrandn-q-zero", space(x={"qrandn": [0, 1, 0]}), "param_space.x", ["q must be > 0"]),
    ("randint-float", space(x={"randint": [0.5, 10]}), "param_space.x", ["0.5", "integer bounds", "decimal point"]),
    ("randint-low-gt-high", space(x={"randint": [10, 1]}), "param_space.x", ["lower bound 10", "upper bound 1"]),
    ("randint-arity", space(x={"randint": [1]}), "param_space.x", ["lower, upper"]),
    ("randint-bool", space(x={"randint": [False, True]}), "param_space.x", ["finite numbers"]),
    ("qrandint-q-float", space(x={"qrandint": [0, 10, 0.5]}), "param_space.x", ["q must be an integer"]),
    ("qrandint-q-zero", space(x={"qrandint": [0, 10, 0]}), "param_space.x", ["q must be > 0"]),
    ("lograndint-zero", space(x={"lograndint": [0, 100]}), "param_space.x", ["lower bound > 0"]),
    ("lograndint-float", space(x={"lograndint": [1, 100.5]}), "param_space.x", ["integer bounds"]),
    ("qlograndint-arity", space(x={"qlograndint": [1, 100]}), "param_space.x", ["lower, upper, q[, base]"]),
    ("qlograndint-base", space(x={"qlograndint": [1, 100, 1, 1]}), "param_space.x", ["log base must be > 1"]),
    ("choice-empty", space(x={"choice": []}), "param_space.x", ['{"choice": []}', "non-empty list", "v1, v2"]),
    ("choice-str", space(x={"choice": "abc"}), "param_space.x", ['"abc"', "non-empty list"]),
    ("choice-dict", space(x={"choice": {"a": 1}}), "param_space.x", ["non-empty list"]),
    ("grid-not-list", space(x={"grid_search": 3}), "param_space.x", ['{"grid_search": 3}', "non-empty list"]),
    ("grid-empty", space(x={"grid_search": []}), "param_space.x", ["non-empty list"]),
    (
        "sample-from-lambda",
        space(x={"sample_from": "lambda spec: 1"}),
        "param_space.x",
        ["lambda spec: 1", "never code"],
    ),
    ("sample-from-import", space(x={"sample_from": "__import__('os')"}), "param_space.x", ["__import__", "never code"]),
    ("sample-from-no-colon", space(x={"sample_from": "os.system"}), "param_space.x", ["package.module:function"]),
    ("sample-from-int", space(x={"sample_from": 3}), "param_space.x", ["import path"]),
    ("unknown-primitive-normal", space(x={"normal": [0, 1]}), "param_space.x", ["'normal'", "randn"]),
    ("unknown-primitive-case", space(x={"Uniform": [0, 1]}), "param_space.x", ["did you mean 'uniform'"]),
    ("unknown-primitive-nospace", space(x={"gridsearch": [1]}), "param_space.x", ["did you mean 'grid_search'"]),
    (
        "nested-path",
        space(model={"layers": {"randint": [8, 2]}, "act": "relu"}),
        "param_space.model.layers",
        ["[8, 2]", "lower bound 8"],
    ),
    ("nested-deep", space(a={"b": {"c": {"choice": []}}}), "param_space.a.b.c", ["non-empty list"]),
    ("in-list", space(x=[1, {"uniform": [1, 0]}]), "param_space.x[1]", ["lower bound 1"]),
    # --- scheduler
    ("scheduler-unknown", {"scheduler": "ashaa"}, "scheduler.name", ["'ashaa'", "unknown scheduler", "asha, "]),
    ("scheduler-bad-factory", {"scheduler": {"factory": "not a path"}}, "scheduler.factory", ["package.module:"]),
    ("scheduler-bad-factory-str", {"scheduler": "pkg:"}, "scheduler.factory", ["'pkg:'", "not an import path"]),
    (
        "scheduler-arg-not-accepted",
        {"scheduler": {"name": "asha", "args": {"perturbation_interval": 2}}},
        "scheduler.args.perturbation_interval",
        ["= 2", "not an argument of asha", "grace_period", "max_t"],
    ),
    ("fifo-args", {"scheduler": {"name": "fifo", "args": {"max_t": 5}}}, "scheduler.args.max_t", ["no arguments"]),
    (
        "scheduler-metric",
        {"scheduler": {"name": "asha", "args": {"metric": "acc"}}},
        "scheduler.args.metric",
        ["'acc'", "set by the spec", "spec's metric"],
    ),
    (
        "scheduler-mode",
        {"scheduler": {"name": "hyperband", "args": {"mode": "max"}}},
        "scheduler.args.mode",
        ["set by the spec", "spec's mode"],
    ),
    (
        "asha-grace-gt-max-t",
        {"scheduler": {"name": "asha", "args": {"grace_period": 20, "max_t": 10}}},
        "scheduler.args.grace_period",
        ["= 20", "exceeds max_t 10", "grace_period <= max_t"],
    ),
    ("asha-max-t-zero", {"scheduler": {"name": "asha", "args": {"max_t": 0}}}, "scheduler.args.max_t", ["positive"]),
    ("scheduler-args-list", {"scheduler": {"name": "asha", "args": [1]}}, "scheduler.args", ["JSON object"]),
    (
        "pbt-no-mutations",
        {"scheduler": {"name": "pbt", "args": {"perturbation_interval": 2}}},
        "scheduler.args.hyperparam_mutations",
        ["null", "PBT needs mutations", "loguniform"],
    ),
    (
        "pbt-bad-mutation",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": {"uniform": [1, 0]}}}}},
        "scheduler.args.hyperparam_mutations.lr",
        ["lower bound 1"],
    ),
    (
        "pb2-no-bounds",
        {"scheduler": {"name": "pb2", "args": {}}},
        "scheduler.args.hyperparam_bounds",
        ["PB2 needs bounds"],
    ),
    (
        "pb2-bad-bounds",
        {"scheduler": {"name": "pb2", "args": {"hyperparam_bounds": {"lr": [0.1, 0.001]}}}},
        "scheduler.args.hyperparam_bounds.lr",
        ["[0.1, 0.001]", "low 0.1 is above high 0.001"],
    ),
    (
        "pb2-bounds-non-numeric",
        {"scheduler": {"name": "pb2", "args": {"hyperparam_bounds": {"lr": ["a", "b"]}}}},
        "scheduler.args.hyperparam_bounds.lr",
        ["[low, high]"],
    ),
    # --- searcher
    ("searcher-unknown", {"search": "skopt"}, "search.name", ["'skopt'", "unknown search algorithm", "optuna"]),
    (
        "optuna-grid",
        {"search": "optuna", "param_space": {"bs": {"grid_search": [16, 32]}, "lr": {"uniform": [0, 1]}}},
        "param_space.bs",
        ["grid_search", "[16, 32]", "optuna searcher", '"choice"'],
    ),
    (
        "hyperopt-nested-grid",
        {"search": {"name": "hyperopt"}, "param_space": {"m": {"bs": {"grid_search": [1, 2]}}}},
        "param_space.m.bs",
        ["hyperopt searcher", "grid_search"],
    ),
    ("search-max-concurrent-0", {"search": {"max_concurrent": 0}}, "search.max_concurrent", ["= 0", "integer >= 1"]),
    ("search-max-concurrent-str", {"search": {"max_concurrent": "2"}}, "search.max_concurrent", ["'2'"]),
    (
        "search-args-metric",
        {"search": {"name": "optuna", "args": {"metric": "acc"}}},
        "search.args.metric",
        ["set by the spec"],
    ),
    ("search-bad-factory", {"search": {"factory": "x y"}}, "search.factory", ["'x y'", "not an import path"]),
    # --- warm start
    (
        "points-unknown-keys",
        {"points_to_evaluate": [{"lr": 0.01}, {"lr": 0.1, "momentum": 0.9}]},
        "points_to_evaluate[1]",
        ["momentum", "not in param_space", "param_space's keys"],
    ),
    # --- resources
    (
        "resources-both",
        {"resources": {"per_trial": {"cpu": 1}, "bundles": [{"CPU": 1}]}},
        "resources",
        ["per_trial or bundles, not both", "drop one"],
    ),
    ("resources-negative", {"resources": {"cpu": -1}}, "resources.cpu", ["= -1", "number >= 0", "e.g. 1"]),
    ("resources-str-amount", {"resources": {"cpu": "1"}}, "resources.cpu", ["'1'", "number >= 0"]),
    ("resources-all-zero", {"resources": {"cpu": 0, "gpu": 0}}, "resources", ["no resources at all", '"cpu": 1']),
    ("resources-empty", {"resources": {}}, "resources", ["{}", "non-empty object"]),
    (
        "resources-bad-strategy",
        {"resources": {"bundles": [{"CPU": 1}], "strategy": "SPREADOUT"}},
        "resources.strategy",
        ["'SPREADOUT'", "unknown strategy", "STRICT_PACK"],
    ),
    ("resources-no-bundles", {"resources": []}, "resources.bundles", ["[]", "non-empty list"]),
    (
        "resources-bundle-negative",
        {"resources": [{"CPU": 1}, {"GPU": -1}]},
        "resources.bundles[1].GPU",
        ["-1", "number >= 0"],
    ),
    ("resources-bundle-zero", {"resources": [{"CPU": 0}]}, "resources.bundles[0]", ["no resources at all"]),
    ("resources-bundle-not-dict", {"resources": [{"CPU": 1}, 2]}, "resources.bundles[1]", ["non-empty object"]),
    # --- checkpoint and failure
    ("ckpt-keep-0", {"checkpoint": {"num_to_keep": 0}}, "checkpoint.num_to_keep", ["= 0", "integer >= 1", "null"]),
    ("ckpt-order", {"checkpoint": {"score_order": "ascending"}}, "checkpoint.score_order", ["'ascending'", "'min'"]),
    ("ckpt-freq-neg", {"checkpoint": {"frequency": -1}}, "checkpoint.frequency", ["-1", "integer >= 0", "0 turns"]),
    ("ckpt-at-end-str", {"checkpoint": {"at_end": "yes"}}, "checkpoint.at_end", ["'yes'", "true or false"]),
    ("ckpt-score-attr-empty", {"checkpoint": {"score_attribute": ""}}, "checkpoint.score_attribute", ["metric name"]),
    ("failure-max-neg2", {"failure": {"max_failures": -2}}, "failure.max_failures", ["-2", "integer >= -1", "-1 re"]),
    ("failure-max-str", {"failure": {"max_failures": "3"}}, "failure.max_failures", ["'3'", "integer >= -1"]),
    ("failure-fail-fast-str", {"failure": {"fail_fast": "no"}}, "failure.fail_fast", ["'no'", "true or false"]),
    # --- metric and mode
    ("mode-maximize", {"mode": "maximize"}, "mode", ["'maximize'", "'min' or 'max'", '"max" to maximize']),
    ("mode-upper", {"mode": "MAX"}, "mode", ["'MAX'", "'min' or 'max'"]),
    ("metric-spaces", {"metric": "val loss"}, "metric", ["'val loss'", "not a metric name", "e.g."]),
    ("metric-leading-digit", {"metric": "1loss"}, "metric", ["'1loss'", "not a metric name"]),
    # --- storage
    ("storage-relative", {"storage_path": "experiments/x"}, "storage_path", ["'experiments/x'", "relative", "s3://"]),
    ("storage-ftp", {"storage_path": "ftp://host/x"}, "storage_path", ["'ftp://host/x'", "unsupported scheme 'ftp'"]),
    ("storage-s3-no-bucket", {"storage_path": "s3://"}, "storage_path", ["'s3://'", "no bucket", "s3://bucket/"]),
    ("storage-s3-bad-bucket", {"storage_path": "s3://Bad_Bucket/x"}, "storage_path", ["'Bad_Bucket'", "S3 bucket"]),
    ("storage-s3-dotdot", {"storage_path": "s3://bucket/../x"}, "storage_path", ["'s3://bucket/../x'", "'..'"]),
    ("storage-s3-short-bucket", {"storage_path": "s3://b/../x"}, "storage_path", ["'b'", "not a valid S3 bucket"]),
    ("storage-s3-space", {"storage_path": "s3://bucket/my exps"}, "storage_path", ["spaces", "plain key prefix"]),
    ("storage-file-relative", {"storage_path": "file://relative"}, "storage_path", ["absolute path", "file:///"]),
    # --- experiment names
    ("name-dotdot-slash", {"name": "../x"}, "name", ["'../x'", "not a safe experiment name", "no slashes"]),
    ("name-slash", {"name": "a/b"}, "name", ["'a/b'", "not a safe experiment name"]),
    ("name-too-long", {"name": "x" * 201}, "name", ["'xxxx", "1-200"]),
    ("name-space", {"name": "my exp"}, "name", ["'my exp'", "spaces"]),
    ("name-leading-dot", {"name": ".hidden"}, "name", ["'.hidden'", "starting with a letter or digit"]),
    ("name-leading-hyphen", {"name": "-x"}, "name", ["'-x'", "not a safe"]),
    ("name-inner-dotdot", {"name": "a..b"}, "name", ["'a..b'", "'..'"]),
    ("name-newline", {"name": "exp\n"}, "name", ["not a safe experiment name"]),
    ("name-unicode", {"name": "exp-é"}, "name", ["not a safe experiment name"]),
]


def test_malformed_table_is_large_and_unique():
    ids = [case[0] for case in MALFORMED]
    assert len(ids) >= 40
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("patch", "path", "words"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_spec_is_rejected_with_field_value_and_fix(patch, path, words):
    err = rejected(make(patch))
    assert err.errors, "a SpecError must list its problems"
    for line in err.errors:
        # Every problem reads "<field> = <value>: <problem>; <fix>".
        assert " = " in line and ": " in line and "; " in line, line
        assert line in str(err)
    fields_named = [line for line in err.errors if path in line.split(" = ", 1)[0]]
    assert fields_named, f"no problem names {path!r}: {err.errors}"
    assert any(all(w in line for w in words) for line in fields_named), (words, fields_named)


def test_not_a_mapping():
    for data in ([1, 2], "spec", None, 3):
        err = rejected(data)
        assert "must be a JSON object" in str(err)


def test_from_json_invalid_json():
    with pytest.raises(SpecError, match="not valid JSON.*check quotes and commas"):
        ExperimentSpec.from_json('{"trainable": "a:b",}')
    with pytest.raises(SpecError, match="not valid JSON"):
        ExperimentSpec.from_json("")
    with pytest.raises(SpecError, match="must be a JSON object"):
        ExperimentSpec.from_json("[1, 2]")
    with pytest.raises(SpecError, match="not JSON text"):
        ExperimentSpec.from_json(None)  # type: ignore[arg-type]
    with pytest.raises(SpecError) as info:
        ExperimentSpec.from_json(json.dumps(make({"mode": "best"})))
    assert "'best'" in str(info.value)


def test_every_problem_is_reported_at_once():
    data = make(
        {
            "trainable": DELETE,
            "mode": "maximize",
            "num_samples": 0,
            "param_space": {"lr": {"uniform": [1, 0]}, "bs": {"choice": []}},
            "scheduler": {"name": "asha", "args": {"metric": "acc"}},
            "resources": {"cpu": -1},
            "colour": "red",
        }
    )
    err = rejected(data)
    heads = [line.split(" = ", 1)[0] for line in err.errors]
    for expected in (
        "trainable",
        "mode",
        "num_samples",
        "param_space.lr",
        "param_space.bs",
        "scheduler.args.metric",
        "resources.cpu",
        "colour",
    ):
        assert expected in heads, (expected, err.errors)
    assert f"({len(err.errors)} problems)" in str(err)
    assert isinstance(err, ValueError)


def test_one_problem_is_singular():
    err = rejected(make({"mode": "best"}))
    assert str(err).startswith("invalid experiment spec (1 problem):")


def test_spec_error_pickles():
    err = rejected(make({"mode": "best", "num_samples": 0}))
    again = pickle.loads(pickle.dumps(err))
    assert again.errors == err.errors
    assert str(again) == str(err)


def test_long_values_are_shortened_in_messages():
    err = rejected(make({"name": "x" * 500}))
    (line,) = err.errors
    assert "..." in line and len(line) < 300


def test_unshowable_value_does_not_crash():
    err = rejected(make({"trainable_kwargs": {(1, 2): "tuple key"}}))
    assert any(line.startswith("trainable_kwargs") for line in err.errors)


# --- valid specs ---------------------------------------------------------------------------------------------------
VALID_NODES: list[Any] = [
    {"uniform": [0, 1]},
    {"uniform": [-1.5, 2.5]},
    {"uniform": {"lower": 0, "upper": 1}},
    {"uniform": {"upper": 1, "lower": 0}},
    {"qrandn": {"mean": 100, "sd": 20, "q": 0.5}},
    {"randn": {"sd": 5}},
    {"qlograndint": {"base": 2, "q": 2, "upper": 1024, "lower": 1}},
    {"quniform": [0, 1, 0.1]},
    {"loguniform": [1e-4, 1e-1]},
    {"loguniform": [1e-4, 1e-1, 2]},
    {"qloguniform": [1e-4, 1e-1, 1e-5]},
    {"qloguniform": [1e-4, 1e-1, 1e-5, 10]},
    {"randn": []},
    {"randn": [0]},
    {"randn": [0, 1]},
    {"qrandn": [0, 1, 0.1]},
    {"randint": [0, 10]},
    {"randint": [-5, 5]},
    {"qrandint": [0, 10]},
    {"qrandint": [0, 10, 2]},
    {"lograndint": [1, 100]},
    {"lograndint": [1, 100, 2]},
    {"qlograndint": [1, 100, 1]},
    {"qlograndint": [1, 100, 1, 10]},
    {"choice": [2, 4, 8]},
    {"choice": ["adam", "sgd", None, [1, 2], {"a": 1}]},
    {"choice": [1]},
    {"grid_search": [16, 32]},
    {"grid_search": ["a"]},
    {"sample_from": "my_pkg.space:sample_bs"},
    {"sample_from": "pkg.mod:Sampler.draw"},
    {"const": {"choice": [1]}},
    {"const": {"uniform": "not a primitive here"}},
    {"const": 5},
    5,
    0.5,
    "relu",
    None,
    True,
    [1, 2, 3],
    ["a", {"b": 1}],
    [{"uniform": [0, 1]}, 3],
    {"layers": {"randint": [1, 4]}, "act": "relu", "dropout": {"uniform": [0, 0.5]}},
    {"a": {"b": {"c": {"choice": [1, 2]}}}},
    {},
]


def test_valid_nodes_cover_every_primitive():
    named = {primitive_of(node) for node in VALID_NODES} - {None}
    assert named == set(PRIMITIVES)


@pytest.mark.parametrize("node", VALID_NODES, ids=[json.dumps(n)[:40] for n in VALID_NODES])
def test_valid_search_space_node(node):
    spec = ExperimentSpec.from_dict(make({"param_space": {"x": node}}))
    assert spec.param_space == {"x": node}


def test_parameters_named_like_primitives_at_the_root():
    """The root of param_space maps parameter names; "choice" or "sample" there are plain parameter names."""
    spec = ExperimentSpec.from_dict(make({"param_space": {"sample": 3}}))
    assert spec.param_space == {"sample": 3}
    spec = ExperimentSpec.from_dict(make({"param_space": {"choice": [1, 2]}}))
    assert spec.param_space == {"choice": [1, 2]}


def test_minimal_spec_defaults():
    spec = ExperimentSpec.from_dict(make({"param_space": DELETE}))
    assert spec.param_space == {}
    assert spec.num_samples == 1
    assert spec.scheduler == SchedulerSpec()
    assert spec.search == SearchSpec()
    assert spec.resources is None
    assert spec.checkpoint == CheckpointSpec()
    assert spec.failure == FailureSpec()
    assert spec.errored_trials == "resume"
    assert spec.best_scope == "last"


def test_spec_is_frozen():
    spec = ExperimentSpec.from_dict(make())
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_by_name(name):
    args: dict[str, Any] = {}
    if name == "pbt":
        args = {"hyperparam_mutations": {"lr": {"loguniform": [1e-4, 1e-1]}, "bs": [16, 32]}}
    if name == "pb2":
        args = {"hyperparam_bounds": {"lr": [1e-4, 1e-1]}}
    spec = ExperimentSpec.from_dict(make({"scheduler": {"name": name, "args": args}}))
    assert spec.scheduler.name == name
    assert spec.scheduler.factory is None


def test_scheduler_as_plain_string_and_alias():
    spec = ExperimentSpec.from_dict(make({"scheduler": "asha"}))
    assert spec.scheduler == SchedulerSpec(name="asha")
    spec = ExperimentSpec.from_dict(make({"scheduler": "ASHA"}))
    assert spec.scheduler.name == "ASHA"
    ExperimentSpec.from_dict(make({"scheduler": "async_hyperband"}))
    ExperimentSpec.from_dict(make({"scheduler": {"name": "median", "args": {"grace_period": 5}}}))
    spec = ExperimentSpec.from_dict(
        make({"scheduler": {"name": "asha", "args": {"grace_period": 1, "max_t": 100, "reduction_factor": 3}}})
    )
    assert spec.scheduler.args["max_t"] == 100


def test_scheduler_and_searcher_as_import_path():
    spec = ExperimentSpec.from_dict(make({"scheduler": "pkg.mod:make", "search": "pkg.search:make_searcher"}))
    assert spec.scheduler == SchedulerSpec(name=None, factory="pkg.mod:make")
    assert spec.search == SearchSpec(name=None, factory="pkg.search:make_searcher")
    spec = ExperimentSpec.from_dict(make({"scheduler": {"factory": "pkg.mod:make", "args": {"anything": 1}}}))
    assert spec.scheduler.args == {"anything": 1}


@pytest.mark.parametrize("name", sorted(SEARCHERS))
def test_every_searcher_by_name(name):
    # BayesOpt takes uniform ranges only (see spec/compatibility.py).
    uniform = {"param_space": {"lr": {"uniform": [1e-4, 1e-1]}}} if name == "bayesopt" else {}
    spec = ExperimentSpec.from_dict(make({"search": {"name": name, "max_concurrent": 2}, **uniform}))
    assert spec.search.name == name
    assert spec.search.max_concurrent == 2


def test_grid_search_with_random_or_grid_searcher():
    data = make({"param_space": {"bs": {"grid_search": [16, 32]}}})
    for name in ("random", "grid"):
        ExperimentSpec.from_dict({**data, "search": name})


def test_optuna_with_choice():
    ExperimentSpec.from_dict(make({"search": "optuna", "points_to_evaluate": [{"lr": 0.01, "depth": 4}]}))


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"cpu": 1, "gpu": 0}, ResourcesSpec(per_trial={"cpu": 1, "gpu": 0})),
        ({"cpu": 0.5, "accel": 1}, ResourcesSpec(per_trial={"cpu": 0.5, "accel": 1})),
        ({"cpu": 2, "strategy": "PACK"}, ResourcesSpec(per_trial={"cpu": 2}, strategy="PACK")),
        ({"per_trial": {"cpu": 1}}, ResourcesSpec(per_trial={"cpu": 1})),
        ([{"CPU": 1}, {"CPU": 1, "GPU": 0}], ResourcesSpec(bundles=[{"CPU": 1}, {"CPU": 1, "GPU": 0}])),
        (
            {"bundles": [{"CPU": 1}], "strategy": "STRICT_SPREAD"},
            ResourcesSpec(bundles=[{"CPU": 1}], strategy="STRICT_SPREAD"),
        ),
        (None, None),
    ],
)
def test_resources_forms(resources, expected):
    assert ExperimentSpec.from_dict(make({"resources": resources})).resources == expected


FULL: dict[str, Any] = make(
    {
        "param_space": {
            "lr": {"loguniform": [1e-4, 1e-1]},
            "bs": {"grid_search": [16, 32]},
            "model": {"layers": {"randint": [1, 4]}, "act": "relu", "sizes": [64, 32]},
            "opt": {"const": {"choice": [1]}},
        },
        "trainable_kwargs": {"data": "s3://my-bucket/data.csv", "epochs": 3},
        "num_samples": 4,
        "max_concurrent_trials": 2,
        "reuse_actors": True,
        "time_budget_s": 3600,
        "stop": {"training_iteration": 10, "loss": 0.01},
        "scheduler": {"name": "asha", "args": {"grace_period": 1, "max_t": 10}},
        "search": {"name": "random", "max_concurrent": 2},
        "points_to_evaluate": [{"lr": 0.01, "bs": 16}],
        "resources": [{"CPU": 1}, {"CPU": 1}],
        "checkpoint": {"num_to_keep": 2, "score_attribute": "loss", "score_order": "min", "frequency": 0},
        "failure": {"max_failures": -1, "fail_fast": False, "tolerate_errored_trials": False},
        "errored_trials": "restart",
        "best_scope": "last-5-avg",
        "progress_interval_s": 5,
        "version": 1,
    }
)


@pytest.mark.parametrize(
    "data",
    [
        make(),
        FULL,
        make({"scheduler": "pkg.mod:make", "search": "pkg.mod:searcher", "resources": {"cpu": 1}}),
        make({"storage_path": "/shared/experiments"}),
        make({"storage_path": "file:///tmp/exps"}),
        make({"storage_path": "gs://bucket/exps"}),
    ],
    ids=["minimal", "full", "factories", "abs-path", "file-uri", "gs"],
)
def test_round_trip(data):
    spec = ExperimentSpec.from_dict(data)
    assert ExperimentSpec.from_dict(spec.to_dict()) == spec
    assert ExperimentSpec.from_json(spec.to_json()) == spec
    assert json.loads(spec.to_json()) == spec.to_dict()
    assert ExperimentSpec.from_json(spec.to_json(indent=2, sort_keys=False)) == spec


def test_full_spec_parts():
    spec = ExperimentSpec.from_dict(FULL)
    assert spec.scheduler == SchedulerSpec(name="asha", args={"grace_period": 1, "max_t": 10})
    assert spec.search == SearchSpec(name="random", max_concurrent=2)
    assert spec.resources == ResourcesSpec(bundles=[{"CPU": 1}, {"CPU": 1}])
    assert spec.checkpoint.num_to_keep == 2
    assert spec.failure.max_failures == -1
    assert spec.to_dict()["param_space"] == FULL["param_space"]


def test_fingerprint_tracks_the_question_not_the_policies():
    a = ExperimentSpec.from_dict(make())
    # Policies, budgets and warm-start points may change between tries of one experiment.
    for same in (
        {"failure": {"max_failures": 3}},
        {"checkpoint": {"num_to_keep": 1}},
        {"time_budget_s": 60},
        {"max_concurrent_trials": 1},
        {"progress_interval_s": 2},
        {"resources": {"cpu": 2}},
        {"points_to_evaluate": [{"lr": 0.01}]},
    ):
        assert ExperimentSpec.from_dict(make(same)).fingerprint() == a.fingerprint(), same
    for other in (
        {"param_space": {"lr": {"uniform": [0, 1]}}},
        {"trainable": "other.mod:fn"},
        {"num_samples": 9},
        {"metric": "acc"},
        {"mode": "max"},
        {"stop": {"training_iteration": 3}},
        {"scheduler": "asha"},
        {"search": "hyperopt"},
        {"trainable_kwargs": {"a": 1}},
    ):
        assert ExperimentSpec.from_dict(make(other)).fingerprint() != a.fingerprint(), other
    b = ExperimentSpec.from_dict(make({"num_samples": 9, "param_space": {"lr": {"uniform": [0, 1]}}}))
    differences = identity_differences(a.to_dict(), b.to_dict())
    assert [d.split(":")[0] for d in differences] == ["param_space.lr", "param_space.depth", "num_samples"]
    assert differences[0].endswith('-> {"uniform": [0, 1]}') and differences[1].endswith("-> '<unset>'")


@pytest.mark.parametrize(
    ("storage", "experiment_uri"),
    [
        ("s3://my-bucket/experiments", "s3://my-bucket/experiments/exp-1"),
        ("s3://my-bucket/experiments/", "s3://my-bucket/experiments/exp-1"),
        ("s3://my-bucket", "s3://my-bucket/exp-1"),
        ("/shared/exps", "/shared/exps/exp-1"),
        ("file:///tmp/exps/", "file:///tmp/exps/exp-1"),
    ],
)
def test_experiment_and_manifest_uris(storage, experiment_uri):
    spec = ExperimentSpec.from_dict(make({"storage_path": storage}))
    assert spec.experiment_uri == experiment_uri
    assert manifest_uri(spec.experiment_uri, "result.json") == f"{experiment_uri}/{MANIFEST_DIR}/result.json"
    assert MANIFEST_DIR == ".airflow_tune"


def test_join_uri():
    assert join_uri("s3://b/p/", "/x/", "y") == "s3://b/p/x/y"
    assert join_uri("s3://b") == "s3://b"
    assert join_uri("/a", "b/c") == "/a/b/c"


# --- experiment names ----------------------------------------------------------------------------------------------
RUN_IDS = [
    "manual__2026-12-02T10:49:18.123456+00:00",
    "scheduled__2026-12-02T00:00:00+00:00",
    "asset_triggered__2026-12-02T10:49:18.123456+00:00",
    "dataset_triggered__2026-12-02T10:49:18+00:00",
    "backfill__2026-12-02T00:00:00+00:00",
    "api__2026-12-02T10:49:18.123456+00:00",
    "my custom run / with ../ and spaces",
]
TRICKY = [
    "",
    ".",
    "..",
    "../..",
    "/",
    "a/b",
    "a:b",
    "a+b",
    "_private",
    "__",
    "=x",
    "-x-",
    ".hidden",
    "x..y",
    "x.-.y",
    "ünïcødé",
    "日本語",
    "emoji🙂task",
    "tab\tnew\nline",
    "group.task",
    "a" * 300,
    "a." * 150,
    "%2e%2e",
    "CON",
]


def _name_is_valid(name: str) -> None:
    assert len(name) <= 200, name
    ExperimentSpec.from_dict(make({"name": name}))


@pytest.mark.parametrize("run_id", RUN_IDS)
def test_experiment_name_for_airflow_run_ids(run_id):
    name = experiment_name_for("retrain_model", "tune", run_id)
    _name_is_valid(name)
    assert name == experiment_name_for("retrain_model", "tune", run_id)
    assert name.startswith("retrain_model__tune__")
    assert name != experiment_name_for("retrain_model", "tune", run_id + "x")


def test_experiment_name_for_is_always_valid():
    for dag_id in TRICKY + ["dag"]:
        for task_id in TRICKY + ["task"]:
            for run_id in [*TRICKY[:6], *RUN_IDS[:2], "r" * 400]:
                for map_index in (-1, 0, 7, 10**40):
                    _name_is_valid(experiment_name_for(dag_id, task_id, run_id, map_index))


def test_experiment_name_for_is_readable():
    name = experiment_name_for("retrain_model", "tune_xgb", "manual__2026-12-02T10:49:18.123456+00:00", 3)
    assert name.startswith("retrain_model__tune_xgb__3__manual__2026-12-02T10-49-18")
    assert "group.task" in experiment_name_for("d", "group.task", "r")


def test_experiment_name_for_keeps_identities_apart():
    run = "manual__2026-12-02T10:49:18.123456+00:00"
    names = {
        experiment_name_for("dag", "task", run),
        experiment_name_for("dag", "task", run, 0),
        experiment_name_for("dag", "task", run, 1),
        experiment_name_for("dag", "task", run + "1"),
        experiment_name_for("a:b", "task", run),
        experiment_name_for("a+b", "task", run),
        experiment_name_for("dag", "t/x", run),
        experiment_name_for("dag", "t x", run),
        experiment_name_for("dag", "task", "scheduled__2026-12-02T10:49:18.123456+00:00"),
        # the same characters split differently between the ids
        experiment_name_for("dag__task", "x", run),
        experiment_name_for("dag", "task__x", run),
        # long ids that share their truncated prefix
        experiment_name_for("d" * 100 + "1", "task", run),
        experiment_name_for("d" * 100 + "2", "task", run),
    }
    assert len(names) == 13
    assert experiment_name_for("dag", "task", run, -1) == experiment_name_for("dag", "task", run)


# --- imports -------------------------------------------------------------------------------------------------------
def test_spec_imports_neither_airflow_nor_ray():
    code = (
        "import sys, airflow_tune.common.spec\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'ray', 'boto3', 'botocore'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_changed_digest_says_what_it_stands_for():
    """Two hashes alone do not say what changed: the trainable's digest (its code or its with_parameters data) and
    the path of other code shipped by value say it; an import path that changed is shown as it is."""
    a = make({"trainable": "airflow_tune_shipped:trainable", "stop": [{"factory": "airflow_tune_shipped:stop_1a"}]})
    b = make({"trainable": "airflow_tune_shipped:trainable", "stop": [{"factory": "airflow_tune_shipped:stop_2b"}]})
    a["trainable_digest"], b["trainable_digest"] = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    differences = identity_differences(a, b)
    assert differences[0].startswith("trainable_digest: ") and "tune.with_parameters" in differences[0]
    assert differences[1].startswith("stop[0].factory: ") and "shipped by value changed" in differences[1]
    plain = identity_differences(make({"trainable": "a.mod:fn"}), make({"trainable": "b.mod:fn"}))
    assert plain == ["trainable: 'a.mod:fn' -> 'b.mod:fn'"]
