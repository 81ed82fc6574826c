"""Process functions for the operator tests; importable by dag.test()'s forked task processes."""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_datagen.example_dags import fakes


def _record(ctx: Any) -> None:
    path = os.environ.get("DATAGEN_TEST_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{ctx.item_id}\t{ctx.attempt}\n")


def fail_3_and_7_once(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Items 3 and 7 fail on their first attempt; everything else succeeds deterministically."""
    _record(ctx)
    if item["id"] in {"3", "7"} and ctx.attempt == 1:
        raise RuntimeError(f"transient failure of item {item['id']}")
    return {"upper": str(item["text"]).upper(), "n": len(str(item["text"]))}


def always_ok(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    _record(ctx)
    return {"upper": str(item["text"]).upper(), "n": len(str(item["text"]))}


def answer_v1(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Version 1 of a process: its output names the version (the processor-version tests)."""
    _record(ctx)
    return {"answer": f"v1:{item['text']}"}


def answer_v2(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Version 2 of :func:`answer_v1`."""
    _record(ctx)
    return {"answer": f"v2:{item['text']}"}


def counted_fake_model(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The quickstart's fake model, recorded: the quickstart test points the example DAG at it."""
    _record(ctx)
    return fakes.fake_model(item, ctx)


def counted_refusing_fake_model(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The fake model with non-retryable first-attempt errors, recorded (the clear-and-rerun story)."""
    _record(ctx)
    return fakes.fake_model_with_refusals(item, ctx)


not_callable = 42


def readme_answer(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The README quick start's ``answer`` with a fake model: the same fields, no network."""
    _record(ctx)
    key = ctx.idempotency_key("model")
    return {"answer": f"an answer to {item['prompt']}", "tokens": len(item["prompt"].split()) + len(key) // 32}


#: what :func:`paid_model` records per call: a fixed cost, so where a budget stops is exact
PAID_COST_USD = 0.01


def paid_model(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A model call that reports its usage (the budget tests)."""
    _record(ctx)
    ctx.record_usage(model="test:paid", input_tokens=100, output_tokens=20, cost_usd=PAID_COST_USD)
    return {"upper": str(item["text"]).upper()}
