"""A small OpenAI-compatible chat-completions server on 127.0.0.1, for the model step's HTTP tests.

``POST /v1/chat/completions`` answers by the last user message:

- containing ``[429]``: HTTP 429 with ``Retry-After: <retry_after>`` and OpenAI's error body;
- containing ``[http NNN]``: HTTP NNN with OpenAI's error body (e.g. 400, 503);
- containing ``[NNN once]`` (e.g. ``[429 once]``, ``[500 once]``): that status for the first request
  of the prompt, the normal answer after;
- containing ``[invalid once]``: for the first request of the prompt, a ``final_result`` call with
  ``{}`` (an answer that fails validation, which pydantic-ai sends back to the model);
- containing ``[slow]``: the normal answer after ``slow_seconds`` (ended early by :meth:`stop`);
- otherwise a completion with ``usage``. Its content is ``"echo: <message>"``, or, when the request
  offers the ``final_result`` output tool (pydantic-ai's structured output), a call of that tool
  with ``tool_args`` (JSON), or, when it asks for a ``json_schema`` response format (the sdk
  engine's structured output), ``tool_args`` as the content's JSON (``{}`` for ``[invalid once]``).

``POST /v1/messages`` (base URL :attr:`FakeOpenAI.anthropic_url`) answers Anthropic's Messages API the
same way: the markers above, Anthropic's error bodies, a ``text`` block ``"echo: <message>"`` or a
``tool_use`` block of the forced ``final_result`` tool with ``tool_args``. Its :attr:`Request.usage`
is recorded in OpenAI's names (``prompt_tokens``, ...), so tests compare either API the same way.

Usage is deterministic and recorded per request in :attr:`FakeOpenAI.requests` (with what was sent and
its arrival time), so a test compares what the client recorded with what the server said;
``on_arrival`` is called as each request arrives, before it is answered. Runs in a thread of the
test process; :meth:`stop` ends it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass
class Request:
    """One request the server answered: its body and the status and usage it answered with."""

    body: dict[str, Any]
    status: int | None = None  # None while a slow answer is pending
    #: ``time.monotonic()`` when it arrived
    at: float = field(default_factory=time.monotonic)
    usage: dict[str, int] | None = None

    @property
    def text(self) -> str:
        """The last user message of the request."""
        return _last_user_text(self.body)


@dataclass
class FakeOpenAI:
    """The server's behaviour and what it saw; :func:`start` runs one."""

    retry_after: int = 7
    slow_seconds: float = 30.0
    tool_args: dict[str, Any] = field(default_factory=dict)
    #: False: a server without the json_schema response format (vLLM, Ollama and LiteLLM builds have
    #: lacked it), which answers such a request 400 naming response_format
    json_schema: bool = True
    requests: list[Request] = field(default_factory=list)
    on_arrival: Callable[[Request], None] | None = None
    #: prompts seen with a "[... once]" marker: the first request of each got its failure
    _throttled_once: set[str] = field(default_factory=set)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"{self.anthropic_url}/v1"

    @property
    def anthropic_url(self) -> str:
        """The base URL of the Anthropic API (the SDK adds ``/v1/messages``)."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def answer_anthropic(self, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        """(status, headers, JSON body) for an Anthropic messages request: the same answers in its shapes."""
        status, headers, payload = self.answer(body)
        if status != 200:
            kind = "rate_limit_error" if status == 429 else "api_error"
            return status, headers, {"type": "error", "error": {"type": kind, "message": payload["error"]["message"]}}
        message = payload["choices"][0]["message"]
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            block = {"type": "tool_use", "id": "toolu_1", "name": "final_result"}
            block["input"] = json.loads(call["function"]["arguments"])
            content, stop = [block], "tool_use"
        else:
            content, stop = [{"type": "text", "text": message["content"]}], "end_turn"
        usage = payload["usage"]
        return (
            200,
            {},
            {
                "id": f"msg_{len(self.requests)}",
                "type": "message",
                "role": "assistant",
                "model": payload["model"],
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
            },
        )

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        """(status, headers, JSON body) for a chat-completions request."""
        text = _last_user_text(body)
        request = Request(body)
        self.requests.append(request)  # on arrival: a test counts the requests a client made
        if self.on_arrival is not None:
            self.on_arrival(request)
        first = text not in self._throttled_once
        marker = re.search(r"\[(\d{3}|invalid) once\]", text)
        once = marker.group(1) if marker and first else None
        if once:
            self._throttled_once.add(text)
        if once not in (None, "429", "invalid"):
            request.status = int(once)
            return int(once), {}, {"error": {"message": f"fake error {once}", "type": "fake"}}
        if "[429]" in text or once == "429":
            request.status = 429
            error = {"message": "Rate limit reached, retry later", "type": "requests", "code": "rate_limit_exceeded"}
            return 429, {"Retry-After": str(self.retry_after)}, {"error": error}
        status = re.search(r"\[http (\d{3})\]", text)
        if status:
            request.status = int(status.group(1))
            return int(status.group(1)), {}, {"error": {"message": f"fake error {status.group(1)}", "type": "fake"}}
        if not self.json_schema and (body.get("response_format") or {}).get("type") == "json_schema":
            request.status = 400
            error = {"message": "response_format type 'json_schema' is not supported", "type": "invalid_request_error"}
            return 400, {}, {"error": error}
        if "[slow]" in text:
            self._stopping.wait(self.slow_seconds)
        # OpenAI's tools carry a "function"; Anthropic's their "name"
        tools = [t.get("function", {}).get("name") or t.get("name") for t in body.get("tools") or []]
        usage = {"prompt_tokens": 10 + len(text), "completion_tokens": 3 + len(text) // 2}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if "final_result" in tools:
            call = {"id": "call_1", "type": "function"}
            args = {} if once == "invalid" else self.tool_args
            call["function"] = {"name": "final_result", "arguments": json.dumps(args)}
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        elif (body.get("response_format") or {}).get("type") == "json_schema":
            args = {} if once == "invalid" else self.tool_args
            message, finish = {"role": "assistant", "content": json.dumps(args)}, "stop"
        else:
            message = {"role": "assistant", "content": f"echo: {text}"}
            finish = "stop"
        request.status, request.usage = 200, usage
        return (
            200,
            {},
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "unknown"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            },
        )

    def stop(self) -> None:
        """End slow answers at once, stop serving and close the socket."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


class _Server(ThreadingHTTPServer):
    #: the listen backlog: http.server's 5 drops the connects of a burst of concurrent clients on a
    #: loaded machine, and a client whose connect timed out sent a request the server never saw
    request_queue_size = 128


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def start(**behaviour: Any) -> FakeOpenAI:
    """A :class:`FakeOpenAI` serving on a free port of 127.0.0.1 in a daemon thread."""
    fake = FakeOpenAI(**behaviour)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            route = self.path.rstrip("/")
            if route == "/v1/chat/completions":
                status, headers, payload = fake.answer(body)
            elif route == "/v1/messages":
                status, headers, payload = fake.answer_anthropic(body)
            else:
                status, headers, payload = 404, {}, {"error": {"message": f"no route {self.path}"}}
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep the test output clean

    server = _Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    fake._server = server
    fake._thread = threading.Thread(target=server.serve_forever, name="fake-openai", daemon=True)
    fake._thread.start()
    return fake
