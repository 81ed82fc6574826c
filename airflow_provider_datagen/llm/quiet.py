"""The HTTP clients' loggers at WARNING while a model step runs: no task-log line per request.

httpx logs every request at INFO (``HTTP Request: POST .../chat/completions "HTTP/1.1 200 OK"``): a
1M-item chunk would write 1M lines. While at least one :func:`quiet_http_logs` block is open in the
process, the loggers below are at WARNING (at their own level if that is higher already); when the
last closes, each gets back the level it had. Counted, not nested: a model step opens one per call
and one from its first call on an event loop until that loop shuts down (the run: ``run_items``'s
loops and ``asyncio.run`` shut their async generators down), so the levels change twice per run, not
per call, and a logger a user configures meanwhile keeps what they set only after the run.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

#: the loggers of the HTTP clients under the SDKs and pydantic-ai, and of the SDKs themselves
HTTP_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "anthropic")

_lock = threading.Lock()
_in_flight = 0
_saved: dict[str, int] = {}


@contextlib.contextmanager
def quiet_http_logs() -> Iterator[None]:
    """Within the block (and while any other such block is open), the HTTP loggers are at WARNING."""
    global _in_flight
    with _lock:
        _in_flight += 1
        for name in HTTP_LOGGERS:
            logger = logging.getLogger(name)
            if _in_flight == 1:
                _saved[name] = logger.level
            # each time: logging configured meanwhile (Airflow's, on the first connection read) may have
            # set the level back while a block was open
            if logger.getEffectiveLevel() < logging.WARNING:
                logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        with _lock:
            _in_flight -= 1
            if _in_flight == 0:
                for name, level in _saved.items():
                    logging.getLogger(name).setLevel(level)
                _saved.clear()
