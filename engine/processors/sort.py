"""Sorting a batch: each processor sorts what it got, one processor merges the sorted runs."""

from __future__ import annotations

import heapq
from typing import Any, Callable

from jetwake.engine.core.chunk_emitter import ChunkEmitter
from jetwake.engine.core.processor import Inbox, Processor
from jetwake.snapshot.protocol.state_saver import StateSaver

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

    _saver: StateSaver | None = None

    def save_to_snapshot(self) -> bool:
        # items under keys unique to this processor, so each is restored exactly once
        if self._saver is None:
            idx = self.context.global_processor_index
            self._saver = StateSaver(((self.context.vertex_name, idx, i), item)
                                     for i, item in enumerate(list(self.items)))
        if self._saver.save(self.outbox):
            self._saver = None
            return True
        return False

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        self.items.extend(item for _, item in inbox.drain())

    def complete(self) -> bool:
        if self._emitter is None:
            self.items.sort(key=self.key, reverse=self.reverse)
            # one chunk per run keeps the runs apart for the merging processor; the items
            # leave the state, so a restore from the final state emits nothing again
            self._emitter = ChunkEmitter([self.items] if self.items else [], size=1)
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

    def save_to_snapshot(self) -> bool:
        idx = self.context.global_processor_index
        return self.outbox.offer_all_to_snapshot(
            [((self.context.vertex_name, idx, i), run) for i, run in enumerate(self.runs)])

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        self.runs.extend(run for _, run in inbox.drain())

    def complete(self) -> bool:
        if self._emitter is None:
            merged = heapq.merge(*self.runs, key=self.key, reverse=self.reverse)
            self._emitter = ChunkEmitter(merged)
            # the runs leave the state: a restore from the final state emits nothing again
            self.runs = []
        return self._emitter.emit(self.outbox)
