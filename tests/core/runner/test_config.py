"""``RunConfig``: run_items's keyword arguments, checked once, as one frozen value."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from airflow_provider_datagen.core.ledger import budget as budget_module
from airflow_provider_datagen.core.ratelimit import RateLimit
from airflow_provider_datagen.core.retry import RetryPolicy
from airflow_provider_datagen.core.runner import run_items
from airflow_provider_datagen.core.runner.config import RUN_OPTIONS, RunConfig
from airflow_provider_datagen.core.runner.shared import DEFAULT_GROUP_ITEMS, DEFAULT_GROUP_SECONDS
from airflow_provider_datagen.exceptions import ConfigurationError


def test_the_options_are_run_items_keyword_arguments_with_the_same_defaults() -> None:
    # run_items bundles its keyword arguments by name: a parameter added on one side only is caught here
    params = inspect.signature(run_items).parameters
    keyword_only = {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in RUN_OPTIONS}
    assert set(RUN_OPTIONS) == set(keyword_only)
    assert defaults == keyword_only


def test_defaults_check_and_give_the_default_commit_policy() -> None:
    config = RunConfig()
    assert config.budget.is_set is False
    assert config.rate_limit is None
    assert config.group_interval == DEFAULT_GROUP_SECONDS
    policy = config.commit_policy()
    assert (policy.group, policy.per_step, policy.pipelined, policy.interval) == (
        DEFAULT_GROUP_ITEMS,
        False,
        True,
        DEFAULT_GROUP_SECONDS,
    )


def test_checkpoint_every_one_checkpoints_every_step_and_commits_each_in_turn() -> None:
    policy = RunConfig(checkpoint_every=1, checkpoint_interval=5.0).commit_policy()
    assert (policy.group, policy.per_step, policy.pipelined, policy.interval) == (1, True, False, 5.0)


def test_a_budget_shortens_the_commit_interval_only() -> None:
    config = RunConfig(budget_usd=1.5, checkpoint_interval=10.0)
    assert config.budget.is_set and config.budget.usd == 1.5
    assert config.group_interval == min(10.0, budget_module.COMMIT_SECONDS)
    assert config.commit_policy().interval == config.group_interval
    # a time bound shorter than the budget's is kept
    assert RunConfig(budget_tokens=100, checkpoint_interval=0.1).group_interval == 0.1


def test_a_rate_limit_dict_is_stored_as_a_rate_limit() -> None:
    config = RunConfig(rate_limit={"requests_per_minute": 60, "key": "k"})  # type: ignore[arg-type]
    assert config.rate_limit == RateLimit(requests_per_minute=60, key="k")


def test_it_is_frozen() -> None:
    config = RunConfig(concurrency=2, retry=RetryPolicy())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.concurrency = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"checkpoint_every": 0}, r"^run_items: checkpoint_every=0 is not a positive int"),
        ({"checkpoint_every": True}, r"^run_items: checkpoint_every=True is not a positive int"),
        ({"processor_version": ""}, r"^run_items: processor_version='' is not a non-empty string"),
        ({"concurrency": 0}, r"^run_items: concurrency=0 is not an int >= 1"),
        ({"concurrency": 2.0}, r"^run_items: concurrency=2.0 is not an int >= 1"),
        ({"max_repeated_failures": 0}, r"^run_items: max_repeated_failures=0 is not an int >= 1 or None"),
        ({"redo_completed": "always"}, r"^run_items: redo_completed='always'"),
        ({"retry": {"attempts": 3}}, r"^run_items: retry=\{'attempts': 3\} is not a RetryPolicy"),
        ({"rate_limit": 60}, r"^run_items: rate_limit=60 is not a RateLimit"),
        ({"budget_usd": -1}, r"^run_items: budget_usd=-1"),
        ({"budget_tokens": 0}, r"^run_items: budget_tokens=0"),
    ],
)
def test_a_bad_argument_is_refused_as_run_items_refuses_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as from_config:
        RunConfig(**kwargs)
    # run_items refuses it with the same message, before it touches the log (None would fail on use)
    with pytest.raises(ConfigurationError) as from_run:
        run_items(None, [], lambda item, ctx: None, **kwargs)  # type: ignore[arg-type]
    assert str(from_run.value) == str(from_config.value)


def test_the_first_bad_argument_is_the_one_named() -> None:
    with pytest.raises(ConfigurationError, match=r"checkpoint_every"):
        RunConfig(checkpoint_every=0, concurrency=0, budget_usd=-1)
    with pytest.raises(ConfigurationError, match=r"concurrency"):
        RunConfig(concurrency=0, retry="x", budget_usd=-1)  # type: ignore[arg-type]


def test_the_owner_is_named_in_the_error() -> None:
    class DatagenMapOperator:
        pass

    with pytest.raises(ConfigurationError, match=r"^DatagenMapOperator: concurrency=0"):
        RunConfig(concurrency=0, owner=DatagenMapOperator)
