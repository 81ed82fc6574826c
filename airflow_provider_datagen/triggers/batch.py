"""DatagenBatchTrigger: poll a chunk's provider batches in the triggerer until every one has ended."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_datagen._arguments import bad_argument

# a light module (no Lance): the one rule for cancelling the batches a killed task waits on
from airflow_provider_datagen.core.batch.cancel import cancel_each
from airflow_provider_datagen.exceptions import BatchAPIError, ConfigurationError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from airflow_provider_datagen.core.batch.protocol import BatchClient

#: the connection llm_batch reads when given no llm_conn_id (llm/batch/step.py's default)
DEFAULT_LLM_CONN_ID = "pydanticai_default"
#: consecutive failed polls (a connection reset, a 5xx after the SDK's own retries) before the trigger
#: gives up: a batch runs for hours, and one network blip must not fail its task
MAX_POLL_ERRORS = 3
#: seconds on_kill spends cancelling before it gives up on the batches left: under the triggerer's own
#: bound (``[triggerer] on_kill_timeout``, 30 s by default), so the trigger's log says what was cancelled
ON_KILL_TIMEOUT = 20.0


def check_poll_interval(owner: object, poll_interval: Any) -> float:
    """``poll_interval`` as a float of seconds > 0 (0 would poll the provider in a busy loop)."""
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
        raise bad_argument(
            owner,
            "poll_interval",
            poll_interval,
            "is not a positive number of seconds",
            "give the seconds between two polls of the provider's batches, e.g. 60",
        )
    return float(poll_interval)


class DatagenBatchTrigger(BaseTrigger):
    """
    Poll provider batches (OpenAI's Batch API, Anthropic's Message Batches) until each has ended or failed.

    The provider's SDK is synchronous: every call runs in ``asyncio.to_thread`` so the triggerer's event
    loop never blocks. The API key is read from the connection here, on the triggerer, so a key kept in
    a connection is never written into the trigger's kwargs (the metadata DB); only a key given to
    ``llm_batch(api_key=...)`` itself travels in them.

    Yields one ``TriggerEvent``: ``{"status": "ended", "batches": {batch_id: {"state", "status",
    "counts", "error"}}, "resume": ...}`` once no batch is in progress, or ``{"status": "error",
    "message": ..., "batch_id": ..., "error_type": ..., "resume": ...}`` when polling failed (a refused
    call at once, a transient one after :data:`MAX_POLL_ERRORS` polls in a row).

    A user's kill of the deferred task (mark failed, mark success, clear) calls :meth:`on_kill`, which
    cancels its batches that have not ended; a triggerer that stops or hands the trigger on calls only
    ``cleanup()``, and the batches run on for the next triggerer to poll.

    :param batch_ids: the provider's ids of the batches to wait for.
    :param provider: ``"openai"`` or ``"anthropic"``.
    :param llm_conn_id: the ``pydanticai`` connection (host = base URL, password = API key), read on the
        triggerer; ``None``: ``pydanticai_default``. Not read when ``base_url`` or ``api_key`` is given,
        as ``llm_batch`` does not read it then.
    :param base_url: the API's base URL given to ``llm_batch`` itself.
    :param api_key: the API key given to ``llm_batch`` itself.
    :param poll_interval: seconds between two polls of the batches still in progress.
    :param resume: what the deferring operator resumes with (its epoch, its submissions per item, its
        report so far), handed back unchanged in the event: ``dag.test()`` replaces a deferral's
        ``next_kwargs`` with the event, so the event is the one place it survives everywhere.
    """

    def __init__(
        self,
        batch_ids: Sequence[str],
        provider: str,
        llm_conn_id: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        poll_interval: float = 60.0,
        resume: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(batch_ids, str) or not isinstance(batch_ids, Sequence) or not batch_ids:
            raise bad_argument(self, "batch_ids", batch_ids, "is not a non-empty list of batch ids", "pass a list")
        if provider not in ("openai", "anthropic"):
            raise bad_argument(self, "provider", provider, "is not a batch provider", "give 'openai' or 'anthropic'")
        self.batch_ids = [str(b) for b in batch_ids]
        self.provider = provider
        self.llm_conn_id = llm_conn_id
        self.base_url = base_url
        self.api_key = api_key
        self.poll_interval = check_poll_interval(self, poll_interval)
        self.resume = dict(resume or {})
        #: the batches run() saw end: on_kill leaves them alone (nothing left to cancel)
        self._ended: set[str] = set()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "batch_ids": list(self.batch_ids),
                "provider": self.provider,
                "llm_conn_id": self.llm_conn_id,
                "base_url": self.base_url,
                "api_key": self.api_key,
                "poll_interval": self.poll_interval,
                "resume": dict(self.resume),
            },
        )

    async def connection(self) -> tuple[str | None, str | None]:
        """``(base_url, api_key)``: the ones given to ``llm_batch``, else the connection's (read now)."""
        if self.base_url is not None or self.api_key is not None:
            return self.base_url, self.api_key
        from airflow.sdk import BaseHook

        # The async read: the triggerer answers a synchronous one from a thread through the event loop
        # that thread would be blocking, and the trigger hangs until the triggerer's deadlock watchdog.
        conn = await BaseHook.aget_connection(self.llm_conn_id or DEFAULT_LLM_CONN_ID)
        return conn.host or None, conn.password or None

    async def _client(self) -> BatchClient:
        # Deferred: the provider SDKs load only in the triggerer that runs this trigger.
        from airflow_provider_datagen.llm.batch.clients import client_for

        base_url, api_key = await self.connection()
        return await asyncio.to_thread(client_for, self.provider, api_key=api_key, base_url=base_url)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ended: dict[str, dict[str, Any]] = {}
        current: str | None = None
        try:
            client = await self._client()
            try:
                errors = 0
                while True:
                    try:
                        for batch_id in self.batch_ids:
                            if batch_id in ended:
                                continue
                            current = batch_id
                            info = await asyncio.to_thread(client.retrieve, batch_id)
                            if info.state != "in_progress":
                                self._ended.add(batch_id)
                                ended[batch_id] = {
                                    "state": info.state,
                                    "status": info.status,
                                    "counts": dict(info.counts),
                                    "error": info.error,
                                }
                        current, errors = None, 0
                    except (BatchAPIError, ConfigurationError):
                        raise  # a refusal: asking again gets the same answer
                    except Exception as exc:
                        errors += 1
                        if errors >= MAX_POLL_ERRORS:
                            raise
                        self.log.warning(
                            "polling batch %s failed (%d of %d in a row): %s: %s",
                            current,
                            errors,
                            MAX_POLL_ERRORS,
                            type(exc).__name__,
                            exc,
                        )
                    if len(ended) == len(self.batch_ids):
                        break
                    self.log.info(
                        "%d of %d %s batches ended; next poll in %.0f s",
                        len(ended),
                        len(self.batch_ids),
                        self.provider,
                        self.poll_interval,
                    )
                    await asyncio.sleep(self.poll_interval)
            finally:
                await asyncio.to_thread(client.close)
        except Exception as exc:
            # The operator raises it again on the worker, naming the batch, where the task's failure shows it.
            yield TriggerEvent(
                {
                    "status": "error",
                    "message": f"{type(exc).__name__}: {exc}",
                    "error_type": type(exc).__name__,
                    "batch_id": current,
                    "batches": ended,
                    "resume": self.resume,
                }
            )
            return
        yield TriggerEvent({"status": "ended", "batches": ended, "resume": self.resume})

    async def on_kill(self) -> None:
        """Cancel this trigger's batches that have not ended: a user killed the deferred task.

        Only this chunk's batches (the ones this trigger polls), through the rule the operator's ``on_kill``
        follows (:func:`~airflow_provider_datagen.core.batch.cancel.cancel_each`): the provider is asked and
        nothing is written to the submissions record, so the cancelled batch ends with its finished rows
        readable and the next run of the chunk records them (they were paid for); its rows that never ran come
        back cancelled, failed attempts of their items, resubmitted as ``retry`` allows.
        """
        left = [b for b in self.batch_ids if b not in self._ended]
        if not left:
            return
        why = "its deferred task was killed"
        asked: list[str] = []
        tried = 0
        try:
            async with asyncio.timeout(ON_KILL_TIMEOUT):
                client = await self._client()
                try:
                    for batch_id in left:
                        # one at a time, each in a thread: the SDK blocks, and a timeout still knows what was asked
                        asked += await asyncio.to_thread(cancel_each, client, [batch_id], why=why, log=self.log)
                        tried += 1
                finally:
                    await asyncio.to_thread(client.close)
        except TimeoutError:
            self.log.warning(
                "gave up cancelling after %g s: %d of %d %s batches may still run: %s",
                ON_KILL_TIMEOUT,
                len(left) - tried,
                len(left),
                self.provider,
                left[tried:],
            )
        finally:
            # also when the connection could not be read: the triggerer logs that error after this line
            self.log.warning(
                "the task was killed while deferred: asked %s to cancel %d of its %d open batches: %s",
                self.provider,
                len(asked),
                len(left),
                asked,
            )
