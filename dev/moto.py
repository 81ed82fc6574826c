"""The moto server as an S3-compatible store on 127.0.0.1, started and stopped by PID.

``atomic_put=True`` runs moto with one change: PutObject runs under a lock. moto checks
``If-None-Match: *`` and stores the object in two steps on a threaded server, so two racing
conditional PUTs of one manifest could both succeed and Lance would lose a commit; AWS S3 makes the
check and the write one atomic step, and the lock does too. (Serving every request serially instead
deadlocks: Lance's client keeps idle connections open and a single-threaded server waits on them.)
Without it, moto behaves as shipped, which is what the lease tests want: the maintenance lease must
not depend on conditional PUTs.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from pathlib import Path

_SERVER = """
import sys, threading
from moto.server import main
if sys.argv[2] == "atomic":
    from moto.s3.responses import S3Response
    lock, put = threading.Lock(), S3Response.put_object
    def put_object(self):
        with lock:
            return put(self)
    S3Response.put_object = put_object
main(["-H", "127.0.0.1", "-p", sys.argv[1]])
"""

#: moto accepts any credentials; these are the stack's (never real ones).
ACCESS_KEY_ID = "AKIADATAGENMOTO00001"
SECRET_ACCESS_KEY = "datagen-moto-secret-not-a-real-key"
REGION = "us-east-1"


class MotoServer:
    """``python -m moto.server`` on a free loopback port; a context manager.

    :param log_path: the server's stdout and stderr.
    :param atomic_put: serialize PutObject (see the module docstring).
    :param buckets: buckets created once it is up.
    """

    def __init__(self, log_path: Path, *, atomic_put: bool = True, buckets: tuple[str, ...] = ()) -> None:
        self.log_path = log_path
        self.atomic_put = atomic_put
        self.buckets = buckets
        self.port = find_free_port()
        self.process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def storage_options(self) -> dict[str, str]:
        """Lance (object_store) storage options for this server."""
        return {
            "aws_endpoint": self.endpoint,
            "aws_access_key_id": ACCESS_KEY_ID,
            "aws_secret_access_key": SECRET_ACCESS_KEY,
            "aws_region": REGION,
            "allow_http": "true",
        }

    def start(self, timeout: float = 60.0) -> None:
        argv = [sys.executable, "-c", _SERVER, str(self.port), "atomic" if self.atomic_put else "plain"]
        self.process = start_process("moto", argv, env=_env(), log_path=self.log_path)
        deadline = time.monotonic() + timeout
        while not is_listening(self.port):
            if not self.process.alive() or time.monotonic() > deadline:
                self.stop()
                raise StackError(f"the moto server did not start:\n{tail(self.log_path)}")
            time.sleep(0.1)
        s3 = self.client("s3")
        for bucket in self.buckets:
            s3.create_bucket(Bucket=bucket)

    def client(self, service: str) -> Any:
        """A boto3 client of this server's ``service`` (``"s3"``, ``"iam"``), with the root credentials."""
        # Deferred: boto3 is a dev dependency, only the stack needs it.
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            region_name=REGION,
        )

    def stop(self) -> None:
        if self.process is not None:
            stop_processes([self.process], timeout=10)
            self.process = None

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _env() -> dict[str, str]:
    # The caller's AWS settings (a profile, real keys) have no business in a local fake store.
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
