"""dev/test_suite.py: a failing phase fails the run, "no tests" never passes, and the phases cover the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dev.test_suite import NO_TESTS, PHASES, exit_code


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


def test_the_phases_hold_every_collected_test_exactly_once(pytestconfig: pytest.Config) -> None:
    def collected(*args: str) -> set[str]:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
            capture_output=True,
            text=True,
            cwd=pytestconfig.rootpath,
            check=False,
        ).stdout
        return {line for line in out.splitlines() if "::" in line}

    phases = {name: collected(*selection[:2]) for name, selection in PHASES}  # the -m expression of each
    everything = collected()
    assert all(phases.values())
    assert not phases["rest"] & phases["e2e"]
    assert phases["rest"] | phases["e2e"] == everything
    assert any(t.startswith("tests/e2e/celery/") for t in phases["e2e"])
    assert not any(t.startswith("tests/e2e/") for t in phases["rest"])
