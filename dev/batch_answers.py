"""The fake batch server's answers: a deterministic function of a request body, in each provider's shape.

:mod:`dev.batch_server` answers a batch row and the online call of the same body with these same
functions, so a test compares an online run with a batch run on one server. ``answer(body)`` (the
server's injectable callable, :func:`default_answer` unless a test sets one) gives the answer; this
module wraps it as an OpenAI ``chat.completion`` or an Anthropic ``message`` with usage that is a
function of the body too.
"""

from __future__ import annotations

import json
from typing import Any

#: What a structured request's answer object holds per JSON-schema type (the default answer).
_DEFAULTS: dict[str, Any] = {"string": "x", "number": 1, "integer": 1, "boolean": True, "null": None}


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts/blocks of a list (both providers)."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return "" if content is None else str(content)


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the request's last user message."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def prompt_words(body: dict[str, Any]) -> int:
    """How many words the request's system prompt and messages hold (the input tokens' base)."""
    texts = [_text(body.get("system"))]
    texts += [_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict)]
    return sum(len(t.split()) for t in texts)


def output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a structured request asks its answer to follow; None for a plain request.

    OpenAI: a ``response_format`` of type ``json_schema``, or a ``tools`` list of one function.
    Anthropic: ``tools`` with a ``tool_choice`` forcing one of them (``tool`` by name, or ``any``).
    """
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        return dict((response_format.get("json_schema") or {}).get("schema") or {})
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    if "tool_choice" in body or any("input_schema" in t for t in tools):  # Anthropic's tools
        choice = body.get("tool_choice") or {}
        chosen = [t for t in tools if choice.get("type") == "any" or t.get("name") == choice.get("name")]
        return dict(chosen[0].get("input_schema") or {}) if choice and len(chosen) >= 1 else None
    functions = [t.get("function") or {} for t in tools if t.get("type") == "function"]
    return dict(functions[0].get("parameters") or {}) if len(functions) == 1 else None


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _resolve(target, root) if isinstance(target, dict) else {}
    for combinator in ("anyOf", "oneOf", "allOf"):
        if schema.get(combinator):
            return _resolve(schema[combinator][0], root)
    return schema


def example(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """A value that validates against ``schema`` in the simple cases: strings "x", numbers 1, ..."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {name: example(sub, root) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    return _DEFAULTS.get(kind, "x")


def default_answer(body: dict[str, Any]) -> str | dict[str, Any]:
    """``"echo: <last user text>"``, or for a structured request an object built from its schema."""
    schema = output_schema(body)
    if schema is not None:
        value = example(schema)
        return value if isinstance(value, dict) else {"value": value}
    return f"echo: {last_user_text(body)}"


def usage(body: dict[str, Any], answer_text: str) -> tuple[int, int]:
    """(input, output) tokens of an answer: the prompt's words + 10, the answer's characters // 4 + 1."""
    return prompt_words(body) + 10, len(answer_text) // 4 + 1


def _answer_text(answer: str | dict[str, Any]) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer)


def openai_completion(body: dict[str, Any], answer: str | dict[str, Any], completion_id: str) -> dict[str, Any]:
    """The ``chat.completion`` answering ``body`` with ``answer`` (a dict: structured, a str: plain text).

    A structured answer is the message content (``response_format``) or a call of the one tool.
    """
    text = _answer_text(answer)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    finish = "stop"
    if isinstance(answer, dict) and not body.get("response_format") and body.get("tools"):
        name = ((body["tools"][0] or {}).get("function") or {}).get("name", "tool")
        call = {"id": f"call_{completion_id}", "type": "function", "function": {"name": name, "arguments": text}}
        message.update(content=None, tool_calls=[call])
        finish = "tool_calls"
    prompt_tokens, completion_tokens = usage(body, text)
    return {
        "id": f"chatcmpl-{completion_id}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body.get("model", "unknown"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def anthropic_message(body: dict[str, Any], answer: str | dict[str, Any], message_id: str) -> dict[str, Any]:
    """The ``message`` answering ``params`` ``body`` with ``answer`` (a dict: the forced tool's input)."""
    text = _answer_text(answer)
    schema_tool = output_schema(body) is not None
    if isinstance(answer, dict) and schema_tool:
        choice = body.get("tool_choice") or {}
        name = choice.get("name") or (body.get("tools") or [{}])[0].get("name", "tool")
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{message_id}", "name": name, "input": answer}
        ]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": text}], "end_turn"
    input_tokens, output_tokens = usage(body, text)
    return {
        "id": f"msg_{message_id}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "unknown"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
