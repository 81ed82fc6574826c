"""Child processes on 127.0.0.1: start one in its own session, stop it (and what it left) by PID.

Shared by the Airflow stack (:mod:`dev.stack`) and the throw-away PostgreSQL cluster
(:mod:`dev.postgres`). Nothing is ever stopped by name: each process is signalled through its own
process group, and descendants recorded beforehand are killed by their own PIDs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class StackError(RuntimeError):
    """A component failed to start or to become healthy; the message carries its log tail."""


def find_free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_listening(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """A child started in its own session; ``pid`` is also its process-group id."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    stop_signal: int = signal.SIGTERM

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


def start_process(
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    cwd: Path | None = None,
    user: str | None = None,
    stop_signal: int = signal.SIGTERM,
) -> ManagedProcess:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=user,
        )
    logger.info("started %s (pid %d), log %s", name, popen.pid, log_path)
    return ManagedProcess(name, popen, log_path, stop_signal)


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    # A zombie still answers kill(0); reap it if it is ours, and ask psutil otherwise.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_processes(processes: Sequence[ManagedProcess], timeout: float = 20.0) -> list[str]:
    """Stop each process by its own PID: its signal to its process group, SIGKILL after ``timeout``.

    Airflow's task supervisor moves each task into a process group of its own, so the descendants
    of every PID are recorded first and any that outlive their parent are killed by PID too.
    Returns the names of processes that needed SIGKILL.
    """
    killed: list[str] = []
    leftovers: dict[int, str] = {}
    for proc in processes:
        for child in _descendants(proc.pid):
            leftovers[child] = proc.name
        if proc.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, proc.stop_signal)
    deadline = time.monotonic() + timeout
    for proc in processes:
        try:
            proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed.append(proc.name)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)
        # The group may hold children that ignored the signal after their parent exited.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    grace = time.monotonic() + 5
    for pid, name in leftovers.items():
        while _pid_alive(pid) and time.monotonic() < grace:
            time.sleep(0.1)
        if _pid_alive(pid):
            killed.append(f"{name} child {pid}")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return killed
