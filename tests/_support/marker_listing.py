"""A pytest plugin for ``--collect-only`` runs: writes each collected test's node id and marker names as
JSON lines to the file ``DATAGEN_MARKER_LISTING`` names (tests/dev/test_test_suite.py reads it, so one
collection of the suite shows what every phase's ``-m`` expression selects)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    target = os.environ.get("DATAGEN_MARKER_LISTING")
    if not target:
        return
    with open(target, "w", encoding="utf-8") as out:
        for item in session.items:
            marks = sorted({m.name for m in item.iter_markers()})
            out.write(json.dumps({"id": item.nodeid, "marks": marks}) + "\n")
