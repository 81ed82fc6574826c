"""The ``celery_stack`` session fixture: the distributed stack of :mod:`dev.celery_stack`, driven over REST.

Redis, PostgreSQL, moto (S3), api-server, scheduler, dag-processor, triggerer and two Celery workers
("host-a", "host-b") that share nothing on disk, all on 127.0.0.1 and stopped by PID at the end. A
missing ``redis-server`` or PostgreSQL is a failure naming the install command, never a skip.
Component logs stay in ``<base>/logs`` (printed when the stack fails to start).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dev.celery_stack import CeleryStack, CeleryStackSettings, require_services
from dev.processes import StackError
from tests.e2e.celery.support import CeleryClient

if TYPE_CHECKING:
    from collections.abc import Iterator


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/celery/" in item.nodeid.replace(os.sep, "/"):
            item.add_marker(pytest.mark.celery)
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def celery_stack(request: pytest.FixtureRequest) -> Iterator[CeleryClient]:
    try:
        require_services()
    except StackError as err:
        pytest.fail(str(err))
    # Under /tmp, not pytest's tmp dir: a failed run's logs stay for a post-mortem (removed on success).
    base = Path(tempfile.mkdtemp(prefix="datagen-celery-"))
    stack = CeleryStack(CeleryStackSettings(base=base, worker_concurrency=3))
    client: CeleryClient | None = None
    started = time.monotonic()
    failed_before = request.session.testsfailed
    try:
        stack.start()
        stack.wait_ready(timeout=300)
        client = CeleryClient(stack)
        client.boot_seconds = time.monotonic() - started
        print(f"\ncelery stack: up after {client.boot_seconds:.0f} s in {base}")
        yield client
    finally:
        if client is not None:
            client.close()
        killed = stack.stop()
        leftover = stack.listening_ports()
        assert not leftover, f"still listening on 127.0.0.1 ports {leftover} after stopping the stack"
        if killed:
            print(f"\ncelery stack: SIGKILL was needed for {killed}")
        if request.session.testsfailed == failed_before:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"\ncelery stack: logs kept in {base}/logs")
