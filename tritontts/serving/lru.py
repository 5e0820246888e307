"""Least-recently-used caches shared by the stages."""
from __future__ import annotations

import threading
from collections import OrderedDict


class LRU:
    """A bounded, thread-safe map that forgets the least recently used entry first: content
    caches (a reference recording's features, cloned many times) and per-stream state whose
    stream may never send its last chunk (a client that went away)."""

    def __init__(self, size: int):
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()
        self.hits = 0

    def get(self, key, make=None):
        """The value, moved to most recent; else make() stored (computed outside the lock,
        so two callers may both compute a missing value: the last one stays), else None."""
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                self.hits += 1
                return self.items[key]
        if make is None:
            return None
        value = make()
        self.put(key, value)
        return value

    def put(self, key, value) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)

    def pop(self, key) -> None:
        with self.lock:
            self.items.pop(key, None)
