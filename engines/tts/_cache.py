"""A thread-safe LRU cache bounded in bytes, for synthesised phrases."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["ByteLruCache"]

V = TypeVar("V")


class ByteLruCache(Generic[V]):
    """Least-recently-used cache whose bound is the total size of its values in bytes.

    Bytes, not entries, because a cached phrase can be 20 kB ("Okay.") or 2 MB (a paragraph);
    a count bound would either waste memory or evict the short greetings worth keeping.

    Thread-safe: streams on several worker threads share one cache.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> V | None:
        """The value for ``key`` (marking it recently used), or ``None``."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, value: V, nbytes: int) -> bool:
        """Store ``value``, evicting the least recently used; False if it alone is too big."""
        if nbytes > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, (_, size) = self._items.popitem(last=False)
                self._bytes -= size
            return True
