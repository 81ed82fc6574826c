"""The batch model step: :func:`llm_batch` builds the :class:`LLMBatchStep` a batch run sends through a provider.

The same prompt template, output types, field mapping and ``version`` rules as ``llm_process``: a batch
run and an online run of the same step over the same answers record the same fields. Each item's request
is the provider's own body (OpenAI chat completions with a ``json_schema`` response format for a
structured answer; Anthropic messages with one forced tool), and its answer is validated against the
output type (an answer that does not validate fails its item, never a silent ``None``).

Nothing is read when the step is built: the connection (host = base URL, password = API key, extra
``model``) is read by :meth:`LLMBatchStep.client` on the worker, so a DAG file that builds the step
parses anywhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_datagen.core.batch.protocol import RequestLine
from airflow_provider_datagen.exceptions import ConfigurationError, OutputValidationError, bad_argument
from airflow_provider_datagen.llm.output import OutputSpec, validated_fields
from airflow_provider_datagen.llm.prompt import PromptTemplate
from airflow_provider_datagen.llm.request import BATCH_PREFIXES, PROVIDERS, RequestBuilder, Target

if TYPE_CHECKING:
    from airflow_provider_datagen.core.batch.protocol import BatchClient, RowResult
    from airflow_provider_datagen.llm.request import LLMRequest

_OWNER = "llm_batch"
_DEFAULT_CONN_ID = "pydanticai_default"
#: the model-name prefixes of each batch provider (pydantic-ai's spellings; llm/request.py is their home)
_PROVIDERS = {prefix: api for prefix, api in PROVIDERS.items() if prefix in BATCH_PREFIXES}
#: the step name a batch step's fields are recorded under: a plain process's, so exports compare
STEP_NAME = "process"


def llm_batch(
    prompt: str,
    *,
    llm_conn_id: str | None = None,
    model_id: str | None = None,
    instructions: str | None = None,
    output_type: Any = str,
    output_field: str = "output",
    model_settings: Mapping[str, Any] | None = None,
    max_requests_per_batch: int | None = None,
    max_bytes_per_batch: int | None = None,
    provider: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    reuse: bool = True,
) -> LLMBatchStep:
    """A model step run through a provider's batch API (half the online price): ``run_batch``'s and
    ``DatagenBatchOperator``'s ``process``.

    :param prompt: a Jinja2 template rendered per item, as ``llm_process``'s. An item it cannot render
        fails alone with ``PromptTemplateError`` and is never sent.
    :param llm_conn_id: a ``pydanticai`` connection: host = base URL, password = API key, extra
        ``{"model": "openai:gpt-4o-mini"}``; ``None``: ``pydanticai_default``. Read on the worker.
    :param model_id: ``"openai:<model>"`` or ``"anthropic:<model>"``, overriding the connection's.
    :param instructions: the system instructions, the same for every item.
    :param output_type: what the model must answer, as ``llm_process``'s (``str``, a pydantic model, a
        JSON schema of an object, a dataclass or TypedDict, or another type pydantic validates).
    :param output_field: the field of a non-structured answer.
    :param model_settings: more request fields (``temperature``, ``max_tokens``, ...), sent as given.
    :param max_requests_per_batch: at most this many requests per batch (the provider's limit is the
        most: OpenAI 50,000, Anthropic 100,000).
    :param max_bytes_per_batch: at most this many bytes of requests per batch (OpenAI 200 MB, Anthropic
        256 MB).
    :param provider: ``"openai"`` or ``"anthropic"``; ``None``: the model name's prefix.
    :param base_url: the API's base URL, without a connection (code outside Airflow, tests); with
        ``api_key`` the connection is not read.
    :param api_key: the API key, without a connection.
    :param reuse: ``True`` (the default): an item whose request's key is in the response store
        (``<root>/datagen_responses``: online replies and earlier batches' rows alike) is recorded from
        it and never submitted (usage entry ``"reused": True``, cost 0). ``False``: every item is
        submitted. Either way the batch's rows are stored. Not in ``version``.
    :returns: the step; its ``version`` is a digest of the prompt, instructions, output type, model,
        connection id and settings, to pass as ``processor_version``.
    """
    template = PromptTemplate(prompt, _OWNER)
    output = OutputSpec(output_type, output_field, _OWNER)
    for param, value in (
        ("llm_conn_id", llm_conn_id),
        ("model_id", model_id),
        ("instructions", instructions),
        ("base_url", base_url),
        ("api_key", api_key),
    ):
        if value is not None and not isinstance(value, str):
            raise bad_argument(_OWNER, param, value, "is not a string", "give a string, or None")
    if model_settings is not None and not isinstance(model_settings, Mapping):
        raise bad_argument(_OWNER, "model_settings", model_settings, "is not a dict", "e.g. {'temperature': 0}")
    for param, limit in (
        ("max_requests_per_batch", max_requests_per_batch),
        ("max_bytes_per_batch", max_bytes_per_batch),
    ):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise bad_argument(_OWNER, param, limit, "is not an int >= 1", "e.g. 10000, or None for the provider's")
    if provider is not None and provider not in ("openai", "anthropic"):
        raise bad_argument(
            _OWNER, "provider", provider, "is not a batch provider", "give 'openai' or 'anthropic', or None"
        )
    if model_id is not None:
        _split_model(model_id, provider)  # a model id of another provider fails when the DAG is parsed
    if not isinstance(reuse, bool):
        raise bad_argument(
            _OWNER, "reuse", reuse, "is not a bool", "give True (answer from the response store) or False"
        )
    return LLMBatchStep(
        template,
        output,
        llm_conn_id=llm_conn_id,
        model_id=model_id,
        instructions=instructions,
        settings=dict(model_settings or {}),
        max_requests_per_batch=max_requests_per_batch,
        max_bytes_per_batch=max_bytes_per_batch,
        endpoint=Endpoint(provider, base_url, api_key),
        reuse=reuse,
    )


class Endpoint(NamedTuple):
    """Where a batch step's requests go when the arguments, not only the connection, say so."""

    provider: str | None
    base_url: str | None
    api_key: str | None


def _split_model(model_id: str, provider: str | None) -> tuple[str, str]:
    """``(provider, bare model)`` of ``"openai:gpt-4o-mini"``; ``provider`` given wins over the prefix."""
    prefix, sep, bare = model_id.partition(":")
    named = _PROVIDERS.get(prefix) if sep else None
    if named is None and provider is None:
        raise bad_argument(
            _OWNER,
            "model_id",
            model_id,
            "does not name a batch provider",
            "write 'openai:<model>' or 'anthropic:<model>', or pass provider='openai' (any OpenAI-compatible server)",
        )
    if named is not None and provider is not None and named != provider:
        raise bad_argument(
            _OWNER, "provider", provider, f"differs from the model's ({named!r} in {model_id!r})", "drop one"
        )
    return provider or named or "openai", bare if named is not None else model_id


class LLMBatchStep:
    """The batch step of :func:`llm_batch` (the ``BatchStep`` of core/batch/protocol.py)."""

    step_name = STEP_NAME
    #: a batch run opens the response store for it (core/batch/run.py)
    uses_response_store = True

    def __init__(
        self,
        template: PromptTemplate,
        output: OutputSpec,
        *,
        llm_conn_id: str | None,
        model_id: str | None,
        instructions: str | None,
        settings: dict[str, Any],
        max_requests_per_batch: int | None,
        max_bytes_per_batch: int | None,
        endpoint: Endpoint,
        reuse: bool = True,
    ) -> None:
        self.reuse = reuse
        self.template = template
        self.output = output
        self.llm_conn_id = llm_conn_id
        self.model_id = model_id
        self.instructions = instructions
        self.settings = settings
        self.max_requests_per_batch = max_requests_per_batch
        self.max_bytes_per_batch = max_bytes_per_batch
        self.provider, self.base_url, self.api_key = endpoint
        self.builder = RequestBuilder(template, output, instructions, self.settings)
        self.schema = self.builder.schema
        #: the base URL of the connection, once read (client())
        self._base_url: str | None = endpoint.base_url
        self.version = self._version()
        #: (provider, bare model) once the connection is read (client())
        self._resolved: tuple[str, str] | None = _split_model(model_id, endpoint.provider) if model_id else None

    def _version(self) -> str:
        description: dict[str, Any] = {
            "prompt": self.template.source,
            "instructions": self.instructions,
            "output": self.output.describe(),
            "model_id": self.model_id,
            "model_settings": self.settings,
            "provider": self.provider,
        }
        if self.llm_conn_id not in (None, _DEFAULT_CONN_ID):
            description["llm_conn_id"] = self.llm_conn_id
        digest = hashlib.sha256(json.dumps(description, sort_keys=True, default=repr).encode()).hexdigest()
        return f"llm-batch-{digest[:12]}"

    # --- the connection -----------------------------------------------------------------------

    def connection(self) -> tuple[str | None, str | None, str | None]:
        """``(base_url, api_key, model)`` of the step's connection (or of ``base_url=``/``api_key=``)."""
        if self.base_url is not None or self.api_key is not None:
            return self.base_url, self.api_key, None
        conn_id = self.llm_conn_id or _DEFAULT_CONN_ID
        try:
            from airflow.sdk import BaseHook
        except ImportError as exc:  # outside Airflow: base_url= and api_key= say where to send
            raise ConfigurationError(
                f"{_OWNER}: reading the connection {conn_id!r} needs Airflow ({exc}); outside Airflow pass "
                "base_url= and api_key="
            ) from exc
        try:
            conn = BaseHook.get_connection(conn_id)
        except Exception as exc:  # AirflowNotFoundException; its module moved between Airflow releases
            if "not defined" not in str(exc) and "NotFound" not in type(exc).__name__:
                raise
            raise ConfigurationError(
                f"{_OWNER}: the connection {conn_id!r} (llm_conn_id) does not exist; add it, e.g. `airflow "
                f"connections add {conn_id} --conn-type pydanticai --conn-host <base url> --conn-password "
                '<api key> --conn-extra \'{"model": "openai:gpt-4o-mini"}\'`'
            ) from exc
        extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
        return conn.host or None, conn.password or None, extra.get("model")

    def client(self) -> BatchClient:
        """The provider's batch client on the step's connection (read now)."""
        from airflow_provider_datagen.llm.batch.clients import client_for

        base_url, api_key, conn_model = self.connection()
        self._base_url = base_url
        if self._resolved is None:
            if not conn_model:
                raise ConfigurationError(
                    f"{_OWNER}: no model: pass model_id='openai:<model>' or set the connection's extra "
                    '{"model": "openai:<model>"}'
                )
            self._resolved = _split_model(conn_model, self.provider)
        return client_for(self._resolved[0], api_key=api_key, base_url=base_url)

    @property
    def resolved(self) -> tuple[str, str]:
        if self._resolved is None:
            raise ConfigurationError(f"{_OWNER}: the model is read from the connection by client(); call it first")
        return self._resolved

    # --- requests and answers -----------------------------------------------------------------

    def request(self, item: Mapping[str, Any], item_id: str, custom_id: str) -> RequestLine:
        """The provider's request body for ``item`` (its prompt rendered from the item's fields): the
        body of the :class:`~airflow_provider_datagen.llm.request.LLMRequest` ``llm_process`` sends too."""
        return RequestLine(custom_id, self._request(item, item_id).body())

    def _request(self, item: Mapping[str, Any], item_id: str) -> LLMRequest:
        provider, model = self.resolved
        return self.builder.build(item, {}, item_id, Target(provider, self._base_url, model, provider))

    def key(self, item: Mapping[str, Any], item_id: str) -> str:
        """The response store's key of ``item``'s request: the same as ``llm_process``'s for the same request."""
        return self._request(item, item_id).key()

    def llm_request(self, item: Mapping[str, Any], item_id: str) -> LLMRequest:
        """``item``'s request (the one :meth:`key` digests), as the response store records it."""
        return self._request(item, item_id)

    def stored_row(self, reply_json: str, custom_id: str) -> RowResult:
        """The succeeded row of a reply read from the response store."""
        from airflow_provider_datagen.llm.batch.clients import row_of_reply

        return row_of_reply(self.resolved[0], custom_id, reply_json, asks_json=self.schema is not None)

    def fields(self, row: RowResult) -> dict[str, Any]:
        """The item's fields of a succeeded row, validated; :class:`OutputValidationError` names what is wrong."""
        answer = row.answer
        if answer is None:
            raise OutputValidationError(
                f"{_OWNER}: row {row.custom_id}: the model gave no answer (a refusal, or the token limit "
                "reached before any output); raise max_tokens in model_settings or look at the prompt"
            )
        return validated_fields(self.output, answer, f"{_OWNER}: row {row.custom_id}")

    def model_label(self, row: RowResult) -> str:
        provider, model = self.resolved
        return f"{provider}:{row.model or model}"
