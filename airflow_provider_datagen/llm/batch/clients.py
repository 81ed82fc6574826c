"""The batch clients of OpenAI and Anthropic (core/batch/protocol.py's ``BatchClient``) on the official sync SDKs.

:class:`OpenAIBatchClient` speaks OpenAI's Batch API (an uploaded JSONL file, ``/v1/chat/completions``
rows), :class:`AnthropicBatchClient` Anthropic's Message Batches (requests inline in the create call).
Airflow's common.ai has batch adapters too, but their custom_id is positional (``{key}-{index}``, parsed
back as an int); a batch run's custom_id derives from the item, so these clients take each
:class:`RequestLine`'s custom_id as given and hand every result row back under it.

The SDKs are imported when a client is built, so this module imports without them. A call the API
refuses (an HTTP 4xx other than 408/409/429: a bad input, an unknown batch) raises
:class:`BatchAPIError` naming the call; a transient failure (connection, 5xx, 429, after the SDK's own
retries) propagates as the SDK's error for the caller's retry policy.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.batch.protocol import BatchInfo, RowResult
from airflow_provider_datagen.exceptions import BatchAPIError, ConfigurationError, bad_argument

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from airflow_provider_datagen.core.batch.protocol import BatchClient, BatchState, RequestLine, RowOutcome

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'airflow-provider-datagen[llm]'"
_ENDPOINT = "/v1/chat/completions"
#: batches.list has no metadata filter: find() scans this many batches at most, newest first ...
_FIND_SCAN_LIMIT = 1000
#: ... and stops at the first one created this long before ``created_after`` (the clocks' slack)
_FIND_CLOCK_SLACK = 300.0
#: The metadata key recording which rows asked a ``json_schema`` answer ("all" or "some"): the output
#: file does not say, and a results() after a restart has only the batch to go by.
JSON_ROWS_KEY = "datagen_json_rows"
#: OpenAI's error codes for rows that never ran
_OPENAI_UNRUN = {"batch_expired": "expired", "batch_cancelled": "cancelled"}
_ANTHROPIC_OUTCOMES: dict[str, RowOutcome] = {"errored": "errored", "expired": "expired", "canceled": "cancelled"}
#: HTTP statuses the SDK raises that are not a refusal (a timeout, a conflict, a rate limit)
_TRANSIENT = {408, 409, 429}


def _json(value: Any) -> bytes:
    # Compact and UTF-8 as the SDKs send JSON: line_bytes() counts exactly what submit() sends.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _parsed(text: Any) -> Any:
    """A JSON text's value; a text that does not parse stays the text (the step's validation names it)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _asks_json(body: Mapping[str, Any]) -> bool:
    response_format = body.get("response_format")
    return isinstance(response_format, dict) and response_format.get("type") == "json_schema"


def _sdk(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError as exc:
        raise ConfigurationError(
            f"the batch API of provider {name!r} needs the {name} SDK, which is not installed ({exc}); "
            f"install it with {_INSTALL}"
        ) from exc


class _SDKClient:
    """What both clients share: the SDK client, its refusals as BatchAPIError, close()."""

    provider: str

    def __init__(self, sdk_name: str, client: Any, build: Callable[[Any], Any]) -> None:
        self._client = build(_sdk(sdk_name)) if client is None else client
        # With an injected client (a test double) the SDK may be absent: then no call is a refusal.
        self._status_error = _status_error(sdk_name)

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._status_error as exc:
            status = int(getattr(exc, "status_code", 0))
            if not 400 <= status < 500 or status in _TRANSIENT:
                raise
            raise BatchAPIError(
                f"{self.provider} refused {what}: HTTP {status} {getattr(exc, 'message', exc)}; fix what it names "
                "(a batch id from another account or provider, a request the API rejects) and run again"
            ) from exc

    def close(self) -> None:
        self._client.close()


def _status_error(sdk_name: str) -> type[Exception]:
    try:
        return __import__(sdk_name).APIStatusError
    except (ImportError, AttributeError):
        return _NeverRaised


class _NeverRaised(Exception):
    pass


def _client_kwargs(api_key: str | None, base_url: str | None) -> dict[str, str]:
    # None falls back to the SDK's own defaults (OPENAI_API_KEY / ANTHROPIC_API_KEY, the public URL).
    return {k: v for k, v in {"api_key": api_key, "base_url": base_url}.items() if v}


class OpenAIBatchClient(_SDKClient):
    """OpenAI's Batch API: each batch a JSONL file of ``/v1/chat/completions`` requests, with metadata.

    A :class:`RequestLine`'s body is the chat-completions request body. A row whose body asks a
    ``json_schema`` ``response_format`` gets its answer parsed from the JSON text; a tool call's answer
    is its parsed arguments.
    """

    provider = "openai"
    max_requests = 50_000
    max_bytes = 200_000_000
    supports_metadata = True

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *, client: Any = None) -> None:
        super().__init__("openai", client, lambda sdk: sdk.OpenAI(**_client_kwargs(api_key, base_url)))

    @staticmethod
    def _line(line: RequestLine) -> bytes:
        request = {"custom_id": line.custom_id, "method": "POST", "url": _ENDPOINT, "body": line.body}
        return _json(request) + b"\n"

    def line_bytes(self, line: RequestLine) -> int:
        """The bytes of ``line``'s JSONL line in the input file, its newline included."""
        return len(self._line(line))

    def submit(self, lines: Sequence[RequestLine], *, metadata: Mapping[str, str]) -> str:
        """Upload the JSONL of ``lines``, then create the batch of it with ``metadata``.

        ``metadata`` gains :data:`JSON_ROWS_KEY` when rows ask a ``json_schema`` answer.
        """
        payload = b"".join(self._line(line) for line in lines)
        json_rows = sum(1 for line in lines if _asks_json(line.body))
        stored = dict(metadata)
        if json_rows:
            stored[JSON_ROWS_KEY] = "all" if json_rows == len(lines) else "some"
        with self._call("the upload of a batch input file"):
            uploaded = self._client.files.create(file=(f"batch-{len(lines)}.jsonl", payload), purpose="batch")
        with self._call(f"the creation of a batch of file {uploaded.id}"):
            batch = self._client.batches.create(
                input_file_id=uploaded.id, endpoint=_ENDPOINT, completion_window="24h", metadata=stored
            )
        logger.info("openai batch %s submitted: %d requests, %d bytes", batch.id, len(lines), len(payload))
        return str(batch.id)

    def find(self, metadata: Mapping[str, str], *, created_after: float) -> str | None:
        """The newest batch whose metadata holds ``metadata``, scanning ``batches.list`` newest first."""
        oldest = created_after - _FIND_CLOCK_SLACK
        with self._call("the listing of batches"):
            for scanned, batch in enumerate(self._client.batches.list(limit=100)):
                if scanned >= _FIND_SCAN_LIMIT:
                    logger.warning("openai batch search stopped after %d batches: none matched %s", scanned, metadata)
                    return None
                if batch.created_at < oldest:
                    return None  # newest first: every later one is older still
                stored = batch.metadata or {}
                if all(stored.get(key) == value for key, value in metadata.items()):
                    return str(batch.id)
        return None

    def retrieve(self, batch_id: str) -> BatchInfo:
        with self._call(f"the retrieval of batch {batch_id}"):
            batch = self._client.batches.retrieve(batch_id)
        status = str(batch.status)
        state: BatchState = "in_progress"
        if status in ("completed", "expired", "cancelled"):
            state = "ended"  # an expired or cancelled batch's rows are readable too: the unrun in the error file
        elif status == "failed":
            state = "failed"
        counts: dict[str, int] = {}
        if batch.request_counts is not None:
            done, failed = batch.request_counts.completed, batch.request_counts.failed
            rest = max(0, batch.request_counts.total - done - failed)
            counts = {"succeeded": done, "errored": failed}
            # OpenAI counts only completed and failed rows: the rest of an expired/cancelled batch never ran.
            counts[{"expired": "expired", "cancelled": "cancelled"}.get(status, "processing")] = rest
        errors = getattr(batch.errors, "data", None) or []
        error = "; ".join(f"{e.code or 'error'}: {e.message or ''}".rstrip(": ") for e in errors) or None
        if state == "failed" and error is None:
            error = f"batch {batch_id} failed without a reason given"
        return BatchInfo(batch_id, state, status, counts, error if state == "failed" else None)

    def results(self, batch_id: str) -> Iterator[RowResult]:
        """The output file's rows, then the error file's, each streamed line by line."""
        with self._call(f"the retrieval of batch {batch_id}"):
            batch = self._client.batches.retrieve(batch_id)
        asks_json = self._json_rows(batch)
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                yield from self._file_rows(batch_id, file_id, asks_json)

    def _lines(self, file_id: str) -> Iterator[str]:
        # with_streaming_response streams the body; files.content() would read 200 MB whole first.
        with (
            self._call(f"the download of file {file_id}"),
            self._client.files.with_streaming_response.content(file_id) as response,
        ):
            yield from (line for line in response.iter_lines() if line.strip())

    def _json_rows(self, batch: Any) -> Callable[[str], bool]:
        """Which rows asked a ``json_schema`` answer, from :data:`JSON_ROWS_KEY` (and the input file for "some")."""
        marked = (batch.metadata or {}).get(JSON_ROWS_KEY)
        if marked != "some":
            return lambda _: marked == "all"
        ids: set[str] = set()
        for text in self._lines(batch.input_file_id):
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                request = json.loads(text)
                if _asks_json(request.get("body") or {}):
                    ids.add(str(request["custom_id"]))
        return ids.__contains__

    def _file_rows(self, batch_id: str, file_id: str, asks_json: Callable[[str], bool]) -> Iterator[RowResult]:
        for text in self._lines(file_id):
            try:
                yield _openai_row(json.loads(text), asks_json)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                # The provider serves the same line every time: skipping it leaves the row missing, and
                # the caller resubmits a missing row; failing here would fail the whole batch forever.
                logger.warning(
                    "openai batch %s: skipped a malformed line of file %s (%s): %.200s", batch_id, file_id, exc, text
                )

    def cancel(self, batch_id: str) -> None:
        with self._call(f"the cancellation of batch {batch_id}"):
            self._client.batches.cancel(batch_id)


def _openai_row(line: dict[str, Any], asks_json: Callable[[str], bool]) -> RowResult:
    custom_id = line["custom_id"]
    if not isinstance(custom_id, str):
        raise TypeError(f"custom_id {custom_id!r} is not a string")
    response = line.get("response") or {}
    body = response.get("body") or {}
    error = line.get("error")
    if error or response.get("status_code") != 200:
        detail = error if isinstance(error, dict) else body.get("error") or {}
        code = str(detail.get("code") or detail.get("type") or f"http_{response.get('status_code')}")
        outcome: RowOutcome = _OPENAI_UNRUN.get(code, "errored")  # type: ignore[assignment]
        message = detail.get("message") or "no message"
        return RowResult(custom_id, outcome, model=body.get("model"), error=f"{code}: {message}")
    message = body["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    if calls:
        answer = _parsed(calls[0]["function"]["arguments"])
    elif message.get("content") is None:
        answer = None  # a refusal, or a budget spent before any visible answer
    else:
        answer = _parsed(message["content"]) if asks_json(custom_id) else message["content"]
    usage = body.get("usage") or {}
    return RowResult(
        custom_id,
        "succeeded",
        answer,
        body.get("model"),
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        raw=json.dumps(body, sort_keys=True),
    )


class AnthropicBatchClient(_SDKClient):
    """Anthropic's Message Batches: the requests inline in the create call, each a message's ``params``.

    A structured answer is the first ``tool_use`` block's ``input`` (the step forces its tool); a
    plain answer is the text blocks joined.
    """

    provider = "anthropic"
    max_requests = 100_000
    max_bytes = 256_000_000
    supports_metadata = False

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *, client: Any = None) -> None:
        super().__init__("anthropic", client, lambda sdk: sdk.Anthropic(**_client_kwargs(api_key, base_url)))

    def line_bytes(self, line: RequestLine) -> int:
        """The bytes of ``line``'s ``{"custom_id", "params"}`` in the create call's body, its comma included."""
        return len(_json({"custom_id": line.custom_id, "params": line.body})) + 1

    def submit(self, lines: Sequence[RequestLine], *, metadata: Mapping[str, str]) -> str:
        """Create the batch; ``metadata`` is dropped (a message batch carries none)."""
        requests = [{"custom_id": line.custom_id, "params": line.body} for line in lines]
        with self._call(f"the creation of a message batch of {len(lines)} requests"):
            batch = self._client.messages.batches.create(requests=requests)
        logger.info("anthropic message batch %s submitted: %d requests", batch.id, len(lines))
        return str(batch.id)

    def find(self, metadata: Mapping[str, str], *, created_after: float) -> str | None:
        """Always None: a message batch carries no metadata to find it by (and the list cannot filter
        by custom_id), so a batch whose create answer was lost cannot be found again."""
        return None

    def retrieve(self, batch_id: str) -> BatchInfo:
        with self._call(f"the retrieval of message batch {batch_id}"):
            batch = self._client.messages.batches.retrieve(batch_id)
        status = str(batch.processing_status)
        counts = batch.request_counts
        return BatchInfo(
            batch_id,
            "ended" if status == "ended" else "in_progress",
            status,
            {
                "succeeded": counts.succeeded,
                "errored": counts.errored,
                "expired": counts.expired,
                "cancelled": counts.canceled,
                "processing": counts.processing,
            },
        )

    def results(self, batch_id: str) -> Iterator[RowResult]:
        """The result lines, streamed; each parsed here, so one malformed line is skipped alone."""
        with self._call(f"the results of message batch {batch_id}"):
            decoder = self._client.messages.batches.results(batch_id)
            # Its raw lines rather than its decoded items: the SDK's decoder ends at a line that is not JSON.
            lines: Iterable[str] = decoder.http_response.iter_lines()
            try:
                for text in lines:
                    if not text.strip():
                        continue
                    try:
                        yield _anthropic_row(json.loads(text))
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                        logger.warning(
                            "anthropic batch %s: skipped a malformed result (%s): %.200s", batch_id, exc, text
                        )
            finally:
                decoder.http_response.close()

    def cancel(self, batch_id: str) -> None:
        with self._call(f"the cancellation of message batch {batch_id}"):
            self._client.messages.batches.cancel(batch_id)


def _anthropic_row(line: dict[str, Any]) -> RowResult:
    custom_id, result = line["custom_id"], line["result"]
    if not isinstance(custom_id, str):
        raise TypeError(f"custom_id {custom_id!r} is not a string")
    kind = result["type"]
    if kind != "succeeded":
        outcome = _ANTHROPIC_OUTCOMES.get(kind)
        if outcome is None:
            raise ValueError(f"unknown result type {kind!r}")
        detail = (result.get("error") or {}).get("error") or {}
        error = f"{detail.get('type', kind)}: {detail.get('message') or f'the request was {kind} before it ran'}"
        return RowResult(custom_id, outcome, error=error)
    message = result["message"]
    blocks = [block for block in message.get("content") or [] if isinstance(block, dict)]
    tool = next((block for block in blocks if block.get("type") == "tool_use"), None)
    texts = [str(block.get("text", "")) for block in blocks if block.get("type") == "text"]
    answer = tool["input"] if tool is not None else "".join(texts) if texts else None
    usage = message.get("usage") or {}
    return RowResult(
        custom_id,
        "succeeded",
        answer,
        message.get("model"),
        int(usage.get("input_tokens") or 0),
        int(usage.get("output_tokens") or 0),
        raw=json.dumps(message, sort_keys=True),
    )


def row_of_reply(provider: str, custom_id: str, reply_json: str, *, asks_json: bool) -> RowResult:
    """The succeeded row a stored reply (the response store's ``reply_json``, from an online request or a
    batch row alike: the provider's completion or message) would have been in a batch's results."""
    reply = json.loads(reply_json)
    if provider == "anthropic":
        return _anthropic_row({"custom_id": custom_id, "result": {"type": "succeeded", "message": reply}})
    line = {"custom_id": custom_id, "response": {"status_code": 200, "body": reply}}
    return _openai_row(line, lambda _: asks_json)


_CLIENTS: dict[str, type[OpenAIBatchClient | AnthropicBatchClient]] = {
    "openai": OpenAIBatchClient,
    "anthropic": AnthropicBatchClient,
}


def client_for(provider: str, *, api_key: str | None, base_url: str | None) -> BatchClient:
    """The batch client of ``provider`` ("openai" or "anthropic")."""
    if provider not in _CLIENTS:
        raise bad_argument("client_for", "provider", provider, "has no batch API here", 'use "openai" or "anthropic"')
    return _CLIENTS[provider](api_key, base_url)
