"""A distributed Airflow on 127.0.0.1: CeleryExecutor on Redis, PostgreSQL, an S3 store, two worker "hosts".

Started and stopped by PID, in this order: Debian's ``redis-server`` (Celery broker and result
backend), a throw-away PostgreSQL cluster (:mod:`dev.postgres`, the metadata DB), the moto server
(:mod:`dev.moto`, the S3-compatible store holding the datagen root ``s3://datagen/root``), the four
components of :mod:`dev.stack`, then one ``airflow celery worker`` per host. The hosts share nothing
on disk: each has its own ``AIRFLOW_HOME``, DAGs folder (a copy: :meth:`CeleryStack.add_dag_file`
writes every one), ``TMPDIR`` and Celery ``--hostname``; each also consumes a queue named after
itself besides ``default``, so a task can be pinned to one host with ``queue="host-a"``.

The executor is ``CeleryExecutor,LocalExecutor``: Celery is the default, and a task (or a DAG's
``default_args``) with ``executor="LocalExecutor"`` runs in the scheduler instead, on the same DB and
store (the baseline the distributed runs are compared with).

Every listening socket is on 127.0.0.1: Redis ``--bind``, PostgreSQL ``listen_addresses``, moto
``-H``, the api-server ``--host``; the scheduler and triggerer run with ``--skip-serve-logs`` and so
do the workers (Airflow's worker log server binds every interface, ``[logging]
worker_log_server_port`` sets only its port), so task logs stay in each host's
``AIRFLOW_HOME/logs``.

A dead host is noticed fast because the stack lowers (see :data:`FAST_FAILURE_DETECTION`)
``[scheduler] task_instance_heartbeat_timeout`` (300 -> 30 s),
``[scheduler] task_instance_heartbeat_timeout_detection_interval`` (10 -> 2 s),
``[workers] min_heartbeat_interval`` (5 -> 3 s) and ``[scheduler] task_queued_timeout``
(600 -> 90 s, for a task message a dead host had taken but not started).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from dev.moto import MotoServer
from dev.postgres import PostgresCluster
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
from dev.stack import AirflowStack, StackSettings, _stable_secret

if TYPE_CHECKING:
    from types import TracebackType

BUCKET = "datagen"
ROOT = f"s3://{BUCKET}/root"
HOSTS = ("host-a", "host-b")
#: The environment variable naming a worker's host, seen by its tasks (the fake process records it).
HOST_ENV = "DATAGEN_STACK_HOST"

FAST_FAILURE_DETECTION = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "3",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "90",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "10",
}
#: A busy api-server (one process serving the REST and the Execution API on a shared 2-core machine)
#: can stall for tens of seconds; the default 5 s per Execution API call then fails healthy tasks.
PATIENT_WORKERS = {
    "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "10",
    # Every task parses its DAG file first; six of them starting at once on 2 busy cores exceed 30 s.
    "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "180",
    # The scheduler fails a scheduler job whose heartbeat is older than this (its own included) and
    # resets the task instances it had queued; a LocalExecutor workload then finds its task instance
    # no longer queued and fails before it starts (no hostname, an empty log). A scheduler loop on 2
    # loaded cores can lag past the default 30 s; the stack never kills its scheduler.
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "300",
}

_INSTALL = {
    "redis-server": "apt-get install -y redis-server (or `make redis`)",
    "postgres": "apt-get install -y postgresql (or `make postgres`)",
}


def require_services() -> None:
    """Raise :class:`StackError` naming the install command when redis-server or PostgreSQL is missing."""
    missing = []
    if shutil.which("redis-server") is None:
        missing.append(_INSTALL["redis-server"])
    try:
        from dev.postgres import _postgres_bindir

        _postgres_bindir()
    except StackError:
        missing.append(_INSTALL["postgres"])
    if missing:
        raise StackError("the distributed stack needs Debian packages that are not installed: " + "; ".join(missing))


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


class RedisServer:
    """Debian's ``redis-server`` on a free loopback port, no persistence, stopped by its PID."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = find_free_port()
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--bind", LOOPBACK, "--port", str(self.port), "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.base), "--protected-mode", "yes", "--daemonize", "no"]
        log_path = self.base / "redis.log"
        self.process = start_process("redis", argv, env={"PATH": os.environ.get("PATH", "")}, log_path=log_path)
        deadline = time.monotonic() + timeout
        while not is_listening(self.port):
            if not self.process.alive() or time.monotonic() > deadline:
                self.stop()
                raise StackError(f"redis-server did not start:\n{tail(log_path)}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            stop_processes([self.process], timeout=10)
            self.process = None


@dataclass
class CeleryStackSettings:
    """Where and how the distributed stack runs.

    :param base: everything goes below it: ``control/`` (the components' home), ``hosts/<name>/``
        (one per worker), ``shared/`` (a directory tests may use for records both hosts reach),
        ``logs/``.
    :param port: api-server port on 127.0.0.1 (a free one by default).
    :param hosts: worker host names (their Celery ``--hostname`` and their own queue).
    :param worker_concurrency: Celery processes per worker (task slots per host).
    :param parallelism: ``[core] parallelism``, per executor: the LocalExecutor's slots (by default as
        many as the Celery workers have together, so the two executors compare fairly).
    :param extra_env: more ``AIRFLOW__...`` settings for every component and worker.
    """

    base: Path
    port: int = 0
    hosts: tuple[str, ...] = HOSTS
    worker_concurrency: int = 3
    parallelism: int = 0
    username: str = "admin"
    password: str = "admin"
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    def host_dir(self, host: str) -> Path:
        return self.base / "hosts" / host


@dataclass
class Worker:
    """One worker host: its settings, and its ``airflow celery worker`` process once started."""

    host: str
    settings: StackSettings
    tmp: Path
    process: ManagedProcess | None = None
    #: Where this start's output begins in the (appended) worker log.
    log_offset: int = 0

    @property
    def celery_hostname(self) -> str:
        return f"{self.host}@{LOOPBACK}"


class CeleryStack:
    """Redis, PostgreSQL, moto, Airflow's four components and one Celery worker per host; a context manager."""

    def __init__(self, settings: CeleryStackSettings) -> None:
        self.settings = settings
        s = settings
        s.base.mkdir(parents=True, exist_ok=True)
        s.logs.mkdir(parents=True, exist_ok=True)
        s.shared.mkdir(parents=True, exist_ok=True)
        if not s.port:
            s.port = find_free_port()
        if not s.parallelism:
            s.parallelism = s.worker_concurrency * len(s.hosts)
        self.redis = RedisServer(s.base / "redis")
        self.postgres: PostgresCluster | None = None
        self.moto = MotoServer(s.logs / "moto.log", atomic_put=True, buckets=(BUCKET,))
        control = s.base / "control"
        control.mkdir(parents=True, exist_ok=True)
        # One secret pair for every process: the scheduler signs the tasks' tokens, the api-server checks them.
        self._secrets = {
            "AIRFLOW__API_AUTH__JWT_SECRET": _stable_secret(control / ".datagen_jwt_secret"),
            "AIRFLOW__API__SECRET_KEY": _stable_secret(control / ".datagen_api_secret"),
        }
        self.control = AirflowStack(
            StackSettings(
                home=control / "home",
                dags_folder=control / "dags",
                port=s.port,
                username=s.username,
                password=s.password,
                log_dir=s.logs,
                dag_refresh_interval=2,
                parallelism=s.parallelism,
            )
        )
        self.workers = [
            Worker(
                host,
                StackSettings(
                    home=s.host_dir(host) / "home",
                    dags_folder=s.host_dir(host) / "dags",
                    port=s.port,
                    log_dir=s.logs,
                    parallelism=s.parallelism,
                ),
                s.host_dir(host) / "tmp",
            )
            for host in s.hosts
        ]

    # -- configuration ------------------------------------------------------------------------------

    def storage_options(self) -> dict[str, str]:
        return self.moto.storage_options()

    def connection_json(self) -> str:
        """The ``datagen_default`` connection: the root on the S3 store, its storage options."""
        return json.dumps({"conn_type": "datagen", "host": ROOT, "extra": {"storage_options": self.storage_options()}})

    def _common_env(self) -> dict[str, str]:
        assert self.postgres is not None
        return {
            **self._secrets,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor,LocalExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url,
            "AIRFLOW__CELERY__BROKER_URL": f"{self.redis.url}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"{self.redis.url}/1",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.settings.worker_concurrency),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__MAX_MAP_LENGTH": "1024",
            "AIRFLOW_CONN_DATAGEN_DEFAULT": self.connection_json(),
            **FAST_FAILURE_DETECTION,
            **PATIENT_WORKERS,
            **self.settings.extra_env,
        }

    # -- DAG files ----------------------------------------------------------------------------------

    @property
    def dags_folders(self) -> list[Path]:
        return [self.control.settings.dags_folder] + [w.settings.dags_folder for w in self.workers]

    def add_dag_file(self, name: str, text: str) -> None:
        """Write a DAG file (or its side file) into every DAGs folder: the dag-processor's and each host's.

        The hosts' copies are written first, so a task the scheduler hands out finds its file.
        """
        for folder in reversed(self.dags_folders):
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{name}.tmp"
            tmp.write_text(text)
            tmp.replace(folder / name)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        require_services()
        s = self.settings
        self.redis.start()
        self.postgres = PostgresCluster(log_path=s.logs / "postgres.log")
        self.postgres.start()
        self.moto.start()
        common = self._common_env()
        self.control.settings.extra_env.update(common)
        # LocalExecutor tasks run in the scheduler's processes: they are on the "control" host.
        self.control.settings.extra_env[HOST_ENV] = "control"
        self.control.start()
        for worker in self.workers:
            worker.settings.extra_env.update(common)
            worker.settings.extra_env[HOST_ENV] = worker.host
            worker.tmp.mkdir(parents=True, exist_ok=True)
            worker.settings.dags_folder.mkdir(parents=True, exist_ok=True)
            worker.settings.home.mkdir(parents=True, exist_ok=True)
            env = worker.settings.env()
            env.update({"TMPDIR": str(worker.tmp), HOST_ENV: worker.host})
            self.start_worker(worker, env)

    def start_worker(self, worker: Worker, env: dict[str, str] | None = None) -> None:
        if env is None:
            env = worker.settings.env()
            env.update({"TMPDIR": str(worker.tmp), HOST_ENV: worker.host})
        argv = [sys.executable, "-m", "airflow", "celery", "worker"]
        argv += ["--celery-hostname", worker.celery_hostname, "--queues", f"default,{worker.host}"]
        argv += ["--concurrency", str(self.settings.worker_concurrency), "--skip-serve-logs"]
        argv += ["--without-gossip", "--without-mingle"]
        log_path = self.settings.logs / f"worker-{worker.host}.log"
        worker.log_offset = log_path.stat().st_size if log_path.exists() else 0
        worker.process = start_process(
            f"worker {worker.host}",
            argv,
            env=env,
            log_path=log_path,
            cwd=worker.settings.home,
        )

    def wait_ready(self, timeout: float = 240.0, *, components: bool = True) -> float:
        """Wait for the components' health and for every started worker to be ready; return seconds."""
        started = time.monotonic()
        if components:
            self.control.wait_healthy(timeout=timeout)
        pending = {w.celery_hostname for w in self.workers if w.process is not None}
        while pending:
            self.check_alive()
            pending -= set(self.ready_workers())
            if not pending:
                break
            if time.monotonic() - started > timeout:
                raise StackError(
                    f"Celery workers {sorted(pending)} were not ready within {timeout:.0f} s\n" + self.log_tails()
                )
            time.sleep(1.0)
        return time.monotonic() - started

    def ready_workers(self) -> list[str]:
        """The Celery hostnames whose worker logged that it is ready (connected to the broker, consuming)."""
        return [
            w.celery_hostname
            for w in self.workers
            if w.process is not None and f"{w.celery_hostname} ready" in _read_from(w.process.log_path, w.log_offset)
        ]

    def check_alive(self) -> None:
        self.control.check_alive()
        dead = [w for w in self.workers if w.process is not None and not w.process.alive()]
        if dead:
            raise StackError("Celery worker(s) exited: " + ", ".join(w.host for w in dead) + "\n" + self.log_tails())

    def log_tails(self, lines: int = 30) -> str:
        parts = [self.control.log_tails(lines=lines)]
        for w in self.workers:
            if w.process is not None:
                parts.append(f"--- worker {w.host}: {w.process.log_path} ---\n{tail(w.process.log_path, lines)}")
        return "\n".join(parts)

    def worker(self, host: str) -> Worker:
        return next(w for w in self.workers if w.host == host)

    def host_pids(self, host: str) -> set[int]:
        """Every PID of one host: its worker and all descendants (Celery pool, task supervisors, tasks)."""
        worker = self.worker(host)
        if worker.process is None:
            return set()
        try:
            root = psutil.Process(worker.process.pid)
            return {root.pid} | {c.pid for c in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def kill_host(self, host: str) -> set[int]:
        """The host dies: freeze every process of it (SIGSTOP, so none forks meanwhile), then SIGKILL them all.

        Airflow's task supervisor puts each task in a process group of its own, so the worker's group
        alone would leave the tasks running; each PID is signalled by itself, and the worker's group too.
        """
        worker = self.worker(host)
        assert worker.process is not None, f"{host} is not running"
        frozen: set[int] = set()
        while True:
            pids = self.host_pids(host) - frozen
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            frozen |= pids
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.process.pid, signal.SIGKILL)
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        worker.process.popen.wait(timeout=30)
        for pid in frozen:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
                psutil.Process(pid).wait(timeout=10)
        worker.process = None
        return frozen

    def stop(self) -> list[str]:
        """Stop workers, components, moto, PostgreSQL and Redis by PID; return what needed SIGKILL."""
        killed = stop_processes([w.process for w in self.workers if w.process is not None], timeout=20)
        for w in self.workers:
            w.process = None
        killed += self.control.stop()
        self.moto.stop()
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        self.redis.stop()
        return killed

    def listening_ports(self) -> list[int]:
        ports = [self.settings.port, self.redis.port, self.moto.port]
        return [p for p in ports if is_listening(p)]

    def __enter__(self) -> CeleryStack:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``make airflow-celery``: the distributed stack with the example DAGs, until Ctrl-C."""
    import argparse
    import logging

    from dev.devserver import _stop_signals_as_keyboard_interrupt, default_dags_folder

    parser = argparse.ArgumentParser(
        prog="python -m dev.celery_stack",
        description="Run Airflow on CeleryExecutor with Redis, PostgreSQL, moto S3 and two worker hosts (127.0.0.1).",
    )
    parser.add_argument("--port", type=int, default=8080, help="api-server port on 127.0.0.1 (8080)")
    parser.add_argument("--base", type=Path, default=Path(".airflow-celery"), help="state (./.airflow-celery)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stack = CeleryStack(CeleryStackSettings(base=args.base.resolve(), port=args.port))
    out = sys.stdout
    with _stop_signals_as_keyboard_interrupt():
        try:
            print(f"Starting the distributed stack in {stack.settings.base} (logs in {stack.settings.logs}) ...")
            stack.start()
            for src in sorted(default_dags_folder().glob("*.py")):
                stack.add_dag_file(src.name, src.read_text())
            took = stack.wait_ready(timeout=300)
            print(f"\nUp after {took:.0f} s: {stack.control.settings.base_url}/  (login admin / admin)", file=out)
            print(f"  datagen root: {ROOT} on moto at {stack.moto.endpoint}", file=out)
            print(f"  workers:      {', '.join(w.celery_hostname for w in stack.workers)}", file=out)
            print(f"  broker:       {stack.redis.url}   metadata DB: {stack.postgres.url if stack.postgres else '?'}")
            print("Press Ctrl-C to stop.", file=out, flush=True)
            while True:
                stack.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            print("\nStopping ...", file=out)
        except StackError as err:
            print(f"\n{err}", file=out)
            return 1
        finally:
            killed = stack.stop()
            if killed:
                print(f"Had to SIGKILL: {', '.join(killed)}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
