"""The datagen_status type and its counts' builder: one list of keys, one rule for what is pending."""

from __future__ import annotations

import pytest

from airflow_provider_datagen.core import DatagenStatus
from airflow_provider_datagen.core.status import STATUS_KEYS, Tally, item_counts, status_dict


def test_the_status_keys_are_the_typed_dicts() -> None:
    assert frozenset(STATUS_KEYS) == DatagenStatus.__required_keys__
    assert DatagenStatus.__optional_keys__ == frozenset({"invalidated"})
    assert len(set(STATUS_KEYS)) == len(STATUS_KEYS)


def test_a_log_status_counts_running_and_never_started_as_pending() -> None:
    counts = item_counts(total=10, completed=3, completed_by_version={"v1": 3}, filtered=1, running=2, never_started=4)
    assert counts == {
        "total": 10,
        "completed": 3,
        "completed_by_version": {"v1": 3},
        "filtered": 1,
        "running": 2,
        "never_started": 4,
        "pending": 6,
    }


@pytest.mark.parametrize("invalidated", [0, 5])
def test_a_source_status_also_counts_the_invalidated_items_as_pending(invalidated: int) -> None:
    counts = item_counts(
        total=15, completed=3, completed_by_version={}, filtered=1, running=2, never_started=4, invalidated=invalidated
    )
    assert (counts["invalidated"], counts["pending"]) == (invalidated, 6 + invalidated)


def test_a_status_lists_every_key_in_order() -> None:
    t = Tally(
        roots=7,
        statuses={"completed": 3, "running": 2, "never_started": 2},
        completed_by_version={"v1": 3},
        failed=1,
        failed_ids=("x",),
        children=4,
        violations=0,
    )
    status = status_dict(t, pipeline="p", experiment="e", log_version=9)
    assert list(status) == list(STATUS_KEYS)
    assert {k: status[k] for k in ("total", "completed", "filtered", "running", "never_started", "pending")} == {
        "total": 7,
        "completed": 3,
        "filtered": 0,
        "running": 2,
        "never_started": 2,
        "pending": 4,
    }
    assert (status["failed_items"], status["failed_item_ids"], status["children"]) == (1, ["x"], 4)
    assert (status["stopped_by_budget"], status["removed"], status["log_version"]) == (False, 0, 9)
