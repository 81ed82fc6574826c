"""The log on an S3-compatible object store (moto's server mode on 127.0.0.1), reached through a connection.

moto runs as a subprocess on a free loopback port (stopped by its PID). Lance commits a version on S3
with a conditional PUT (``If-None-Match: *`` on the manifest), which moto implements, so concurrent
appends are safe with no external commit lock and no extra storage option (the S3 keys used are
``aws_endpoint``, ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_region``, ``allow_http``).
Credentials are only in the Airflow connection ``datagen_s3`` (an ``AIRFLOW_CONN_DATAGEN_S3`` JSON
variable given to each process); the test greps
every process's stdout and stderr (DEBUG logging, Lance logging on), the status dicts operators push as
XComs, the hook's repr, error messages and the UI's pages and JSON for the secret values.

Scenario: four writer processes append at once while a fifth is SIGKILLed after two commits and a
sixth runs ``maintain()`` in a loop; a resume finishes the killed writer's items; a final maintenance
pass; then the log holds exactly the events of the same work done locally by one writer, and the
export fingerprints are equal.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog, export_results, run_items
from airflow_provider_datagen.exceptions import DatagenError

# Imported at collection, not inside the test: the first Airflow import sets up logging handlers on the
# current sys.stderr, which inside a test using capsys is a stream closed when that test ends.
from airflow_provider_datagen.hooks.datagen import DatagenHook
from tests._support import REPO
from tests._support.workers.s3 import EXPERIMENT, PIPELINE, items_for, process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUCKET = "datagen-bucket"
KEY_ID = "AKIADATAGENS3KEYID77"
SECRET = "dG9wLXNlY3JldC1kYXRhZ2VuLXMzLWtleQ-Zq8wXv2y"
SECRETS = (KEY_ID, SECRET)
WRITERS = [("w0", 12, "1"), ("w1", 12, "3"), ("w2", 12, "5"), ("w3", 12, "none")]
CRASHER = ("wk", 10, "2")


# moto's server (``python -m moto.server``) with one change: PutObject runs under a lock. moto checks
# ``If-None-Match: *`` and stores the object in two steps on a threaded server, so two racing
# conditional PUTs of one manifest could both succeed and Lance would lose a commit; AWS S3 makes the
# check and the write one atomic step, and the lock does too. (Serving every request serially instead
# deadlocks: Lance's client keeps idle connections open and a single-threaded server waits on them.)
_MOTO_ATOMIC_PUT = """
import sys, threading
from moto.s3.responses import S3Response
from moto.server import main
lock, put = threading.Lock(), S3Response.put_object
def put_object(self):
    with lock:
        return put(self)
S3Response.put_object = put_object
main(["-H", "127.0.0.1", "-p", sys.argv[1]])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    logs = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(logs, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _MOTO_ATOMIC_PUT, str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start: {logs.read_text()[-2000:]}") from None
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET, region_name="us-east-1"
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        proc.kill()  # by its own PID
        proc.wait(timeout=30)


def _options(endpoint: str) -> dict[str, Any]:
    return {
        "aws_endpoint": endpoint,
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_region": "us-east-1",
        "allow_http": True,
    }


def _conn(endpoint: str, bucket: str = BUCKET) -> str:
    return json.dumps(
        {"conn_type": "datagen", "host": f"s3://{bucket}/prefix", "extra": {"storage_options": _options(endpoint)}}
    )


def _env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AIRFLOW_CONN_DATAGEN_S3": _conn(endpoint),
            "AIRFLOW_CONN_DATAGEN_S3_BAD": _conn(endpoint, bucket="no-such-bucket"),
            "PYTHONPATH": str(REPO),
            "LANCE_LOG": "debug",
        }
    )
    return env


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests._support.workers.s3", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], captured: list[str], timeout: float = 240) -> tuple[int, dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    captured.extend([out, err])
    results = [json.loads(line[len("RESULT ") :]) for line in out.splitlines() if line.startswith("RESULT ")]
    return proc.returncode, results[-1] if results else {"no_result": err[-3000:]}


def _assert_no_secret(what: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a credential appears in {what}: ...{text[max(0, text.find(secret) - 200) :][:400]}"


def test_writers_crash_resume_and_maintenance_on_s3_never_leak_credentials(
    moto_endpoint: str, tmp_path: Path, airflow_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = _env(moto_endpoint)
    captured: list[str] = []
    stop = tmp_path / "stop"
    maint = _start(env, "maintain", "--conn", "datagen_s3", "--stop-file", str(stop))
    writers = [
        _start(env, "writer", "--conn", "datagen_s3", "--writer", w, "--items", str(n), "--checkpoint-every", ce)
        for w, n, ce in WRITERS
    ]
    w, n, ce = CRASHER
    crasher = _start(
        env,
        "writer",
        "--conn",
        "datagen_s3",
        "--writer",
        w,
        "--items",
        str(n),
        "--checkpoint-every",
        ce,
        "--kill-after",
        "2",
    )
    try:
        results = [_finish(p, captured) for p in writers]
        crash_code, crash = _finish(crasher, captured)
    finally:
        stop.touch()
    maint_code, maint_result = _finish(maint, captured)

    for code, res in results:
        assert code == 0, res
        assert res["report"]["failed"] == 0 and res["status"]["pending"] == 0, res
    assert crash_code == -9 and crash["killed_after"] == 2, crash
    assert maint_code == 0 and not maint_result["errors"], maint_result
    assert any(not r.get("skipped") for r in maint_result["runs"]), maint_result

    # the resume: the killed writer runs again and finishes only what it had not acknowledged
    code, resumed = _finish(
        _start(env, "writer", "--conn", "datagen_s3", "--writer", w, "--items", str(n), "--checkpoint-every", ce),
        captured,
    )
    assert code == 0, resumed
    acked_before = crash["rows"]
    assert resumed["report"]["skipped"] >= 1 and resumed["report"]["processed"] == n - resumed["report"]["skipped"]
    assert resumed["report"]["invocations"] == resumed["report"]["processed"]

    # final maintenance in this process, from the same connection
    os.environ["AIRFLOW_CONN_DATAGEN_S3"] = env["AIRFLOW_CONN_DATAGEN_S3"]
    try:
        hook = DatagenHook(datagen_conn_id="datagen_s3")
        log = hook.get_log(PIPELINE, EXPERIMENT)
        assert log.maintain()["skipped"] is False
        hook_repr = repr(hook)
    finally:
        del os.environ["AIRFLOW_CONN_DATAGEN_S3"]

    # nothing lost, nothing extra: the same work done locally by one writer has the same event ids
    local = CheckpointLog.open(tmp_path / "local", pipeline=PIPELINE, experiment=EXPERIMENT)
    for wid, count, _ in [*WRITERS, CRASHER]:
        run_items(local, items_for(wid, count), process, writer_id="solo", epoch=1)
    import lance

    s3_ids = lance.dataset(log.uri, storage_options=log.storage_options).to_table(columns=["event_id"])["event_id"]
    local_ids = lance.dataset(local.uri).to_table(columns=["event_id"])["event_id"]
    assert set(s3_ids.to_pylist()) == set(local_ids.to_pylist())
    appended = sum(r["rows"] for _, r in results) + acked_before + resumed["rows"]
    assert len(s3_ids) == appended  # every appended row is there once: no lost or doubled commit
    summary = log.summary()
    total = sum(c for _, c, _ in [*WRITERS, CRASHER])
    assert summary["completed"] == total and summary["pending"] == 0 and summary["fencing_violations"] == 0
    on_s3 = export_results(log, f"s3://{BUCKET}/exports/e1.lance", storage_options=log.storage_options)
    assert on_s3 == export_results(local, str(tmp_path / "local.lance"))
    # a Parquet export on the object store: the same fingerprint; unchanged, nothing is written again
    parquet = f"s3://{BUCKET}/exports/e1_parquet"
    on_s3_parquet = export_results(log, parquet, storage_options=log.storage_options, format="parquet")
    assert on_s3_parquet["fingerprint"] == on_s3["fingerprint"] and on_s3_parquet["rows"] == on_s3["rows"]
    assert not export_results(log, parquet, storage_options=log.storage_options, format="parquet")["changed"]
    from airflow_provider_datagen.core.export_files import read_files_export

    assert read_files_export(parquet, log.storage_options).num_rows == on_s3["rows"]

    # a wrong bucket: a clear DatagenError, naming the log and without the credentials
    with pytest.raises(DatagenError) as excinfo:
        bad = CheckpointLog.open(
            f"s3://no-such-bucket-{os.getpid()}/p", pipeline="p", experiment="e", storage_options=log.storage_options
        )
        run_items(bad, [{"id": 1}], process)
    bad_message = str(excinfo.value)
    assert f"no-such-bucket-{os.getpid()}" in bad_message

    # the UI, through Airflow's API server app, for this connection and for one with a wrong bucket
    code, ui = _finish(
        _start(
            env,
            "ui",
            "--conn",
            "datagen_s3",
            "--bad-conn",
            "datagen_s3_bad",
            "--passwords-file",
            str(tmp_path / "passwords.json"),
        ),
        captured,
    )
    assert code == 0, ui
    pages = ui["pages"]
    assert pages["/datagen/api/experiments"]["status"] == 200
    listed = json.loads(pages["/datagen/api/experiments"]["body"])
    assert PIPELINE in json.dumps(listed) and EXPERIMENT in json.dumps(listed)
    status = json.loads(pages[f"/datagen/api/experiments/{PIPELINE}/{EXPERIMENT}"]["body"])
    assert status["completed"] == total, status
    assert pages[f"/datagen/experiments/{PIPELINE}/{EXPERIMENT}/item?id=w0-1"]["status"] == 200
    assert pages[f"bad:/datagen/api/experiments/{PIPELINE}/{EXPERIMENT}"]["status"] >= 400

    # the grep: every output, XCom-like dict, repr, error and page
    for i, text in enumerate(captured):
        _assert_no_secret(f"captured process output #{i}", text)
    for _, res in results:
        _assert_no_secret("a writer's status/report dicts", json.dumps(res))
    _assert_no_secret("the hook's repr", hook_repr)
    _assert_no_secret("the log's repr", repr(log))
    _assert_no_secret("the summary", json.dumps(summary))
    _assert_no_secret("the wrong-bucket error", bad_message)
    for path, page in pages.items():
        _assert_no_secret(f"the UI page {path}", page["body"])
    assert "datagen_s3" in hook_repr and "'***'" in hook_repr
    with capsys.disabled():
        print(
            f"\nobject store: {len(WRITERS)} writers x {WRITERS[0][1]} items + 1 killed after 2 commits and resumed, "
            f"{len(s3_ids)} events, {len(maint_result['runs'])} maintenance runs, 0 credentials leaked"
        )


def test_a_missing_bucket_is_reported_as_such_not_as_a_damaged_log(moto_endpoint: str) -> None:
    """A wrong bucket in the connection is a configuration problem; restoring a backup would not fix it."""
    options = {k: str(v).lower() if isinstance(v, bool) else v for k, v in _options(moto_endpoint).items()}
    with pytest.raises(DatagenError) as excinfo:
        CheckpointLog.open("s3://no-such-bucket/p", pipeline="p", experiment="e", storage_options=options).states()
    message = str(excinfo.value)
    assert "no-such-bucket" in message
    assert "restore" not in message.lower(), message
    assert "bucket" in message.lower() and "connection" in message.lower(), message


def test_folds_are_remembered_and_stored_on_s3_and_a_log_written_again_is_never_mistaken_for_them(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store the fold's identity is the commit time its manifest records (no inode to stat)."""
    import boto3

    from airflow_provider_datagen.core import fold_table
    from tests._support.engine import light_events
    from tests.core.store.test_projection import ScanCount, _write

    options = {k: str(v).lower() if isinstance(v, bool) else v for k, v in _options(moto_endpoint).items()}

    def opened() -> CheckpointLog:
        return CheckpointLog.open(f"s3://{BUCKET}/memo", pipeline="p", experiment="e", storage_options=options)

    def folded(log: CheckpointLog) -> list[dict[str, Any]]:
        return fold_table(light_events(log)).sort_by("item_id").to_pylist()

    log = opened()
    _write(log, "w", [(op, n) for n in range(60) for op in ("create", "field", "done")])
    first = log.states()
    count = ScanCount(monkeypatch)
    assert log.states().equals(first) and count.calls == 0  # remembered: no scan of an unchanged log
    _write(log, "w", [(op, n) for n in range(60, 63) for op in ("create", "done")])
    after = log.states()
    assert 0 < count.rows < 20  # the 3 new items, not 186 events
    assert after.sort_by("item_id").to_pylist() == folded(log)

    assert log.refresh_projection(min_new_events=1)  # the planner's fold, stored as the projection
    count.rows = count.calls = 0
    mapped = opened()  # a mapped task: reads the projection, scans no event
    assert mapped.states().sort_by("item_id").to_pylist() == folded(log)
    assert count.rows == 0 and mapped.max_epoch() == log.max_epoch()

    # The same log deleted and written again: the same version numbers, another history.
    s3 = boto3.resource(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    s3.Bucket(BUCKET).objects.filter(Prefix="memo/").delete()
    other = opened()
    _write(other, "w", [(op, n) for n in range(60) for op in ("create", "fail")])
    _write(other, "w", [(op, n) for n in range(60, 63) for op in ("create", "fail")])
    assert other.version == log.table.opened.version
    log.table.close()  # as a new process at the same version numbers would open it
    assert log.states().sort_by("item_id").to_pylist() == folded(other)
    assert {r["status"] for r in log.states().to_pylist()} == {"running"}


def test_the_usage_projection_is_stored_and_read_on_s3(moto_endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    """``maintain()`` stores the usage projection beside the log on S3; a fresh object reads it and the tail."""
    from airflow_provider_datagen.core.fold.usage import empty_usage
    from airflow_provider_datagen.core.store import usage_projection
    from tests._support.engine import raw_events
    from tests.core.store.test_usage_projection import _expected, _land_again, _write

    options = {k: str(v).lower() if isinstance(v, bool) else v for k, v in _options(moto_endpoint).items()}

    def opened() -> CheckpointLog:
        return CheckpointLog.open(f"s3://{BUCKET}/usage", pipeline="p", experiment="e", storage_options=options)

    log = opened()
    created: set[int] = set()
    _write(log, "w1", [("done", n, n) for n in range(10)] + [("failed", 1, 2)], created)
    with caplog.at_level("WARNING", logger=usage_projection.__name__):
        assert opened().usage() == _expected(log) != empty_usage()  # no projection object yet: no warning
    assert caplog.records == []
    report = log.maintain()
    assert report["projected_usage_rows"] == 3  # one writer epoch, three models
    _write(log, "w2", [("done", 11, 3), ("transient", 12, 4)], created)
    _land_again(log, raw_events(log).slice(0, 6))  # a batch landing again after the projection
    stored = usage_projection.open_usage_projection(opened())
    assert stored is not None and stored.log_version == report["version"] < log.version
    assert opened().usage() == _expected(log)


def test_epochs_claimed_at_once_on_s3_are_distinct(moto_endpoint: str) -> None:
    """Issue 24 point 7 on an object store: claims go through a timed lease, not a conditional PUT."""
    import threading

    options = {k: str(v).lower() if isinstance(v, bool) else v for k, v in _options(moto_endpoint).items()}

    def opened() -> CheckpointLog:
        return CheckpointLog.open(f"s3://{BUCKET}/epochs", pipeline="p", experiment="e", storage_options=options)

    seed = opened()
    with seed.writer("seed", 3).batch() as b:
        b.item_created("seed", input_fingerprint="fp")
    barrier = threading.Barrier(3)
    claimed: list[int] = []
    errors: list[BaseException] = []

    def claim() -> None:
        log = opened()
        barrier.wait(60)
        try:
            claimed.extend(log.next_epoch() for _ in range(2))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors
    assert sorted(claimed) == [4, 5, 6, 7, 8, 9]  # distinct, each above the log's epoch 3
