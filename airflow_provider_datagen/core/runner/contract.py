"""The process's contract, and when breaking it ends the chunk instead of failing one item.

A step returns a dict of field name -> JSON-serializable value, or None, and writes fields through
``ctx.set``/``ctx.append`` under the same rules. One item that breaks the contract fails alone (its
FAILED row, like any error of the user's code). :data:`CONTRACT_STREAK` consecutive ones end the run
with :class:`~airflow_provider_datagen.exceptions.ProcessContractError`: a process that breaks its
contract breaks it on every item, and each call may be paid for (a model call) with nothing kept.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from airflow_provider_datagen.core.events import encode_value
from airflow_provider_datagen.core.ids import MAX_FIELD_NAME, check_field_name
from airflow_provider_datagen.core.steps import Step
from airflow_provider_datagen.exceptions import DatagenError, ProcessContractError, ProcessError

#: this many consecutive items breaking the contract end the run (the mapped task: the chunk)
CONTRACT_STREAK = 3
#: what a step must return, as the errors say it
CONTRACT_FIX = (
    "return a dict of field name -> JSON-serializable value, or None (field names are non-empty strings of at "
    f"most {MAX_FIELD_NAME} characters without NUL)"
)
# The checks' errors keep their types (the FAILED rows name them as before); this attribute tells
# them apart from the same types raised by the user's own code, which stay ordinary item failures.
_BROKEN = "_datagen_broke_contract"


def broke_contract(exc: DatagenError) -> DatagenError:
    """Mark ``exc`` as raised by a contract check (see :func:`is_contract_error`); returns it."""
    setattr(exc, _BROKEN, True)
    return exc


def is_contract_error(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a check of the process's contract, not by the process's own code."""
    return getattr(exc, _BROKEN, False) is True


def check_result_of(item_id: str, step: Step, result: Any) -> dict[str, Any]:
    """The fields a step returned, checked: a mapping of valid names to storable values."""
    if not isinstance(result, Mapping):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: closed here, so Python does not warn about it later
            raise broke_contract(
                ProcessError(
                    f"item {item_id!r}: step {step.name!r} returned a coroutine; declare the function itself "
                    "`async def` (or give an object whose __call__ is async) so the runner awaits it"
                )
            )
        raise broke_contract(
            ProcessError(f"item {item_id!r}: step {step.name!r} returned a {type(result).__name__}; {CONTRACT_FIX}")
        )
    out: dict[str, Any] = {}
    try:
        for name, value in result.items():
            check_field_name(name, error=ProcessError, where=f"item {item_id!r}: step {step.name!r} returned")
            encode_value(value, what=f"field {name!r} returned by step {step.name!r} for item {item_id!r}")
            out[name] = value
    except DatagenError as exc:
        raise broke_contract(exc) from None
    return out


def check_field(item_id: str, call: str, name: Any, value: Any) -> None:
    """The same rules for a field written through ``ctx.set``/``ctx.append`` (``call``)."""
    try:
        check_field_name(name, error=ProcessError, where=f"item {item_id!r}: {call} got")
        encode_value(value, what=f"field {name!r} of item {item_id!r}")
    except DatagenError as exc:
        raise broke_contract(exc) from None


class ContractStreak:
    """Counts consecutive contract errors in acknowledgement order, with no work for items that pass.

    ``acks`` is how many items the run has acknowledged (finished or failed) before this one: when it
    is exactly one past the last contract error's, nothing was acknowledged in between. Under
    ``concurrency`` items are acknowledged in completion order (items finishing together in
    submission order), so that is the order "consecutive" means there.
    """

    __slots__ = ("at", "count")

    def __init__(self) -> None:
        self.count = 0
        self.at = -1

    def add(self, acks: int) -> int:
        """Count a contract error acknowledged after ``acks`` others; the length of the streak."""
        self.count = self.count + 1 if acks == self.at else 1
        self.at = acks + 1
        return self.count


def contract_abort(pipeline: Step, step_name: str | None, item_id: str, err: BaseException) -> ProcessContractError:
    """The error that ends a chunk whose process broke its contract :data:`CONTRACT_STREAK` times in a row."""
    wrong = str(err).replace(f"; {CONTRACT_FIX}", "")  # the fix is said once, below
    return ProcessContractError(
        f"{_function_of(pipeline, step_name)} broke the process contract on {CONTRACT_STREAK} consecutive items, "
        f"the last item {item_id!r} ({wrong}); the chunk stopped so that no more calls are paid for, and the items "
        f"not yet processed stay pending. Fix it to {CONTRACT_FIX}, then rerun"
    )


def _function_of(pipeline: Step, step_name: str | None) -> str:
    """The process function's qualified name, or the step's name (and function) in a step pipeline."""
    step = _find(pipeline, step_name) if step_name else None
    if step is None:
        return f"step {step_name!r}" if step_name else "the process"
    fn = getattr(step, "fn", None) or getattr(step, "reduce", None)  # a fan-out's contract is its reduce's
    qualname = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}" if fn else None
    if step is pipeline and type(step) is Step and qualname:
        return f"the process function {qualname}"
    return f"step {step.name!r} ({qualname})" if qualname else f"step {step.name!r}"


def _find(step: Step, name: str) -> Step | None:
    if step.name == name:
        return step
    for child in step.children():
        found = _find(child, name)
        if found is not None:
            return found
    return None
