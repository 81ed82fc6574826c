"""Deterministic stand-ins for expensive per-item work, imported by the example DAGs.

They hash their input instead of calling a model, so runs are reproducible offline; a few items fail
on their first attempt, like a flaky API. :func:`fake_model`'s error is transient (a timeout): the
quickstart's retry policy retries it in place, in the same run. :func:`fake_model_with_refusals` fails
the same items with an error no retry policy covers (a refused request), to show that clearing a
failed task reruns only them.
Each reports the usage a real model would (``ctx.record_usage``: its prompt's and answer's tokens,
priced as :data:`FAKE_MODEL` by genai-prices; a refused request its prompt's tokens), so the usage
ledger and a budget work with them; usage never changes the exported fields.
The example DAGs name them as their ``process`` (``"airflow_provider_datagen.example_dags.fakes:fake_model"``);
to count invocations, wrap one in a process of your own and point the DAG at it (the quickstart's
``DATAGEN_QUICKSTART_PROCESS``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from airflow_provider_datagen.core import Conditional, ItemContext, Loop, MapReduce, Sequence, Step


class TransientModelError(RuntimeError):
    """A fake model's flaky first attempt: a timeout, worth retrying (the quickstart's ``retry_on``)."""


class ModelRequestError(ValueError):
    """A fake model refused the request (an HTTP 400): calling again at once cannot help, so no retry."""


#: the model the fakes report their usage as (priced by genai-prices like the real one)
FAKE_MODEL = "openai:gpt-5-mini"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prompt_tokens(item: dict[str, Any]) -> int:
    """A fake's input token count: about four characters a token, as for English text."""
    return len(str(item.get("prompt", ""))) // 4 + 1


def _answer(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    h = _digest(str(item.get("prompt", "")))
    tokens = int(h[12:16], 16) % 500 + 1
    ctx.record_usage(model=FAKE_MODEL, input_tokens=prompt_tokens(item), output_tokens=tokens)
    return {"answer": f"answer-{h[:12]}", "tokens": tokens}


def flaky_on_first_attempt(item_id: str) -> bool:
    """About one item in eight fails its first attempt (deterministic in the id)."""
    return int(_digest(item_id)[:4], 16) % 8 == 0


def fake_model(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    """Answer a prompt with a hash; some items fail on their first attempt."""
    if ctx.attempt == 1 and flaky_on_first_attempt(ctx.item_id):
        # a timeout: the endpoint never answered, so no usage is reported
        raise TransientModelError(f"model endpoint timed out for {ctx.item_id} (a fake, transient error)")
    return _answer(item, ctx)


def fake_model_with_refusals(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    """:func:`fake_model` whose flaky first attempts raise :class:`ModelRequestError`, which is not retried.

    The items fail the run; a rerun (a cleared task: their next attempt) answers them as
    :func:`fake_model` does. ``make demo`` runs the quickstart with it to show clear-and-rerun.
    """
    if ctx.attempt == 1 and flaky_on_first_attempt(ctx.item_id):
        # the request was read and refused: its prompt's tokens are billed (a failed attempt's cost)
        ctx.record_usage(model=FAKE_MODEL, input_tokens=prompt_tokens(item), output_tokens=0)
        raise ModelRequestError(f"model refused the request for {ctx.item_id} (a fake, non-retryable error)")
    return reliable_fake_model(item, ctx)


def reliable_fake_model(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    """The same answers as :func:`fake_model` without the flaky first attempts (an uninterrupted run)."""
    return _answer(item, ctx)


def _draft(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    prev = ctx.fields.get("draft", item["question"])
    return {"draft": _digest(f"{prev}|{ctx.iteration}")[:16]}


def _candidates(item: dict[str, Any], ctx: ItemContext) -> list[dict[str, Any]]:
    return [{"question": item["question"], "draft": ctx.fields["draft"], "seed": s} for s in range(2)]


def _solve(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    return {"solution": int(_digest(f"{item['draft']}|{item['seed']}")[:6], 16) % 100}


def _vote(children: list[dict[str, Any]], ctx: ItemContext) -> dict[str, Any]:
    scores = [c["solution"] for c in children]
    return {"score": max(scores), "agreement": len(set(scores)) == 1}


def _is_hard(item: dict[str, Any], ctx: ItemContext) -> bool:
    return ctx.fields["score"] >= 50


def _escalate(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    return {"route": "expert", "final": f"expert:{ctx.fields['draft']}"}


def _accept(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    return {"route": "auto", "final": f"auto:{ctx.fields['draft']}"}


#: A multi-step pipeline: a Loop of drafts, a MapReduce fan-out into two solver children per item
#: (child ids ``<key>/solve_twice:0`` and ``:1``), and a Conditional choosing a route.
qa_pipeline = Sequence(
    "qa",
    [
        Loop("refine", Step("draft", _draft), times=3),
        MapReduce("solve_twice", over=_candidates, map=Step("solve", _solve), reduce=_vote),
        Conditional("check", _is_hard, then=Step("escalate", _escalate), otherwise=Step("accept", _accept)),
    ],
)


def prompts(n: int) -> list[dict[str, Any]]:
    """``n`` deterministic prompt items keyed ``p0000``, ``p0001``, ..."""
    return [{"id": f"p{i:04d}", "prompt": f"Write a haiku about the number {i}."} for i in range(n)]


def questions(n: int) -> list[dict[str, Any]]:
    """``n`` deterministic question items for the pipeline example."""
    return [{"id": f"q{i:03d}", "question": f"What is {i} squared plus {i}?"} for i in range(n)]
