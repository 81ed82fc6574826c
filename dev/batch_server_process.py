"""The fake batch server (:mod:`dev.batch_server`) as a process of its own, started and stopped by PID.

A test that SIGKILLs a *client* mid-call needs the server to live on in another process; this starts
``python -m dev.batch_server``, waits for the port it writes, reads and steers it over HTTP
(``/_fake/state``, ``/_fake/config``) and stops it through :func:`dev.processes.stop_processes`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from dev.processes import LOOPBACK, ManagedProcess, StackError, start_process, stop_processes, tail

_ROOT = Path(__file__).resolve().parent.parent


class BatchServerProcess:
    """``python -m dev.batch_server`` with its files under ``workdir``; a context manager.

    :param flags: more command-line flags (``--complete-after-polls 3``, ``--errored-regex ...``).
    """

    def __init__(self, workdir: Path, *flags: str) -> None:
        self.workdir = workdir
        self.flags = flags
        self.port_file = workdir / "batch_server.port"
        self.state_dir = workdir / "batch_server_state"
        self.process: ManagedProcess | None = None
        self.port = 0

    @property
    def anthropic_base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.anthropic_base_url}/v1"

    def start(self, timeout: float = 30.0) -> BatchServerProcess:
        """Start the server and wait until it has written its port (its log tail in the error if not)."""
        self.port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "dev.batch_server", "--port-file", str(self.port_file)]
        argv += ["--state-dir", str(self.state_dir), *self.flags]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
        log_path = self.workdir / "batch_server.log"
        self.process = start_process("fake-batch-server", argv, env=env, log_path=log_path, cwd=_ROOT)
        deadline = time.monotonic() + timeout
        while not self.port_file.exists():
            if not self.process.alive() or time.monotonic() > deadline:
                self.stop()
                raise StackError(f"the fake batch server did not start:\n{tail(log_path)}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        return self

    def stop(self) -> None:
        """SIGTERM by its PID (SIGKILL after a grace period); it writes ``state_dir/state.json``."""
        if self.process is not None:
            stop_processes([self.process], timeout=10)
            self.process = None

    def _call(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            f"{self.anthropic_base_url}{path}", data=data, method="GET" if data is None else "POST"
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def state(self) -> dict[str, Any]:
        """What the server saw (:meth:`dev.batch_server.FakeBatchServer.snapshot`)."""
        return dict(self._call("/_fake/state"))

    def configure(self, **settings: Any) -> None:
        """Change its behaviour: complete_after_polls, create_delay, shuffle_results, seed,
        errored_regex, expired_regex (:meth:`dev.batch_server.FakeBatchServer.configure`)."""
        self._call("/_fake/config", settings)

    def __enter__(self) -> BatchServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
