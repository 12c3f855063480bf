"""The spec's trial name creators as Tune keeps them, so that a restored experiment names its new trials with this
try's creators and never needs an earlier try's code to load its saved state.

Tune keeps a creator wherever it keeps the experiment: in ``tuner.pkl`` (the TuneConfig), in the search algorithm's
saved state (the experiment spec it makes new trials from) and in each trial's state; a restore loads all three and
makes new trials from the saved spec, so a retry's changed creator was ignored, and a creator whose module the retry
no longer ships failed the load. Here Tune is given a :class:`TrialCreator` for each field instead: it calls the
creator this driver loaded for that field, and pickles as the field's name alone. On a restore,
:func:`put_creators` puts this try's onto the restored search algorithm and trials (an experiment saved before
these stand-ins holds the first try's functions there). Persisted name: ``tuner.pkl`` refers to
``airflow_tune.engine.trial_creators:TrialCreator`` by that path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_tune.common.spec.trial_output import NAMING_FIELDS
from airflow_tune.engine.imports import EngineError

#: This driver's creator for each field that has one (set from the spec before Tune makes any trial).
_LOADED: dict[str, Any] = {}


class TrialCreator:
    """Tune's ``trial_name_creator`` or ``trial_dirname_creator``: calls the one this driver loaded for ``field``.

    False when this driver has none for ``field``, so that Tune (which calls a creator only when it is true) names the
    trial as it does without one. Pickled (and copied) as ``TrialCreator(field)``: no code of any try.

    :param field: ``trial_name_creator`` or ``trial_dirname_creator``.
    """

    __slots__ = ("field",)

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, trial: Any) -> Any:
        creator = _LOADED.get(self.field)
        if creator is None:
            raise EngineError(f"{self.field} was called, but this run has none: Tune calls a creator only when set")
        return creator(trial)

    def __bool__(self) -> bool:
        return _LOADED.get(self.field) is not None

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (TrialCreator, (self.field,))

    def __repr__(self) -> str:
        return f"TrialCreator({self.field!r})"


def load_creators(loaded: Mapping[str, Any]) -> dict[str, TrialCreator | None]:
    """Keep this driver's creators (``{field: function or None}``) and return what Tune is given for each field."""
    _LOADED.clear()
    _LOADED.update({field: fn for field, fn in loaded.items() if fn is not None})
    return _given()


def put_creators(search_alg: Any, trials: Iterable[Any]) -> None:
    """This driver's creators on what a restore loaded: the experiment spec(s) the search algorithm makes new trials
    from (a ``BasicVariantGenerator``'s, including the variants it already drew, or a ``SearchGenerator``'s) and each
    restored trial (which Tune copies when it restarts an errored one). Trials made earlier keep their names and
    folders, where their checkpoints are.

    :raises AttributeError: a search algorithm whose saved spec this does not know, when there is a creator to put.
    """
    from ray.tune.search.basic_variant import BasicVariantGenerator

    given = _given()
    specs: list[dict[str, Any]] = []
    if isinstance(search_alg, BasicVariantGenerator):
        for iterator in search_alg._iterators:
            specs.append(iterator.unresolved_spec)
            variants = getattr(iterator, "variants", None)
            if variants is not None and not variants.lazy_eval:
                specs.extend(spec for _, spec in variants.iterable)
    elif isinstance(getattr(getattr(search_alg, "_experiment", None), "spec", None), dict):
        specs.append(search_alg._experiment.spec)
    elif _LOADED:
        raise AttributeError(f"{type(search_alg).__name__} keeps no experiment spec this engine knows")
    for spec in specs:
        spec.update(given)
    for trial in trials:
        for field, creator in given.items():
            setattr(trial, field, creator)


def _given() -> dict[str, TrialCreator | None]:
    """What Tune is given for each creator field: a stand-in where this driver loaded a creator, else None."""
    return {field: (TrialCreator(field) if field in _LOADED else None) for field in NAMING_FIELDS}
