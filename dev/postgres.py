"""A throw-away PostgreSQL cluster on 127.0.0.1 for ``DATAGEN_E2E_POSTGRES=1`` runs of the e2e suite."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from dev.processes import (
    LOOPBACK,
    ManagedProcess,
    StackError,
    find_free_port,
    is_listening,
    start_process,
    stop_processes,
    tail,
)


def _postgres_bindir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name.split(".")[0]))
    if candidates:
        return Path(candidates[-1])
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    raise StackError("PostgreSQL is not installed; run `make postgres` (Debian's postgresql package)")


class PostgresCluster:
    """A throw-away PostgreSQL cluster on 127.0.0.1, in a temporary directory, stopped by its PID.

    As root the cluster belongs to the ``postgres`` user (PostgreSQL refuses to run as root). It
    uses trust authentication, which is acceptable only because it listens on loopback alone and
    lives for one test session.

    :param port: TCP port on 127.0.0.1 (a free one by default).
    :param log_path: server log (in the cluster directory by default).
    """

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or find_free_port()
        self.bindir = _postgres_bindir()
        self.user = "postgres" if os.geteuid() == 0 else None
        # Its own directory under /tmp: a pytest tmp_path sits below a 0700 directory of root's
        # that the postgres user cannot enter.
        self.base = Path(tempfile.mkdtemp(prefix="datagen-pg-"))
        self.data = self.base / "data"
        self.socket_dir = self.base / "socket"
        self.log_path = log_path or self.base / "postgres.log"
        self.process: ManagedProcess | None = None
        self.database = "airflow"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@{LOOPBACK}:{self.port}/{self.database}"

    def _run(self, *argv: str) -> None:
        result = subprocess.run(list(argv), user=self.user, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise StackError(f"{' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}")

    def start(self, timeout: float = 30.0) -> None:
        self.socket_dir.mkdir(parents=True)
        if self.user:
            shutil.chown(self.base, self.user, self.user)
            shutil.chown(self.socket_dir, self.user, self.user)
            self.log_path.touch()
            shutil.chown(self.log_path, self.user, self.user)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.process = start_process(
            "postgres",
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.socket_dir),
                "-c",
                f"listen_addresses={LOOPBACK}",
                "-c",
                "fsync=off",
            ],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
            log_path=self.log_path,
            cwd=self.base,
            user=self.user,
            # SIGINT is PostgreSQL's "fast" shutdown; SIGTERM would wait for clients to leave.
            stop_signal=signal.SIGINT,
        )
        deadline = time.monotonic() + timeout
        while not is_listening(self.port):
            if not self.process.alive() or time.monotonic() > deadline:
                self.stop()
                raise StackError(f"PostgreSQL did not start:\n{tail(self.log_path)}")
            time.sleep(0.2)
        self._run(str(self.bindir / "createdb"), "-h", LOOPBACK, "-p", str(self.port), "-U", "postgres", self.database)

    def stop(self) -> None:
        if self.process is not None:
            stop_processes([self.process], timeout=20)
            self.process = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
