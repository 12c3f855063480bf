"""The part of :mod:`.compat` (the one place that knows Ray Tune's internals and release differences) that holds
Tune's reads of a restored experiment's saved state to the files the submitter proved
(:class:`.state_seals.ProvenState`).

Where a restore reads the state (the same places in 2.43.0, 2.50.1 and 2.60.0; only the decoder differs):

- ``Tuner.restore`` unpickles ``tuner.pkl`` from storage with the ``pickle`` of ``ray.tune.impl.tuner_internal``
  (``ray.cloudpickle``; the engine's sealing stands in for it already, :func:`.state_seals.seal_tune_state`).
- ``Tuner.restore`` then builds an ``ExperimentAnalysis`` of the experiment, which decodes the newest
  ``experiment_state-*.json`` from storage (errors swallowed: the Tuner then has no analysis).
- ``TuneController.resume`` decodes the newest ``experiment_state-*.json`` from storage again, then
  ``_ExperimentCheckpointManager.sync_down_experiment_state`` downloads every ``*.json``/``*.pkl`` directly in the
  experiment folder into the driver's staging folder, whose searcher and callback state Tune then unpickles.
- The experiment state's decoder, in ``ray.tune.analysis.experiment_analysis`` and
  ``ray.tune.execution.tune_controller``: ``_loads_with_cloudpickle(bytes)`` in 2.60, ``json.loads(bytes,
  cls=TuneFunctionDecoder)`` in 2.43 and 2.50 (the decoder is given the file's text). Both turn a
  ``CLOUDPICKLE_FALLBACK`` value into objects with ``cloudpickle.loads``.

Each read is checked where its bytes are about to be decoded, after Tune's own download, so no write to storage
between the engine's check and Tune's use goes unseen.
"""

from __future__ import annotations

from typing import Any

from airflow_tune.engine.compat import ray_version
from airflow_tune.engine.imports import EngineError
from airflow_tune.engine.state_seals import ProvenState

#: The modules whose decoder of the experiment state is held to the proof (each imports the decoder by name).
STATE_DECODING_MODULES = ("ray.tune.analysis.experiment_analysis", "ray.tune.execution.tune_controller")


def hold_state_reads(proven: ProvenState) -> None:
    """Have every read of the saved state that Tune's restore makes checked by ``proven`` before it is decoded."""
    import importlib

    from ray.tune.execution import experiment_state
    from ray.tune.impl import tuner_internal

    manager: Any = getattr(experiment_state, "_ExperimentCheckpointManager", None)
    decoders = [(module, _decoder_name(module)) for module in map(importlib.import_module, STATE_DECODING_MODULES)]
    if (
        not hasattr(tuner_internal, "pickle")
        or not callable(getattr(manager, "sync_down_experiment_state", None))
        or any(name is None for _, name in decoders)
    ):
        raise EngineError(
            f"cannot check what Tune reads of the restored experiment's state on Ray {ray_version()} (it reads it "
            "where the engine does not look; see engine/compat_state.py): run a Ray release airflow-tune supports"
        )
    setattr(tuner_internal, "pickle", _CheckedPickle(tuner_internal.pickle, proven))  # noqa: B010 - a module
    for module, name in decoders:
        original = getattr(module, str(name))
        if name == "_loads_with_cloudpickle":
            setattr(module, name, _checked_loads(original, proven))
        else:
            setattr(module, str(name), _checked_decoder(original, proven))
    original_sync_down = manager.sync_down_experiment_state

    def sync_down_experiment_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original_sync_down(self, *args, **kwargs)
        proven.check_folder(self._storage.experiment_driver_staging_path)
        return out

    setattr(manager, "sync_down_experiment_state", sync_down_experiment_state)  # noqa: B010 - patching a class


def _decoder_name(module: Any) -> str | None:
    """The name under which ``module`` holds its decoder of the experiment state (see the module's docstring)."""
    for name in ("_loads_with_cloudpickle", "TuneFunctionDecoder"):
        if getattr(module, name, None) is not None:
            return name
    return None


def _checked_loads(loads: Any, proven: ProvenState) -> Any:
    """2.60's ``_loads_with_cloudpickle(data)``, given the bytes read from storage: checked first."""

    def checked(data: Any, *args: Any, **kwargs: Any) -> Any:
        proven.check(data)
        return loads(data, *args, **kwargs)

    return checked


def _checked_decoder(decoder: type, proven: ProvenState) -> type:
    """2.43's and 2.50's ``TuneFunctionDecoder``, handed to ``json.loads``: the text it decodes is checked first."""

    class Checked(decoder):  # type: ignore[misc, valid-type]
        def decode(self, text: str, *args: Any, **kwargs: Any) -> Any:
            proven.check(text)
            return super().decode(text, *args, **kwargs)

    return Checked


class _CheckedPickle:
    """Stands in for the pickler module of ``ray.tune.impl.tuner_internal``: ``loads`` (of ``tuner.pkl``, the one
    that module makes) only of the proven bytes."""

    def __init__(self, module: Any, proven: ProvenState) -> None:
        self._module = module
        self._proven = proven

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def loads(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        self._proven.check(data, "tuner.pkl")
        return self._module.loads(data, *args, **kwargs)
