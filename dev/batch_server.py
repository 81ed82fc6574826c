"""A fake of OpenAI's Batch API and Anthropic's Message Batches API on 127.0.0.1, for tests and benchmarks.

It speaks the routes the official SDKs call (``openai.OpenAI`` at :attr:`FakeBatchServer.base_url`,
``anthropic.Anthropic`` at :attr:`FakeBatchServer.anthropic_base_url`): OpenAI's files and batches,
Anthropic's message batches and their results, and the two online endpoints (``/v1/chat/completions``,
``/v1/messages``) answering exactly what a batch row of the same body answers (:mod:`dev.batch_answers`).

A test steers it through attributes: ``answer``, the ``errored``/``expired`` predicates of a row's
custom_id, ``shuffle_results``, ``complete_after_polls`` (rows finish in order as the batch is
retrieved; it ends on that retrieve, or at create for 0), ``create_delay`` (the create call sleeps
after registering the batch, so a client killed inside it leaves the batch behind), ``fail_batch``
and ``clock``; and reads what it saw: ``batches``, ``creates``, ``online_requests`` and
``requests_per_custom_id_base`` (each row counted at submission under its custom_id less the last
``-<suffix>``: a resubmitted row has another suffix, the same base).

``python -m dev.batch_server --port-file PATH`` runs it as a process of its own (so a test can SIGKILL
a client while the server lives on); ``GET /_fake/state`` and ``POST /_fake/config`` read and steer
it there (:mod:`dev.batch_server_process`). State is in memory: it lives as long as the server.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import itertools
import json
import logging
import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlsplit

from dev import batch_api
from dev.batch_answers import anthropic_message, default_answer, openai_completion

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

Provider = Literal["openai", "anthropic"]
Reply = tuple[int, Any]  # (HTTP status, a JSON value or the bytes of a JSONL body)


@dataclass
class Row:
    """One request of a batch; ``outcome`` and ``response`` are set once it has run."""

    custom_id: str
    body: dict[str, Any]
    #: succeeded / errored / expired / cancelled; None while it has not run
    outcome: str | None = None
    #: the chat.completion (OpenAI) or message (Anthropic) of a succeeded row
    response: dict[str, Any] | None = None


@dataclass
class SubmittedBatch:
    """A batch the server was given, and where it is now."""

    id: str
    provider: Provider
    rows: list[Row]
    metadata: dict[str, str]
    created_at: float
    input_file_id: str | None = None
    #: how many times the batch was retrieved
    polls: int = 0
    cancel_requested_at: float | None = None
    ended_at: float | None = None
    #: the message of a batch that failed as a whole
    failed: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None

    @property
    def row_count(self) -> int:
        return len(self.rows)

    @property
    def custom_ids(self) -> list[str]:
        return [row.custom_id for row in self.rows]

    def count(self, outcome: str | None) -> int:
        return sum(1 for row in self.rows if row.outcome == outcome)


def custom_id_base(custom_id: str) -> str:
    """The custom_id without its last ``-<suffix>`` (the submission's), naming the item."""
    return custom_id.rsplit("-", 1)[0]


def _never(_: Any) -> bool:
    return False


def _no_failure(_: SubmittedBatch) -> str | None:
    return None


@dataclass
class FakeBatchServer:
    """The fake's behaviour, state and HTTP server; :meth:`start` serves it, :meth:`stop` ends it."""

    answer: Callable[[dict[str, Any]], str | dict[str, Any]] = default_answer
    errored: Callable[[str], bool] = _never
    expired: Callable[[str], bool] = _never
    shuffle_results: bool = False
    seed: int = 0
    complete_after_polls: int = 0
    create_delay: float = 0.0
    #: the message a whole batch fails with (None: it runs)
    fail_batch: Callable[[SubmittedBatch], str | None] = _no_failure
    #: epoch seconds now (a test moves it back to create a batch "long ago")
    clock: Callable[[], float] = time.time
    host: str = "127.0.0.1"
    port: int = 0
    batches: list[SubmittedBatch] = field(default_factory=list)
    requests_per_custom_id_base: collections.Counter[str] = field(default_factory=collections.Counter)
    creates: int = 0
    online_requests: int = 0
    #: uploaded and result files: id -> (filename, bytes, created_at)
    files: dict[str, tuple[str, bytes, float]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeBatchServer:
        """Serve on ``host:port`` (a free port for 0) in a daemon thread."""
        self._server = _Server((self.host, self.port), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-batch", daemon=True
        )
        self._thread.start()
        logger.info("fake batch server on %s:%d", self.host, self.port)
        return self

    def stop(self) -> None:
        """End pending create delays, stop serving and close the socket."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeBatchServer:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def anthropic_base_url(self) -> str:
        """The Anthropic SDK's ``base_url`` (it appends ``/v1/...`` itself)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's ``base_url``."""
        return f"{self.anthropic_base_url}/v1"

    def batch(self, batch_id: str) -> SubmittedBatch | None:
        with self.lock:
            return next((b for b in self.batches if b.id == batch_id), None)

    def new_id(self, prefix: str) -> str:
        # A sequence number first: ids sort in creation order; the pid keeps two servers' ids apart.
        return f"{prefix}{next(self._ids):08d}{os.getpid():x}"

    # ---- the batches' life -----------------------------------------------------------------------

    def register(
        self,
        provider: Provider,
        requests: list[tuple[str, dict[str, Any]]],
        metadata: dict[str, str],
        input_file_id: str | None = None,
        *,
        failed: str | None = None,
    ) -> SubmittedBatch:
        """Record a batch of (custom_id, body) requests, counting its rows; run at once for
        ``complete_after_polls == 0``. ``failed``: why its input is invalid (it fails as a whole)."""
        rows = [Row(custom_id, body) for custom_id, body in requests]
        with self.lock:
            batch = SubmittedBatch(
                self.new_id("batch_" if provider == "openai" else "msgbatch_"),
                provider,
                rows,
                dict(metadata),
                self.clock(),
                input_file_id,
            )
            self.batches.append(batch)
            self.creates += 1
            self.requests_per_custom_id_base.update(custom_id_base(row.custom_id) for row in rows)
            batch.failed = failed if failed is not None else self.fail_batch(batch)
            if batch.failed is not None:
                batch.ended_at = self.clock()
            elif self.complete_after_polls <= 0:
                self._finish_rows(batch, len(rows))
            return batch

    def delay_create(self) -> None:
        """The create call's sleep between registering its batch and answering (ended by :meth:`stop`)."""
        if self.create_delay > 0:
            self._stopping.wait(self.create_delay)

    def poll(self, batch: SubmittedBatch) -> None:
        """One retrieve of ``batch``: a requested cancel takes effect, or more of its rows run."""
        with self.lock:
            batch.polls += 1
            if batch.ended_at is not None:
                return
            if batch.cancel_requested_at is not None:
                self._end(batch)
                return
            target = len(batch.rows) * batch.polls // max(1, self.complete_after_polls)
            self._finish_rows(batch, min(target, len(batch.rows)))

    def cancel(self, batch: SubmittedBatch) -> None:
        """Ask to cancel: the next retrieve ends the batch with its rows that have not run cancelled."""
        with self.lock:
            if batch.ended_at is None and batch.cancel_requested_at is None:
                batch.cancel_requested_at = self.clock()

    def _finish_rows(self, batch: SubmittedBatch, upto: int) -> None:
        for row in batch.rows[:upto]:
            if row.outcome is not None:
                continue
            if self.expired(row.custom_id):
                row.outcome = "expired"
            elif self.errored(row.custom_id):
                row.outcome = "errored"
            else:
                row.outcome = "succeeded"
                row.response = self.respond(batch.provider, row.body)
        if upto >= len(batch.rows):
            self._end(batch)

    def _end(self, batch: SubmittedBatch) -> None:
        for row in batch.rows:
            if row.outcome is None:
                row.outcome = "cancelled"
        batch.ended_at = self.clock()
        if batch.provider == "openai":
            batch_api.write_openai_files(self, batch)

    def respond(self, provider: Provider, body: dict[str, Any]) -> dict[str, Any]:
        """What the model answers ``body`` (a chat.completion or a message), as online and in a batch."""
        answer = self.answer(body)
        # The ids too are the body's: an online answer equals the batch row's of the same body, field for field.
        answer_id = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
        if provider == "openai":
            return openai_completion(body, answer, answer_id)
        return anthropic_message(body, answer, answer_id)

    def result_order(self, batch: SubmittedBatch, rows: list[Row]) -> list[Row]:
        """``rows`` in the order the results list them: as submitted, or seeded-shuffled."""
        if not self.shuffle_results:
            return rows
        shuffled = list(rows)
        random.Random(f"{self.seed}:{batch.id}").shuffle(shuffled)
        return shuffled

    def snapshot(self) -> dict[str, Any]:
        """What the server saw, as JSON (``GET /_fake/state``)."""
        with self.lock:
            return {
                "creates": self.creates,
                "online_requests": self.online_requests,
                "requests_per_custom_id_base": dict(self.requests_per_custom_id_base),
                "batches": [
                    {
                        "id": b.id,
                        "provider": b.provider,
                        "metadata": b.metadata,
                        "row_count": b.row_count,
                        "custom_ids": b.custom_ids,
                        "ended": b.ended_at is not None,
                        "cancelled": b.cancel_requested_at is not None,
                    }
                    for b in self.batches
                ],
            }

    def configure(self, settings: dict[str, Any]) -> None:
        """Set the behaviour a process form takes as JSON (``POST /_fake/config``, the CLI flags)."""
        for name in ("complete_after_polls", "create_delay", "shuffle_results", "seed"):
            if settings.get(name) is not None:
                setattr(self, name, type(getattr(self, name))(settings[name]))
        for name in ("errored", "expired"):
            pattern = settings.get(f"{name}_regex")
            if pattern is not None:
                setattr(self, name, re.compile(pattern).search if pattern else _never)


class _Server(ThreadingHTTPServer):
    #: a burst of concurrent clients (a benchmark) overflows http.server's backlog of 5
    request_queue_size = 128


def _handler(fake: FakeBatchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the SDKs keep their connections open
        #: a reply's headers and body go out as two writes; Nagle would hold the second for the ACK
        disable_nagle_algorithm = True

        def _read_body(self) -> bytes:
            if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(chunks)

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                status, payload = batch_api.route(
                    fake, method, url.path.rstrip("/"), query, self.headers.get("Content-Type") or "", self._read_body
                )
            except Exception as exc:  # a bug of the fake: answer it rather than hang the client
                logger.exception("fake batch server: %s %s failed", method, self.path)
                status, payload = 500, batch_api.error_body("api_error", f"fake server error: {exc}")
            if isinstance(payload, bytes):
                data, content_type = payload, "application/octet-stream"
            else:
                data, content_type = json.dumps(payload).encode(), "application/json"
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client went away
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("fake batch server: " + format, *args)

    return Handler


@contextlib.contextmanager
def serving(**behaviour: Any) -> Iterator[FakeBatchServer]:
    """A started :class:`FakeBatchServer` with ``behaviour`` (its attributes), stopped on exit."""
    fake = FakeBatchServer(**behaviour).start()
    try:
        yield fake
    finally:
        fake.stop()


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT, the port written to ``--port-file`` once listening."""
    parser = argparse.ArgumentParser(prog="python -m dev.batch_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", type=Path, required=True, help="written with the port once listening")
    parser.add_argument("--state-dir", type=Path, help="state.json (what the server saw) is written here on stop")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--complete-after-polls", type=int, default=0)
    parser.add_argument("--create-delay", type=float, default=0.0)
    parser.add_argument("--shuffle-results", action="store_true")
    parser.add_argument("--errored-regex", help="rows whose custom_id matches error")
    parser.add_argument("--expired-regex", help="rows whose custom_id matches expire")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fake = FakeBatchServer(port=args.port)
    fake.configure({k: v for k, v in vars(args).items() if k not in ("port_file", "state_dir", "port")})
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    fake.start()
    # Written whole under another name and renamed: a reader never sees a partial port.
    partial = args.port_file.with_name(args.port_file.name + ".partial")
    partial.write_text(str(fake.port))
    partial.replace(args.port_file)
    stopping.wait()
    fake.stop()
    if args.state_dir is not None:
        args.state_dir.mkdir(parents=True, exist_ok=True)
        (args.state_dir / "state.json").write_text(json.dumps(fake.snapshot()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
