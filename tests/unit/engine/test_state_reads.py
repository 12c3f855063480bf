"""What the engine lets Tune decode on the driver (issue 40): a restore's reads of the saved state held to the proven
files (engine/state_seals.py ``ProvenState``, engine/compat_state.py), and errored trials' errors read as text
(engine/compat.py ``read_trial_errors_as_text``, engine/result_manifest.py ``latest_failure``). The hooks are put on
the installed Ray's own modules; the integration tests (test_state_proof.py, test_error_pickles.py) run them on a
cluster."""

from __future__ import annotations

import importlib
import json
import pickle

import pytest

from airflow_tune.common.contract import digest_of
from airflow_tune.engine import compat, compat_state
from airflow_tune.engine.imports import EngineError
from airflow_tune.engine.result_manifest import latest_failure
from airflow_tune.engine.state_seals import ProvenState

URI = "s3://bkt/exp/e"
TUNER = b"tuner bytes"
SNAPSHOT = b'{"trial_data": [], "runner_data": {}}'


class _Marker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _proven() -> ProvenState:
    return ProvenState(URI, {"tuner.pkl": digest_of(TUNER), "experiment_state-1.json": digest_of(SNAPSHOT)})


def test_a_named_file_passes_only_with_its_proven_bytes_and_the_refusal_names_it():
    proven = _proven()
    proven.check(TUNER, "tuner.pkl")
    with pytest.raises(EngineError, match=r"changed after the submitter proved it \(tuner\.pkl\)"):
        proven.check(b"other", "tuner.pkl")
    with pytest.raises(EngineError, match=r"\(experiment_state-1\.json\)"):
        proven.check(TUNER, "experiment_state-1.json")  # another proven file's bytes under this name
    assert proven.refusal is not None


def test_an_unnamed_snapshot_passes_as_bytes_or_text_of_a_proven_snapshot_only(monkeypatch):
    proven = _proven()
    proven.check(SNAPSHOT)
    proven.check(SNAPSHOT.decode())  # 2.43/2.50's decoder is given the text
    proven.raise_refusal()
    found = {"experiment_state-1.json": digest_of(SNAPSHOT), "experiment_state-2.json": digest_of(b"{}")}
    monkeypatch.setattr("airflow_tune.common.storage.file_digests", lambda uri, recursive: found)
    with pytest.raises(EngineError, match=r"\(experiment_state-2\.json\)"):
        proven.check(TUNER)  # tuner.pkl's bytes are no snapshot of the experiment's state
    with pytest.raises(EngineError, match="experiment_state-2.json"):
        proven.raise_refusal()  # kept for the read whose error Tune swallows


def test_the_downloaded_folder_is_checked_file_by_file(tmp_path):
    (tmp_path / "tuner.pkl").write_bytes(TUNER)
    (tmp_path / ".validate_storage_marker").write_bytes(b"")
    _proven().check_folder(str(tmp_path))
    (tmp_path / "searcher-state-1.pkl").write_bytes(b"planted")
    with pytest.raises(EngineError, match=r"\(searcher-state-1\.pkl\)"):
        _proven().check_folder(str(tmp_path))


@pytest.fixture
def held(monkeypatch):
    """The installed Ray's modules with the state reads held to :func:`_proven` (put back after the test)."""
    from ray.tune.execution import experiment_state
    from ray.tune.impl import tuner_internal

    monkeypatch.setattr(tuner_internal, "pickle", tuner_internal.pickle)
    manager = experiment_state._ExperimentCheckpointManager
    monkeypatch.setattr(manager, "sync_down_experiment_state", manager.sync_down_experiment_state)
    modules = [importlib.import_module(name) for name in compat_state.STATE_DECODING_MODULES]
    for module in modules:
        name = compat_state._decoder_name(module)
        monkeypatch.setattr(module, name, getattr(module, name))
    compat_state.hold_state_reads(_proven())
    return tuner_internal, modules


def _decode(module, data: bytes):
    """Decode ``data`` as ``module`` decodes the experiment state on this Ray (2.60: ``_loads_with_cloudpickle``;
    2.43 and 2.50: ``json.loads`` with ``TuneFunctionDecoder``)."""
    if compat_state._decoder_name(module) == "_loads_with_cloudpickle":
        return module._loads_with_cloudpickle(data)
    return json.loads(data, cls=module.TuneFunctionDecoder)


def test_tunes_own_decoders_decode_only_proven_state(held, tmp_path):
    tuner_internal, modules = held
    marker = tmp_path / "unpickled"
    planted = pickle.dumps(_Marker(str(marker)))
    with pytest.raises(EngineError, match=r"\(tuner\.pkl\)"):
        tuner_internal.pickle.loads(planted)
    fallback = json.dumps({"_type": "CLOUDPICKLE_FALLBACK", "value": planted.hex()}).encode()
    for module in modules:
        assert _decode(module, SNAPSHOT) == {"trial_data": [], "runner_data": {}}
        with pytest.raises(EngineError, match="changed after the submitter proved it"):
            _decode(module, fallback)
    assert not marker.exists()


def test_errored_trials_error_pickle_is_never_read(monkeypatch):
    from ray.tune.experiment.trial import Trial

    monkeypatch.setattr(Trial, "get_pickled_error", Trial.get_pickled_error)
    compat.read_trial_errors_as_text()
    assert Trial.get_pickled_error(object()) is None


def test_the_latest_failure_is_taken_from_error_txt():
    text = (
        "Failure # 1 (occurred at 2026-12-06_03-00-00)\nray::ImplicitFunc.train()\nRuntimeError: first\n"
        "Failure # 2 (occurred at 2026-12-06_03-00-09)\nray::ImplicitFunc.train()\n  File x\nValueError: second\n"
    )
    assert latest_failure(text) == "ray::ImplicitFunc.train()\n  File x\nValueError: second"
    assert latest_failure("ValueError: no header") == "ValueError: no header"
