"""Validation of what Tune would fail on later, or run otherwise than the spec says (issue 22, items 3 and 7).

- A misspelt primitive, or one with an extra key, is refused with a did-you-mean; plausible nested configs stay.
- Primitives inside ``choice``/``grid_search`` are checked like top-level ones.
- One table per searcher (spec/compatibility.py), checked here against the installed Ray's ``convert_search_space``:
  what the table refuses raises or warns there, what it accepts converts without a word.
- Cross-field checks: fail_fast with retries, constant PBT mutations, PBT/PB2 with a searcher, scheduler values.
- Checkpoint retention follows Tune's defaults.
"""

from __future__ import annotations

import copy
import inspect
import logging
from typing import Any

import jsonschema
import pytest

from airflow_tune.common.spec import PRIMITIVES, SEARCHERS, ExperimentSpec, SpecError
from airflow_tune.common.spec.compatibility import SEARCHER_SPACES, searcher_primitives
from airflow_tune.common.spec.form_schema import search_space_schema

BASE: dict[str, Any] = {
    "trainable": "my_pkg.train:train_fn",
    "name": "exp-1",
    "storage_path": "/tmp/aft-unit-experiments",
    "metric": "loss",
    "mode": "min",
    "param_space": {"lr": {"uniform": [1e-4, 1e-1]}},
}


def spec(**patch: Any) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**copy.deepcopy(BASE), **patch})


def refused(**patch: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec(**patch)
    for line in info.value.errors:
        assert " = " in line and ": " in line and "; " in line, line  # field = value: problem; fix
    return info.value.errors


def assert_refused(patch: dict[str, Any], field: str, words: list[str]) -> None:
    errors = refused(**patch)
    hits = [e for e in errors if e.startswith(f"{field} = ")]
    assert hits, errors
    for word in words:
        assert any(word in e for e in hits), (word, hits)


# --- item 3a: misspelt primitives -----------------------------------------------------------------------------
MISREAD = [
    ("unifrom", {"unifrom": [0, 1]}, "param_space.x", ["'unifrom'", "did you mean 'uniform'", '"const"']),
    ("logunifrom", {"logunifrom": [1e-4, 0.1]}, "param_space.x", ["did you mean 'loguniform'"]),
    ("choise", {"choise": [1, 2]}, "param_space.x", ["did you mean 'choice'"]),
    ("grid-serach", {"grid_serach": [1, 2]}, "param_space.x", ["did you mean 'grid_search'"]),
    ("smaple-from", {"smaple_from": "pkg.mod:fn"}, "param_space.x", ["did you mean 'sample_from'"]),
    ("randint-dict", {"randnit": {"low": 1, "high": 5}}, "param_space.x", ["did you mean 'randint'"]),
    ("nested", {"net": {"width": {"qrandit": [1, 9, 2]}}}, "param_space.x.net.width", ["did you mean 'qrandint'"]),
    ("in-list", [{"unifrom": [0, 1]}], "param_space.x[0]", ["did you mean 'uniform'"]),
    ("extra-key", {"uniform": [0, 1], "q": 0.1}, "param_space.x", ["one-key object", "'q'", "quniform", '"const"']),
    ("extra-key-choice", {"choice": [1, 2], "p": [0.5, 0.5]}, "param_space.x", ["one-key object", "'p'"]),
    ("const-grid", {"const": {"a": {"grid_search": [1, 2]}}}, "param_space.x.const.a", ["expands", "grid"]),
]


@pytest.mark.parametrize(("case", "node", "field", "words"), MISREAD, ids=[c[0] for c in MISREAD])
def test_a_misread_primitive_is_refused_with_a_did_you_mean(case, node, field, words):
    assert_refused({"param_space": {"x": node}}, field, words)


#: Nested configs that read like primitives at a glance, and are not: each stays a nested config.
NESTED_CONFIGS = [
    {"model": {"layers": 3}},
    {"choices": [1, 2]},  # a plural is a word, not a typo
    {"sample": 0.1},
    {"unifrom": "text"},  # not a primitive's arguments
    {"cost": 5},  # close to "const", which is never guessed
    {"rand": "x"},
    {"menu": {"choice": "a", "price": 3}},  # a key named like a primitive, without its arguments
    {"physics": {"const": 9.8, "g": 1}},
    {"const": {"grid_search": [1], "b": 2}},  # two keys: Tune leaves it alone
]


@pytest.mark.parametrize("node", NESTED_CONFIGS, ids=[str(n)[:40] for n in NESTED_CONFIGS])
def test_plausible_nested_configs_stay_legal(node):
    assert spec(param_space={"x": node}).param_space == {"x": node}


# --- item 3b: primitives inside choice and grid_search ---------------------------------------------------------
INSIDE = [
    ("choice-typo", {"choice": [{"unifrom": [0, 1]}]}, "param_space.x.choice[0]", ["did you mean 'uniform'"]),
    ("grid-bounds", {"grid_search": [1, {"uniform": [1, 0]}]}, "param_space.x.grid_search[1]", ["lower bound 1"]),
    ("choice-deep", {"choice": [{"a": {"randint": [5, 1]}}]}, "param_space.x.choice[0].a", ["lower bound 5"]),
    ("choice-in-choice", {"choice": [{"choice": []}]}, "param_space.x.choice[0]", ["non-empty list"]),
    ("grid-list", {"grid_search": [[{"loguniform": [0, 1]}]]}, "param_space.x.grid_search[0][0]", ["> 0"]),
]


@pytest.mark.parametrize(("case", "node", "field", "words"), INSIDE, ids=[c[0] for c in INSIDE])
def test_primitives_inside_choice_and_grid_are_checked(case, node, field, words):
    assert_refused({"param_space": {"x": node}}, field, words)


def test_primitives_inside_choice_and_grid_pass_with_the_random_searcher():
    node = {"choice": [{"uniform": [0, 1]}, {"a": {"grid_search": [1, 2]}}, [{"randint": [1, 3]}]]}
    assert spec(param_space={"x": node}).param_space["x"] == node


# --- item 3c: one table per searcher ---------------------------------------------------------------------------
#: One node of every primitive, with its arguments.
EXAMPLES: dict[str, dict[str, Any]] = {
    "uniform": {"uniform": [0, 1]},
    "quniform": {"quniform": [0, 1, 0.1]},
    "loguniform": {"loguniform": [1e-4, 1e-1]},
    "qloguniform": {"qloguniform": [1e-4, 1e-1, 1e-5]},
    "randn": {"randn": [0, 1]},
    "qrandn": {"qrandn": [0, 1, 0.1]},
    "randint": {"randint": [0, 10]},
    "qrandint": {"qrandint": [0, 10, 2]},
    "lograndint": {"lograndint": [1, 100]},
    "qlograndint": {"qlograndint": [1, 100, 2]},
    "choice": {"choice": [1, 2]},
    "grid_search": {"grid_search": [1, 2]},
    "sample_from": {"sample_from": "my_pkg.space:draw"},
    "const": {"const": {"a": 1}},
}


def test_the_table_covers_every_searcher_and_names_only_primitives():
    assert set(EXAMPLES) == set(PRIMITIVES)
    assert set(SEARCHER_SPACES) == set(SEARCHERS)
    for takes in SEARCHER_SPACES.values():
        assert set(takes.refused) <= set(PRIMITIVES)


@pytest.mark.parametrize("searcher", sorted(SEARCHERS))
@pytest.mark.parametrize("primitive", sorted(PRIMITIVES))
def test_each_searcher_takes_what_its_table_says(searcher, primitive):
    data = {"search": searcher, "param_space": {"x": EXAMPLES[primitive], "y": {"uniform": [0, 1]}}}
    if primitive in SEARCHER_SPACES[searcher].refused:
        assert_refused(data, "param_space.x", [f"the {searcher} searcher", "random searcher"])
    else:
        assert spec(**data).param_space["x"] == EXAMPLES[primitive]


def test_optuna_takes_qlograndint_with_step_one():
    spec(search="optuna", param_space={"x": {"qlograndint": [1, 100, 1]}})


SHAPES = [
    ("optuna-choice-of-primitive", "optuna", {"x": {"choice": [{"uniform": [0, 1]}, 2]}}, "param_space.x.choice[0]"),
    ("optuna-choice-deep", "optuna", {"x": {"choice": [{"a": {"randint": [1, 3]}}]}}, "param_space.x.choice[0].a"),
    ("optuna-in-list", "optuna", {"x": [{"uniform": [0, 1]}, 3]}, "param_space.x[0]"),
    ("bayesopt-in-list", "bayesopt", {"x": [{"uniform": [0, 1]}]}, "param_space.x[0]"),
    ("optuna-slash-key", "optuna", {"a/b": {"uniform": [0, 1]}}, "param_space.a/b"),
    ("bayesopt-slash-nested", "bayesopt", {"n": {"c/d": 1}, "y": {"uniform": [0, 1]}}, "param_space.n.c/d"),
    (
        "optuna-slash-in-const",
        "optuna",
        {"n": {"const": {"c/d": 1}}, "y": {"uniform": [0, 1]}},
        "param_space.n.const.c/d",
    ),
    ("hyperopt-list-in-choice", "hyperopt", {"x": {"choice": [[{"uniform": [0, 1]}]]}}, "param_space.x.choice[0][0]"),
    (
        "hyperopt-sample-in-choice",
        "hyperopt",
        {"x": {"choice": [{"a": {"sample_from": "p.m:f"}}]}},
        "param_space.x.choice[0].a",
    ),
    ("hyperopt-grid-in-choice", "hyperopt", {"x": {"choice": [{"grid_search": [1]}]}}, "param_space.x.choice[0]"),
]


@pytest.mark.parametrize(("case", "searcher", "space", "field"), SHAPES, ids=[c[0] for c in SHAPES])
def test_shapes_a_searcher_cannot_take(case, searcher, space, field):
    assert_refused({"search": searcher, "param_space": space}, field, [f"the {searcher} searcher"])


def test_shapes_hyperopt_and_the_random_searcher_take():
    nested = {"x": {"choice": [{"uniform": [0, 1]}, {"a": {"randint": [1, 3]}}, 5]}, "l": [{"randn": [0, 1]}]}
    spec(search="hyperopt", param_space=nested)
    spec(search="random", param_space={**nested, "a/b": {"uniform": [0, 1]}, "g": {"grid_search": [1, 2]}})
    # A slash in a key is fine for Optuna when nothing is sampled (Optuna converts nothing then).
    spec(search="optuna", param_space={"a/b": 1})


def _domain(primitive: str) -> Any:
    from ray import tune

    from airflow_tune.engine.build import build_domain

    if primitive == "sample_from":
        return tune.sample_from(lambda config: 1)
    return build_domain(EXAMPLES[primitive])


@pytest.mark.parametrize("searcher", ["optuna", "hyperopt", "bayesopt"])
def test_the_table_is_what_rays_convert_search_space_does(searcher):
    """What the table refuses, the installed Ray's convert_search_space raises or warns on; the rest converts
    without a word (a warning there is a distribution other than the spec's)."""
    from ray.tune.search.bayesopt import BayesOptSearch
    from ray.tune.search.hyperopt import HyperOptSearch
    from ray.tune.search.optuna import OptunaSearch

    convert = {"optuna": OptunaSearch, "hyperopt": HyperOptSearch, "bayesopt": BayesOptSearch}[searcher]
    warned: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warned.append  # type: ignore[method-assign]
    ray_logger = logging.getLogger("ray")  # Ray's loggers do not propagate to the root one
    ray_logger.addHandler(handler)
    try:
        for primitive in sorted(set(PRIMITIVES) - {"const"}):
            warned.clear()
            try:
                convert.convert_search_space({"x": _domain(primitive)})
                outcome = "warns" if warned else "ok"
            except (ValueError, TypeError):
                outcome = "raises"
            expected_refused = primitive in SEARCHER_SPACES[searcher].refused
            assert (outcome != "ok") == expected_refused, (searcher, primitive, outcome)
    finally:
        ray_logger.removeHandler(handler)
    if searcher == "optuna":  # the conditional refusal: a step of 1 converts
        OptunaSearch.convert_search_space({"x": _domain("lograndint")})
        from airflow_tune.engine.build import build_domain

        OptunaSearch.convert_search_space({"x": build_domain({"qlograndint": [1, 100, 1]})})
    if searcher in ("optuna", "bayesopt"):  # the shapes: a list index and a "/" key fail there
        with pytest.raises(TypeError):
            convert.convert_search_space({"x": [_domain("uniform")]})
        with pytest.raises(ValueError, match="delimiter"):
            convert.convert_search_space({"n": {"a/b": 1}, "x": _domain("uniform")})


def test_the_form_schema_offers_what_a_searcher_takes():
    for searcher in SEARCHERS:
        offered = searcher_primitives(searcher)
        schema = search_space_schema(offered)
        for primitive in offered:
            node = EXAMPLES[primitive]
            jsonschema.validate({"x": node}, schema)
            spec(search=searcher, param_space={"x": node})
    assert searcher_primitives("bayesopt") == ("uniform",)


# --- item 3e: cross-field failure checks -----------------------------------------------------------------------
CROSS = [
    ("fail-fast-retries", {"failure": {"fail_fast": True, "max_failures": 2}}, "failure.max_failures", ["fail_fast"]),
    ("fail-fast-forever", {"failure": {"fail_fast": True, "max_failures": -1}}, "failure.max_failures", ["must be 0"]),
    (
        "pbt-constant",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": 0.1}}}},
        "scheduler.args.hyperparam_mutations.lr",
        ["not a constant", "[0.1, ...]"],
    ),
    (
        "pbt-nested-constant",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"opt": {"lr": "adam"}}}}},
        "scheduler.args.hyperparam_mutations.opt.lr",
        ["not a constant"],
    ),
    (
        "pbt-empty-list",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": []}}}},
        "scheduler.args.hyperparam_mutations.lr",
        ["empty list"],
    ),
    (
        "pbt-grid",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": {"grid_search": [1, 2]}}}}},
        "scheduler.args.hyperparam_mutations.lr",
        ["no grid"],
    ),
    (
        "pbt-const",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": {"const": 0.1}}}}},
        "scheduler.args.hyperparam_mutations.lr",
        ["constant is no mutation"],
    ),
    (
        "pbt-primitive-in-list",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": [{"uniform": [0, 1]}]}}}},
        "scheduler.args.hyperparam_mutations.lr[0]",
        ["as they are"],
    ),
    (
        "pbt-typo-in-mutation",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": {"unifrom": [0, 1]}}}}},
        "scheduler.args.hyperparam_mutations.lr",
        ["did you mean 'uniform'"],
    ),
    (
        "pbt-with-optuna",
        {"search": "optuna", "scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": [0.1, 0.2]}}}},
        "search.name",
        ["PopulationBasedTraining", "random"],
    ),
    (
        "pb2-with-hyperopt",
        {"search": "hyperopt", "scheduler": {"name": "pb2", "args": {"hyperparam_bounds": {"lr": [0, 1]}}}},
        "search.name",
        ["PB2"],
    ),
    (
        "pbt-quantile",
        {"scheduler": {"name": "pbt", "args": {"hyperparam_mutations": {"lr": [1]}, "quantile_fraction": 0.6}}},
        "scheduler.args.quantile_fraction",
        ["between 0 and 0.5"],
    ),
    (
        "asha-reduction-one",
        {"scheduler": {"name": "asha", "args": {"reduction_factor": 1}}},
        "scheduler.args.reduction_factor",
        ["> 1"],
    ),
    (
        "hyperband-reduction-one",
        {"scheduler": {"name": "hyperband", "args": {"reduction_factor": 1}}},
        "scheduler.args.reduction_factor",
        ["> 1"],
    ),
    (
        "asha-grace-over-default-max-t",
        {"scheduler": {"name": "asha", "args": {"grace_period": 200}}},
        "scheduler.args.grace_period",
        ["exceeds max_t (by default) 100"],
    ),
]


@pytest.mark.parametrize(("case", "patch", "field", "words"), CROSS, ids=[c[0] for c in CROSS])
def test_what_tune_refuses_only_once_it_runs_is_refused_at_submit(case, patch, field, words):
    assert_refused(patch, field, words)


def test_the_legal_neighbours_of_the_cross_field_checks_pass():
    spec(failure={"fail_fast": True, "max_failures": 0})
    spec(failure={"fail_fast": False, "max_failures": -1})
    # A top-level sample_from is Tune's callable mutation (the engine gives PBT the function itself).
    mutations = {"lr": [0.1, 0.2], "m": {"uniform": [0, 1]}, "opt": {"b": [1, 2], "fn": {"sample_from": "p.m:f"}}}
    mutations["f"] = {"sample_from": "p.m:g"}
    spec(scheduler={"name": "pbt", "args": {"hyperparam_mutations": mutations, "quantile_fraction": 0.5}})
    spec(search="grid", scheduler={"name": "pbt", "args": {"hyperparam_mutations": {"lr": [1]}}})
    spec(search={"factory": "pkg.mod:make"}, scheduler={"name": "pbt", "args": {"hyperparam_mutations": {"lr": [1]}}})
    spec(scheduler={"name": "asha", "args": {"grace_period": 100}})


def test_tune_refuses_the_same_combinations():
    """The refusals above are Tune's own, with the installed Ray: each raises there."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    with pytest.raises(ValueError, match="max_failures must be 0"):
        tune.FailureConfig(max_failures=-1, fail_fast=True)
    with pytest.raises(TypeError):
        PopulationBasedTraining(hyperparam_mutations={"lr": 0.1})
    with pytest.raises(ValueError, match="sample_from"):
        PopulationBasedTraining(hyperparam_mutations={"lr": tune.sample_from(lambda c: 1)})
    with pytest.raises(ValueError, match="quantile_fraction"):
        PopulationBasedTraining(hyperparam_mutations={"lr": [1]}, quantile_fraction=0.6)
    with pytest.raises(AssertionError):
        ASHAScheduler(reduction_factor=1)
    with pytest.raises(AssertionError):
        ASHAScheduler(grace_period=200)
    defaults = inspect.signature(ASHAScheduler.__init__).parameters
    assert (defaults["grace_period"].default, defaults["max_t"].default) == (1, 100)  # what the check assumes


# --- item 7: checkpoint retention as Tune's -----------------------------------------------------------------------
def test_checkpoint_retention_follows_tunes_defaults():
    from ray import tune

    from airflow_tune.engine.build import build_run_config

    newest = build_run_config(spec(checkpoint={"num_to_keep": 2}), []).checkpoint_config
    assert newest.num_to_keep == 2 and newest.checkpoint_score_attribute is None  # Tune keeps the newest
    assert newest.checkpoint_score_order == tune.CheckpointConfig().checkpoint_score_order
    best = build_run_config(
        spec(mode="max", checkpoint={"num_to_keep": 2, "score_attribute": "loss", "score_order": "min"}), []
    ).checkpoint_config
    assert (best.checkpoint_score_attribute, best.checkpoint_score_order) == ("loss", "min")  # never the mode


def test_optunas_evaluated_rewards_pair_with_complete_points():
    space = {"x": {"uniform": [0, 1]}, "n": {"w": {"randint": [1, 4]}}}
    rewards = {"search": {"name": "optuna", "args": {"evaluated_rewards": [0.5, 0.7]}}, "param_space": space}
    assert_refused(
        {**rewards, "points_to_evaluate": [{"x": 0.1, "n": {"w": 2}}]}, "search.args.evaluated_rewards", ["1 points"]
    )
    assert_refused(rewards, "search.args.evaluated_rewards", ["0 points"])
    point = {"x": 0.1, "n": {"w": 2}}
    assert_refused(
        {**rewards, "points_to_evaluate": [point, {"x": 0.2}]}, "points_to_evaluate[1]", ["no n.w", "never evaluated"]
    )
    spec(**rewards, points_to_evaluate=[point, {"x": 0.2, "n": {"w": 3}}])


def test_the_tables_match_the_installed_rays_signatures():
    """The argument tables (spec/arguments.py) against inspect.signature of the classes Ray imports (the AST test in
    test_spec_resources_searchers.py reads the same classes' source)."""
    from ray.tune.schedulers import (
        AsyncHyperBandScheduler,
        HyperBandScheduler,
        MedianStoppingRule,
        PopulationBasedTraining,
        ResourceChangingScheduler,
    )
    from ray.tune.schedulers.pb2 import PB2
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.bayesopt import BayesOptSearch
    from ray.tune.search.hyperopt import HyperOptSearch
    from ray.tune.search.optuna import OptunaSearch

    from airflow_tune.common.spec.arguments import (
        SCHEDULER_CODE_ARGS,
        SCHEDULERS,
        SEARCHER_ARGS,
        SEARCHER_CODE_ARGS,
        SEARCHER_SET_BY_SPEC,
    )

    def params(cls: type) -> set[str]:
        return set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}

    searchers = {"random": BasicVariantGenerator, "grid": BasicVariantGenerator, "optuna": OptunaSearch}
    searchers |= {"hyperopt": HyperOptSearch, "bayesopt": BayesOptSearch}
    assert set(searchers) == set(SEARCHERS)
    for name, cls in searchers.items():
        extra = {"max_concurrent"} if name in ("random", "grid") else set()
        spec_set = (set(SEARCHER_SET_BY_SPEC) | extra) & params(cls)
        assert params(cls) == set(SEARCHER_ARGS[name]) | set(SEARCHER_CODE_ARGS.get(name, {})) | spec_set, name
    schedulers = {"asha": AsyncHyperBandScheduler, "hyperband": HyperBandScheduler, "pbt": PopulationBasedTraining}
    schedulers |= {"median_stopping_rule": MedianStoppingRule, "pb2": PB2}
    schedulers |= {"resource_changing": ResourceChangingScheduler}  # no metric or mode: its base scheduler takes them
    assert set(schedulers) == set(SCHEDULERS) - {"fifo"}
    for name, cls in schedulers.items():
        expected = SCHEDULERS[name] | set(SCHEDULER_CODE_ARGS.get(name, {})) | {"metric", "mode"}
        assert params(cls) | {"metric", "mode"} == expected, name
