"""Run Airflow's components on 127.0.0.1 for clicking through by hand (``make airflow``), and for tests.

``airflow standalone`` is not used: it starts log servers bound to 0.0.0.0. Instead the api-server,
scheduler, dag-processor and triggerer are started one by one, each in its own process group, with
every listening socket on 127.0.0.1, LocalExecutor, SQLite (or a throw-away PostgreSQL cluster) and
Airflow's SimpleAuthManager with one known admin user. They are stopped by their own PIDs.

This module imports nothing from Airflow at module level: the end-to-end test harness imports it into
a pytest process whose own Airflow configuration must stay untouched, and every component runs as a
``python -m airflow`` child with its own environment.

Usage::

    python -m airflow_provider_datagen.devserver [--port 8080] [--home .airflow] [--dags-folder DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from types import TracebackType

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Health endpoint keys of the components that heartbeat into the metadata DB.
_HEALTH_KEYS = ("metadatabase", "scheduler", "triggerer", "dag_processor")


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


def _stable_secret(path: Path) -> str:
    # Kept in the home so that tokens survive a restart of the devserver (and the browser stays
    # logged in); every component must share it or task tokens fail validation.
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(32)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class StackSettings:
    """Where and how the components run.

    :param home: AIRFLOW_HOME (config, SQLite DB, task logs, passwords file).
    :param dags_folder: ``[core] dags_folder``.
    :param port: api-server port on 127.0.0.1.
    :param username: SimpleAuthManager admin user.
    :param password: its password (written to the passwords file before start).
    :param sql_alchemy_conn: metadata DB URL; ``None`` means SQLite in ``home``.
    :param log_dir: where each component's stdout/stderr goes (``<log_dir>/<component>.log``).
    :param dag_refresh_interval: seconds between dag-processor scans of the DAGs folder for new files.
    :param parallelism: ``[core] parallelism``; LocalExecutor starts this many worker processes.
    :param extra_env: more environment for every component (``AIRFLOW__SECTION__KEY`` overrides).
    """

    home: Path
    dags_folder: Path
    port: int = 8080
    username: str = "admin"
    password: str = "admin"
    sql_alchemy_conn: str | None = None
    log_dir: Path | None = None
    dag_refresh_interval: int = 5
    parallelism: int = 8
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def logs(self) -> Path:
        return self.log_dir or self.home / "component-logs"

    def env(self) -> dict[str, str]:
        """The complete environment of every component: the caller's, minus its Airflow settings."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "_AIRFLOW"))
            and key not in {"AIRFLOW_HOME", "AIRFLOW_CONFIG"}
        }
        db_url = self.sql_alchemy_conn or f"sqlite:///{self.home / 'airflow.db'}"
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "PYTHONUNBUFFERED": "1",
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
                "AIRFLOW__CORE__AUTH_MANAGER": (
                    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
                ),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.username}:admin",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
                # Everything that listens does so on loopback (the API default host is 0.0.0.0).
                "AIRFLOW__API__HOST": LOOPBACK,
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__BASE_URL": f"{self.base_url}/",
                # Workers call the Execution API; its default URL is localhost:8080 whatever the port.
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": LOOPBACK,
                "AIRFLOW__API_AUTH__JWT_SECRET": _stable_secret(self.home / ".datagen_jwt_secret"),
                "AIRFLOW__API__SECRET_KEY": _stable_secret(self.home / ".datagen_api_secret"),
                # New DAG files show up within seconds instead of the 300 s default.
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": str(self.dag_refresh_interval),
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
            }
        )
        env.update(self.extra_env)
        return env

    @property
    def passwords_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json"


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
    log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
    return ManagedProcess(name, popen, log_path, stop_signal)


def _descendants(pid: int) -> list[int]:
    try:
        import psutil  # Airflow depends on it; only descendants need it
    except ImportError:  # pragma: no cover
        return []
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
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
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


def _airflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow", *args]


def component_argv(name: str, settings: StackSettings) -> list[str]:
    """The command line of one component; the log servers are skipped (they bind 0.0.0.0)."""
    if name == "api-server":
        return _airflow("api-server", "--host", LOOPBACK, "--port", str(settings.port), "--workers", "1")
    if name in ("scheduler", "triggerer"):
        return _airflow(name, "--skip-serve-logs")
    if name == "dag-processor":
        return _airflow("dag-processor")
    raise ValueError(f"unknown component {name!r}; choose from {COMPONENTS}")


class AirflowStack:
    """The four components of one Airflow deployment on 127.0.0.1; a context manager.

    :param settings: where and how to run.
    :param components: which components to start (all four by default).
    """

    def __init__(self, settings: StackSettings, components: Sequence[str] = COMPONENTS) -> None:
        self.settings = settings
        self.components = tuple(components)
        self.processes: list[ManagedProcess] = []
        self._env: dict[str, str] | None = None

    @property
    def env(self) -> dict[str, str]:
        if self._env is None:
            self.settings.home.mkdir(parents=True, exist_ok=True)
            self._env = self.settings.env()
        return self._env

    def prepare(self) -> None:
        """Create the home and DAGs folder, write the admin's password, migrate the metadata DB."""
        s = self.settings
        s.home.mkdir(parents=True, exist_ok=True)
        s.dags_folder.mkdir(parents=True, exist_ok=True)
        s.logs.mkdir(parents=True, exist_ok=True)
        # SimpleAuthManager generates a random password for users missing from this file; writing
        # it first makes the password known.
        passwords: dict[str, str] = {}
        if s.passwords_file.exists():
            with contextlib.suppress(ValueError):
                passwords = json.loads(s.passwords_file.read_text() or "{}")
        passwords[s.username] = s.password
        s.passwords_file.write_text(json.dumps(passwords) + "\n")
        s.passwords_file.chmod(0o600)
        log_path = s.logs / "db-migrate.log"
        with log_path.open("ab") as out:
            result = subprocess.run(
                _airflow("db", "migrate"),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=600,
                check=False,
            )
        if result.returncode != 0:
            raise StackError(f"airflow db migrate failed ({result.returncode}):\n{tail(log_path)}")

    def start(self) -> None:
        """Prepare, then start every component (does not wait for health)."""
        if is_listening(self.settings.port):
            raise StackError(
                f"port {self.settings.port} on {LOOPBACK} is already in use; stop what listens there "
                "or choose another port"
            )
        self.prepare()
        for name in self.components:
            self.processes.append(
                start_process(
                    name,
                    component_argv(name, self.settings),
                    env=self.env,
                    log_path=self.settings.logs / f"{name}.log",
                    cwd=self.settings.home,
                )
            )

    def health(self) -> dict | None:
        """The ``/api/v2/monitor/health`` document, or ``None`` while the api-server is not up."""
        try:
            with urllib.request.urlopen(f"{self.settings.base_url}/api/v2/monitor/health", timeout=5) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_healthy(self, timeout: float = 120.0) -> float:
        """Wait until every started component reports healthy; return the seconds it took."""
        started = time.monotonic()
        wanted = [key for key in _HEALTH_KEYS if key == "metadatabase" or key.replace("_", "-") in self.components]
        health: dict | None = None
        while time.monotonic() - started < timeout:
            self.check_alive()
            health = self.health()
            if health and all((health.get(k) or {}).get("status") == "healthy" for k in wanted):
                return time.monotonic() - started
            time.sleep(0.5)
        raise StackError(f"Airflow was not healthy after {timeout:.0f} s (last health: {health}).\n" + self.log_tails())

    def check_alive(self) -> None:
        """Raise :class:`StackError` with the log tail of any component that has exited."""
        dead = [p for p in self.processes if not p.alive()]
        if dead:
            raise StackError(
                "Airflow component(s) exited: "
                + ", ".join(f"{p.name} (code {p.popen.returncode})" for p in dead)
                + "\n"
                + self.log_tails(dead)
            )

    def log_tails(self, processes: Sequence[ManagedProcess] | None = None, lines: int = 30) -> str:
        return "\n".join(
            f"--- {p.name}: {p.log_path} ---\n{tail(p.log_path, lines)}" for p in (processes or self.processes)
        )

    def stop(self, timeout: float = 20.0) -> list[str]:
        """Stop every component by PID (reverse start order); return the names that needed SIGKILL."""
        killed = stop_processes(list(reversed(self.processes)), timeout=timeout)
        self.processes.clear()
        return killed

    def __enter__(self) -> AirflowStack:
        try:
            self.start()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


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


def default_dags_folder() -> Path:
    """The package's ``example_dags`` folder (found without importing the package's Airflow parts)."""
    return Path(__file__).resolve().parent / "example_dags"


def _print(out: IO[str], text: str) -> None:
    out.write(text + "\n")
    out.flush()


@contextlib.contextmanager
def _stop_signals_as_keyboard_interrupt() -> Iterator[None]:
    # SIGINT is set explicitly too: a shell starts background jobs with SIGINT ignored, and Python
    # then never raises KeyboardInterrupt, so `kill -INT` would leave the components running.
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_datagen.devserver",
        description="Run Airflow (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=8080, help="api-server port on 127.0.0.1 (8080)")
    parser.add_argument("--home", type=Path, default=Path(".airflow"), help="AIRFLOW_HOME (./.airflow)")
    parser.add_argument("--dags-folder", type=Path, default=None, help="DAGs folder (the example DAGs)")
    parser.add_argument("--username", default="admin")
    parser.add_argument("--password", default="admin")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    settings = StackSettings(
        home=args.home.resolve(),
        dags_folder=(args.dags_folder or default_dags_folder()).resolve(),
        port=args.port,
        username=args.username,
        password=args.password,
        dag_refresh_interval=10,
    )
    stack = AirflowStack(settings)
    out = sys.stdout
    with _stop_signals_as_keyboard_interrupt():
        try:
            _print(out, f"Starting Airflow in {settings.home} (component logs in {settings.logs}) ...")
            stack.start()
            took = stack.wait_healthy(timeout=180)
            _print(out, f"\nAirflow is up after {took:.0f} s: {settings.base_url}/")
            _print(out, f"  login:    {settings.username}")
            _print(out, f"  password: {settings.password}")
            _print(out, f"  DAGs:     {settings.dags_folder}")
            _print(out, "Press Ctrl-C to stop.")
            while True:
                stack.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            _print(out, "\nStopping ...")
        except StackError as err:
            _print(out, f"\n{err}")
            return 1
        finally:
            killed = stack.stop()
            if killed:
                _print(out, f"Had to SIGKILL: {', '.join(killed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
