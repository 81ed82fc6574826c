"""What a batch run needs from a provider's batch API and from the step: two small protocols and their values.

The domain (``run_batch``, the submission records) speaks only these; the model step's package
(``airflow_provider_datagen.llm.batch``) implements them with the providers' official SDKs. Nothing here
imports a provider SDK or Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

#: A batch's state as every provider's is collapsed to: still running, or ended (results readable).
#: ``failed``: the provider refused the whole batch (bad input file); none of its rows ran.
BatchState = Literal["in_progress", "ended", "failed"]

#: One row's outcome. ``errored``/``expired``/``cancelled`` rows are resubmitted (up to the retry policy's
#: attempts); ``succeeded`` rows carry the model's answer.
RowOutcome = Literal["succeeded", "errored", "expired", "cancelled"]


@dataclass(frozen=True)
class RequestLine:
    """One request of a batch: its ``custom_id`` and the provider-native request body (the JSON it sends)."""

    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class BatchInfo:
    """A submitted batch as the provider reports it now."""

    batch_id: str
    state: BatchState
    #: the provider's own status word ("in_progress", "finalizing", "ended", ...), shown in the UI
    status: str
    #: rows by outcome so far: {"succeeded", "errored", "expired", "cancelled", "processing"} (missing = 0)
    counts: Mapping[str, int] = field(default_factory=dict)
    #: the provider's explanation when ``state == "failed"``
    error: str | None = None


@dataclass(frozen=True)
class RowResult:
    """One row of an ended batch's results (rows come in any order; match them by ``custom_id``)."""

    custom_id: str
    outcome: RowOutcome
    #: the answer: the text of a plain answer, or the parsed JSON value of a structured one (an OpenAI
    #: ``response_format`` answer is parsed here; a JSON text that does not parse stays a ``str``);
    #: ``None`` when the model gave no answer (refusal, no tool call)
    answer: Any = None
    #: the model that answered, as the provider reported it (``"gpt-4o-mini-2024-07-18"``)
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    #: the provider's error for a row that did not succeed: "code: message"
    error: str | None = None
    #: a succeeded row's reply as the provider sent it (the completion's or message's JSON): what the
    #: response store keeps
    raw: str | None = None


class BatchClient(Protocol):
    """One provider's batch API (``openai`` Batch API, ``anthropic`` Message Batches), synchronous.

    Built on the worker (it reads the connection); one per run; :meth:`close` frees its connections.
    """

    #: "openai" or "anthropic": the prefix of ``"provider:model"`` labels the ledger prices by
    provider: str
    #: the provider's limits per batch (requests, bytes of the serialized requests)
    max_requests: int
    max_bytes: int
    #: whether a batch carries the metadata :meth:`find` matches (OpenAI yes, Anthropic no)
    supports_metadata: bool

    def line_bytes(self, line: RequestLine) -> int:
        """The bytes ``line`` adds to a batch's payload (OpenAI: its JSONL line; Anthropic: its JSON request)."""
        ...

    def submit(self, lines: Sequence[RequestLine], *, metadata: Mapping[str, str]) -> str:
        """Create a batch of ``lines`` (uploading its input file first where the API needs one); its id.

        ``metadata`` (string keys and values, each under 64/512 characters) is stored with the batch
        where the provider keeps metadata, for :meth:`find`; a client may add keys of its own (OpenAI's
        adds ``datagen_json_rows``: which rows asked a JSON answer, read back by :meth:`results`).
        """
        ...

    def find(self, metadata: Mapping[str, str], *, created_after: float) -> str | None:
        """The id of the newest batch created at or after ``created_after`` (epoch seconds, minus a few
        minutes of clock slack) whose metadata holds every item of ``metadata``; None if none does (or
        the provider keeps no metadata)."""
        ...

    def retrieve(self, batch_id: str) -> BatchInfo:
        """The batch's state and counts now."""
        ...

    def results(self, batch_id: str) -> Iterator[RowResult]:
        """The rows of an ended batch, streamed (a file of 200 MB is never held whole)."""
        ...

    def cancel(self, batch_id: str) -> None:
        """Ask the provider to cancel the batch (its finished rows stay readable)."""
        ...

    def close(self) -> None: ...


class BatchStep(Protocol):
    """A model step that runs through a batch API (:func:`airflow_provider_datagen.llm.llm_batch`)."""

    #: a digest of what the step says (prompt, instructions, output type, model, settings): the
    #: ``processor_version`` to pass so that changing any of them reruns the items
    version: str
    #: the step name its fields are recorded under ("process", as a plain process's)
    step_name: str
    #: the step's own limits per batch (None: the provider's)
    max_requests_per_batch: int | None
    max_bytes_per_batch: int | None

    def client(self) -> BatchClient:
        """The provider's batch client, built from the step's connection (read now, on the worker)."""
        ...

    def request(self, item: Mapping[str, Any], item_id: str, custom_id: str) -> RequestLine:
        """The batch request of one item (its prompt rendered). Raises the prompt's error (naming the
        missing field) for an item the template cannot render: that item fails alone."""
        ...

    def fields(self, row: RowResult) -> dict[str, Any]:
        """The item's fields of a succeeded row's answer, validated against the step's output type.
        Raises ``OutputValidationError`` (naming what is wrong) for an answer that does not validate."""
        ...

    def model_label(self, row: RowResult) -> str:
        """``"provider:model"`` of the row, the name the ledger prices it by."""
        ...
