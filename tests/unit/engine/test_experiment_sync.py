"""The driver's uploads of the experiment folder (engine/experiment_sync.py): what changed since the last upload, the
experiment's own files every time, Tune's exclude patterns, nothing lost when a file fails or changes while it is
sent. On pyarrow's local filesystem (the S3 path is the real stack's: tests/integration/test_engine_speed.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow.fs
import pytest

from airflow_tune.engine import experiment_sync
from airflow_tune.engine.experiment_sync import upload_changed


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def _counting(sent: list[str]) -> pyarrow.fs.FileSystem:
    local = pyarrow.fs.LocalFileSystem()

    class Handler(pyarrow.fs.FileSystemHandler):
        def get_type_name(self) -> str:
            return "counting"

        def open_output_stream(self, path: str, metadata: dict) -> object:
            sent.append(path)
            return local.open_output_stream(path)

        def create_dir(self, path: str, recursive: bool) -> None:
            local.create_dir(path, recursive=recursive)

        def __eq__(self, other: object) -> bool:
            return self is other

        def __ne__(self, other: object) -> bool:
            return self is not other

        def get_file_info(self, paths):  # pragma: no cover - unused by the upload
            return local.get_file_info(paths)

        def get_file_info_selector(self, selector):  # pragma: no cover
            return local.get_file_info_selector(selector)

        def delete_dir(self, path):  # pragma: no cover
            local.delete_dir(path)

        def delete_dir_contents(self, path, missing_dir_ok=False):  # pragma: no cover
            local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

        def delete_root_dir_contents(self):  # pragma: no cover
            raise NotImplementedError

        def delete_file(self, path):  # pragma: no cover
            local.delete_file(path)

        def move(self, src, dest):  # pragma: no cover
            local.move(src, dest)

        def copy_file(self, src, dest):  # pragma: no cover
            local.copy_file(src, dest)

        def open_input_stream(self, path):  # pragma: no cover
            return local.open_input_stream(path)

        def open_input_file(self, path):  # pragma: no cover
            return local.open_input_file(path)

        def open_append_stream(self, path, metadata):  # pragma: no cover
            return local.open_append_stream(path)

        def normalize_path(self, path):
            return path

    return pyarrow.fs.PyFileSystem(Handler())


@pytest.fixture(autouse=True)
def _forget_uploads():
    experiment_sync._SENT.clear()
    yield
    experiment_sync._SENT.clear()


def test_the_first_upload_sends_everything_and_the_next_only_what_changed_and_the_experiments_own_files(tmp_path):
    staging, dest, sent = tmp_path / "staging", tmp_path / "dest", []
    _write(staging / "experiment_state-1.json", "state 1")
    _write(staging / "tuner.pkl", "tuner")
    for trial in ("t1", "t2"):
        _write(staging / trial / "result.json", f"{trial} r1\n")
        _write(staging / trial / "params.json", f"{trial} params")
    fs = _counting(sent)

    assert upload_changed(str(staging), fs, str(dest)) == 6
    assert _tree(dest) == _tree(staging)

    sent.clear()
    time.sleep(0.01)
    _write(staging / "t1" / "result.json", "t1 r1\nt1 r2\n")  # a trial reported again
    _write(staging / "t3" / "result.json", "t3 r1\n")  # a new trial
    upload_changed(str(staging), fs, str(dest))
    names = sorted(os.path.relpath(p, dest) for p in sent)
    # The experiment's own files every time (what a restore reads), the trials' files only when changed.
    assert names == ["experiment_state-1.json", "t1/result.json", "t3/result.json", "tuner.pkl"], names
    assert _tree(dest) == _tree(staging)


def test_a_file_rewritten_with_the_same_size_is_sent_again(tmp_path):
    staging, dest, sent = tmp_path / "staging", tmp_path / "dest", []
    _write(staging / "t1" / "progress.csv", "status,RUNNING")
    fs = _counting(sent)
    upload_changed(str(staging), fs, str(dest))
    path = staging / "t1" / "progress.csv"
    path.write_text("status,PENDING")  # the same length
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 1_000_000))
    upload_changed(str(staging), fs, str(dest))
    assert (dest / "t1" / "progress.csv").read_text() == "status,PENDING"


def test_tunes_exclude_patterns_are_honoured(tmp_path):
    staging, dest = tmp_path / "staging", tmp_path / "dest"
    _write(staging / "t1" / "result.json", "r")
    _write(staging / "t1" / "checkpoint_000001" / "model.pt", "weights")
    _write(staging / "t1" / "events.out.tfevents.1", "e")
    upload_changed(str(staging), pyarrow.fs.LocalFileSystem(), str(dest), exclude=["*/checkpoint_*", "*.tfevents.*"])
    assert sorted(_tree(dest)) == ["t1/result.json"]


def test_a_failed_file_raises_after_the_others_are_sent_and_is_sent_next_time(tmp_path):
    staging, dest = tmp_path / "staging", tmp_path / "dest"
    for trial in ("t1", "t2", "t3"):
        _write(staging / trial / "result.json", trial)
    (dest / "t2").mkdir(parents=True)
    (dest / "t2" / "result.json").mkdir()  # a folder where the file goes: its upload fails
    fs = pyarrow.fs.LocalFileSystem()
    with pytest.raises(OSError):
        upload_changed(str(staging), fs, str(dest))
    assert (dest / "t1" / "result.json").read_text() == "t1" and (dest / "t3" / "result.json").read_text() == "t3"
    (dest / "t2" / "result.json").rmdir()
    assert upload_changed(str(staging), fs, str(dest)) == 1
    assert _tree(dest) == _tree(staging)


def test_a_file_changed_while_it_was_sent_is_sent_again(tmp_path, monkeypatch):
    staging, dest = tmp_path / "staging", tmp_path / "dest"
    _write(staging / "t1" / "result.json", "r1\n")
    real_stat = experiment_sync._stat
    calls = {"n": 0}

    def stat_that_moves(path: str):
        calls["n"] += 1
        found = real_stat(path)
        # The check after sending sees another time: Tune wrote the file meanwhile.
        return (found[0], found[1] + 1) if found and calls["n"] == 2 else found

    monkeypatch.setattr(experiment_sync, "_stat", stat_that_moves)
    fs = pyarrow.fs.LocalFileSystem()
    assert upload_changed(str(staging), fs, str(dest)) == 1
    monkeypatch.setattr(experiment_sync, "_stat", real_stat)
    assert upload_changed(str(staging), fs, str(dest)) == 1  # not remembered as sent: sent again
    assert upload_changed(str(staging), fs, str(dest)) == 0


def test_tunes_syncer_uploads_a_folder_with_the_changes_only_and_a_single_file_as_before(tmp_path, monkeypatch):
    from ray.train._internal import storage as ray_storage

    original = ray_storage._FilesystemSyncer._sync_up_command
    monkeypatch.setattr(ray_storage._FilesystemSyncer, "_sync_up_command", original)
    experiment_sync.upload_experiment_changes()
    experiment_sync.upload_experiment_changes()  # once is enough: a second call keeps the first patch
    patched = ray_storage._FilesystemSyncer._sync_up_command
    assert patched is not original and patched._airflow_tune_changes_only

    syncer = ray_storage._FilesystemSyncer(storage_filesystem=pyarrow.fs.LocalFileSystem())
    folder = tmp_path / "experiment"
    folder.mkdir()
    fn, kwargs = patched(syncer, local_path=str(folder), uri=str(tmp_path / "out"), exclude=["*.tmp"])
    assert fn is experiment_sync.upload_changed and kwargs["exclude"] == ["*.tmp"]
    (folder / "one.json").write_text("{}")
    fn, _ = patched(syncer, local_path=str(folder / "one.json"), uri=str(tmp_path / "out" / "one.json"))
    assert fn is not experiment_sync.upload_changed  # Tune's own single-file upload
