"""The local stack's processes: each started in a session of its own and stopped by id, never by name; and the reaper
that stops a multi-node stack's Ray nodes when the stack's owner dies, however it dies."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path


class StackError(RuntimeError):
    """The local stack could not start or stop as asked."""


def stop_when_parent_dies() -> None:
    """Runs in the child before exec: the kernel sends it SIGTERM when the process that started it dies.

    ``ray start --block`` answers SIGTERM by stopping every Ray process it started, so a test run or demo killed
    with SIGKILL (or a CI time-out) leaves no Ray head behind.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def is_alive(pid: int) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_started_at(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def stop_process_tree(pid: int, sig: int = signal.SIGTERM, grace: float = 10.0) -> list[int]:
    """Stop the process group led by ``pid`` and every descendant it spawned; return the ids that were stopped.

    Descendants are collected before the first signal: processes that start their own session (Ray job
    drivers do) leave the group, and would be reparented away from us once their parent exits.
    """
    pids = {pid, *descendants(pid)}
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for other in pids - {pid}:
        try:
            os.kill(other, sig)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids |= set(descendants(pid))
        if not any(is_alive(p) for p in pids):
            break
        time.sleep(0.2)
    pids |= set(descendants(pid))
    for p in pids:
        if is_alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return sorted(pids)


def reap_when_owner_dies(poll_interval: float = 1.0) -> None:
    """The body of a stack's reaper process (multi-node stacks): stop every process of the stack's Ray nodes when the
    stack's owner dies.

    The owner writes the process id of each node it starts to the reaper's stdin (``dir <path>`` for each node's temp
    dir), and ``exit`` when it stops the nodes itself. End of input without ``exit`` means the owner died, however it
    died: the reaper then stops each node's whole process tree, as known from its last look (every ``poll_interval``
    seconds) and as found now, and removes the temp dirs. A node's own
    teardown cannot be relied on then: a worker node whose head is stopping at the same moment hangs in it, and its
    agents outlive it, blocked on reporting to the head that is gone.
    """
    import threading

    import psutil

    roots: set[int] = set()
    folders: list[str] = []
    seen: dict[int, float] = {}  # pid -> create time, so a reused pid is never signalled
    lock = threading.Lock()
    done = threading.Event()
    reap = threading.Event()

    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "exit":
                done.set()
                return
            with lock:
                if line.startswith("dir "):
                    folders.append(line[4:].rstrip("\n"))
                else:
                    roots.add(int(line))
        reap.set()
        done.set()

    def look() -> None:
        with lock:
            for root in list(roots):
                for pid in (root, *descendants(root)):
                    try:
                        seen.setdefault(pid, psutil.Process(pid).create_time())
                    except psutil.NoSuchProcess:
                        pass

    threading.Thread(target=read, daemon=True).start()
    while not done.wait(poll_interval):
        look()
    if not reap.is_set():
        return
    look()
    procs = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


class Processes:
    """The processes one stack started, in the order it started them, each logging to a file of ``logs``.

    :param logs: the folder of the processes' log files.
    :param outlive_owner: keep the processes running when their owner exits; by default each is told to stop when
        its owner dies (see :func:`stop_when_parent_dies`).
    """

    def __init__(self, logs: Path, *, outlive_owner: bool) -> None:
        self.logs = logs
        self.outlive_owner = outlive_owner
        self.started: list[subprocess.Popen] = []
        self._reaper: subprocess.Popen | None = None

    def spawn(self, args: list[str], log_name: str, env: dict[str, str], cwd: str | None = None) -> subprocess.Popen:
        log = open(self.logs / log_name, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=None if self.outlive_owner else stop_when_parent_dies,
        )
        log.close()
        self.started.append(proc)
        self.tell_reaper(str(proc.pid))
        return proc

    def start_reaper(self) -> None:
        """A process that stops every process spawned from now on if this process dies (see reap_when_owner_dies)."""
        log = open(self.logs / "reaper.log", "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self._reaper = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from airflow_tune.local.processes import reap_when_owner_dies; reap_when_owner_dies()",
            ],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        log.close()

    def tell_reaper(self, line: str) -> None:
        """Tell the reaper (if there is one) of a process id, or ``dir <path>`` of a folder to remove."""
        if self._reaper is not None and self._reaper.stdin is not None:
            self._reaper.stdin.write(f"{line}\n")
            self._reaper.stdin.flush()

    def forget(self, proc: subprocess.Popen) -> None:
        """``proc`` was stopped by other means: :meth:`stop` leaves it alone."""
        self.started.remove(proc)

    def stop(self, first: Collection[subprocess.Popen] = ()) -> list[int]:
        """Stop every process started, newest first but those in ``first`` before all others, then dismiss the reaper;
        return the process ids stopped."""
        stopped: list[int] = []
        procs = [p for p in reversed(self.started) if p in first]
        procs += [p for p in reversed(self.started) if p not in procs]
        for proc in procs:
            stopped += stop_process_tree(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.started.clear()
        if self._reaper is not None:
            try:
                assert self._reaper.stdin is not None
                self._reaper.stdin.write("exit\n")
                self._reaper.stdin.close()
                self._reaper.wait(timeout=10)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self._reaper.kill()
            self._reaper = None
        return stopped
