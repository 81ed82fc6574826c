"""Short GIL turns: process-wide while any plan runs, the interval found first restored by the last to leave."""

from __future__ import annotations

import sys
import threading

import pytest

from airflow_provider_datagen.core.gil import SHORT_TURN, short_gil_turns


@pytest.fixture
def interval() -> float:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.003)
    yield 0.003
    sys.setswitchinterval(before)


def test_short_turns_last_while_any_use_runs_and_the_first_interval_comes_back(interval: float) -> None:
    entered, release = threading.Event(), threading.Event()
    seen: list[float] = []

    def other_plan() -> None:
        with short_gil_turns():
            entered.set()
            release.wait(10)

    # two plans overlapping out of order: the second leaves first, and the interval stays short
    with short_gil_turns():
        thread = threading.Thread(target=other_plan)
        thread.start()
        assert entered.wait(10)
    seen.append(sys.getswitchinterval())
    release.set()
    thread.join(10)
    seen.append(sys.getswitchinterval())
    assert seen == [pytest.approx(SHORT_TURN), pytest.approx(interval)]


def test_short_turns_end_on_an_error_and_never_lengthen_a_shorter_interval(interval: float) -> None:
    with pytest.raises(RuntimeError, match="boom"), short_gil_turns():
        raise RuntimeError("boom")
    assert sys.getswitchinterval() == pytest.approx(interval)
    sys.setswitchinterval(SHORT_TURN / 2)
    with short_gil_turns():
        assert sys.getswitchinterval() == pytest.approx(SHORT_TURN / 2, abs=2e-6)  # kept in whole microseconds
