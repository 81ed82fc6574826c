"""Development tooling run from a checkout (``make airflow``, ``make demo``); not part of the wheel."""

from __future__ import annotations
