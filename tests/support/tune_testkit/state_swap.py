"""Test-only entrypoint: the engine (``python -m airflow_tune.engine``'s ``main``), with one file of storage replaced
right after the engine checked the restored experiment's state and before Tune reads it, as any writer of that
storage could at that moment. Never part of the product: the tests submit it as the job's entrypoint in place of
the engine's.

``TUNE_TESTKIT_SWAP`` (JSON ``{"source": uri, "target": uri}``): after the check, ``target`` gets ``source``'s bytes.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SWAP_ENV = "TUNE_TESTKIT_SWAP"


def swap_after_the_check() -> None:
    from airflow_tune.common import storage
    from airflow_tune.engine import tuner

    swap = json.loads(os.environ[SWAP_ENV])
    check = tuner.check_restore_state

    def check_then_swap(*args: Any, **kwargs: Any) -> None:
        check(*args, **kwargs)
        storage.write_bytes(swap["target"], storage.read_bytes(swap["source"]))
        print(f"[tune_testkit] replaced {swap['target']} after the engine's check", flush=True)

    tuner.check_restore_state = check_then_swap


if __name__ == "__main__":
    from airflow_tune.engine.__main__ import main

    swap_after_the_check()
    sys.exit(main())
