"""Short GIL turns while a plan's threads share the interpreter (see docs/adr/0019-partitioned-plan.md).

A plan fingerprints the source in Python on one thread (holding the GIL) while a second thread
reads the log through Lance and Arrow calls that release it. Each time that thread's call returns
it waits for the GIL, up to a whole switch interval (5 ms by default), thousands of times over a
large plan: at 10M items / 49M events the log's pass took 33-39 s beside the fingerprinting
against 21 s alone. Handing the GIL over every 0.1 ms instead costs the fingerprinting little.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

#: The switch interval while a plan runs, in seconds.
SHORT_TURN = 1e-4

_lock = threading.Lock()
_holders = 0
_before = 0.0  # the interval the first holder found
_short = 0.0  # the interval the holders set, as read back


def _set_interval(seconds: float) -> float:
    """Set the switch interval to ``seconds`` in whole microseconds, and return it as read back.

    CPython keeps the interval in microseconds and truncates ``seconds * 1e6``; the float
    ``getswitchinterval`` returns (``us / 1e6``) often multiplies back to just under ``us`` (15 us
    reads 1.4999...e-05), so setting the value read would lose a microsecond per plan. Half a
    microsecond over truncates to the intended one.
    """
    sys.setswitchinterval((round(seconds * 1e6) + 0.5) / 1e6)
    return sys.getswitchinterval()


@contextlib.contextmanager
def short_gil_turns() -> Iterator[None]:
    """Hand the GIL over every :data:`SHORT_TURN` seconds while this runs, then restore the interval.

    The interval is process-wide: overlapping uses (nested, or two plans on two threads) share one
    short interval, and the last to leave restores, exactly, the one found by the first to enter.
    An interval someone else set meanwhile is theirs, and is left as it is.
    """
    global _holders, _before, _short
    with _lock:
        if _holders == 0:
            _before = sys.getswitchinterval()
            _short = _set_interval(min(_before, SHORT_TURN))
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and sys.getswitchinterval() == _short:
                _set_interval(_before)
