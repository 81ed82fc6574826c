"""In-place retries of transient errors: :class:`RetryPolicy` (see docs/adr/0008-in-place-retries.md).

A policy says which errors of a process are transient (``retry_on``: classes, or dotted names matched
against the error's class hierarchy so no SDK need be installed), how many calls an item may take in
one run (``attempts``, the first included) and how long to wait between them (exponential backoff,
optionally jittered, never below a ``Retry-After`` the error carries). The waiting and stopping are
tenacity's (:meth:`RetryPolicy.retrying`, :meth:`RetryPolicy.async_retrying` for async processes);
the runner makes the first attempt a plain call and hands only its failure to tenacity
(:func:`failed_first`), and stages each retried attempt as a transient FAILED event
(core/runner/attempts.py). Nothing here knows about the log.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tenacity import (
    AsyncRetrying,
    BaseRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)

from airflow_provider_datagen.exceptions import bad_argument

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_KEYS = ("attempts", "retry_on", "backoff", "max_backoff", "jitter")


def dotted_name(cls: type) -> str:
    """``module.qualname`` of a class: how :meth:`RetryPolicy.as_dict` names an exception class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _name_matches(name: str, cls: type) -> bool:
    """Whether the dotted ``name`` names ``cls``: its exact ``module.qualname``, or the qualname
    re-exported by a parent package (``openai.RateLimitError`` is ``openai._exceptions.RateLimitError``)."""
    module = cls.__module__
    full = f"{module}.{cls.__qualname__}"
    if name == full:
        return True
    package, _, qualname = name.rpartition(".")
    return qualname == cls.__qualname__ and module.startswith(package + ".")


def retry_after_of(exc: BaseException, now: Callable[[], float] = time.time) -> float | None:
    """Seconds the error asks to wait before the next call, or None.

    An attribute ``retry_after`` (seconds), else a ``Retry-After`` header of an HTTP response the error
    carries (``exc.response.headers``, as httpx/requests and the SDKs built on them do): seconds, or an
    HTTP date (the seconds until then, 0 if past). Anything else (unreadable, not finite, negative
    seconds) is ignored: plain backoff. A long wait is returned as asked: the policy does not retry
    what asks for more than its ``max_backoff``, and a rate limit caps the cooldown it stores.
    """
    value: Any = getattr(exc, "retry_after", None)
    if value is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
        if headers is None:
            return None
        try:
            value = headers.get("Retry-After") if hasattr(headers, "get") else None
        except Exception:  # a foreign mapping type may raise anything: treat it as no header
            return None
        if value is None:
            return None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        seconds = _float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(text)
                # a date already past asks for no wait
                return max(0.0, when.timestamp() - now())
            except (TypeError, ValueError, OverflowError, OSError):
                return None
    else:
        return None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def _float(value: int | float) -> float | None:
    try:
        return float(value)
    except OverflowError:  # an int beyond any float: not a number of seconds
        return None


@dataclass(frozen=True)
class RetryPolicy:
    """How a run retries a process's transient errors in place.

    :param attempts: at most this many calls of the process per item per run, the first included
        (``1``: no retry).
    :param retry_on: the transient errors: exception classes (subclasses match too) or dotted names
        ``"package.module.ClassName"`` matched against the class hierarchy of the raised error (a
        name also matches a class its package re-exports: ``"openai.RateLimitError"``).
    :param backoff: seconds before the first retry; each further retry doubles it (0: no wait).
    :param max_backoff: the longest single wait, in seconds: the exponential backoff is capped at it,
        and an error whose ``Retry-After`` asks for longer is not retried in this run (the item fails
        now; a later run retries it).
    :param jitter: "full jitter": each wait is drawn uniformly from 0 to the capped exponential
        backoff, so workers that failed together do not retry together; a ``Retry-After`` is a floor.
    :param sleep: how a wait is slept, for tests (not serialised, not compared); ``None``: the
        runner's own wait, which ends early when the run ends. For an async process it may return an
        awaitable, which is awaited.
    """

    attempts: int = 3
    retry_on: tuple[type[BaseException] | str, ...] = (TimeoutError, ConnectionError)
    backoff: float = 1.0
    max_backoff: float = 60.0
    jitter: bool = True
    sleep: Callable[[float], Any] | None = field(default=None, compare=False, repr=False)
    _classes: tuple[type[BaseException], ...] = field(init=False, repr=False, compare=False)
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        a = self.attempts
        if isinstance(a, bool) or not isinstance(a, int) or a < 1:
            raise bad_argument(self, "attempts", a, "is not an int >= 1", "give the most calls per item, e.g. 5")
        retry_on = self.retry_on
        if isinstance(retry_on, (str, type)):
            retry_on = (retry_on,)
        if not isinstance(retry_on, (tuple, list)):
            raise bad_argument(
                self, "retry_on", retry_on, "is not a tuple", "give exception classes or 'module.Class' names"
            )
        classes: list[type[BaseException]] = []
        names: list[str] = []
        for entry in retry_on:
            if isinstance(entry, type) and issubclass(entry, Exception):
                classes.append(entry)
            elif isinstance(entry, str) and _DOTTED.match(entry):
                names.append(entry)
            else:
                raise bad_argument(
                    self,
                    "retry_on",
                    entry,
                    "is not an Exception subclass or a dotted 'module.ClassName'",
                    "name the error class, e.g. TimeoutError or 'openai.RateLimitError'",
                )
        for what in ("backoff", "max_backoff"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise bad_argument(self, what, v, "is not a number of seconds >= 0", "e.g. 2.0")
        if self.max_backoff < self.backoff:
            raise bad_argument(
                self, "max_backoff", self.max_backoff, f"is below backoff={self.backoff}", "give max_backoff >= backoff"
            )
        if not isinstance(self.jitter, bool):
            raise bad_argument(self, "jitter", self.jitter, "is not a bool", "pass True or False")
        if self.sleep is not None and not callable(self.sleep):
            raise bad_argument(self, "sleep", self.sleep, "is not callable", "pass a function of seconds, or None")
        object.__setattr__(self, "retry_on", tuple(retry_on))
        object.__setattr__(self, "backoff", float(self.backoff))
        object.__setattr__(self, "max_backoff", float(self.max_backoff))
        object.__setattr__(self, "_classes", tuple(classes))
        object.__setattr__(self, "_names", tuple(names))

    # --- serialisation ----------------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """The JSON-able form (classes as dotted names); :meth:`from_dict` gives an equal-acting policy."""
        return {
            "attempts": self.attempts,
            "retry_on": [e if isinstance(e, str) else dotted_name(e) for e in self.retry_on],
            "backoff": self.backoff,
            "max_backoff": self.max_backoff,
            "jitter": self.jitter,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetryPolicy:
        """A policy from :meth:`as_dict`'s form (e.g. from params or a Variable); unknown keys are refused."""
        if not isinstance(data, Mapping):
            raise bad_argument(cls, "retry", data, "is not a dict", f"give a RetryPolicy or a dict of {list(_KEYS)}")
        unknown = sorted(str(k) for k in data if k not in _KEYS)
        if unknown:
            raise bad_argument(cls, "retry", dict(data), f"has unknown keys {unknown}", f"use only {list(_KEYS)}")
        kwargs = dict(data)
        if isinstance(kwargs.get("retry_on"), list):
            kwargs["retry_on"] = tuple(kwargs["retry_on"])
        return cls(**kwargs)

    @classmethod
    def coerce(cls, value: RetryPolicy | Mapping[str, Any] | None) -> RetryPolicy | None:
        """``value`` as a policy: a policy, its dict form, or None (no retry)."""
        if value is None or isinstance(value, RetryPolicy):
            return value
        return cls.from_dict(value)

    # --- deciding ---------------------------------------------------------------------------------

    def matches(self, exc: BaseException) -> bool:
        """Whether ``exc`` is one of the transient errors of ``retry_on``."""
        if not isinstance(exc, Exception):
            return False  # interrupts and the orchestrator's own signals are never retried
        if self._classes and isinstance(exc, self._classes):
            return True
        names = self._names
        return bool(names) and any(_name_matches(n, c) for c in type(exc).__mro__ for n in names)

    def retryable(self, exc: BaseException) -> bool:
        """Whether another call may follow ``exc``: it is transient and its Retry-After fits ``max_backoff``."""
        if not self.matches(exc):
            return False
        after = retry_after_of(exc)
        return after is None or after <= self.max_backoff

    def wait(self, retry_state: RetryCallState) -> float:
        """Seconds before the next call (a tenacity wait): the backoff, at least the Retry-After."""
        base = (
            wait_random_exponential(multiplier=self.backoff, max=self.max_backoff)
            if self.jitter
            else wait_exponential(multiplier=self.backoff, max=self.max_backoff)
        )(retry_state)
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        after = retry_after_of(exc) if exc is not None else None
        return base if after is None else max(base, after)

    def tenacity_kwargs(self, retry_also: Callable[[BaseException], bool] | None = None) -> dict[str, Any]:
        """The stop, wait and retry strategies as keyword arguments of ``tenacity.Retrying`` (or ``AsyncRetrying``).

        ``retry_also`` narrows what is retried (the runner never retries its own contract errors).
        """
        retryable = self.retryable
        check = retryable if retry_also is None else (lambda e: retry_also(e) and retryable(e))
        return {
            "stop": stop_after_attempt(self.attempts),
            "wait": self.wait,
            "retry": retry_if_exception(check),
            "reraise": True,
        }

    def retrying(
        self,
        *,
        sleep: Callable[[float], None],
        before: Callable[[RetryCallState], None] | None = None,
        before_sleep: Callable[[RetryCallState], None] | None = None,
        retry_also: Callable[[BaseException], bool] | None = None,
    ) -> Retrying:
        """A ``tenacity.Retrying`` for one call of one item: exhausted or not retryable, the last error raises."""
        kwargs = self.tenacity_kwargs(retry_also)
        if before is not None:
            kwargs["before"] = before
        if before_sleep is not None:
            kwargs["before_sleep"] = before_sleep
        return Retrying(sleep=sleep, **kwargs)

    def async_retrying(
        self,
        *,
        sleep: Callable[[float], Any],
        before: Callable[[RetryCallState], Any] | None = None,
        before_sleep: Callable[[RetryCallState], Any] | None = None,
        retry_also: Callable[[BaseException], bool] | None = None,
    ) -> AsyncRetrying:
        """:meth:`retrying` for an async process: a ``tenacity.AsyncRetrying`` (hooks and sleep may be async)."""
        kwargs = self.tenacity_kwargs(retry_also)
        if before is not None:
            kwargs["before"] = before
        if before_sleep is not None:
            kwargs["before_sleep"] = before_sleep
        return AsyncRetrying(sleep=sleep, **kwargs)


def failed_first(retrying: BaseRetrying, exc: BaseException) -> RetryCallState:
    """Tenacity's state after a first attempt that raised ``exc``, made outside tenacity.

    The runner makes the first call plain (no ``Retrying`` per call when nothing fails) and hands
    only a failure over: driving ``retrying.iter`` from this state, as ``Retrying.__call__`` does,
    decides whether to retry it, how long to wait and when to stop, exactly as if tenacity had made
    the first call.
    """
    retrying.begin()
    rs = RetryCallState(retrying, fn=None, args=(), kwargs={})
    rs.set_exception((type(exc), exc, exc.__traceback__))
    return rs
