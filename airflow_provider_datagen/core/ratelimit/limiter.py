"""SharedLimiter: one RateLimit drawn from a shared storage, with tokens and a shared cooldown.

Requests and tokens are two moving windows of 60 s in a ``limits`` storage, driven by
:class:`limits.strategies.MovingWindowRateLimiter`: the embedded :class:`.sqlite.SQLiteStorage`
(every process of one host), or any Redis URI ``limits`` understands (every host). The cooldown after
a 429 is one shared "blocked until" deadline per key, kept beside the windows in the same storage.

A cooldown is bounded by the limiter's ``max_cooldown`` (the run's ``RetryPolicy.max_backoff``, else
:data:`DEFAULT_MAX_COOLDOWN`): a longer one is stored as that ceiling, and a stored deadline further
ahead than the ceiling (an older version stored any hint, e.g. ``Retry-After: 1e9``) is ignored and
replaced, so one hostile hint never blocks a key for longer than the ceiling, on any host.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol, cast

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from airflow_provider_datagen.core.ratelimit.spec import RateLimit, check_seconds
from airflow_provider_datagen.core.ratelimit.sqlite import SQLiteStorage
from airflow_provider_datagen.core.store.paths import CHECKPOINTS_DIR, is_local, local_path
from airflow_provider_datagen.core.uri import scheme_of
from airflow_provider_datagen.exceptions import bad_argument

if TYPE_CHECKING:
    from collections.abc import Callable

    from limits.storage import Storage

logger = logging.getLogger(__name__)

#: The embedded storage's file, beside the experiments of a local root.
STORAGE_FILE = ".ratelimits.sqlite"
#: URI schemes accepted for a shared storage (``limits``' Redis family, and ``memory://`` for one process).
REDIS_SCHEMES = ("redis", "rediss", "redis+unix", "redis+cluster", "redis+sentinel")
STORAGE_SCHEMES = (*REDIS_SCHEMES, "memory")
#: A token window holds at most this many entries: tokens are counted in units of tokens_per_minute/1000
#: (a Redis moving window stores one list element per unit).
_TOKEN_SLOTS = 1000
#: Shortest sleep between two tries, so waiters never spin on a boundary instant.
_MIN_WAIT = 0.005
_WINDOW = 60.0
_NAMESPACE = "DATAGEN"
#: the longest cooldown (seconds) a limiter stores or honours when the run has no retry policy
#: (a policy's ``max_backoff`` is the ceiling otherwise: it retries nothing that asks for longer)
DEFAULT_MAX_COOLDOWN = 60.0

# A stored value that is not a number, or is after ARGV[3] (the ceiling), counts as none.
_COOLDOWN_LUA = """
local current = tonumber(redis.call('get', KEYS[1]) or '0') or 0
if current ~= current or current > tonumber(ARGV[3]) then
  current = 0
end
local wanted = tonumber(ARGV[1])
if wanted > current then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return tostring(current)
"""


class Cooldowns(Protocol):
    """Where the shared "blocked until" deadline of each key lives.

    ``latest`` is the furthest deadline that may be stored now (now + the ceiling): one found after
    it is an older version's unbounded cooldown, replaced by :meth:`block_until` and read as none
    (0.0) by :meth:`blocked_until`.
    """

    def block_until(self, key: str, until: float, latest: float = math.inf) -> float: ...

    def blocked_until(self, key: str, latest: float = math.inf) -> float: ...


def _deadline(value: Any, latest: float) -> float:
    """A stored deadline, or 0.0 when it is unreadable, not finite or after ``latest``."""
    try:
        until = float(value)
    except (TypeError, ValueError):
        return 0.0
    return until if math.isfinite(until) and until <= latest else 0.0


class _RedisCooldowns:
    def __init__(self, storage: Any) -> None:
        self._client = storage.get_connection()
        self._prefix = getattr(storage, "key_prefix", "LIMITS")
        self._script = self._client.register_script(_COOLDOWN_LUA)

    def _key(self, key: str) -> str:
        return f"{self._prefix}:{_NAMESPACE}/cooldown/{key}"

    def block_until(self, key: str, until: float, latest: float = math.inf) -> float:
        # Lua turns numbers into integers on return, so the deadline travels as text; the key outlives
        # the deadline by a second so a reader never sees it vanish early.
        ttl_ms = max(1, math.ceil((until - time.time()) * 1000) + 1000)
        ceiling = repr(latest) if math.isfinite(latest) else "1e308"
        return _deadline(self._script(keys=[self._key(key)], args=[repr(until), ttl_ms, ceiling]), latest)

    def blocked_until(self, key: str, latest: float = math.inf) -> float:
        value = self._client.get(self._key(key))
        return _deadline(value, latest) if value is not None else 0.0


class _MemoryCooldowns:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}

    def block_until(self, key: str, until: float, latest: float = math.inf) -> float:
        with self._lock:
            self._until[key] = max(_deadline(self._until.get(key, 0.0), latest), until)
            return self._until[key]

    def blocked_until(self, key: str, latest: float = math.inf) -> float:
        return _deadline(self._until.get(key, 0.0), latest)


# memory:// is per process by nature; one storage per process at least makes it shared by its threads.
_MEMORY: tuple[MemoryStorage, _MemoryCooldowns] | None = None
_MEMORY_LOCK = threading.Lock()


class SharedLimiter:
    """
    Draws calls (and tokens) of one :class:`RateLimit` from a storage shared by everyone on its key.

    Thread-safe; one per process is enough. Build it with :func:`open_limiter`.

    :param rate_limit: the budget.
    :param storage: a ``limits`` storage with moving-window support.
    :param cooldowns: where the key's shared cooldown deadline lives (the same storage).
    :param clock: wall clock in seconds since the epoch (shared deadlines are absolute times).
    :param sleep: how :meth:`acquire` waits; both injectable for tests.
    :param max_cooldown: the longest cooldown stored or honoured, in seconds (see the module's doc).
    """

    def __init__(
        self,
        rate_limit: RateLimit,
        storage: Storage,
        cooldowns: Cooldowns,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
        max_cooldown: float = DEFAULT_MAX_COOLDOWN,
    ) -> None:
        self.max_cooldown = check_seconds(type(self), "max_cooldown", max_cooldown)
        self.rate_limit = rate_limit
        self.key = rate_limit.key
        self.storage = storage
        self._cooldowns = cooldowns
        self._clock = clock
        self._sleep = sleep
        self._strategy = MovingWindowRateLimiter(storage)
        self._requests = RateLimitItemPerMinute(rate_limit.requests_per_minute, namespace=_NAMESPACE)
        tpm = rate_limit.tokens_per_minute
        #: Tokens per unit charged to the token window (1 below 1000 tokens per minute).
        self.token_unit = math.ceil(tpm / _TOKEN_SLOTS) if tpm else 1
        self._tokens = RateLimitItemPerMinute(tpm // self.token_unit, namespace=_NAMESPACE) if tpm else None
        # Tokens this limiter owes the shared window; negative is a credit (see charge_tokens).
        self._owed = 0
        # Requests charged after their calls (``calls=N`` through ctx) not yet in the shared window.
        self._owed_requests = 0
        self._lock = threading.Lock()

    # -- public API ------------------------------------------------------------------------------------

    def acquire(self, cost_requests: int = 1, est_tokens: int = 0) -> float:
        """Block until a call may start; return the seconds waited.

        :param cost_requests: requests this call counts for (1 unless the process charges more).
        :param est_tokens: tokens the call is expected to use, charged now (ignored without a token budget).
        """
        self._check_cost(cost_requests, est_tokens)
        start = self._clock()
        self._add_owed(est_tokens)
        while (wait := self._attempt(cost_requests)) > 0:
            self._sleep(wait)
        return max(0.0, self._clock() - start)

    async def acquire_async(self, cost_requests: int = 1, est_tokens: int = 0) -> float:
        """:meth:`acquire` for an event loop: waits with ``asyncio.sleep`` (storage calls stay short)."""
        self._check_cost(cost_requests, est_tokens)
        start = self._clock()
        self._add_owed(est_tokens)
        while (wait := self._attempt(cost_requests)) > 0:
            await asyncio.sleep(wait)
        return max(0.0, self._clock() - start)

    def try_acquire(self, cost_requests: int = 1, est_tokens: int = 0) -> bool:
        """Take a start now if the budget allows it (never waits); ``False`` leaves no request charged."""
        self._check_cost(cost_requests, est_tokens)
        self._add_owed(est_tokens)
        if self._attempt(cost_requests) == 0:
            return True
        # Whatever part of the estimate was already paid stays as this limiter's credit.
        self._add_owed(-est_tokens)
        return False

    def charge_tokens(self, n: int) -> None:
        """Charge ``n`` more tokens to the key (``actual - estimate`` after a call; may be negative).

        A positive charge is written to the shared window at once as far as it fits, and the rest is
        paid by this limiter's next :meth:`acquire` before it lets a call start. A moving window cannot
        give entries back, so a negative correction becomes a credit of this limiter, spent on its
        next charges (and lost when the process ends).
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise bad_argument(type(self), "charge_tokens(n)", n, "is not an int", "give a token count")
        if self._tokens is None or n == 0:
            return
        self._add_owed(n)
        self._pay_tokens()

    def charge_requests(self, n: int) -> None:
        """Charge ``n`` more requests to the key: calls already made (an attempt that made several).

        Never waits, so an event loop may call it: the calls happened already, so blocking now would
        not stop them. What fits is written to the shared window at once; the rest is paid by this
        limiter's next :meth:`acquire` before it lets a call start.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise bad_argument(type(self), "charge_requests(n)", n, "is not an int >= 0", "give a request count")
        if n:
            with self._lock:
                self._owed_requests += n
            self._pay_requests()

    def cooldown(self, seconds: float) -> float:
        """After a 429: no call starts on this key, in any process, for ``seconds``; the shared deadline.

        Deadlines only move later: a shorter cooldown never shortens one already set. At most
        ``max_cooldown`` seconds: a longer wait is stored as that ceiling.
        """
        seconds = check_seconds(type(self), "cooldown(seconds)", seconds)
        if seconds > self.max_cooldown:
            logger.warning(
                "Rate limit %r: a cooldown of %.1f s asked for is capped at max_cooldown=%.1f s",
                self.key,
                seconds,
                self.max_cooldown,
            )
            seconds = self.max_cooldown
        now = self._clock()
        deadline = self._cooldowns.block_until(self.key, now + seconds, now + self.max_cooldown)
        logger.info("Rate limit %r cooled down for %.1f s (until %.3f)", self.key, seconds, deadline)
        return deadline

    def blocked_until(self) -> float:
        """The key's shared cooldown deadline (seconds since the epoch; 0.0 when none was set).

        A stored deadline more than ``max_cooldown`` ahead (an older version's) reads as none.
        """
        return self._cooldowns.blocked_until(self.key, self._clock() + self.max_cooldown)

    @property
    def owed_tokens(self) -> int:
        """Tokens charged but not yet written to the shared window (negative: this limiter's credit)."""
        return self._owed

    def close(self) -> None:
        """Release the storage connection of an embedded storage (a Redis pool closes on its own)."""
        if isinstance(self.storage, SQLiteStorage):
            self.storage.close()

    # -- internals -------------------------------------------------------------------------------------

    def _check_cost(self, cost_requests: int, est_tokens: int) -> None:
        rpm = self.rate_limit.requests_per_minute
        if isinstance(cost_requests, bool) or not isinstance(cost_requests, int) or not 1 <= cost_requests <= rpm:
            raise bad_argument(
                type(self),
                "cost_requests",
                cost_requests,
                f"is not an int from 1 to requests_per_minute ({rpm})",
                "charge a call as 1 request, or raise requests_per_minute",
            )
        if isinstance(est_tokens, bool) or not isinstance(est_tokens, int) or est_tokens < 0:
            raise bad_argument(type(self), "est_tokens", est_tokens, "is not an int >= 0", "give a token estimate")

    def _add_owed(self, n: int) -> None:
        if self._tokens is not None and n:
            with self._lock:
                self._owed += n

    def _attempt(self, cost: int) -> float:
        """Take a start if the cooldown, the owed tokens and the request window allow it (then 0.0);
        otherwise the seconds to wait before trying again."""
        now = self._clock()
        until = self._cooldowns.blocked_until(self.key, now + self.max_cooldown)
        if until > now:
            return until - now
        if self._tokens is not None and (wait := self._pay_tokens()) > 0:
            return wait
        if self._owed_requests and (wait := self._pay_requests()) > 0:
            return wait
        # Tokens are paid before the request slot is taken: a slot taken and then held while waiting
        # would be counted earlier than its call starts, letting N+1 starts into some 60 s.
        if self._strategy.hit(self._requests, self.key, "requests", cost=cost):
            return 0.0
        return self._wait_for(self._requests, "requests")

    def _pay_tokens(self) -> float:
        """Write owed tokens to the token window, in pieces that fit; 0.0 when nothing is left owed."""
        item = cast("RateLimitItemPerMinute", self._tokens)
        with self._lock:
            # Rounded up to whole units; the excess is kept as a credit for the next charges.
            units = math.ceil(self._owed / self.token_unit) if self._owed > 0 else 0
            while units > 0:
                remaining = self._strategy.get_window_stats(item, self.key, "tokens").remaining
                piece = min(units, remaining)
                if piece <= 0 or not self._strategy.hit(item, self.key, "tokens", cost=piece):
                    break
                self._owed -= piece * self.token_unit
                units -= piece
        return self._wait_for(item, "tokens") if units > 0 else 0.0

    def _pay_requests(self) -> float:
        """Write owed requests to the request window, in pieces that fit; 0.0 when nothing is left owed."""
        with self._lock:
            while self._owed_requests > 0:
                remaining = self._strategy.get_window_stats(self._requests, self.key, "requests").remaining
                piece = min(self._owed_requests, remaining)
                if piece <= 0 or not self._strategy.hit(self._requests, self.key, "requests", cost=piece):
                    break
                self._owed_requests -= piece
            owed = self._owed_requests
        return self._wait_for(self._requests, "requests") if owed > 0 else 0.0

    def _wait_for(self, item: RateLimitItemPerMinute, kind: str) -> float:
        # Until the oldest start in the window leaves it (a slot frees then); someone else may take it,
        # and the next try computes the next wait.
        reset = self._strategy.get_window_stats(item, self.key, kind).reset_time
        return min(max(reset - self._clock(), _MIN_WAIT), _WINDOW)


def default_storage_path(root: str) -> str:
    """The embedded storage's file for datagen ``root``.

    A local root keeps it beside its experiments (``<root>/datagen_checkpoints/.ratelimits.sqlite``). An
    object-store root cannot hold a SQLite file, so its budget is kept per host, under
    ``$AIRFLOW_HOME/datagen_ratelimits/`` (or the system temp dir), in a file named by the root's hash.
    """
    if is_local(root):
        return os.path.join(local_path(root), CHECKPOINTS_DIR, STORAGE_FILE)
    digest = hashlib.sha256(root.rstrip("/").encode()).hexdigest()[:16]
    base = os.environ.get("AIRFLOW_HOME") or tempfile.gettempdir()
    return os.path.join(os.path.expanduser(base), "datagen_ratelimits", f"{digest}.sqlite")


def open_limiter(
    rate_limit: RateLimit,
    *,
    root: str | None = None,
    storage_uri: str | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], object] = time.sleep,
    max_cooldown: float | None = None,
) -> SharedLimiter:
    """The limiter of ``rate_limit`` on the shared storage.

    :param rate_limit: the budget (its ``key`` names it in the storage).
    :param root: the datagen root; without ``storage_uri`` the embedded SQLite storage of this root
        is used (every process of this host).
    :param storage_uri: a shared storage for many hosts, e.g. ``redis://127.0.0.1:6379/0`` (the
        ``datagen`` connection's ``extra.rate_limit_storage``); ``memory://`` limits one process only.
    :param clock: wall clock, injectable for tests (the embedded storage uses it too; Redis keeps its
        own entries by the host's clock).
    :param sleep: how :meth:`SharedLimiter.acquire` waits.
    :param max_cooldown: the longest cooldown stored or honoured (``run_items`` passes its retry
        policy's ``max_backoff``); None: :data:`DEFAULT_MAX_COOLDOWN`.
    :raises ConfigurationError: neither ``root`` nor ``storage_uri``, or an unsupported URI scheme.
    """
    if not isinstance(rate_limit, RateLimit):
        raise bad_argument("open_limiter", "rate_limit", rate_limit, "is not a RateLimit", "give RateLimit(...)")
    if max_cooldown is None:
        max_cooldown = DEFAULT_MAX_COOLDOWN
    if storage_uri is None:
        if not root:
            raise bad_argument(
                "open_limiter", "root", root, "is empty and no storage_uri is given", "give the datagen root"
            )
        storage = SQLiteStorage(default_storage_path(root), clock=clock)
        return SharedLimiter(rate_limit, storage, storage, clock=clock, sleep=sleep, max_cooldown=max_cooldown)
    scheme = check_storage_uri("open_limiter", "storage_uri", storage_uri)
    if scheme == "memory":
        global _MEMORY
        with _MEMORY_LOCK:
            if _MEMORY is None:
                _MEMORY = (MemoryStorage(), _MemoryCooldowns())
            memory, cooldowns = _MEMORY
        return SharedLimiter(rate_limit, memory, cooldowns, clock=clock, sleep=sleep, max_cooldown=max_cooldown)
    # A sync scheme (checked above) always gives a sync storage.
    redis_storage = cast("Storage", storage_from_string(storage_uri))
    return SharedLimiter(
        rate_limit, redis_storage, _RedisCooldowns(redis_storage), clock=clock, sleep=sleep, max_cooldown=max_cooldown
    )


def check_storage_uri(owner: object, param: str, uri: Any) -> str:
    """The scheme of a usable storage URI (``redis://host:port/db`` and its kin)."""
    scheme = scheme_of(uri)
    if scheme not in STORAGE_SCHEMES:
        raise bad_argument(
            owner,
            param,
            redact_storage_uri(uri) if isinstance(uri, str) else uri,
            "is not a rate limit storage URI",
            f"give one of the schemes {', '.join(s + '://' for s in STORAGE_SCHEMES)}, e.g. redis://127.0.0.1:6379/0",
        )
    return cast("str", scheme)


def redact_storage_uri(uri: str) -> str:
    """``uri`` without its password, fit for messages and logs."""
    scheme, sep, rest = uri.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return uri
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
