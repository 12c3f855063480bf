"""A local stack (Ray head, S3 endpoint) run by another environment's Python, for the compatibility tier's modules."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def compat_stack(what: str, prefix: str, **options: Any) -> Iterator[tuple[Any, Path]]:
    """Start :class:`~airflow_tune.local.LocalStack` with ``options`` (``cluster_python``, ``num_cpus``, ...) in a
    folder of its own and point Ray Jobs, S3 and Airflow clients at it while the block runs; stop it and remove the
    folder after, even when the block fails. A stack that does not start fails the test, naming ``what`` and the
    end of Ray's log. Yields the stack's state and its folder."""
    from airflow_tune.local import LocalStack

    root = Path(tempfile.mkdtemp(prefix=prefix))
    local = LocalStack(root, **options)
    started = time.monotonic()
    try:
        state = local.start()
    except Exception as exc:
        log = root / "logs" / "ray.log"
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no ray.log)"
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"the {what} did not start: {exc}\n{tail}")
    print(f"\nthe {what} started in {time.monotonic() - started:.1f}s")
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in state.env().items():
                patch.setenv(key, value)
            yield state, root
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)
