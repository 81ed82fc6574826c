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


@pytest.mark.parametrize("found", [0.005, 0.000123, 0.000015, 0.0002])
def test_the_interval_found_comes_back_exactly_however_often_turns_are_shortened(interval: float, found: float) -> None:
    # CPython truncates to whole microseconds and 15 us reads back as 1.4999...e-05: setting the
    # value read would lose a microsecond per plan
    sys.setswitchinterval(found)
    before = sys.getswitchinterval()
    during = before if found < SHORT_TURN else pytest.approx(SHORT_TURN)
    for _ in range(5):
        with short_gil_turns():
            assert sys.getswitchinterval() == during
        assert sys.getswitchinterval() == before


def test_nested_turns_on_one_thread_restore_only_at_the_outermost_exit(interval: float) -> None:
    with short_gil_turns():
        with short_gil_turns():
            assert sys.getswitchinterval() == pytest.approx(SHORT_TURN)
        assert sys.getswitchinterval() == pytest.approx(SHORT_TURN)
    assert sys.getswitchinterval() == pytest.approx(interval)


def test_an_interval_someone_else_sets_while_turns_are_short_is_theirs(interval: float) -> None:
    with short_gil_turns():
        sys.setswitchinterval(0.002)  # the worker's own choice, made during the plan
    assert sys.getswitchinterval() == pytest.approx(0.002)
    with short_gil_turns():  # and the next plan finds and restores it
        pass
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_many_threads_entering_and_leaving_at_once_restore_the_interval_found(interval: float) -> None:
    barrier = threading.Barrier(8)
    seen: list[float] = []

    def plan() -> None:
        for _ in range(50):
            barrier.wait(10)
            with short_gil_turns():
                seen.append(sys.getswitchinterval())

    threads = [threading.Thread(target=plan) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(seen) == 400 and all(turn == pytest.approx(SHORT_TURN) for turn in seen)
    assert sys.getswitchinterval() == pytest.approx(interval)
