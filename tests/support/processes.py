"""Process-tree checks of the stack tests: what a stack started, and what of it still runs."""

from __future__ import annotations

import psutil


def tree(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (a zombie does not)."""
    running = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.add(pid)
        except psutil.NoSuchProcess:
            pass
    return running
