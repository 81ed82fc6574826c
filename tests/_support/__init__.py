"""Helpers shared by the test tree: the dag.test() harness, engine pipelines, subprocess workers.

Workers run as ``python -m tests._support.workers.<name>`` from :data:`REPO` (with it on
``PYTHONPATH``), so they import the same helpers as the tests that launch them.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
