"""The usage ledger: what model calls an item's attempts made, what they cost, and a budget that stops a run.

- :mod:`.pricing`: a model name and its tokens priced with genai-prices (at record time).
- :mod:`.records`: ``ctx.record_usage`` checked and priced into a :class:`UsageRecord`, and the JSON
  entries an attempt's STEP_COMPLETED or FAILED row carries.
- :mod:`.budget`: ``budget_usd``/``budget_tokens`` checked, and :class:`RunUsage`, a run's own tally
  with the budget's pull check and the rate limit's token charge.

The fold of the stored entries is ``core/fold/usage.py``. See docs/adr/0011-usage-ledger.md.
"""

from __future__ import annotations

from airflow_provider_datagen.core.ledger.budget import Budget, RunUsage, check_budget
from airflow_provider_datagen.core.ledger.pricing import price_usd
from airflow_provider_datagen.core.ledger.records import UsageRecord, attempt_entries, usage_record

__all__ = ["Budget", "RunUsage", "UsageRecord", "attempt_entries", "check_budget", "price_usd", "usage_record"]
