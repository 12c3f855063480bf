"""Resources and searcher arguments are data with Ray's own rules (issue 19, items 6 and 8).

- Resources: Ray's internal names (``node:__internal_head__``, a placement group's ``bundle`` / ``*_group_*``) and
  amounts Ray refuses or rounds (below 0.0001, not a multiple of it, a GPU fraction above 1) are refused, naming the
  field, the value and the fix; node pins (``node:<ip>``) are listed by ``node_pins`` for the Airflow side.
- Searcher and scheduler ``args`` are checked against tables read from Ray 2.60's signatures (a test below compares
  them with Ray's source, so a new argument in a later Ray fails here); arguments that are objects, callables or
  storage are code and refused with a factory as the fix; values are plain JSON.
- The trigger form's schema refuses a parameter name with a trailing newline.

Every refusal test here passes a spec that the code before this change accepted (it refused only negative, non-number
and all-zero amounts, and of a searcher's args only metric/mode/space/points_to_evaluate), so each fails there with
"DID NOT RAISE"; the schema's old ``$`` let "lr\\n" through.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from airflow_tune.common.spec import ExperimentSpec, SpecError

BASE: dict[str, Any] = {
    "trainable": "my_pkg.train:train_fn",
    "name": "exp-1",
    "storage_path": "s3://my-bucket/experiments",
    "metric": "loss",
    "mode": "min",
    "param_space": {"lr": {"loguniform": [1e-4, 1e-1]}, "depth": {"choice": [2, 4, 8]}},
}
PG_ID = "8d0e5f5a6d7c4c1f9a1b2c3d4e5f60718293"  # a placement group id: 18 bytes in hex


def spec(patch: dict[str, Any]) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**copy.deepcopy(BASE), **patch})


def assert_refused(patch: dict[str, Any], field: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        spec(patch)
    errors = info.value.errors
    for line in errors:
        # Every problem reads "<field> = <value>: <problem>; <fix>".
        assert " = " in line and ": " in line and "; " in line, line
    named = [line for line in errors if line.split(" = ", 1)[0] == field]
    assert named, f"no problem names {field!r}: {errors}"
    assert any(all(w in line for w in words) for line in named), (words, named)


# -- resources ------------------------------------------------------------------------------------------------------
RESOURCE_REFUSALS = [
    (
        "head-node-sliver",
        {"cpu": 0, "node:__internal_head__": 0.001},
        "resources.node:__internal_head__",
        ["= 0.001", "Ray keeps for itself", "runs on the head", "drop it"],
    ),
    (
        "head-node-with-cpu",
        {"cpu": 1, "node:__internal_head__": 0.001},
        "resources.node:__internal_head__",
        ["Ray keeps for itself"],
    ),
    ("other-internal", {"cpu": 1, "node:__internal_x": 1}, "resources.node:__internal_x", ["Ray keeps for itself"]),
    (
        "head-in-a-bundle",
        [{"CPU": 1}, {"CPU": 0, "node:__internal_head__": 0.001}],
        "resources.bundles[1].node:__internal_head__",
        ["Ray keeps for itself"],
    ),
    (
        "below-granularity",
        {"cpu": 1e-9},
        "resources.cpu",
        ["= 1e-09", "smallest amount 0.0001", "give 0, or at least 0.0001"],
    ),
    (
        "not-a-multiple",
        {"cpu": 0.00015},
        "resources.cpu",
        ["= 0.00015", "round this down to 0.0001", "multiple of 0.0001"],
    ),
    (
        "custom-below-granularity",
        [{"CPU": 1, "accel": 0.00001}],
        "resources.bundles[0].accel",
        ["smallest amount 0.0001"],
    ),
    (
        "pin-only",
        {"cpu": 0, "node:10.0.0.5": 0.001},
        "resources",
        ['"node:10.0.0.5": 0.001', "only for a node pin", 'e.g. {"cpu": 1}'],
    ),
    ("gpu-fraction-above-1", {"cpu": 1, "gpu": 1.5}, "resources.gpu", ["= 1.5", "GPU above 1", "1 or 2"]),
    ("bundle-gpu-fraction", [{"CPU": 1, "GPU": 2.5}], "resources.bundles[0].GPU", ["GPU above 1", "2 or 3"]),
    (
        "node-name-not-an-address",
        {"cpu": 1, "node:worker-1": 0.01},
        "resources.node:worker-1",
        ["names no node", "node:<ip-address>", '"node:10.0.0.5": 0.01'],
    ),
    ("pin-above-1", {"cpu": 1, "node:10.0.0.5": 2}, "resources.node:10.0.0.5", ["exactly 1", "0.001"]),
    (
        "accelerator-type-above-1",
        {"cpu": 1, "accelerator_type:A100": 1.5},
        "resources.accelerator_type:A100",
        ["exactly 1"],
    ),
    ("accelerator-type-only", {"cpu": 0, "accelerator_type:A100": 0.001}, "resources", ["accelerator type"]),
    ("bundle-resource", [{"CPU": 1, "bundle": 1}], "resources.bundles[0].bundle", ["placement group", "drop it"]),
    (
        "indexed-group-resource",
        {"cpu": 1, f"CPU_group_0_{PG_ID}": 1},
        f"resources.CPU_group_0_{PG_ID}",
        ["placement group's own resource"],
    ),
    (
        "wildcard-group-resource",
        {"cpu": 1, f"bundle_group_{PG_ID}": 0.001},
        f"resources.bundle_group_{PG_ID}",
        ["placement group's own resource", "_group_"],
    ),
    ("cpu-twice", {"cpu": 1, "CPU": 2}, "resources.CPU", ["= 2", "names CPU again", "once"]),
    ("memory-not-bytes", {"cpu": 1, "memory": 0.5}, "resources.memory", ["= 0.5", "in bytes", "2147483648"]),
    ("tpu-chip-count", {"cpu": 1, "TPU": 3}, "resources.TPU", ["= 3", "1, 2, 4 or 8"]),
    ("neuron-fraction", {"cpu": 1, "neuron_cores": 0.5}, "resources.neuron_cores", ["whole numbers only"]),
    ("too-large", {"cpu": 1e15}, "resources.cpu", ["largest amount"]),
    ("empty-name", {"cpu": 1, "": 1}, "resources", ["not a resource name"]),
]


@pytest.mark.parametrize(
    ("resources", "field", "words"), [c[1:] for c in RESOURCE_REFUSALS], ids=[c[0] for c in RESOURCE_REFUSALS]
)
def test_resources_ray_reserves_or_would_round_are_refused(resources, field, words):
    assert_refused({"resources": resources}, field, words)


@pytest.mark.parametrize(
    "resources",
    [
        {"cpu": 1, "gpu": 0.5},
        {"cpu": 0.5},
        {"accel": 1},
        {"cpu": 0, "accel": 1},
        {"cpu": 0.5, "accel": 2},
        {"cpu": 1.5},  # Ray takes CPU fractions above 1 (only unit-instance resources such as GPU do not)
        {"cpu": 0.0001, "gpu": 0.25},
        {"cpu": 2, "gpu": 2, "memory": 2 * 1024**3},
        {"cpu": 2, "gpu": 0.5, "memory": 1e9},
        {"cpu": 1, "node:10.0.0.5": 0.01},
        {"cpu": 1, "node:fe80::1": 0.01},
        {"cpu": 1, "accelerator_type:A100": 0.001},
        {"cpu": 1, "TPU": 4},
        {"cpu": 1, "gpu": 0},
        [{"CPU": 1}, {"CPU": 1, "accel": 1}],
        [{"CPU": 1}, {"accel": 1}],
        {"bundles": [{"cpu": 1}, {"CPU": 1, "gpu": 0}], "strategy": "SPREAD"},
    ],
    ids=str,
)
def test_legitimate_resources_keep_passing(resources):
    assert spec({"resources": resources}).resources is not None


def test_node_pins_lists_every_node_key_with_its_field():
    from airflow_tune.common.spec import node_pins

    assert node_pins(None) == []
    assert node_pins(spec({"resources": {"cpu": 1, "accel": 1}}).resources) == []
    assert node_pins(spec({"resources": {"cpu": 1, "node:10.0.0.5": 0.01}}).resources) == [
        ("resources.node:10.0.0.5", "node:10.0.0.5")
    ]
    pinned = spec({"resources": [{"CPU": 1, "node:10.0.0.5": 0.01}, {"CPU": 1}, {"CPU": 1, "node:10.0.0.6": 0.01}]})
    assert node_pins(pinned.resources) == [
        ("resources.bundles[0].node:10.0.0.5", "node:10.0.0.5"),
        ("resources.bundles[2].node:10.0.0.6", "node:10.0.0.6"),
    ]


# -- searcher and scheduler arguments -------------------------------------------------------------------------------
CODE_FIX = '"factory": "pkg.mod:make"'
ARG_REFUSALS = [
    (
        "optuna-storage-url",
        {"search": {"name": "optuna", "args": {"storage": "postgresql://u:p@db.example/optuna"}}},
        "search.args.storage",
        ["'postgresql://u:p@db.example/optuna'", "code, not data", "python -O", CODE_FIX, "allow-list"],
    ),
    (
        "optuna-sampler",
        {"search": {"name": "optuna", "args": {"sampler": "optuna.samplers:TPESampler"}}},
        "search.args.sampler",
        ["sampler object", "code, not data", CODE_FIX],
    ),
    (
        "bayesopt-analysis",
        {"search": {"name": "bayesopt", "args": {"analysis": "s3://other-bucket/exp"}}},
        "search.args.analysis",
        ["ExperimentAnalysis", "code, not data", CODE_FIX],
    ),
    (
        "optuna-typo",
        {"search": {"name": "optuna", "args": {"seeed": 1}}},
        "search.args.seeed",
        ["= 1", "not an argument of optuna", "did you mean 'seed'?", "study_name"],
    ),
    (
        "hyperopt-typo",
        {"search": {"name": "hyperopt", "args": {"n_initial_point": 5}}},
        "search.args.n_initial_point",
        ["did you mean 'n_initial_points'?"],
    ),
    (
        "random-unknown",
        {"search": {"name": "random", "args": {"pruner": "median"}}},
        "search.args.pruner",
        ["not an argument of random", "constant_grid_search, random_state"],
    ),
    (
        "random-max-concurrent",
        {"search": {"name": "random", "args": {"max_concurrent": 100}}},
        "search.args.max_concurrent",
        ["= 100", "set by the spec", "search.max_concurrent"],
    ),
    (
        "optuna-seed-string",
        {"search": {"name": "optuna", "args": {"seed": "1"}}},
        "search.args.seed",
        ["'1'", "integer seed"],
    ),
    (
        "grid-flag-string",
        {"search": {"name": "grid", "args": {"constant_grid_search": "yes"}}},
        "search.args.constant_grid_search",
        ["'yes'", "true or false"],
    ),
    (
        "hyperopt-gamma",
        {"search": {"name": "hyperopt", "args": {"gamma": 2}}},
        "search.args.gamma",
        ["= 2", "between 0 and 1"],
    ),
    (
        "optuna-rewards",
        {"search": {"name": "optuna", "args": {"evaluated_rewards": "0.9"}}},
        "search.args.evaluated_rewards",
        ["list of numbers"],
    ),
    (
        "bayesopt-utility-kind",
        {"search": {"name": "bayesopt", "args": {"utility_kwargs": {"kind": "ucbb"}}}},
        "search.args.utility_kwargs.kind",
        ["'ucbb'", '"ucb", "ei" or "poi"'],
    ),
    (
        "bayesopt-utility-typo",
        {"search": {"name": "bayesopt", "args": {"utility_kwargs": {"kapa": 2.0}}}},
        "search.args.utility_kwargs.kapa",
        ["not an argument of UtilityFunction", "did you mean 'kappa'?"],
    ),
    (
        "python-object-in-args",
        {"search": {"name": "random", "args": {"random_state": object()}}},
        "search.args.random_state",
        ["not JSON data", CODE_FIX],
    ),
    (
        "python-object-in-factory-args",
        {"search": {"factory": "pkg.search:make", "args": {"opts": {"fn": print}}}},
        "search.args.opts.fn",
        ["not JSON data"],
    ),
    (
        "pbt-custom-explore-fn",
        {
            "scheduler": {
                "name": "pbt",
                "args": {"hyperparam_mutations": {"lr": [0.1, 0.01]}, "custom_explore_fn": "os:system"},
            }
        },
        "scheduler.args.custom_explore_fn",
        ["'os:system'", "Callable", "code, not data", 'scheduler={"factory": "pkg.mod:make"}'],
    ),
    (
        "scheduler-typo",
        {"scheduler": {"name": "asha", "args": {"max_tt": 10}}},
        "scheduler.args.max_tt",
        ["not an argument of asha", "did you mean 'max_t'?"],
    ),
    (
        "scheduler-python-object",
        {"scheduler": {"name": "asha", "args": {"time_attr": object()}}},
        "scheduler.args.time_attr",
        ["not JSON data"],
    ),
]


@pytest.mark.parametrize(("patch", "field", "words"), [c[1:] for c in ARG_REFUSALS], ids=[c[0] for c in ARG_REFUSALS])
def test_searcher_and_scheduler_args_are_checked_and_code_is_refused(patch, field, words):
    assert_refused(patch, field, words)


@pytest.mark.parametrize(
    "patch",
    [
        # The forms of the README, the example DAGs and the other tests.
        {"search": {"name": "optuna", "args": {"seed": 1}, "max_concurrent": 2}},
        {"search": {"name": "optuna", "max_concurrent": 4}},
        {"search": {"name": "optuna", "args": {"study_name": "digits", "seed": 0}}},
        {
            "search": {"name": "optuna", "args": {"evaluated_rewards": [0.5, 0.25]}},
            "points_to_evaluate": [{"lr": 0.01, "depth": 4}, {"lr": 0.001, "depth": 2}],
        },
        {"search": {"name": "hyperopt", "args": {"n_initial_points": 5, "random_state_seed": 3, "gamma": 0.25}}},
        {
            "search": {
                "name": "bayesopt",
                "args": {
                    "utility_kwargs": {"kind": "ei", "kappa": 2.5, "xi": 0.01},
                    "random_state": 1,
                    "random_search_steps": 4,
                    "verbose": 0,
                    "patience": 5,
                    "skip_duplicate": True,
                    "repeat_float_precision": 5,
                },
            },
            "param_space": {"lr": {"uniform": [0, 1]}},
        },
        {"search": {"name": "random", "args": {"random_state": 7, "constant_grid_search": True}}},
        {"search": {"name": "grid", "args": {"random_state": None}}},
        {"search": {"factory": "pkg.search:make", "args": {"anything": [1, {"nested": "json"}]}}},
        {"scheduler": {"name": "asha", "args": {"max_t": 8, "grace_period": 2, "reduction_factor": 2}}},
        {
            "scheduler": {
                "name": "pbt",
                "args": {
                    "time_attr": "training_iteration",
                    "perturbation_interval": 2,
                    "hyperparam_mutations": {"lr": [0.5, 1, 2, 4]},
                    "quantile_fraction": 0.25,
                    "synch": True,
                },
            }
        },
        {"scheduler": {"factory": "pkg.mod:make", "args": {"anything": 1}}},
    ],
    ids=lambda p: str(p)[:60],
)
def test_legitimate_searcher_and_scheduler_args_keep_passing(patch):
    spec(patch)


def _ray_init_params(relative: str, cls: str) -> dict[str, str]:
    """The keyword arguments of ``cls.__init__`` in Ray's source, with their annotations (read, not imported)."""
    found = importlib.util.find_spec("ray")
    assert found is not None and found.origin is not None, "ray must be installed (the provider requires it)"
    tree = ast.parse((Path(found.origin).parent / relative).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args.args[1:] + item.args.kwonlyargs
                    return {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in args}
    raise AssertionError(f"{cls}.__init__ not found in ray/{relative}")


RAY_SEARCHERS = {
    "random": ("tune/search/basic_variant.py", "BasicVariantGenerator"),
    "grid": ("tune/search/basic_variant.py", "BasicVariantGenerator"),
    "optuna": ("tune/search/optuna/optuna_search.py", "OptunaSearch"),
    "hyperopt": ("tune/search/hyperopt/hyperopt_search.py", "HyperOptSearch"),
    "bayesopt": ("tune/search/bayesopt/bayesopt_search.py", "BayesOptSearch"),
}
RAY_SCHEDULERS = {
    "asha": ("tune/schedulers/async_hyperband.py", "AsyncHyperBandScheduler"),
    "hyperband": ("tune/schedulers/hyperband.py", "HyperBandScheduler"),
    "median_stopping_rule": ("tune/schedulers/median_stopping_rule.py", "MedianStoppingRule"),
    "pbt": ("tune/schedulers/pbt.py", "PopulationBasedTraining"),
    "pb2": ("tune/schedulers/pb2.py", "PB2"),
    "resource_changing": ("tune/schedulers/resource_changing_scheduler.py", "ResourceChangingScheduler"),
}
#: The annotation in Ray 2.60 each JSON kind of the table stands for.
KIND_ANNOTATIONS = {
    "bool": {"bool"},
    "seed": {"int", "Optional[int]", "Optional[Union[int, np.random.Generator, np.random.RandomState]]"},
    "count": {"int"},
    "fraction": {"float"},
    "name": {"Optional[str]"},
    "rewards": {"Optional[List]"},
    "utility": {"Optional[Dict]"},
}


@pytest.mark.parametrize("name", sorted(RAY_SEARCHERS))
def test_searcher_table_matches_rays_signature(name):
    from airflow_tune.common.spec.arguments import SEARCHER_ARGS, SEARCHER_CODE_ARGS, SEARCHER_SET_BY_SPEC, SEARCHERS

    assert set(RAY_SEARCHERS) == set(SEARCHERS)
    params = _ray_init_params(*RAY_SEARCHERS[name])
    table, code = SEARCHER_ARGS[name], SEARCHER_CODE_ARGS.get(name, {})
    set_by_spec = set(SEARCHER_SET_BY_SPEC) | ({"max_concurrent"} if name in ("random", "grid") else set())
    # Every argument of Ray's signature is in exactly one place: data (with its kind), code, or set by the spec.
    assert set(params) == set(table) | set(code) | (set_by_spec & set(params)), params
    assert not set(table) & set(code) and not (set(table) | set(code)) & set_by_spec
    for arg, kind in table.items():
        assert params[arg] in KIND_ANNOTATIONS[kind], (arg, params[arg], kind)
    for arg in code:  # an object or a callable in Ray's signature, never a JSON type
        assert not any(params[arg] in allowed for allowed in KIND_ANNOTATIONS.values()), (arg, params[arg])


@pytest.mark.parametrize("name", sorted(RAY_SCHEDULERS))
def test_scheduler_table_matches_rays_signature(name):
    from airflow_tune.common.spec.arguments import SCHEDULER_CODE_ARGS, SCHEDULERS

    params = _ray_init_params(*RAY_SCHEDULERS[name])
    code = SCHEDULER_CODE_ARGS.get(name, {})
    # (ResourceChangingScheduler takes no metric or mode: it hands the TuneConfig's to its base scheduler.)
    assert set(params) | {"metric", "mode"} == set(SCHEDULERS[name]) | set(code) | {"metric", "mode"}, params
    for arg in code:
        assert "Callable" in params[arg] or "TrialScheduler" in params[arg], (arg, params[arg])


def test_ray_constants_the_resource_rules_copy():
    from airflow_tune.common.spec import resources

    found = importlib.util.find_spec("ray")
    assert found is not None and found.origin is not None
    root = Path(found.origin).parent
    constants = (root / "_private/ray_constants.py").read_text()
    assert re.search(r"^MIN_RESOURCE_GRANULARITY = 0\.0001$", constants, re.M)
    assert re.search(r"^MAX_RESOURCE_QUANTITY = 100e12$", constants, re.M)
    common = (root / "_common/constants.py").read_text()
    assert 'NODE_ID_PREFIX = "node:"' in common and 'NODE_ID_PREFIX + "__internal_head__"' in common
    utils = (root / "_common/utils.py").read_text()
    assert 'RESOURCE_CONSTRAINT_PREFIX = "accelerator_type:"' in utils
    assert 'PLACEMENT_GROUP_BUNDLE_RESOURCE_NAME = "bundle"' in utils
    autoscaler = (root / "autoscaler/_private/util.py").read_text()
    assert "PLACEMENT_GROUP_WILDCARD_RESOURCE_PATTERN.match(resource_name)" in autoscaler
    assert resources.RESOURCE_UNIT == 0.0001 and resources.MAX_RESOURCE_QUANTITY == 100e12


# -- the trigger form's schema --------------------------------------------------------------------------------------
def test_form_schema_refuses_a_parameter_name_with_a_trailing_newline():
    from airflow_tune.common.spec import search_space_schema

    schema = search_space_schema()
    value = {"uniform": [0, 1]}
    jsonschema.validate({"lr": value}, schema)
    jsonschema.validate({"a" * 64: value}, schema)
    # Python's ``$`` matches before a final newline, and jsonschema uses re.search: the old pattern let this through.
    assert re.search(r"^[A-Za-z_][A-Za-z0-9_]*$", "lr\n")
    for name in ("lr\n", "lr\r\n", "a" * 65, "1lr", "l r", ""):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({name: value}, schema)
