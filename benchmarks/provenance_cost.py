"""What proving the hand-off costs on a large checkpoint (1 GiB by default, in 4 files), on the local stack's S3
endpoint: the deploy's download verified against the content digest (ours) against the plain download (the
baseline), and the engine's one read of the best checkpoint when the experiment ends, to take the digests, against
the same plain download. Hashing runs over bytes the download already brings; the engine's read is the extra cost
(see docs/security.rst). And the promotion's copy into a registry: streamed through the worker and every file proven
on the way (ours, :func:`airflow_tune.registries.transfer.copy_proven`) against the server-side copy it replaced,
which cannot see the bytes it registers (the baseline)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from typing import Any

CHUNK = 64 * 1024 * 1024


def _write_checkpoint(state: Any, total: int, files: int = 4) -> str:
    from airflow_tune.common import storage

    uri = f"{state.storage_uri}/bench-provenance-{uuid.uuid4().hex[:8]}/trial_0/checkpoint_000000"
    block = os.urandom(CHUNK)
    for index in range(files):
        fs, path = storage.resolve(f"{uri}/part-{index}.bin")
        with fs.open_output_stream(path) as out:
            for _ in range(total // files // CHUNK):
                out.write(block)
    return uri


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _server_side_copy(s3: Any, objects: list[dict[str, Any]], bucket: str, dest: str) -> None:
    """The promotion's copy before issue 40: S3 copies each object itself (multipart in 64 MiB parts)."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_threshold=CHUNK, multipart_chunksize=CHUNK)
    for obj in objects:
        s3.copy({"Bucket": bucket, "Key": obj["Key"]}, bucket, f"{dest}/{obj['rel']}", Config=config)


def promotion_copy(uri: str, digests: dict[str, str]) -> dict[str, float]:
    """Seconds of the server-side copy (baseline) and of the streamed, proven copy (ours) of the checkpoint."""
    import boto3

    from airflow_tune.registries.s3 import list_checkpoint, split_s3_uri
    from airflow_tune.registries.transfer import copy_proven

    s3 = boto3.client("s3")
    bucket, _ = split_s3_uri(uri)
    objects = list_checkpoint(s3, uri)
    registry = f"bench-registry-{uuid.uuid4().hex[:8]}"
    return {
        "promotion: server-side copy (before, baseline)": _timed(
            lambda: _server_side_copy(s3, objects, bucket, f"{registry}/server-side")
        ),
        "promotion: streamed copy, every file proven (ours)": _timed(
            lambda: copy_proven(s3, uri, objects, digests, bucket, f"{registry}/proven")
        ),
    }


def main(stack_state: Any = None, total: int | None = None) -> dict[str, float]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    from airflow_tune.checkpoints import download_checkpoint
    from airflow_tune.common import storage
    from airflow_tune.common.provenance import files_digest

    total = total or int(os.environ.get("AIRFLOW_TUNE_BENCH_CHECKPOINT_BYTES", str(1024**3)))
    uri = _write_checkpoint(stack_state, total)
    scratch = tempfile.mkdtemp(prefix="aft-bench-provenance-")
    try:
        digests: dict[str, str] = {}
        figures = {
            "plain download (baseline)": _timed(lambda: storage.download_dir(uri, f"{scratch}/plain")),
            "download + verify the content digest (deploy, ours)": 0.0,
            "engine's digests at the experiment's end (one read)": _timed(
                lambda: digests.update(storage.file_digests(uri))
            ),
        }
        expected = files_digest(digests)
        figures["download + verify the content digest (deploy, ours)"] = _timed(
            lambda: download_checkpoint(uri, f"{scratch}/verified", expected_digest=expected)
        )
        copies = promotion_copy(uri, digests)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = figures["plain download (baseline)"]
    print(f"Proving the hand-off of a {total / 1024**3:.2f} GiB checkpoint (4 files, local S3 endpoint)")
    for name, seconds in figures.items():
        print(f"  {name:<55} {seconds:7.2f} s  ({seconds / base:.2f}x the plain download)")
    server_side = copies["promotion: server-side copy (before, baseline)"]
    for name, seconds in copies.items():
        print(f"  {name:<55} {seconds:7.2f} s  ({seconds / server_side:.2f}x the server-side copy)")
    return {**figures, **copies}
