"""The fake batch server's routes: each provider's requests read and its objects written, field for field.

:mod:`dev.batch_server` keeps the state (batches, files, counters) and the behaviour; this module maps
the SDKs' HTTP calls onto it and renders its batches as OpenAI ``batch`` and Anthropic
``message_batch`` objects, with the result lines each API documents. Errors carry both SDKs' shape
(``{"type": "error", "error": {"type", "message", ...}}``: each reads ``error.message``).
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from dev.batch_server import FakeBatchServer, Reply, Row, SubmittedBatch

#: Anthropic's rule for a custom_id; the fake refuses others as Anthropic would.
_ANTHROPIC_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_DAY = 24 * 3600


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message, "param": None, "code": None}}


def _not_found(what: str) -> Reply:
    return 404, error_body("not_found_error", f"No such {what}")


def _bad_request(message: str) -> Reply:
    return 400, error_body("invalid_request_error", message)


def _rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _jsonl(values: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(value).encode() + b"\n" for value in values)


def route(
    fake: FakeBatchServer,
    method: str,
    path: str,
    query: Mapping[str, str],
    content_type: str,
    read_body: Callable[[], bytes],
) -> Reply:
    """The (status, payload) answering ``method path``."""
    raw = read_body()
    for (route_method, pattern), endpoint in _ROUTES.items():
        match = re.fullmatch(pattern, path)
        if route_method == method and match:
            if pattern == "/v1/files":  # multipart; every other POST is JSON
                return _openai_upload(fake, content_type, raw)
            body = json.loads(raw) if raw.strip() else {}
            return endpoint(fake, body, query, *match.groups())
    return _not_found(f"route {method} {path}")


# ---- OpenAI ----------------------------------------------------------------------------------------


def _openai_upload(fake: FakeBatchServer, content_type: str, raw: bytes) -> Reply:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw
    )
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = str(part.get_param("name", header="content-disposition"))
        payload = part.get_payload(decode=True)
        fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    if "file" not in fields or fields.get("purpose", (None, b""))[1] != b"batch":
        return _bad_request("expected a multipart upload of 'file' with purpose=batch")
    filename, data = fields["file"]
    with fake.lock:
        file_id = fake.new_id("file-")
        fake.files[file_id] = (filename or "upload.jsonl", data, fake.clock())
        return 200, _openai_file(fake, file_id, "batch")


def _openai_file(fake: FakeBatchServer, file_id: str, purpose: str) -> dict[str, Any]:
    filename, data, created = fake.files[file_id]
    return {
        "id": file_id,
        "object": "file",
        "bytes": len(data),
        "created_at": int(created),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
    }


def _openai_file_get(fake: FakeBatchServer, body: Any, query: Any, file_id: str) -> Reply:
    with fake.lock:
        if file_id not in fake.files:
            return _not_found(f"file {file_id}")
        return 200, _openai_file(fake, file_id, "batch")


def _openai_file_content(fake: FakeBatchServer, body: Any, query: Any, file_id: str) -> Reply:
    with fake.lock:
        if file_id not in fake.files:
            return _not_found(f"file {file_id}")
        return 200, fake.files[file_id][1]


def _parse_input(data: bytes) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    """The (custom_id, body) requests of an input file, and what makes the file invalid (None: valid)."""
    requests: list[tuple[str, dict[str, Any]]] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            requests.append((str(request["custom_id"]), dict(request["body"])))
        except (ValueError, KeyError, TypeError):
            return requests, f"line {number} is not a request of custom_id, method, url and body"
        if request.get("url") != "/v1/chat/completions" or request.get("method") != "POST":
            return requests, f"line {number}: expected POST /v1/chat/completions"
    if len({custom_id for custom_id, _ in requests}) != len(requests):
        return requests, "the input file repeats a custom_id"
    return requests, None


def _openai_create(fake: FakeBatchServer, body: dict[str, Any], query: Any) -> Reply:
    file_id = body.get("input_file_id")
    if body.get("endpoint") != "/v1/chat/completions" or body.get("completion_window") != "24h":
        return _bad_request("the fake serves endpoint=/v1/chat/completions, completion_window=24h")
    with fake.lock:
        if file_id not in fake.files:
            return _not_found(f"file {file_id}")
        requests, invalid = _parse_input(fake.files[file_id][1])
        # The real API fails a batch of an invalid file in its validation, after create.
        batch = fake.register("openai", requests, body.get("metadata") or {}, file_id, failed=invalid)
        reply = openai_batch(batch)
    fake.delay_create()
    return 200, reply


def openai_status(batch: SubmittedBatch) -> str:
    if batch.failed is not None:
        return "failed"
    if batch.ended_at is not None:
        if batch.cancel_requested_at is not None:
            return "cancelled"
        return "expired" if batch.count("expired") else "completed"
    if batch.cancel_requested_at is not None:
        return "cancelling"
    return "validating" if batch.polls == 0 else "in_progress"


def openai_batch(batch: SubmittedBatch) -> dict[str, Any]:
    status = openai_status(batch)
    ended = int(batch.ended_at) if batch.ended_at is not None else None
    errors = None
    if batch.failed is not None:
        errors = {"object": "list", "data": [{"code": "invalid_request", "message": batch.failed, "line": None}]}
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": "24h",
        "status": status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": int(batch.created_at) if batch.polls and batch.failed is None else None,
        "expires_at": int(batch.created_at) + _DAY,
        "finalizing_at": ended if status in ("completed", "expired") else None,
        "completed_at": ended if status == "completed" else None,
        "failed_at": ended if status == "failed" else None,
        "expired_at": ended if status == "expired" else None,
        "cancelling_at": int(batch.cancel_requested_at) if batch.cancel_requested_at is not None else None,
        "cancelled_at": ended if status == "cancelled" else None,
        "request_counts": {
            "total": 0 if batch.failed is not None else batch.row_count,
            "completed": batch.count("succeeded"),
            "failed": batch.count("errored"),
        },
        "metadata": batch.metadata or None,
    }


def _openai_line(fake: FakeBatchServer, row: Row) -> dict[str, Any]:
    line: dict[str, Any] = {"id": fake.new_id("batch_req_"), "custom_id": row.custom_id, "error": None}
    if row.outcome == "succeeded":
        line["response"] = {"status_code": 200, "request_id": fake.new_id("req_"), "body": row.response}
    elif row.outcome == "errored":
        error = {"message": "fake row error", "type": "server_error", "param": None, "code": "server_error"}
        line["response"] = {"status_code": 500, "request_id": fake.new_id("req_"), "body": {"error": error}}
    else:
        why = "could not be executed before the completion window expired"
        if row.outcome == "cancelled":
            why = "was not executed because the batch was cancelled"
        line["response"] = None
        line["error"] = {"code": f"batch_{row.outcome}", "message": f"This request {why}."}
    return line


def write_openai_files(fake: FakeBatchServer, batch: SubmittedBatch) -> None:
    """The output file (succeeded rows) and the error file (the others) of an ended batch, if not empty."""
    rows = fake.result_order(batch, batch.rows)
    succeeded = [_openai_line(fake, row) for row in rows if row.outcome == "succeeded"]
    others = [_openai_line(fake, row) for row in rows if row.outcome != "succeeded"]
    for lines, attribute in ((succeeded, "output_file_id"), (others, "error_file_id")):
        if lines:
            file_id = fake.new_id("file-")
            fake.files[file_id] = (f"{batch.id}_{attribute[:-8]}.jsonl", _jsonl(lines), fake.clock())
            setattr(batch, attribute, file_id)


def _openai_retrieve(fake: FakeBatchServer, body: Any, query: Any, batch_id: str) -> Reply:
    batch = fake.batch(batch_id)
    if batch is None or batch.provider != "openai":
        return _not_found(f"batch {batch_id}")
    fake.poll(batch)
    with fake.lock:
        return 200, openai_batch(batch)


def _cancel(provider: str, render: Callable[[FakeBatchServer, SubmittedBatch], Any]) -> Callable[..., Reply]:
    def cancel(fake: FakeBatchServer, body: Any, query: Any, batch_id: str) -> Reply:
        batch = fake.batch(batch_id)
        if batch is None or batch.provider != provider:
            return _not_found(f"batch {batch_id}")
        fake.cancel(batch)
        with fake.lock:
            return 200, render(fake, batch)

    return cancel


def _page(
    fake: FakeBatchServer, provider: str, query: Mapping[str, str], after_key: str
) -> tuple[list[SubmittedBatch], bool]:
    """A page of the provider's batches, newest first, after the id ``query[after_key]`` names."""
    with fake.lock:
        newest_first = [b for b in reversed(fake.batches) if b.provider == provider]
    ids = [b.id for b in newest_first]
    limit = max(1, min(int(query.get("limit") or 20), 1000))
    start = ids.index(query[after_key]) + 1 if query.get(after_key) in ids else 0
    end = start + limit
    if query.get("before_id") in ids:  # Anthropic's backwards page: the newer batches just before it
        end = ids.index(query["before_id"])
        start = max(0, end - limit)
    return newest_first[start:end], end < len(ids)


def _openai_list(fake: FakeBatchServer, body: Any, query: Mapping[str, str]) -> Reply:
    page, more = _page(fake, "openai", query, "after")
    with fake.lock:
        data = [openai_batch(b) for b in page]
    first, last = (page[0].id, page[-1].id) if page else (None, None)
    return 200, {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}


# ---- Anthropic -------------------------------------------------------------------------------------


def anthropic_batch(fake: FakeBatchServer, batch: SubmittedBatch) -> dict[str, Any]:
    ended = batch.ended_at is not None
    status = "ended" if ended else "canceling" if batch.cancel_requested_at is not None else "in_progress"
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": {
            "processing": batch.count(None),
            "succeeded": batch.count("succeeded"),
            "errored": batch.count("errored"),
            "canceled": batch.count("cancelled"),
            "expired": batch.count("expired"),
        },
        "created_at": _rfc3339(batch.created_at),
        "expires_at": _rfc3339(batch.created_at + _DAY),
        "ended_at": _rfc3339(batch.ended_at),
        "cancel_initiated_at": _rfc3339(batch.cancel_requested_at),
        "archived_at": None,
        "results_url": f"{fake.anthropic_base_url}/v1/messages/batches/{batch.id}/results" if ended else None,
    }


def _anthropic_create(fake: FakeBatchServer, body: dict[str, Any], query: Any) -> Reply:
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        return _bad_request("requests: expected a non-empty list of {custom_id, params}")
    pairs: list[tuple[str, dict[str, Any]]] = []
    for number, request in enumerate(requests):
        custom_id = request.get("custom_id") if isinstance(request, dict) else None
        if not isinstance(custom_id, str) or not _ANTHROPIC_CUSTOM_ID.match(custom_id):
            return _bad_request(f"requests.{number}.custom_id: expected ^[a-zA-Z0-9_-]{{1,64}}$, got {custom_id!r}")
        if not isinstance(request.get("params"), dict):
            return _bad_request(f"requests.{number}.params: expected an object")
        pairs.append((custom_id, request["params"]))
    if len({custom_id for custom_id, _ in pairs}) != len(pairs):
        return _bad_request("requests: custom_id values must be unique within a batch")
    with fake.lock:
        batch = fake.register("anthropic", pairs, {})
        if batch.failed is not None:  # Anthropic refuses a bad batch at create; it never exists
            fake.batches.remove(batch)
            return _bad_request(batch.failed)
        reply = anthropic_batch(fake, batch)
    fake.delay_create()
    return 200, reply


def _anthropic_retrieve(fake: FakeBatchServer, body: Any, query: Any, batch_id: str) -> Reply:
    batch = fake.batch(batch_id)
    if batch is None or batch.provider != "anthropic":
        return _not_found(f"message batch {batch_id}")
    fake.poll(batch)
    with fake.lock:
        return 200, anthropic_batch(fake, batch)


def _anthropic_result(row: Row) -> dict[str, Any]:
    if row.outcome == "succeeded":
        return {"type": "succeeded", "message": row.response}
    if row.outcome == "errored":
        return {
            "type": "errored",
            "error": {"type": "error", "error": error_body("api_error", "fake row error")["error"]},
        }
    return {"type": "canceled" if row.outcome == "cancelled" else "expired"}


def _anthropic_results(fake: FakeBatchServer, body: Any, query: Any, batch_id: str) -> Reply:
    batch = fake.batch(batch_id)
    if batch is None or batch.provider != "anthropic":
        return _not_found(f"message batch {batch_id}")
    with fake.lock:
        if batch.ended_at is None:
            return _bad_request(f"message batch {batch_id} is still in progress")
        rows = fake.result_order(batch, batch.rows)
        return 200, _jsonl([{"custom_id": row.custom_id, "result": _anthropic_result(row)} for row in rows])


def _anthropic_list(fake: FakeBatchServer, body: Any, query: Mapping[str, str]) -> Reply:
    page, more = _page(fake, "anthropic", query, "after_id")
    with fake.lock:
        data = [anthropic_batch(fake, b) for b in page]
    first, last = (page[0].id, page[-1].id) if page else (None, None)
    return 200, {"data": data, "first_id": first, "last_id": last, "has_more": more}


# ---- online and the fake's own ---------------------------------------------------------------------


def _online(provider: Any) -> Callable[..., Reply]:
    def online(fake: FakeBatchServer, body: dict[str, Any], query: Any) -> Reply:
        with fake.lock:
            fake.online_requests += 1
        return 200, fake.respond(provider, body)

    return online


def _state(fake: FakeBatchServer, body: Any, query: Any) -> Reply:
    return 200, fake.snapshot()


def _config(fake: FakeBatchServer, body: dict[str, Any], query: Any) -> Reply:
    with fake.lock:
        fake.configure(body)
    return 200, {"ok": True}


_ROUTES: dict[tuple[str, str], Callable[..., Reply]] = {
    ("POST", "/v1/files"): _openai_upload,
    ("GET", "/v1/files/([^/]+)"): _openai_file_get,
    ("GET", "/v1/files/([^/]+)/content"): _openai_file_content,
    ("POST", "/v1/batches"): _openai_create,
    ("GET", "/v1/batches"): _openai_list,
    ("GET", "/v1/batches/([^/]+)"): _openai_retrieve,
    ("POST", "/v1/batches/([^/]+)/cancel"): _cancel("openai", lambda fake, batch: openai_batch(batch)),
    ("POST", "/v1/messages/batches"): _anthropic_create,
    ("GET", "/v1/messages/batches"): _anthropic_list,
    ("GET", "/v1/messages/batches/([^/]+)"): _anthropic_retrieve,
    ("GET", "/v1/messages/batches/([^/]+)/results"): _anthropic_results,
    ("POST", "/v1/messages/batches/([^/]+)/cancel"): _cancel("anthropic", anthropic_batch),
    ("POST", "/v1/chat/completions"): _online("openai"),
    ("POST", "/v1/messages"): _online("anthropic"),
    ("GET", "/_fake/state"): _state,
    ("POST", "/_fake/config"): _config,
}
