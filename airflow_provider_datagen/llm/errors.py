"""The transient errors of a model call, by name, for a run's ``retry=`` policy.

pydantic-ai turns each provider SDK's errors into its own categories (the SDK's exception is the
``__cause__``), so one list covers OpenAI, Anthropic, vLLM, Ollama and the rest. A rate-limit error
carries the provider's ``Retry-After`` as ``retry_after`` (seconds; from ``retry-after-ms`` or
``Retry-After``), which the retry policy waits at least. Dotted names, so a DAG file naming them needs
no SDK installed.

Not in the list, on purpose: a rejected request (400, 401, 403, 404, a context window exceeded) or an
exhausted quota fails the same way when sent again, and an answer that does not validate
(``UnexpectedModelBehavior``, after the agent's own output retries) is a prompt or schema problem;
add ``"pydantic_ai.exceptions.UnexpectedModelBehavior"`` to retry those too.
"""

from __future__ import annotations

#: Errors of a model call that another call may not meet: give them to ``RetryPolicy(retry_on=...)``.
RETRYABLE_ERRORS: tuple[str, ...] = (
    # HTTP 429 and the like; carries retry_after
    "pydantic_ai.exceptions.ModelRateLimitError",
    # HTTP 503/529: unavailable or overloaded
    "pydantic_ai.exceptions.ModelUnavailableError",
    # HTTP 500/502/504
    "pydantic_ai.exceptions.ModelServerError",
    # refused, reset or dropped connections, and the client's own timeout (ModelTimeoutError)
    "pydantic_ai.exceptions.ModelConnectionError",
    # the step's timeout= (pydantic-ai's request_timeout) ran out
    "pydantic_ai.exceptions.ModelRequestTimeout",
)
