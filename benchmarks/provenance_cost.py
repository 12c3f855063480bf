"""What proving the hand-off costs on a large checkpoint (1 GiB by default, in 4 files), on the local stack's S3
endpoint: the deploy's download verified against the content digest (ours) against the plain download (the
baseline), and the engine's one read of the best checkpoint when the experiment ends, to take the digests, against
the same plain download. Hashing runs over bytes the download already brings; the engine's read is the extra cost
(see docs/security.rst)."""

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
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = figures["plain download (baseline)"]
    print(f"Proving the hand-off of a {total / 1024**3:.2f} GiB checkpoint (4 files, local S3 endpoint)")
    for name, seconds in figures.items():
        print(f"  {name:<55} {seconds:7.2f} s  ({seconds / base:.2f}x the plain download)")
    return figures
