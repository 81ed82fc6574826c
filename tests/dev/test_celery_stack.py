"""The distributed stack's own parts that need no Airflow: service checks, Redis on loopback, DAG copies."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

import psutil
import pytest

from dev import celery_stack
from dev.celery_stack import CeleryStack, CeleryStackSettings, RedisServer, require_services
from dev.processes import LOOPBACK, StackError, is_listening

if TYPE_CHECKING:
    from pathlib import Path


def test_a_missing_redis_server_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which
    monkeypatch.setattr(celery_stack.shutil, "which", lambda name: None if name == "redis-server" else real(name))
    with pytest.raises(StackError, match=r"apt-get install -y redis-server \(or `make redis`\)"):
        require_services()


def test_redis_listens_on_loopback_only_and_stops_by_pid(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        assert redis.process is not None
        addresses = {c.laddr for c in psutil.Process(redis.process.pid).net_connections() if c.status == "LISTEN"}
        assert addresses == {(LOOPBACK, redis.port)}
    finally:
        redis.stop()
    assert not is_listening(redis.port)


def test_hosts_share_nothing_on_disk_and_every_dags_folder_gets_each_file(tmp_path: Path) -> None:
    stack = CeleryStack(CeleryStackSettings(base=tmp_path))
    homes = {w.settings.home for w in stack.workers} | {stack.control.settings.home}
    tmps = {w.tmp for w in stack.workers}
    assert len(homes) == 3 and len(tmps) == 2
    assert [w.celery_hostname for w in stack.workers] == ["host-a@127.0.0.1", "host-b@127.0.0.1"]
    assert stack.settings.parallelism == 2 * stack.settings.worker_concurrency
    stack.add_dag_file("x.py", "print('x')\n")
    assert [(folder / "x.py").read_text() for folder in stack.dags_folders] == ["print('x')\n"] * 3
    assert len(set(stack.dags_folders)) == 3
