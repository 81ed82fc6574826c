"""A small LRU of page data keyed by log version: one computation per key at a time.

A fold of a big log takes seconds; the pages of an experiment are then Arrow kernels over the folded
table. Keys include the log version, so a new commit is a new key and the next request folds again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_SIZE = 8


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    value: Any = None


class VersionedCache:
    """A small LRU keyed by (experiment, version, extra); one computation per key at a time."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self._size = size
        self._slots: OrderedDict[tuple[Any, ...], _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot()
                while len(self._slots) > self._size:
                    self._slots.popitem(last=False)
            else:
                self._slots.move_to_end(key)
        # A cold fold of a big log takes a while; concurrent requests wait for it instead of folding too.
        with slot.lock:
            if slot.value is None:
                slot.value = compute()
            return slot.value
