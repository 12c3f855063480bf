"""``download_checkpoint`` in both documented forms, against the real S3 endpoint: into a new temp dir the caller
removes, and into a folder the caller gives."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pytest

from airflow_tune.checkpoints import download_checkpoint
from airflow_tune.common import storage


def _checkpoint_in_s3(stack) -> str:
    uri = f"{stack.storage_uri}/download-{uuid.uuid4().hex[:8]}/checkpoint_000001"
    storage.write_bytes(f"{uri}/state.json", b'{"step": 1}')
    storage.write_bytes(f"{uri}/weights/layer.bin", b"\x00\x01")
    return uri


def _files(folder: str) -> dict[str, bytes]:
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                found[os.path.relpath(path, folder)] = fh.read()
    return found


EXPECTED = {"state.json": b'{"step": 1}', os.path.join("weights", "layer.bin"): b"\x00\x01"}


def test_without_local_dir_it_downloads_into_a_new_temp_dir(stack):
    folder = download_checkpoint(_checkpoint_in_s3(stack))
    try:
        assert os.path.dirname(folder) == tempfile.gettempdir()
        assert os.path.basename(folder).startswith("checkpoint-")
        assert _files(folder) == EXPECTED
    finally:
        shutil.rmtree(folder)


def test_into_the_folder_the_caller_gives(stack, tmp_path):
    target = str(tmp_path / "model")
    assert download_checkpoint(_checkpoint_in_s3(stack), target) == target
    assert _files(target) == EXPECTED


def test_no_uri_is_refused_before_any_download():
    with pytest.raises(ValueError, match="saved no checkpoint"):
        download_checkpoint("")
