"""Ports on 127.0.0.1 for the local stack: free ones to hand out (each once), and waiting until one serves HTTP."""

from __future__ import annotations

import random
import socket
import subprocess
import time
import urllib.error
import urllib.request

from airflow_tune.local.processes import StackError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_block(
    size: int = 200, low: int = 20000, high: int = 32000, taken: set[int] | None = None
) -> tuple[int, int]:
    """A block of free ports for Ray's workers, below the ephemeral range the other ports come from.

    :param taken: ports already handed out (to another node's block): the new block avoids them.
    """
    taken = taken if taken is not None else set()
    for _ in range(50):
        start = random.randrange(low, high - size)
        block = range(start, start + size)
        if taken.intersection(block):
            continue
        if all(port_is_free(p) for p in range(start, start + size, 7)) and port_is_free(start + size - 1):
            taken.update(block)
            return start, start + size - 1
    raise StackError("no block of free ports found for Ray workers")


def fresh_port(taken: set[int]) -> int:
    """A free port not handed out before by this stack (the OS may offer a port again until it is bound)."""
    for _ in range(100):
        port = free_port()
        if port not in taken:
            taken.add(port)
            return port
    raise StackError("no free port found")


def wait_http(
    url: str,
    timeout: float,
    proc: subprocess.Popen | None = None,
    what: str = "",
    *,
    headers: dict[str, str] | None = None,
    ok_below: int = 500,
) -> None:
    """Wait until ``url`` gives an HTTP answer below ``ok_below`` (by default any answer below 500, which means it
    serves); fail early if ``proc``, the process that serves it, exits."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what or url} exited with code {proc.returncode} before it served")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as resp:
                if resp.status < ok_below:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < ok_below:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    raise StackError(f"{what or url} did not answer at {url} within {timeout:.0f}s: {last}")
