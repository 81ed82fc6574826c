"""RateLimit: the serialisable description of one shared budget of calls (and tokens) per minute."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from airflow_provider_datagen.exceptions import bad_argument

# A key becomes part of storage keys (a SQLite row, a Redis key joined with "/"), so it stays plain.
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
_FIELDS = ("requests_per_minute", "tokens_per_minute", "key")
_EXAMPLE = "RateLimit(requests_per_minute=600, tokens_per_minute=200_000, key='openai')"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class RateLimit:
    """
    At most ``requests_per_minute`` calls start in any 60 s, across everything naming the same ``key``.

    The window is a moving one: every start is remembered for 60 s, so a burst of the whole budget may
    start at once and the next call waits until the oldest start is 60 s old (never more than N starts
    in any 60 s interval, wherever it begins).

    :param requests_per_minute: calls that may start in any 60 s window for this key (an int >= 1).
    :param tokens_per_minute: optional token budget per 60 s window for this key (an int >= 1);
        tokens are charged as they become known (an estimate before the call, the correction after).
    :param key: names the shared budget: every limiter with this key under the same datagen root (or
        the same Redis database) draws from it; letters, digits and ``_ . : @ -``, at most 128.
    """

    requests_per_minute: int
    tokens_per_minute: int | None = None
    key: str = "default"

    def __post_init__(self) -> None:
        _check_fields(RateLimit, "", self.requests_per_minute, self.tokens_per_minute, self.key)

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready form, read back by :meth:`from_dict`."""
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "key": self.key,
        }

    @classmethod
    def from_dict(cls, data: Any, *, owner: object = "RateLimit", param: str = "rate_limit") -> RateLimit:
        """A RateLimit from its :meth:`as_dict` form (e.g. a DAG param or an Airflow Variable).

        :param owner: who received the value, named in the error (an operator class, ``run_items``).
        :param param: the argument's name, named in the error.
        :raises ConfigurationError: ``data`` is not a dict, has unknown or missing keys or bad values.
        """
        if not isinstance(data, dict):
            raise bad_argument(owner, param, data, "is not a dict", f"give a dict like {_EXAMPLE}.as_dict()")
        unknown = sorted(str(k) for k in data if k not in _FIELDS)
        if unknown:
            raise bad_argument(
                owner, param, data, f"has the unknown key(s) {', '.join(map(repr, unknown))}", _fields_fix()
            )
        if "requests_per_minute" not in data:
            raise bad_argument(owner, param, data, "has no 'requests_per_minute'", _fields_fix())
        rpm, tpm, key = data["requests_per_minute"], data.get("tokens_per_minute"), data.get("key", "default")
        _check_fields(owner, f"{param}.", rpm, tpm, key)
        return cls(requests_per_minute=rpm, tokens_per_minute=tpm, key=key)

    @classmethod
    def coerce(cls, value: Any, *, owner: object, param: str = "rate_limit") -> RateLimit | None:
        """``value`` as a RateLimit: a RateLimit, its dict form, or ``None`` (no limit).

        :raises ConfigurationError: anything else, or a malformed dict.
        """
        if value is None or isinstance(value, RateLimit):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value, owner=owner, param=param)
        raise bad_argument(owner, param, value, "is not a RateLimit, a dict or None", f"give {_EXAMPLE}")


def _fields_fix() -> str:
    return f"use the keys {', '.join(map(repr, _FIELDS))} (only 'requests_per_minute' is required)"


def _check_fields(owner: object, prefix: str, rpm: Any, tpm: Any, key: Any) -> None:
    if not _is_count(rpm):
        raise bad_argument(owner, f"{prefix}requests_per_minute", rpm, "is not an int of 1 or more", "give e.g. 600")
    if tpm is not None and not _is_count(tpm):
        raise bad_argument(
            owner,
            f"{prefix}tokens_per_minute",
            tpm,
            "is not an int of 1 or more",
            "give e.g. 200_000, or None for no token budget",
        )
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise bad_argument(
            owner,
            f"{prefix}key",
            key,
            "is not a usable budget name",
            "use 1 to 128 letters, digits or '_.:@-', starting with a letter or digit, e.g. 'openai'",
        )


def check_seconds(owner: object, param: str, value: Any) -> float:
    """``value`` as a finite number of seconds >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise bad_argument(owner, param, value, "is not a finite number of seconds >= 0", "give e.g. 2.0")
    return float(value)
