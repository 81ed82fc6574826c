"""Every socket the distributed stack listens on is on 127.0.0.1 (Redis, PostgreSQL, moto, Airflow, workers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psutil

from dev.processes import LOOPBACK

if TYPE_CHECKING:
    from tests.e2e.celery.support import CeleryClient


def test_every_listening_socket_of_the_stack_is_on_loopback(celery_stack: CeleryClient):
    cluster = celery_stack.cluster
    roots = [p for p in (cluster.redis.process, cluster.moto.process) if p is not None]
    roots += list(cluster.control.processes) + [w.process for w in cluster.workers if w.process is not None]
    assert cluster.postgres is not None and cluster.postgres.process is not None
    roots.append(cluster.postgres.process)
    listening: dict[str, set[tuple[str, int]]] = {}
    for managed in roots:
        root = psutil.Process(managed.pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                sockets = proc.net_connections(kind="inet")
            except psutil.NoSuchProcess:
                continue
            for conn in sockets:
                if conn.status == psutil.CONN_LISTEN:
                    listening.setdefault(managed.name, set()).add((conn.laddr.ip, conn.laddr.port))
    assert {name for name, addrs in listening.items() for ip, _ in addrs if ip != LOOPBACK} == set(), listening
    # The ones that must listen do, on the ports the stack chose.
    assert (LOOPBACK, cluster.redis.port) in listening["redis"]
    assert (LOOPBACK, cluster.moto.port) in listening["moto"]
    assert (LOOPBACK, cluster.postgres.port) in listening["postgres"]
    assert (LOOPBACK, cluster.settings.port) in listening["api-server"]
    # The Celery workers and the scheduler and triggerer serve no logs (that server binds every interface).
    assert not any(name.startswith("worker") or name in ("scheduler", "triggerer") for name in listening), listening
