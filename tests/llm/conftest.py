"""Fixtures of the model step's tests."""

from __future__ import annotations

import pytest

from tests._support.recording_context import RecordingContext


@pytest.fixture
def make_ctx() -> type[RecordingContext]:
    """``make_ctx(item_id="k1", fields=None)``: a context recording the usage a step reports."""
    return RecordingContext
