"""Prices come from genai-prices' table: a known model has a positive price, an unknown one none (never $0)."""

from __future__ import annotations

from airflow_provider_datagen.core.ledger.pricing import price_usd


def test_a_known_model_is_priced_by_its_tokens() -> None:
    one = price_usd("openai:gpt-4o-mini", 1_000_000, 0)
    assert one is not None and one > 0
    # linear in the tokens, and the bare name matches the same table row
    assert price_usd("openai:gpt-4o-mini", 2_000_000, 0) == 2 * one
    assert price_usd("gpt-4o-mini", 1_000_000, 0) == one


def test_an_unknown_model_is_unpriced_not_free() -> None:
    assert price_usd("nobody:no-such-model-xyz", 1000, 1000) is None
