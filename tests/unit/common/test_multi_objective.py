"""Several objectives (``metric`` and ``mode`` as lists): the spec's form and its refusals, the operator's argument
forms, the engine's searcher and TuneConfig, the Pareto front, the XCom and the Experiment view. Pure logic: the run
itself is tests/integration/test_multi_objective.py."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.common.contract import RESULT_KEYS, xcom_result
from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.engine.imports import EngineError
from airflow_tune.engine.objectives import PARETO_LISTED, check_searcher_objectives, pareto_front, pareto_summary
from airflow_tune.plugins import experiment_files, experiment_shape
from airflow_tune.plugins.experiment_shape import TaskFacts
from tests.support.experiment_files import owner_record
from tests.unit.operators.test_argument_forms import TEMPLATE_FORMS, _spec_with

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {
    "trainable": "pkg.mod:train",
    "name": "exp",
    "storage_path": "s3://bkt/experiments",
    "param_space": {"x": {"uniform": [0, 1]}},
}
TWO = {"metric": ["loss", "acc"], "mode": ["min", "max"], "search": "optuna"}
OBJECTIVES = [{"metric": "loss", "mode": "min"}, {"metric": "acc", "mode": "max"}]


def _spec(**fields: Any) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, **TWO, **fields})


def _refused(**fields: Any) -> str:
    with pytest.raises(SpecError) as exc:
        _spec(**fields)
    return str(exc.value)


# -- the spec's form -------------------------------------------------------------------------------------------------
def test_lists_become_the_first_objective_and_every_objective_in_order():
    spec = _spec()
    assert (spec.metric, spec.mode, spec.objectives) == ("loss", "min", OBJECTIVES)
    again = ExperimentSpec.from_dict(json.loads(spec.to_json()))  # the spec file's form, as the engine reads it
    assert again == spec and again.fingerprint() == spec.fingerprint()
    assert spec.identity()["objectives"] == OBJECTIVES
    assert _spec(metric=("loss", "acc"), mode=("min", "max")).fingerprint() == spec.fingerprint()  # tuples


def test_the_objectives_are_part_of_the_question():
    other = _spec(metric=["loss", "f1"]).fingerprint()
    flipped = _spec(mode=["min", "min"]).fingerprint()
    single = ExperimentSpec.from_dict({**BASE, "metric": "loss", "mode": "min", "search": "optuna"}).fingerprint()
    assert len({_spec().fingerprint(), other, flipped, single}) == 4


def test_a_list_of_one_is_a_plain_metric_with_the_same_fingerprint():
    plain = ExperimentSpec.from_dict({**BASE, "metric": "loss", "mode": "min"})
    listed = ExperimentSpec.from_dict({**BASE, "metric": ["loss"], "mode": ["min"]})
    assert listed == plain and listed.objectives is None and listed.fingerprint() == plain.fingerprint()
    assert "objectives" not in plain.identity()  # a single objective's identity is as it was


@pytest.mark.parametrize(
    ("fields", "where", "says"),
    [
        ({"mode": "min"}, "mode = 'min'", "lists one mode for each"),
        ({"mode": ["min"]}, 'mode = ["min"]', "lists 1 modes for 2 metrics"),
        ({"metric": "loss", "mode": ["min", "max"]}, "mode = [", "needs a list of metrics"),
        ({"metric": ["loss", "loss"]}, "metric[1] = 'loss'", "names an objective twice"),
        ({"metric": ["loss", "1acc"]}, "metric[1] = '1acc'", "not a metric name"),
        ({"mode": ["min", "up"]}, "mode[1] = 'up'", "must be 'min' or 'max'"),
        ({"metric": [], "mode": []}, "mode = []", "lists 0 modes for 0 metrics"),
        ({"objectives": OBJECTIVES}, "objectives = [", "given beside metric and mode as lists"),
    ],
)
def test_malformed_lists_are_refused_naming_the_field(fields, where, says):
    text = _refused(**fields)
    assert where in text and says in text


def test_objectives_that_disagree_with_metric_and_mode_are_refused():
    data = {**BASE, "metric": "acc", "mode": "max", "objectives": OBJECTIVES, "search": "optuna"}
    with pytest.raises(SpecError, match=r"objectives\[0\] = .*is not the spec's metric and mode"):
        ExperimentSpec.from_dict(data)
    with pytest.raises(SpecError, match="must list two or more"):
        ExperimentSpec.from_dict({**data, "metric": "loss", "mode": "min", "objectives": OBJECTIVES[:1]})


@pytest.mark.parametrize("searcher", ["random", "grid", "hyperopt", "bayesopt"])
def test_a_searcher_that_takes_one_metric_is_refused(searcher):
    text = _refused(search=searcher)
    assert f"search.name = '{searcher}'" in text and "only Optuna's takes a list" in text and 'search="optuna"' in text


@pytest.mark.parametrize(
    "scheduler",
    [
        "asha",
        "hyperband",
        "median_stopping_rule",
        {"name": "pbt", "args": {"hyperparam_mutations": {"x": [0.1, 0.2]}}},
        "pkg.sched:make",
    ],
)
def test_a_scheduler_other_than_fifo_is_refused(scheduler):
    text = _refused(scheduler=scheduler, search="random" if isinstance(scheduler, dict) else "optuna")
    assert "scheduler = " in text and "stops, pauses or perturbs trials by one metric" in text and '"fifo"' in text


def test_optuna_rewards_and_plateau_stoppers_without_a_metric_are_refused():
    text = _refused(
        search={"name": "optuna", "args": {"evaluated_rewards": [0.5]}},
        points_to_evaluate=[{"x": 0.5}],
        stop=[{"name": "trial_plateau"}, {"name": "experiment_plateau", "args": {"metric": "loss"}}],
    )
    assert "search.args.evaluated_rewards = [0.5]" in text and "refuses it" in text
    assert "stop[0].args = {}: the trial_plateau stopper's metric and mode default" in text
    assert 'stop[1].args = {"metric": "loss"}: the experiment_plateau stopper\'s mode default' in text


def test_what_tune_runs_with_several_objectives_is_accepted():
    spec = _spec(
        scheduler="fifo",
        search={"name": "optuna", "args": {"seed": 1}, "max_concurrent": 2},
        points_to_evaluate=[{"x": 0.5}],
        stop=[{"metric": "loss", "below": 0.1}, {"name": "trial_plateau", "args": {"metric": "acc", "mode": "max"}}],
        checkpoint={"score_attribute": "acc", "score_order": "max", "num_to_keep": 1},
    )
    assert spec.objectives == OBJECTIVES
    assert _spec(search="pkg.search:make").search.factory == "pkg.search:make"  # checked on the cluster


# -- the operator's argument forms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["python", *TEMPLATE_FORMS])
def test_every_argument_form_gives_the_same_spec_and_fingerprint(form):
    metrics, modes = ["loss", "acc"], ["min", "max"]
    if form == "python":
        spec = _spec_with(metric=metrics, mode=modes, search="optuna")
    else:
        template, native = TEMPLATE_FORMS[form]
        spec = _spec_with(
            params={"value": metrics, "modes": modes},
            native=native,
            metric=template,
            mode=template.replace("params.value", "params.modes"),
            search="optuna",
        )
    assert spec.objectives == OBJECTIVES and (spec.metric, spec.mode) == ("loss", "min")
    assert spec.fingerprint() == _spec_with(metric=metrics, mode=modes, search="optuna").fingerprint()


# -- the engine -----------------------------------------------------------------------------------------------------
def test_optuna_carries_the_objectives_and_the_tune_config_none():
    from ray.tune.search import ConcurrencyLimiter

    from airflow_tune.engine.build import build_tune_config

    config = build_tune_config(_spec(search={"name": "optuna", "max_concurrent": 2}))
    assert config.metric is None and config.mode is None
    assert isinstance(config.search_alg, ConcurrencyLimiter)
    assert config.search_alg.searcher.metric == ["loss", "acc"] and config.search_alg.searcher.mode == ["min", "max"]


def test_a_factory_searcher_must_carry_the_spec_objectives():
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    many, one = _spec(search="pkg.search:make"), _spec(metric="loss", mode="min", search="pkg.search:make")
    check_searcher_objectives(OptunaSearch(metric=["loss", "acc"], mode=["min", "max"]), many, "search.factory")
    check_searcher_objectives(
        ConcurrencyLimiter(OptunaSearch(metric=["loss", "acc"], mode=["min", "max"]), 1), many, "f"
    )
    with pytest.raises(EngineError, match=r"built a OptunaSearch for metric 'loss', mode 'min', but the spec has 2"):
        check_searcher_objectives(OptunaSearch(metric="loss", mode="min"), many, "search.factory")
    with pytest.raises(EngineError, match="for metric None, mode None"):
        check_searcher_objectives(OptunaSearch(), many, "search.factory")
    # The silent reduction Tune does: a searcher of two objectives under a spec of one.
    with pytest.raises(EngineError, match=r"for 2 objectives, .* the spec names one metric, 'loss'"):
        check_searcher_objectives(OptunaSearch(metric=["loss", "acc"], mode=["min", "max"]), one, "search.factory")
    check_searcher_objectives(OptunaSearch(), one, "search.factory")


# -- the Pareto front -------------------------------------------------------------------------------------------------
def test_the_pareto_front_keeps_what_nothing_beats_in_every_objective():
    results = [
        {"loss": 1.0, "acc": 0.5},  # 0: front
        {"loss": 2.0, "acc": 0.5},  # 1: beaten by 0
        {"loss": 0.5, "acc": 0.2},  # 2: front (best loss)
        {"loss": 3.0, "acc": 0.9},  # 3: front (best acc)
        {"loss": 1.0, "acc": 0.5},  # 4: equal to 0: kept
        {"loss": 0.1},  # 5: no acc: left out
        {"loss": math.nan, "acc": 1.0},  # 6: NaN: left out
        {"loss": 2.5, "acc": 0.4},  # 7: beaten by 0
    ]
    assert pareto_front(results, OBJECTIVES) == [2, 0, 4, 3]  # by loss, then acc (as minimized)
    both_min = [{"metric": "loss", "mode": "min"}, {"metric": "acc", "mode": "min"}]
    assert pareto_front(results, both_min) == [2]


def test_the_summary_marks_rows_and_lists_a_bounded_front_without_errored_trials():
    spec = _spec()
    n = PARETO_LISTED + 5
    metrics = [{"loss": float(i), "acc": float(i)} for i in range(n)]  # all on the front
    metrics.append({"loss": -1.0, "acc": 100.0})  # would beat all, but errored
    results = [SimpleNamespace(metrics=m) for m in metrics]
    rows = [
        {"trial_id": f"t{i}", "config": {"i": i}, "metrics": m, "error": None if i < n else "boom"}
        for i, m in enumerate(metrics)
    ]
    out = pareto_summary(spec, results, rows)
    assert out["objectives"] == OBJECTIVES and out["pareto_front_size"] == n
    assert [r["trial_id"] for r in out["pareto_front"]] == [f"t{i}" for i in range(PARETO_LISTED)]
    assert out["pareto_front"][1] == {"trial_id": "t1", "config": {"i": 1}, "metrics": {"loss": 1.0, "acc": 1.0}}
    assert [r["pareto"] for r in rows] == [True] * n + [False]
    single = ExperimentSpec.from_dict({**BASE, "metric": "loss", "mode": "min"})
    assert pareto_summary(single, results, rows) == {
        "objectives": [{"metric": "loss", "mode": "min"}],
        "pareto_front": None,
        "pareto_front_size": None,
    }


# -- the XCom and the view -------------------------------------------------------------------------------------------
def _manifest() -> dict[str, Any]:
    front = [{"trial_id": "a", "config": {"x": 0.1}, "metrics": {"loss": 0.5, "acc": 0.7}}]
    return {
        "experiment": "exp",
        "experiment_uri": "s3://bkt/experiments/exp",
        "owner": owner_record("retrain"),
        "metric": "loss",
        "mode": "min",
        "objectives": OBJECTIVES,
        "pareto_front": front,
        "pareto_front_size": 3,
        "best_trial_id": "a",
        "best_config": {"x": 0.1},
        "best_metrics": {"loss": 0.5, "acc": 0.7},
        "num_trials": 4,
        "num_terminated": 4,
        "num_errored": 0,
        "trials": [{"trial_id": "a", "status": "TERMINATED", "config": {"x": 0.1}, "metrics": front[0]["metrics"]}],
        "finished_at": 1.0,
    }


def test_the_xcom_gives_the_objectives_and_the_front():
    out = xcom_result(_manifest(), "job", None)
    assert {"objectives", "pareto_front", "pareto_front_size"} <= set(RESULT_KEYS) and set(out) == set(RESULT_KEYS)
    assert out["objectives"] == OBJECTIVES and out["pareto_front_size"] == 3
    assert out["pareto_front"] == _manifest()["pareto_front"] and (out["metric"], out["mode"]) == ("loss", "min")
    old = {k: v for k, v in _manifest().items() if not k.startswith(("objectives", "pareto"))}
    assert xcom_result(old, "job", None)["objectives"] == [{"metric": "loss", "mode": "min"}]  # a result from before


def test_the_experiment_view_shows_the_objectives_and_the_front():
    files = experiment_files.ExperimentFiles(result=experiment_files.reduce_result(_manifest()))
    facts = TaskFacts(dag_id="retrain", run_id="r", task_id="tune", experiment_uri="s3://bkt/experiments/exp")
    view = experiment_shape.experiment_view(facts, files)
    assert view["metric"] == "loss" and view["objectives"] == OBJECTIVES and view["pareto_front_size"] == 3
    assert view["pareto_front"] == [{"trial_id": "a", "values": [0.5, 0.7], "config": '{"x": 0.1}'}]
    single = {k: v for k, v in _manifest().items() if not k.startswith(("objectives", "pareto"))}
    view = experiment_shape.experiment_view(
        facts, experiment_files.ExperimentFiles(result=experiment_files.reduce_result(single))
    )
    assert view["objectives"] is None and view["pareto_front"] is None
