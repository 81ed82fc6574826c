"""ctx.record_usage's arguments checked and priced: genai-prices' table, the caller's cost, unpriced models."""

from __future__ import annotations

import math

import pytest
from genai_prices import Usage, calc_price

from airflow_provider_datagen.core.ledger import attempt_entries, price_usd, usage_record
from airflow_provider_datagen.exceptions import ConfigurationError


def test_a_known_model_is_priced_by_genai_prices() -> None:
    expected = float(
        calc_price(Usage(input_tokens=812, output_tokens=240), "gpt-5-mini", provider_id="openai").total_price
    )
    assert expected > 0
    rec = usage_record("openai:gpt-5-mini", 812, 240, None, 1)
    assert rec.cost_usd == expected
    # the bare name is matched too
    assert price_usd("gpt-5-mini", 812, 240) == expected


def test_an_unknown_model_is_unpriced_never_zero() -> None:
    rec = usage_record("my-lab:finetune-7", 100, 10, None, 1)
    assert rec.cost_usd is None
    assert price_usd("no-such-model-anywhere", 1, 1) is None


def test_the_callers_cost_wins_over_the_table() -> None:
    assert usage_record("openai:gpt-5-mini", 812, 240, 0.5, 1).cost_usd == 0.5
    assert usage_record("my-lab:finetune-7", 1, 1, 0, 1).cost_usd == 0.0  # a given 0 is priced, not unknown


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "model='' is not a model name"),
        ({"model": 3}, "model=3 is not a model name"),
        ({"input_tokens": -1}, "input_tokens=-1 is not an int >= 0"),
        ({"output_tokens": 1.5}, "output_tokens=1.5 is not an int >= 0"),
        ({"calls": 0}, "calls=0 is not an int >= 1"),
        ({"calls": True}, "calls=True is not an int >= 1"),
        ({"cost_usd": math.nan}, "cost_usd=nan is not a number"),
        ({"cost_usd": -0.01}, "cost_usd=-0.01 is negative"),
        ({"cost_usd": "1"}, "cost_usd='1' is not a number"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_fix(kwargs: dict[str, object], message: str) -> None:
    args = {"model": "m", "input_tokens": 1, "output_tokens": 1, "cost_usd": None, "calls": 1, **kwargs}
    with pytest.raises(ConfigurationError, match="ctx.record_usage: " + message.replace("(", r"\(")):
        usage_record(args["model"], args["input_tokens"], args["output_tokens"], args["cost_usd"], args["calls"])


def test_an_attempts_records_become_one_entry_per_model() -> None:
    recs = [
        usage_record("a", 10, 1, 0.25, 1),
        usage_record("b", 5, 5, None, 2),
        usage_record("a", 20, 2, None, 3),  # a call of a priced model without a price: counted apart
    ]
    assert attempt_entries(recs) == [
        {"model": "a", "calls": 4, "input_tokens": 30, "output_tokens": 3, "cost_usd": 0.25, "unpriced_calls": 3},
        {"model": "b", "calls": 2, "input_tokens": 5, "output_tokens": 5, "cost_usd": None, "unpriced_calls": 2},
    ]
