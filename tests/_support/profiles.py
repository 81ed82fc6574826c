"""Hypothesis profiles: ``quick`` for the inner loop (``make unit``), ``full`` for ``make test``.

``DATAGEN_HYPOTHESIS_PROFILE`` picks one (``quick`` when unset); tests/conftest.py loads it before any test
module is imported, so a ``@settings(...)`` that leaves ``max_examples`` unset takes the profile's count.
A test that needs more examples than Hypothesis's default says so with :func:`examples`, which keeps
that count under ``full`` and caps it at the quick count otherwise: the full run stays as thorough as
before while the inner loop stays short.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE_ENV = "DATAGEN_HYPOTHESIS_PROFILE"
QUICK_EXAMPLES = 20

# "full" is Hypothesis's defaults (100 examples, a 200 ms deadline), as the suite ran before profiles.
# "quick" drops the deadline: on two shared cores a cold first example often takes longer than 200 ms,
# and a deadline miss there says nothing about the code.
settings.register_profile("full")
settings.register_profile("quick", max_examples=QUICK_EXAMPLES, deadline=None)


def active_profile() -> str:
    return os.environ.get(PROFILE_ENV, "quick")


def load() -> None:
    settings.load_profile(active_profile())


def examples(full: int) -> int:
    """A property test's example count: ``full`` under the full profile, at most the quick count otherwise."""
    return full if active_profile() == "full" else min(full, QUICK_EXAMPLES)
