"""``SharedLimiter.charge_requests``: calls made beyond an attempt's first, charged without waiting."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_datagen.core.ratelimit import RateLimit
from airflow_provider_datagen.core.ratelimit.limiter import open_limiter
from airflow_provider_datagen.exceptions import ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path


def test_charged_requests_fill_the_window_and_the_excess_is_paid_before_the_next_start(tmp_path: Path) -> None:
    waits: list[float] = []
    limiter = open_limiter(RateLimit(requests_per_minute=5, key="k"), root=str(tmp_path))
    limiter._sleep = waits.append  # record the waits instead of sleeping (the window never moves here)
    limiter._clock = lambda: 1_000.0
    try:
        assert limiter.try_acquire()
        limiter.charge_requests(6)  # never waits: 4 fit now, 2 are owed
        assert waits == []
        assert limiter._owed_requests == 2
        assert not limiter.try_acquire()  # the owed requests come first: no start in a full window
        other = open_limiter(RateLimit(requests_per_minute=5, key="k"), root=str(tmp_path))
        try:
            assert not other.try_acquire()  # everyone on the key sees the 5 charged
        finally:
            other.close()
    finally:
        limiter.close()


def test_charge_requests_refuses_a_bad_count(tmp_path: Path) -> None:
    limiter = open_limiter(RateLimit(requests_per_minute=5, key="k"), root=str(tmp_path))
    try:
        with pytest.raises(ConfigurationError, match=r"charge_requests\(n\)=-1 is not an int >= 0"):
            limiter.charge_requests(-1)
        limiter.charge_requests(0)
        assert limiter.try_acquire(cost_requests=5)
    finally:
        limiter.close()
