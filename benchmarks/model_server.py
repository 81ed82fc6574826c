"""A fast OpenAI-compatible chat-completions server on 127.0.0.1 for ``make bench --only model_step``.

Run in a process of its own (``python -m benchmarks.model_server --delay 0.1``): it prints its port on
the first line of stdout and answers ``POST .../chat/completions`` after ``delay`` seconds, on
keep-alive HTTP/1.1 connections, with a raw asyncio protocol (no framework: the server must cost far
less per request than the clients it measures). The answer follows the request: a call of the first
tool when the request offers tools (pydantic-ai's structured output), the JSON of the response
format's schema when it asks for one, else a short text. Structured answers fill each property of
the schema with a value of its type.

``--rate-limited`` answers that share of first attempts (a prompt seen for the first time, chosen by
its hash: the same prompts in every run) with 429 and ``Retry-After: 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from typing import Any

_HEAD_END = b"\r\n\r\n"


def _value(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "integer":
        return 2
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if kind == "array":
        return [_value(schema.get("items") or {"type": "string"})]
    if kind == "object":
        return {k: _value(v) for k, v in (schema.get("properties") or {}).items()}
    return "bonjour"


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion the server sends for ``body`` (a parsed request)."""
    tools = body.get("tools") or []
    fmt = body.get("response_format") or {}
    message: dict[str, Any]
    if tools:
        fn = tools[0].get("function", {})
        args = json.dumps(_value(fn.get("parameters") or {}))
        call = {"id": "call_1", "type": "function", "function": {"name": fn.get("name"), "arguments": args}}
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    elif fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        message, finish = {"role": "assistant", "content": json.dumps(_value(schema))}, "stop"
    else:
        message, finish = {"role": "assistant", "content": "bonjour"}, "stop"
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body.get("model", "bench"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }


class ChatServer(asyncio.Protocol):
    """One connection: requests parsed as they arrive, each answered ``delay`` seconds later, in order."""

    def __init__(self, delay: float, limited: float, seen: set[bytes]) -> None:
        self.delay = delay
        self.limited = limited
        self.seen = seen
        self.buf = b""
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport instances
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(_HEAD_END)
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            raw = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.loop.call_later(self.delay, self._reply, raw)

    def _reply(self, raw: bytes) -> None:
        if self.transport is None:
            return
        if self.limited:
            digest = hashlib.blake2b(raw, digest_size=8).digest()
            first = digest not in self.seen
            self.seen.add(digest)
            if first and int.from_bytes(digest, "big") % 10_000 < self.limited * 10_000:
                err = b'{"error": {"message": "rate limited", "type": "rate_limit_error", "code": "rate_limited"}}'
                self._send(b"429 Too Many Requests", err, b"Retry-After: 1\r\n")
                return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self._send(b"400 Bad Request", b'{"error": {"message": "not JSON"}}')
            return
        self._send(b"200 OK", json.dumps(answer(body)).encode())

    def _send(self, status: bytes, payload: bytes, extra: bytes = b"") -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 "
            + status
            + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(payload)).encode()
            + b"\r\n"
            + extra
            + b"\r\n"
            + payload
        )


async def serve(delay: float, limited: float) -> None:
    loop = asyncio.get_running_loop()
    seen: set[bytes] = set()
    server = await loop.create_server(lambda: ChatServer(delay, limited, seen), "127.0.0.1", 0, backlog=2048)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model_server")
    parser.add_argument("--delay", type=float, default=0.1, help="seconds before each answer")
    parser.add_argument("--rate-limited", type=float, default=0.0, help="share of first attempts answered 429")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.delay, args.rate_limited))
    except ImportError:
        asyncio.run(serve(args.delay, args.rate_limited))
    return 0


if __name__ == "__main__":
    sys.exit(main())
