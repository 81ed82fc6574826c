"""Prices of model calls from genai-prices' table (a maintained table, never a hand-written one).

A model is named ``"provider:model"`` (pydantic-ai's spelling, e.g. ``"openai:gpt-5-mini"``) or by
its bare name; genai-prices matches the name against its providers' patterns. A model it does not
know has no price: the caller records it as unpriced, never as $0.
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4096)
def price_usd(model: str, input_tokens: int, output_tokens: int) -> float | None:
    """The price in USD of one call's tokens for ``model``; None when genai-prices does not know it.

    Cached: a run's calls repeat the same (model, tokens) often, and one lookup costs about 100 us.
    """
    # Deferred: the table loads on first use, which a run without usage never pays for.
    from genai_prices import Usage, calc_price

    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens)
    provider, sep, name = model.partition(":")
    tries = [(name, provider), (model, None)] if sep and name else [(model, None)]
    for ref, provider_id in tries:
        try:
            return float(calc_price(usage, ref, provider_id=provider_id).total_price)
        except LookupError:
            continue
    logger.debug("genai-prices has no price for model %r: its calls are recorded as unpriced", model)
    return None
