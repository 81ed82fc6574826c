"""Cancelling batches: an experiment's open ones (``CheckpointLog.cancel_batches``), or the ones a killed task
waits on (the batch operator's and the batch trigger's ``on_kill``, through :func:`cancel_each`).

Only the provider is asked: nothing is closed in the submissions record. A cancelled batch ends with its
finished rows readable, so the next round of a batch run (or the next run) records them as usual (they
were paid for) and the rows that never ran come back cancelled, their items still pending.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable

    from airflow_provider_datagen.core.batch.protocol import BatchClient
    from airflow_provider_datagen.core.store.projection import Located

logger = logging.getLogger(__name__)


class Warns(Protocol):
    """Where :func:`cancel_each` logs: a ``logging.Logger``, or an Airflow task's or trigger's ``self.log``."""

    def warning(self, msg: Any, /, *args: Any) -> Any: ...


def _sdk_client(provider: str) -> BatchClient:
    # Deferred, and only without a client of the caller's: the SDKs read their key (and base URL) from the
    # environment (OPENAI_API_KEY / OPENAI_BASE_URL, ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL).
    from airflow_provider_datagen.llm.batch.clients import client_for

    return client_for(provider, api_key=None, base_url=None)


def cancel_each(client: BatchClient, batch_ids: Iterable[str], *, why: str, log: Warns = logger) -> list[str]:
    """Ask the provider to cancel each of ``batch_ids``; the ids it accepted.

    One refusal does not stop the rest (a killed task must leave as little running as it can), and each
    outcome is logged to ``log`` (the task's or the trigger's own, where its user reads it) with ``why``.
    """
    asked: list[str] = []
    for batch_id in batch_ids:
        try:
            client.cancel(batch_id)
        except Exception as exc:
            log.warning("could not cancel batch %s (%s): %s: %s", batch_id, why, type(exc).__name__, exc)
            continue
        asked.append(batch_id)
        log.warning("asked the provider to cancel batch %s: %s", batch_id, why)
    return asked


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
    # Deferred: the record is Lance's, and cancel_each runs in a triggerer whose event loop must not import it.
    from airflow_provider_datagen.core.store import batches

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
