"""Every error the provider raises is a :class:`DatagenError`; messages name the thing and the fix."""

from __future__ import annotations

from typing import Any


class DatagenError(Exception):
    """Base class of every error raised by airflow-provider-datagen."""


class InvalidNameError(DatagenError, ValueError):
    """A pipeline, experiment, step or field name is unusable as given."""


class InvalidItemError(DatagenError, ValueError):
    """A source item is malformed: not a dict, missing its key field, or a duplicate key."""


class InvalidValueError(DatagenError, ValueError):
    """A value cannot be stored in the log (not JSON-serializable and not bytes)."""


class InvalidEventError(DatagenError, ValueError):
    """An event would break a log invariant (unknown status, mixed FIELD_SET/FIELD_APPEND, ...)."""


class SchemaVersionError(DatagenError):
    """The log was written by a schema version this code does not understand."""


class NotALogError(DatagenError):
    """The path exists but is not a Lance dataset written by airflow-provider-datagen."""


class LogCorruptedError(DatagenError):
    """The log's files are damaged or missing; names the dataset and how to restore it."""


class LogWriteError(DatagenError):
    """A write to the log failed; the batch was not acknowledged and will be redone."""


class FencingError(DatagenError):
    """A writer with a stale epoch tried to act after a newer attempt took ownership."""


class InvalidPipelineError(DatagenError, ValueError):
    """A step graph is malformed: duplicate step names, unknown kinds, bad options."""


class ProcessError(DatagenError):
    """The user's process function misbehaved (returned a non-dict, a non-JSON value, ...)."""


class ProcessContractError(ProcessError):
    """The process broke its contract (return type, field names or values) on consecutive items: the chunk stopped."""


class PromptTemplateError(DatagenError, ValueError):
    """A model step's prompt template could not be rendered for an item (e.g. it names a field the item lacks)."""


class ConfigurationError(DatagenError, ValueError):
    """An operator, hook or sensor argument is invalid; names the parameter."""


class ItemsFailedError(DatagenError):
    """Some items of a mapped chunk failed; they are recorded in the log and pending for a rerun."""


class TooManyFailedItemsError(DatagenError):
    """More items are failed than a status sensor's ``max_failed_items`` allows."""


class UsageLimitExceededError(DatagenError):
    """An experiment's recorded usage is above a status sensor's ``max_cost_usd`` or ``max_tokens``."""


class NotFoundError(DatagenError):
    """An experiment, item or blob the UI was asked for does not exist; the message says what."""


class ExperimentNotFoundError(NotFoundError):
    """An experiment has no log (a misspelt name, another root, or nothing generated yet)."""


class RepeatedFailureError(DatagenError):
    """Items in a row failed with the same error (``max_repeated_failures``): a systemic failure stopped the chunk."""


class UsageValueError(DatagenError, ValueError):
    """A ``ctx.record_usage`` value is out of range (tokens above 10**12 or cost above 10**6 per call)."""


class ItemFailedError(DatagenError):
    """An item's processing raised and ``fail_fast`` was set."""


class ProcessInterrupted(DatagenError):
    """The user's function raised KeyboardInterrupt or SystemExit; acknowledged work was kept."""


class MisalignedStreamsError(DatagenError, ValueError):
    """The two column streams of a streamed fold did not list the same rows; the reader folds again."""


class OutputValidationError(DatagenError, ValueError):
    """A model's answer does not validate against the step's ``output_type`` (the item fails, never a silent None)."""


class BatchRowError(DatagenError):
    """A provider's batch reported a row errored, expired or cancelled; the row is resubmitted alone."""


class BatchAPIError(DatagenError):
    """A provider's batch API refused a call (a batch it failed, an input it would not accept)."""


class ResponseStoreError(DatagenError):
    """The response store (``<root>/datagen_responses``) cannot be read or written; names its URI and the fix."""


#: How much of a bad argument's value a message shows.
_MAX_SHOWN = 200


def _owner_name(owner: object) -> str:
    if isinstance(owner, str):
        return owner
    if isinstance(owner, type):
        return owner.__name__
    return type(owner).__name__


def bad_argument(owner: object, param: str, value: Any, problem: str, fix: str) -> ConfigurationError:
    """The error for ``owner``'s argument ``param``: what is wrong with ``value`` and how to fix it.

    :param owner: the class (or an instance of it, or its name) whose argument is bad.
    """
    shown = repr(value)
    if len(shown) > _MAX_SHOWN:
        shown = shown[:_MAX_SHOWN] + "…"
    return ConfigurationError(f"{_owner_name(owner)}: {param}={shown} {problem}; {fix}")
