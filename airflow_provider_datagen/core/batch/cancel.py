"""Cancelling an experiment's open batches (``CheckpointLog.cancel_batches``, the batch operator's ``on_kill``).

Only the provider is asked: nothing is closed in the submissions record. A cancelled batch ends with its
finished rows readable, so the next round of a batch run (or the next run) records them as usual (they
were paid for) and the rows that never ran come back cancelled, their items still pending.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_provider_datagen.core.store import batches

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from airflow_provider_datagen.core.batch.protocol import BatchClient
    from airflow_provider_datagen.core.store.projection import Located

logger = logging.getLogger(__name__)


def _sdk_client(provider: str) -> BatchClient:
    # Deferred, and only without a client of the caller's: the SDKs read their key (and base URL) from the
    # environment (OPENAI_API_KEY / OPENAI_BASE_URL, ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL).
    from airflow_provider_datagen.llm.batch.clients import client_for

    return client_for(provider, api_key=None, base_url=None)


def cancel_batches(
    log: Located,
    client: BatchClient | None = None,
    *,
    item_ids: Collection[str] | None = None,
    build: Callable[[str], BatchClient] = _sdk_client,
) -> list[str]:
    """Ask the provider to cancel every open, submitted batch of the experiment; the ids asked.

    ``client`` serves every batch (a step's ``client()``); without one, a client per provider is built
    from the SDK's environment. ``item_ids``: only the submissions holding one of these items (a chunk's).
    """
    asked: list[str] = []
    built: dict[str, BatchClient] = {}
    try:
        for sub in batches.open_submissions(log):
            if sub.batch_id is None or sub.kind != batches.SUBMITTED:
                continue  # not created yet (nothing to cancel), or ended already (results to record)
            if item_ids is not None and not any(i in item_ids for i in sub.item_ids):
                continue
            if client is not None:
                chosen = client
            else:
                provider = sub.provider or "openai"
                chosen = built.get(provider) or built.setdefault(provider, build(provider))
            chosen.cancel(sub.batch_id)
            asked.append(sub.batch_id)
            logger.info("asked the provider to cancel batch %s (submission %s)", sub.batch_id, sub.submission_key)
    finally:
        for made in built.values():
            made.close()
    return asked
