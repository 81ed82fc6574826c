"""The ``airflow_stack`` session fixture: real Airflow components on 127.0.0.1, driven over REST.

SQLite by default; ``DATAGEN_E2E_POSTGRES=1`` runs the metadata DB on a throw-away PostgreSQL
cluster instead (``make postgres`` installs Debian's server). Component logs stay in the session's
tmp dir (``<tmp>/airflow-e2e0/logs``) and their tails are attached to start-up failures.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest

from dev.postgres import PostgresCluster
from dev.processes import find_free_port, is_listening
from dev.stack import AirflowStack, StackSettings
from tests.e2e.harness import AirflowClient, make_client

if TYPE_CHECKING:
    from collections.abc import Iterator


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/e2e is end-to-end, whether or not its module remembered the marker.
    for item in items:
        if "tests/e2e/" in item.nodeid.replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def airflow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowClient]:
    """Migrate a fresh metadata DB, start api-server, scheduler, dag-processor and triggerer.

    Yields an :class:`~tests.e2e.harness.AirflowClient`; ``client.boot_seconds`` is the time from
    start to healthy. Everything is stopped by PID at the end of the session, and the fixture
    fails if anything is still listening on the api-server port afterwards.
    """
    base = tmp_path_factory.mktemp("airflow-e2e")
    postgres: PostgresCluster | None = None
    if os.environ.get("DATAGEN_E2E_POSTGRES") == "1":
        postgres = PostgresCluster(log_path=base / "logs" / "postgres.log")
        (base / "logs").mkdir(parents=True, exist_ok=True)
    settings = StackSettings(
        home=base / "home",
        dags_folder=base / "dags",
        port=find_free_port(),
        log_dir=base / "logs",
        dag_refresh_interval=2,
    )
    stack = AirflowStack(settings)
    client: AirflowClient | None = None
    started = time.monotonic()
    try:
        if postgres is not None:
            postgres.start()
            settings.sql_alchemy_conn = postgres.url
        stack.start()
        stack.wait_healthy(timeout=180)
        client = make_client(stack)
        client.boot_seconds = time.monotonic() - started  # type: ignore[attr-defined]
        yield client
    finally:
        if client is not None:
            client.close()
        killed = stack.stop()
        if postgres is not None:
            postgres.stop()
        leftover = [p for p in (settings.port, postgres.port if postgres else None) if p and is_listening(p)]
        assert not leftover, f"still listening on 127.0.0.1 ports {leftover} after stopping the stack"
        if killed:
            # Not a failure, but a sign that a component ignores SIGTERM.
            print(f"\nairflow_stack: SIGKILL was needed for {killed}")
