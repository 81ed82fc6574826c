"""dev/test_suite.py: a failing phase fails the run, "no tests" never passes, and the phases cover the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from _pytest.mark.expression import Expression  # the -m evaluator itself (pytest exports no public one)

from dev.test_suite import NO_TESTS, PHASES, exit_code

#: the plugin that lists each collected test with its markers
PLUGIN = ("-p", "tests._support.marker_listing")

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@pytest.mark.parametrize(
    ("rest", "e2e", "narrowed", "expected"),
    [
        (0, 0, False, 0),
        (1, 0, False, 1),
        (0, 2, False, 2),
        (NO_TESTS, 0, False, NO_TESTS),  # a phase that collected nothing is a broken selection
        (0, NO_TESTS, False, NO_TESTS),
        (0, NO_TESTS, True, 0),  # the arguments picked tests of one phase only
        (NO_TESTS, NO_TESTS, True, NO_TESTS),
        (NO_TESTS, 1, True, 1),
    ],
)
def test_the_run_fails_when_a_phase_fails_or_nothing_ran(rest: int, e2e: int, narrowed: bool, expected: int) -> None:
    assert exit_code({"rest": rest, "e2e": e2e}, narrowed) == expected


@pytest.mark.slow  # `make test` runs it; `make unit`, the inner loop, leaves it out
def test_the_phases_hold_every_collected_test_exactly_once(pytestconfig: pytest.Config, tmp_path: Path) -> None:
    # One collection of the whole suite (each costs ~20 s of imports), every test listed with its markers;
    # each phase's -m expression is then evaluated over them as pytest's -m evaluates it.
    listing = tmp_path / "collected.jsonl"
    subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *PLUGIN],
        capture_output=True,
        text=True,
        cwd=pytestconfig.rootpath,
        check=True,
        env={**os.environ, "DATAGEN_MARKER_LISTING": str(listing)},
    )
    tests = [json.loads(line) for line in listing.read_text().splitlines()]
    assert len(tests) > 1000

    def selected(expression: str) -> set[str]:
        compiled = Expression.compile(expression)
        return {t["id"] for t in tests if compiled.evaluate(_has_marker(t["marks"]))}

    everything = {t["id"] for t in tests}
    phases = {name: selected(selection[selection.index("-m") + 1]) for name, selection in PHASES}
    assert all(phases.values())
    assert not phases["rest"] & phases["e2e"]
    assert phases["rest"] | phases["e2e"] == everything
    assert any(t.startswith("tests/e2e/celery/") for t in phases["e2e"])
    assert not any(t.startswith("tests/e2e/") for t in phases["rest"])


def _has_marker(marks: list[str]) -> Callable[..., bool]:
    return lambda name, /, **kwargs: name in marks
