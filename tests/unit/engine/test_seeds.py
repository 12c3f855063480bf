"""Seed points, pure logic: which keys a space samples (nested too), what a point lacks or names wrongly, the
searchers' shapes (flat ``a/b`` for Optuna and BayesOpt, nested for HyperOpt), the engine's filling by sampling, and
the warm start restricted to the sampled leaves. Each searcher takes the engine's points as Tune's own class."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.common.spec import points as pts
from airflow_tune.engine import build, seeds
from airflow_tune.operators.tune_spec import TuneSpecBuilder

SPACE: dict[str, Any] = {
    "x": {"uniform": [0, 10]},
    "y": {"uniform": [0, 1]},
    "net": {"width": {"randint": [1, 9]}, "act": {"choice": ["relu", "tanh"]}, "depth": 3},
    "opt": {"choice": [{"name": "adam"}, {"name": "sgd"}]},
    "bs": {"const": {"a": 1}},
    "fn": {"sample_from": "m:f"},
    "steps": 2,
}
SAMPLED = [("x",), ("y",), ("net", "width"), ("net", "act"), ("opt",)]


def _spec(**fields: Any) -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, **fields})


def test_sampled_paths_go_through_nested_configs_only():
    assert pts.sampled_paths(SPACE) == SAMPLED
    assert pts.sampled_paths({"a": {"b": {"c": {"randn": []}}}, "k": [1, 2]}) == [("a", "b", "c")]
    assert pts.sampled_paths("not a space") == []


def test_missing_paths_top_level_and_nested():
    point = {"x": 1.0, "net": {"width": 4}, "opt": {"name": "sgd"}}
    assert pts.missing_paths(point, SPACE) == [("y",), ("net", "act")]
    assert pts.missing_paths({"net": 5}, SPACE) == [("x",), ("y",), ("net", "width"), ("net", "act"), ("opt",)]
    assert pts.missing_paths({}, {"a": 1}) == []


def test_with_value_copies_and_creates_nested_configs():
    point = {"net": {"width": 4}}
    filled = pts.with_value(pts.with_value(point, ("net", "act"), "tanh"), ("z", "q"), 1)
    assert filled == {"net": {"width": 4, "act": "tanh"}, "z": {"q": 1}}
    assert point == {"net": {"width": 4}}


def test_flatten_follows_the_space_never_a_leafs_value():
    point = {"x": 1.0, "net": {"width": 4, "act": "relu"}, "opt": {"name": "adam"}}
    assert pts.flatten(point, SPACE) == {"x": 1.0, "net/width": 4, "net/act": "relu", "opt": {"name": "adam"}}


def test_restrict_keeps_the_sampled_leaves_nested():
    config = {
        "x": 2.0,
        "net": {"width": 5, "depth": 7, "gone": 1},
        "opt": {"name": "sgd"},
        "bs": {"a": 2},
        "fn": 3,
        "steps": 9,
        "unrelated": 1,
        "layers": [0.5, 2],
    }
    space = {**SPACE, "layers": [{"uniform": [0, 1]}, 2]}
    assert pts.restrict(config, space) == {"x": 2.0, "net": {"width": 5}, "opt": {"name": "sgd"}, "layers": [0.5, 2]}
    assert pts.restrict({"net": {"depth": 1}}, SPACE) == {}
    assert pts.restrict({"net": 4}, SPACE) == {}
    assert pts.restrict("x", SPACE) == {} and pts.restrict({"x": 1}, None) == {}


@pytest.mark.parametrize("searcher", [None, "optuna", "hyperopt", "bayesopt", "factory"])
def test_unknown_keys_are_named_nested_too(searcher):
    problems = pts.point_problems({"x": 1, "momentum": 0.9, "net": {"widht": 3}}, SPACE, searcher)
    assert problems[0] == ("names parameters not in param_space: momentum, net.widht", "use the param_space's keys")


@pytest.mark.parametrize("searcher", ["optuna", "hyperopt", "bayesopt"])
def test_model_based_searchers_refuse_constants_and_flat_values_for_nested_configs(searcher):
    problems = pts.point_problems({"x": 1, "steps": 3, "net": {"depth": 4}, "bs": {"a": 2}}, SPACE, searcher)
    assert len(problems) == 1
    problem, fix = problems[0]
    assert "for steps, net.depth, bs:" in problem and searcher in problem and pts.CONSTANT_IN_POINT[searcher] in problem
    assert "drop them from the point" in fix
    ((problem, fix),) = pts.point_problems({"net": 5}, SPACE, searcher)
    assert "plain values for net" in problem and "nested as in param_space" in fix


@pytest.mark.parametrize("searcher", [None, "factory"])
def test_random_and_factories_take_constants(searcher):
    assert pts.point_problems({"x": 1, "steps": 3, "net": 5}, SPACE, searcher) == []


def test_a_missing_list_of_primitives_cannot_be_filled():
    space = {"x": {"uniform": [0, 1]}, "deep": {"layers": [{"randint": [1, 4]}, 8]}}
    for searcher in ("hyperopt", "factory"):
        ((problem, fix),) = pts.point_problems({"x": 0.5}, space, searcher)
        assert (
            problem.startswith("lacks deep.layers: lists holding primitives")
            and fix == "give their values in the point"
        )
    assert pts.point_problems({"x": 0.5, "deep": {"layers": [2, 8]}}, space, "hyperopt") == []
    assert pts.point_problems({"x": 0.5}, space, None) == []


def test_the_spec_names_the_point_and_key():
    space = {k: v for k, v in SPACE.items() if k not in ("fn", "opt")}  # pairs every searcher takes
    with pytest.raises(SpecError) as info:
        _spec(param_space=space, search="optuna", points_to_evaluate=[{"x": 1.0}, {"net": {"widht": 2}, "steps": 1}])
    about_points = [e for e in info.value.errors if e.startswith("points_to_evaluate")]
    assert len(about_points) == 2, info.value.errors
    assert all(e.startswith("points_to_evaluate[1] = ") for e in about_points)
    assert "net.widht" in about_points[0] and "steps" in about_points[1] and "constants" in about_points[1]
    # Missing keys pass: the engine fills them.
    spec = _spec(param_space=space, search="hyperopt", points_to_evaluate=[{"net": {"width": 2}}])
    assert spec.points_to_evaluate == [{"net": {"width": 2}}]
    # The random searcher sets constants from a point itself.
    _spec(param_space=SPACE, points_to_evaluate=[{"steps": 5}])


# --- the engine: filling by sampling, in each searcher's shape --------------------------------------------------
ENGINE_SPACE: dict[str, Any] = {
    "x": {"uniform": [0, 10]},
    "y": {"quniform": [0, 1, 0.25]},
    "net": {"width": {"randint": [1, 9]}, "act": {"choice": ["relu", "tanh"]}, "depth": 3},
    "steps": 2,
}


def _fill(searcher: str, points: list[dict[str, Any]]) -> tuple[list[dict[str, Any]] | None, list[str]]:
    said: list[str] = []
    return seeds.seed_points(points, ENGINE_SPACE, searcher, build.build_domain, said.append), said


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        out = pts.with_value(out, tuple(key.split("/")), value)
    return out


def _check_filled(nested: dict[str, Any]) -> None:
    assert isinstance(nested["y"], float) and nested["y"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert nested["net"]["act"] in ("relu", "tanh") and type(nested["net"]["act"]) is str


@pytest.mark.parametrize("searcher", ["optuna", "bayesopt", "hyperopt", "factory"])
def test_missing_keys_are_sampled_and_logged(searcher):
    points, said = _fill(searcher, [{"x": 3.0, "net": {"width": 4}}, {"x": 1.0, "y": 0.5, "net": {"width": 2}}])
    assert points is not None and len(points) == 2
    if seeds.SHAPES[searcher] == "flat":
        assert set(points[0]) == {"x", "y", "net/width", "net/act"}
        nested = [_nest(p) for p in points]
    else:
        assert set(points[0]) == {"x", "y", "net"}
        nested = points
    assert nested[0]["x"] == 3.0 and nested[0]["net"]["width"] == 4
    _check_filled(nested[0])
    assert nested[1]["y"] == 0.5 and nested[1]["net"]["width"] == 2
    assert [line.split(":")[0] for line in said] == [
        "points_to_evaluate[0] has no y",
        "points_to_evaluate[0] has no net.act",
        "points_to_evaluate[1] has no net.act",
    ]
    assert f"the {searcher} searcher takes a point only whole" in said[0]


def test_the_random_searcher_gets_the_points_as_they_are():
    points, said = _fill("random", [{"x": 3.0}])
    assert points == [{"x": 3.0}] and said == []
    assert seeds.seed_points(None, ENGINE_SPACE, "optuna", build.build_domain) is None


def test_plain_turns_numpy_scalars_into_python_values():
    np = pytest.importorskip("numpy")
    assert type(seeds.plain(np.float64(0.5))) is float and seeds.plain("a") == "a" and seeds.plain([1]) == [1]


@pytest.mark.parametrize("searcher", ["optuna", "hyperopt", "bayesopt"])
def test_each_searcher_takes_the_completed_point_and_suggests_it_first(searcher):
    """Tune's own searcher classes, as build_search makes them, take the engine's points: the first suggestion is
    the seed, with the sampled fills, nested as the trainable sees it."""
    space = {"x": {"uniform": [0, 10]}, "net": {"width": {"uniform": [1, 9]}, "lr": {"uniform": [0, 1]}}, "k": 1}
    spec = _spec(param_space=space, search=searcher, points_to_evaluate=[{"x": 3.0, "net": {"width": 4.0}}])
    searcher_obj = build.build_search(spec)
    assert searcher_obj.set_search_properties("loss", "min", build.build_param_space(spec))
    first = searcher_obj.suggest("trial-1")
    assert first["x"] == 3.0 and first["net"]["width"] == 4.0 and 0 <= first["net"]["lr"] <= 1


def test_warm_start_keeps_nested_sampled_keys(caplog):
    champion = {"x": 2.0, "net": {"width": 5, "depth": 7}, "steps": 9, "old": 1}
    operator = types.SimpleNamespace(warm_start=champion, log=logging.getLogger("warm"), aws_conn_id=None)
    with caplog.at_level(logging.INFO, "warm"):
        point = TuneSpecBuilder.warm_start_point(operator, SPACE)  # type: ignore[arg-type]
    assert point == {"x": 2.0, "net": {"width": 5}}
    assert "Warm start: trying {'x': 2.0, 'net': {'width': 5}} first" in caplog.text
    operator.warm_start = {"steps": 1, "net": {"depth": 1}}
    assert TuneSpecBuilder.warm_start_point(operator, SPACE) is None  # type: ignore[arg-type]
