"""Airflow's api-server, scheduler, dag-processor and triggerer on 127.0.0.1, started and stopped by PID.

``airflow standalone`` is not used: it starts log servers bound to 0.0.0.0. Instead each component
is started on its own, in its own process group, with every listening socket on 127.0.0.1,
LocalExecutor, SQLite (or a throw-away PostgreSQL cluster, :mod:`dev.postgres`) and Airflow's
SimpleAuthManager with one known admin user.

This module imports nothing from Airflow: the end-to-end test harness imports it into a pytest
process whose own Airflow configuration must stay untouched, and every component runs as a
``python -m airflow`` child with its own environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dev.processes import LOOPBACK, ManagedProcess, StackError, is_listening, start_process, stop_processes, tail

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path
    from types import TracebackType

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Health endpoint keys of the components that heartbeat into the metadata DB.
_HEALTH_KEYS = ("metadatabase", "scheduler", "triggerer", "dag_processor")


def _stable_secret(path: Path) -> str:
    # Kept in the home so that tokens survive a restart of the stack (and the browser stays
    # logged in); every component must share it or task tokens fail validation.
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(32)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value


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


_SECTION = re.compile(r"^\[([^\]]+)\]\s*$")


def write_config(path: Path, env: Mapping[str, str]) -> None:
    """Set each ``AIRFLOW__<SECTION>__<KEY>`` of ``env`` in the ``airflow.cfg`` at ``path``, keeping the rest.

    Airflow writes a default ``airflow.cfg`` into a new home (its ``dags_folder`` is ``<home>/dags``,
    its JWT secret a random one) while the components run on environment overrides, so an ``airflow``
    command run later in that home saw another deployment. Lines of other keys, comments and the
    generated Fernet key stay as Airflow wrote them; a key not in the file is added to its section.
    """
    wanted: dict[str, dict[str, str]] = {}
    for name, value in env.items():
        parts = name.split("__")
        if len(parts) == 3 and parts[0] == "AIRFLOW" and parts[1] and parts[2]:
            # the file is read with interpolation: a literal "%" is written "%%"
            wanted.setdefault(parts[1].lower(), {})[parts[2].lower()] = value.replace("%", "%%")
    lines = path.read_text().splitlines() if path.exists() else []
    out: list[str] = []
    section: str | None = None
    done: set[tuple[str, str]] = set()

    def close_section() -> None:  # the section's keys the file did not have
        if section is None:
            return
        for key, value in wanted.get(section, {}).items():
            if (section, key) not in done:
                out.append(f"{key} = {value}")
                done.add((section, key))

    for line in lines:
        header = _SECTION.match(line)
        if header:
            close_section()
            section = header.group(1).strip().lower()
            out.append(line)
            continue
        is_option = "=" in line and not line.lstrip().startswith(("#", ";"))
        key = line.split("=", 1)[0].strip().lower() if is_option else None
        if section is not None and key in wanted.get(section, {}):
            if (section, key) not in done:  # a repeated key keeps one line
                out.append(f"{key} = {wanted[section][key]}")
                done.add((section, key))
            continue
        out.append(line)
    close_section()
    for sec, keys in wanted.items():
        missing = {k: v for k, v in keys.items() if (sec, k) not in done}
        if missing:
            out += ["", f"[{sec}]", *(f"{k} = {v}" for k, v in missing.items())]
    path.write_text("\n".join(out) + "\n")
    path.chmod(0o600)  # it holds the stack's secrets, as Airflow's own file does


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
        # After the migration, which made Airflow write its default airflow.cfg into a new home.
        write_config(s.home / "airflow.cfg", self.env)

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
