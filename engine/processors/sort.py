"""Sorting a batch: each processor sorts what it got, one processor merges the sorted runs."""

from __future__ import annotations

import heapq
from typing import Any, Callable

from ..chunk_emitter import ChunkEmitter
from ..processor import Inbox, Processor

__all__ = ["SortProcessor", "MergeSortedProcessor"]


class SortProcessor(Processor):
    """Collects its input and emits it sorted when the input ends."""

    def __init__(self, key: Callable[[Any], Any] | None, reverse: bool) -> None:
        self.key = key
        self.reverse = reverse
        self.items: list = []
        self._emitter: ChunkEmitter | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self.items.extend(inbox.drain())

    def complete(self) -> bool:
        if self._emitter is None:
            self.items.sort(key=self.key, reverse=self.reverse)
            # one chunk per run keeps the runs apart for the merging processor
            self._emitter = ChunkEmitter([self.items], size=1)
            self.items = []
        return self._emitter.emit(self.outbox)


class MergeSortedProcessor(Processor):
    """Receives sorted runs (one item each: a list) and emits their merge."""

    def __init__(self, key: Callable[[Any], Any] | None, reverse: bool) -> None:
        self.key = key
        self.reverse = reverse
        self.runs: list[list] = []
        self._emitter: ChunkEmitter | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self.runs.extend(run for run in inbox.drain() if run)

    def complete(self) -> bool:
        if self._emitter is None:
            merged = heapq.merge(*self.runs, key=self.key, reverse=self.reverse)
            self._emitter = ChunkEmitter(merged)
        return self._emitter.emit(self.outbox)
