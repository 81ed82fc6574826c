"""``make test``: the suite in two phases, each the way its tests run best on two cores.

1. Everything but the end-to-end tests, on two xdist workers (``-n 2 --dist worksteal``, as ``make unit``):
   those tests are independent of each other and mostly wait on disk, subprocesses or dag.test().
2. The end-to-end tests (``-m e2e``: real Airflow components, the Celery stack), serial and alone: each
   stack is a session fixture started once, and its timing-sensitive parts (heartbeats, host death) never
   share the cores with another stack or with phase 1.

Both phases always run; the exit code is the first failing phase's. A phase that collects nothing (pytest's
5) fails the run unless arguments narrowed the selection (then only both collecting nothing fails).

Usage: ``python -m dev.test_suite [pytest args...]``; the arguments go to both phases.
"""

from __future__ import annotations

import subprocess
import sys

NO_TESTS = 5
PHASES = (
    ("rest", ["-m", "not e2e", "-n", "2", "--dist", "worksteal"]),
    ("e2e", ["-m", "e2e"]),
)


def exit_code(codes: dict[str, int], narrowed: bool) -> int:
    """The run's exit code from each phase's (see the module docstring)."""
    failing = [code for code in codes.values() if code not in (0, NO_TESTS)]
    if failing:
        return failing[0]
    empty = [name for name, code in codes.items() if code == NO_TESTS]
    if empty and (not narrowed or len(empty) == len(codes)):
        sys.stderr.write(f"test_suite: no tests collected in {', '.join(empty)}\n")
        return NO_TESTS
    return 0


def main(argv: list[str]) -> int:
    codes: dict[str, int] = {}
    for name, selection in PHASES:
        sys.stdout.write(f"\n===== test_suite: phase {name} =====\n")
        sys.stdout.flush()
        # a child of ours, waited for; Ctrl-C reaches it through the terminal's process group
        codes[name] = subprocess.call([sys.executable, "-m", "pytest", "-ra", "--durations=25", *selection, *argv])
    sys.stdout.write(f"\ntest_suite: {', '.join(f'{n} exited {c}' for n, c in codes.items())}\n")
    return exit_code(codes, narrowed=bool(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
