"""The transient errors of a model call, by name, for a run's ``retry=`` policy: both engines'.

``engine="sdk"`` raises the provider SDK's own errors (``openai``'s and ``anthropic``'s, which share
their names); ``engine="pydantic-ai"`` turns each SDK's errors into its own categories (the SDK's
exception is the ``__cause__``). A rate-limit error carries the provider's ``Retry-After``: pydantic-ai's
as ``retry_after`` (seconds), the SDKs' in their ``response`` headers (and ``retry-after-ms`` as
``retry_after``), which the retry policy waits at least. Dotted names, so a DAG file naming them needs
no SDK installed.

Not in the list, on purpose: a rejected request (400, 401, 403, 404, a context window exceeded) or an
exhausted quota fails the same way when sent again, and an answer that does not validate (after the
step's ``output_retries``: ``OutputValidationError``, pydantic-ai's ``UnexpectedModelBehavior``) is a
prompt or schema problem; add their names to retry those too.
"""

from __future__ import annotations

#: Errors of a model call that another call may not meet: give them to ``RetryPolicy(retry_on=...)``.
RETRYABLE_ERRORS: tuple[str, ...] = (
    # --- engine="pydantic-ai"
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
    # --- engine="sdk": the SDKs' own errors
    # HTTP 429; its response carries Retry-After
    "openai.RateLimitError",
    "anthropic.RateLimitError",
    # HTTP 5xx (Anthropic's 529 overloaded, 503 and 504 included)
    "openai.InternalServerError",
    "anthropic.InternalServerError",
    # refused, reset or dropped connections, and the client's timeout (APITimeoutError is one)
    "openai.APIConnectionError",
    "anthropic.APIConnectionError",
)
