"""What a restored experiment takes of a retry's code objects (engine side): Tune keeps the trial name creators only
as stand-ins naming their field, which call this run's creators, so a retry's changed or dropped creator (by value or
by import path) names the trials made from then on and no earlier run's code is needed to load the saved state; a
restore puts this run's creators on what Tune saved before the stand-ins; a new experiment's callbacks stay out of
``tuner.pkl``; a saved state that refers to code this run cannot import fails naming that code and the fix."""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import pytest
from ray import cloudpickle
from ray.tune.search.basic_variant import BasicVariantGenerator, _TrialIterator, _VariantIterator
from ray.tune.search.search_generator import SearchGenerator
from ray.tune.search.searcher import Searcher

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import compat, compat_resume, trial_creators
from airflow_tune.engine.trial_creators import TrialCreator, load_creators, put_creators

pytestmark = pytest.mark.unit


def first_runs_name(trial):
    return "first_" + trial.trial_id


def retrys_name(trial):
    return "retry_" + trial.trial_id


@pytest.fixture(autouse=True)
def _no_creators_left():
    yield
    load_creators({})


def test_tune_keeps_a_creator_as_its_field_name_and_calls_this_runs():
    given = load_creators({"trial_name_creator": first_runs_name, "trial_dirname_creator": None})
    assert given["trial_dirname_creator"] is None
    kept = cloudpickle.dumps(given["trial_name_creator"])
    assert b"first_runs_name" not in kept and b"first_" not in kept  # no code of the first run in Tune's state
    assert given["trial_name_creator"](SimpleNamespace(trial_id="t1")) == "first_t1"

    # A retry that changed the creator: the stand-in loaded from the saved state calls the retry's.
    load_creators({"trial_name_creator": retrys_name})
    restored = pickle.loads(kept)
    assert restored(SimpleNamespace(trial_id="t2")) == "retry_t2"
    assert copy.deepcopy(restored)(SimpleNamespace(trial_id="t3")) == "retry_t3"  # Tune deep-copies specs
    # A retry that dropped it: false, so Tune names the trial as it does without one.
    load_creators({})
    assert not restored


def _saved_variant_generator(old: dict) -> BasicVariantGenerator:
    """A random/grid search algorithm as a restore loads it: the first run's experiment spec, and a variant it drew."""
    search = BasicVariantGenerator()
    iterator = _TrialIterator(uuid_prefix="a_", num_samples=2, unresolved_spec={"run": "train", **old})
    iterator.variants = _VariantIterator([({}, {"run": "train", **old})])
    search._iterators.append(iterator)
    return search


def test_a_restore_puts_this_runs_creators_on_the_saved_specs_and_trials():
    old = {"trial_name_creator": first_runs_name, "trial_dirname_creator": first_runs_name}
    variants, trials = _saved_variant_generator(old), [SimpleNamespace(**old)]
    searcher = SearchGenerator(Searcher(metric="loss", mode="min"))
    searcher._experiment = SimpleNamespace(spec={"run": "train", **old})
    load_creators({"trial_name_creator": retrys_name})  # changed one, dropped the other
    put_creators(variants, trials)
    put_creators(searcher, [])
    (iterator,) = variants._iterators
    specs = [iterator.unresolved_spec, *(spec for _, spec in iterator.variants.iterable), searcher._experiment.spec]
    for spec in [*specs, vars(trials[0])]:
        assert spec["trial_dirname_creator"] is None, spec
        assert spec["trial_name_creator"](SimpleNamespace(trial_id="t")) == "retry_t", spec


def test_a_search_algorithm_whose_saved_spec_is_unknown_fails_only_when_there_is_a_creator_to_put():
    put_creators(object(), [])
    load_creators({"trial_name_creator": retrys_name})
    with pytest.raises(AttributeError, match="keeps no experiment spec"):
        put_creators(object(), [])


def test_a_saved_state_that_needs_code_this_run_lacks_fails_naming_it_and_the_fix():
    earlier = {"callbacks": ["gone_callbacks.loud:Loud"], "trial_name_creator": "pkg.names:name"}
    exc = ModuleNotFoundError("No module named 'gone_callbacks'", name="gone_callbacks")
    text = str(compat_resume.unloadable_state(exc, "tuner.pkl", earlier))
    assert "(tuner.pkl, written by an earlier run): ModuleNotFoundError: No module named 'gone_callbacks'" in text
    assert "the earlier run's callbacks[0].factory 'gone_callbacks.loud:Loud')" in text and "pkg.names" not in text
    assert "ship its module with the job as the earlier run did" in text and "another experiment_name" in text
    assert "\n" not in text  # the verdict shows one line
    other = str(compat_resume.unloadable_state(OSError("connection reset"), "its search state", earlier))
    assert "OSError: connection reset; stopping here rather than starting the experiment over" in other
    assert "ship its module" not in other


def test_a_new_experiments_tuner_pkl_holds_no_callback_and_no_creator_code(tmp_path, monkeypatch):
    from ray.tune.execution import class_cache

    from airflow_tune.engine.tuner import build_tuner

    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", set(class_cache.ENV_VARS_TO_PROPAGATE))

    spec = ExperimentSpec.from_dict(
        {
            "trainable": "tests.support.tune_testkit.functions:quadratic",
            "name": "exp",
            "storage_path": str(tmp_path),
            "metric": "loss",
            "mode": "min",
            "trial_name_creator": "tests.support.tune_testkit.output:trial_name",
            "callbacks": ["csv"],
        }
    )
    ours = SimpleNamespace()
    tuner, restored = build_tuner(spec, [ours])
    assert not restored
    assert compat.tuner_run_config(tuner).callbacks[0] is ours and len(compat.tuner_run_config(tuner).callbacks) == 2
    saved = pickle.loads((tmp_path / "exp" / "tuner.pkl").read_bytes())
    assert saved["_run_config"].callbacks == []
    assert isinstance(saved["_tune_config"].trial_name_creator, TrialCreator)
    assert saved["_tune_config"].trial_dirname_creator is None
    assert trial_creators._LOADED["trial_name_creator"].__name__ == "trial_name"
