"""The maintenance lease across hosts on an S3-compatible store (moto's server on 127.0.0.1, as shipped).

moto's conditional PUT is not atomic under contention, so the lease must not depend on it: two
contender processes race for the lease object in rounds started at the same wall-clock instant,
and at most one may hold it at any time.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core.store.lease import FileLease, ObjectLease, lease_for
from airflow_provider_datagen.core.store.maintenance import MaintenanceLease
from airflow_provider_datagen.example_dags.fakes import prompts, reliable_fake_model
from airflow_provider_datagen.exceptions import ConfigurationError, LogWriteError
from dev.moto import MotoServer
from tests._support import REPO

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(180)

BUCKET = "leases"
FAST = {"ttl": 30.0, "write_bound": 0.5, "settle": 0.8}


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto") / "moto.log", atomic_put=False, buckets=(BUCKET,)) as server:
        yield server


@pytest.mark.slow  # `make test` runs it; `make unit`, the inner loop, leaves it out
def test_two_processes_racing_never_hold_the_lease_at_once(moto: MotoServer) -> None:
    rounds, hold = 6, 0.6
    first = time.time() + 4.0  # both interpreters are up and waiting before the first round
    args = {
        "uri": f"s3://{BUCKET}/race/.maintenance.lease",
        "storage_options": moto.storage_options(),
        "timing": FAST,
        "hold": hold,
        "starts": [first + r * 2.5 for r in range(rounds)],
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests._support.workers.lease", json.dumps(args)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outs.append([json.loads(line) for line in out.splitlines()])
    assert [len(o) for o in outs] == [rounds, rounds]
    held = sorted((r["start"], r["end"], who) for who, o in enumerate(outs) for r in o if r["won"])
    for r in range(rounds):
        assert sum(outs[who][r]["won"] for who in range(2)) <= 1, f"round {r}: both contenders took the lease"
    for (_, end, _), (start, _, _) in itertools.pairwise(held):
        assert end <= start, f"two holders at once: {held}"
    # Not a lease that simply refuses everyone: a round normally has its one winner.
    assert len(held) >= rounds // 2, f"only {len(held)} of {rounds} rounds had a winner"


def test_a_live_lease_excludes_others_until_released(moto: MotoServer) -> None:
    uri = f"s3://{BUCKET}/live/.maintenance.lease"
    a, b = (ObjectLease(uri, moto.storage_options(), **FAST) for _ in range(2))
    assert a.acquire()
    assert a.current()["token"] == a.token
    assert not b.acquire()
    a.release()
    assert a.current() is None
    assert b.acquire()
    b.release()


def test_an_expired_lease_is_taken_over_and_its_late_release_leaves_the_successor_alone(moto: MotoServer) -> None:
    uri = f"s3://{BUCKET}/expiry/.maintenance.lease"
    opts = moto.storage_options()
    dead = ObjectLease(uri, opts, ttl=1.0, write_bound=0.5, settle=0.6)
    assert dead.acquire()  # its host "dies": never released in time
    time.sleep(1.1)
    successor = ObjectLease(uri, opts, **FAST)
    assert successor.acquire()
    dead.release()  # too late: the lease is the successor's now
    assert successor.current()["token"] == successor.token
    successor.release()


def test_a_slow_write_gives_up_and_leaves_its_record_to_expire(moto: MotoServer) -> None:
    uri = f"s3://{BUCKET}/slow/.maintenance.lease"
    slow = ObjectLease(uri, moto.storage_options(), ttl=30.0, write_bound=1e-6, settle=0.1)
    assert not slow.acquire()
    # The record stays: deleting it could erase a racer's lease that overwrote it meanwhile.
    assert slow.current()["token"] == slow.token
    assert not ObjectLease(uri, moto.storage_options(), **FAST).acquire()


# What pyarrow's S3 client raised in a CI run when moto dropped a response under load.
DROPPED = "AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream (eof: 0, bad: 1)"


class FlakyFs:
    """The lease's real filesystem, whose next ``failures[name]`` calls of a method raise ``DROPPED``."""

    def __init__(self, fs: Any, **failures: int) -> None:
        self._fs = fs
        self.failures = failures
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._fs, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if self.failures.get(name, 0) > 0:
                self.failures[name] -= 1
                raise OSError(DROPPED)
            return method(*args, **kwargs)

        return call


def flaky(lease: ObjectLease, **failures: int) -> FlakyFs:
    lease._fs = fs = FlakyFs(lease._fs, **failures)
    return fs


def test_a_dropped_response_is_read_and_written_again(moto: MotoServer) -> None:
    uri = f"s3://{BUCKET}/flaky/.maintenance.lease"
    lease = ObjectLease(uri, moto.storage_options(), **FAST)
    fs = flaky(lease, open_input_stream=2, open_output_stream=1, delete_file=1)
    assert lease.acquire()
    assert lease.current()["token"] == lease.token
    lease.release()
    assert lease.current() is None
    assert fs.failures == {"open_input_stream": 0, "open_output_stream": 0, "delete_file": 0}
    assert fs.calls.count("open_output_stream") == 2 and fs.calls.count("delete_file") == 2


def test_a_store_that_keeps_failing_is_a_typed_error_naming_the_lease(moto: MotoServer) -> None:
    uri = f"s3://{BUCKET}/down/.maintenance.lease"
    lease = ObjectLease(uri, moto.storage_options(), **FAST)
    fs = flaky(lease, open_input_stream=99)
    expected = r"reading the lease s3://leases/down/\.maintenance\.lease failed 4 times: AWS Error INTERNAL_FAILURE"
    with pytest.raises(LogWriteError, match=expected + ".*storage_options"):
        lease.acquire()
    assert fs.calls == ["open_input_stream"] * 4
    assert ObjectLease(uri, moto.storage_options(), **FAST).current() is None  # nothing was written


def test_a_release_the_store_refuses_is_logged_and_the_record_left_to_expire(
    moto: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{BUCKET}/stuck/.maintenance.lease"
    lease = ObjectLease(uri, moto.storage_options(), **FAST)
    assert lease.acquire()
    flaky(lease, delete_file=99)
    lease.release()  # the work under the lease is done: this must not raise
    assert "could not release the lease s3://leases/stuck/.maintenance.lease" in caplog.text
    assert ObjectLease(uri, moto.storage_options(), **FAST).current()["token"] == lease.token


def test_settle_must_exceed_the_write_bound() -> None:
    with pytest.raises(ConfigurationError, match=r"ObjectLease: settle=1\.0 does not exceed write_bound=2\.0"):
        ObjectLease("s3://b/x", {}, write_bound=2.0, settle=1.0)


def test_a_local_root_keeps_the_file_lock(tmp_path: Path) -> None:
    lease = lease_for(str(tmp_path / "exp" / ".maintenance.lock"))
    assert isinstance(lease, FileLease)
    assert lease.acquire()
    assert not FileLease(str(tmp_path / "exp" / ".maintenance.lock")).acquire()
    lease.release()


def test_maintenance_on_s3_is_a_no_op_while_another_host_holds_the_lease(moto: MotoServer) -> None:
    opts = moto.storage_options()
    log = CheckpointLog.open(f"s3://{BUCKET}/root", pipeline="p", experiment="m", storage_options=opts)
    report = run_items(log, prompts(12), reliable_fake_model, processor_version="v1", checkpoint_every=3)
    assert len(report.processed) == 12
    other_host = MaintenanceLease(log.uri, opts)
    assert other_host.acquire()
    try:
        assert log.maintain() == {"skipped": True, "reason": "another maintenance worker holds the lease"}
    finally:
        other_host.release()
    done = log.maintain()
    assert done["skipped"] is False and done["fragments_after"] < done["fragments_before"]
    assert log.summary()["completed"] == 12
