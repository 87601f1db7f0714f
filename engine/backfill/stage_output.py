"""A translated stage's output: an RDD of chunks and what is known of its elements."""

from __future__ import annotations

from typing import Any

from jetwake.engine.backfill.chunks import Step, run_chain
from jetwake.engine.core.functions import identity

__all__ = ["StageOut"]


class StageOut:
    """A translated stage: an RDD of chunks, the chain of chunk functions still to run on them
    (the stateless stages after it, and counting), and what is known of its elements.

    ``timed``: elements are ``(ts, wm, item)`` (otherwise the items themselves);
    ``timestamped``: that ``ts`` is the event time of ``with_timestamps``; ``ordered``: the
    partitions in order are the member's arrival order; ``unbounded``: from a source that is
    unbounded (Kafka), read up to the run's ``until``, its partitions side by side; ``cut``: the
    hand-off watermark of its event time (unbounded only).
    """

    def __init__(self, chunks: Any, *, timed: bool = False, timestamped: bool = False,
                 ordered: bool = False, unbounded: bool = False, cut: int | None = None,
                 last_watermark: int | None = None,
                 chain: tuple = (), local: list | None = None,
                 columns: Any = None) -> None:
        self.base = chunks
        # the same chunks as (times, watermarks, items) lists, before the chain, when the
        # watermark stage made them (a window stage reads them without building triples)
        self.columns = columns
        # the items of each partition, when the driver has them (a list read by a source and
        # nothing changed them yet)
        self.local = local
        self.chain: tuple[Step, ...] = chain
        self.timed = timed or timestamped
        self.timestamped = timestamped
        self.ordered = ordered
        self.unbounded = unbounded
        self.cut = cut
        # a bounded input read in order: the watermark after its last event (what the member's
        # watermark stage emits before the end of the stream), when known
        self.last_watermark = last_watermark
        self._chunks: Any = None

    def flags(self) -> dict[str, Any]:
        """What this output says of its elements, for another output of the same elements."""
        return dict(timed=self.timed, timestamped=self.timestamped, ordered=self.ordered,
                    unbounded=self.unbounded, cut=self.cut, last_watermark=self.last_watermark)

    def then(self, step: Step, **flags: Any) -> "StageOut":
        """This output with one more chain step (a stateless stage, or counting)."""
        kw = dict(self.flags(), local=self.local if step[0] is None else None,
                  columns=self.columns if step[0] is None else None)
        kw.update(flags)
        return StageOut(self.base, chain=self.chain + (step,), **kw)

    def chunks(self, counters: Any) -> Any:
        """The RDD of chunks with the chain applied (the same RDD on every call)."""
        if self._chunks is None:
            steps = self.chain
            self._chunks = self.base if not steps else self.base.mapPartitions(
                lambda it: run_chain(it, steps, counters), preservesPartitioning=True)
        return self._chunks

    def uncounted(self) -> Any:
        """The chunks once more, for a pass that only looks (a maximum, a side output): the
        chain runs without counting again what the stage's consumers count."""
        if self._chunks is not None and not self.chain:
            return self._chunks
        steps = tuple((fn, None) for fn, _ in self.chain)
        if not any(fn is not None for fn, _ in steps):
            return self.base
        return self.base.mapPartitions(lambda it: run_chain(it, steps, None),
                                       preservesPartitioning=True)

    def elements(self, counters: Any) -> Any:
        """One RDD element per element."""
        return self.chunks(counters).flatMap(identity, preservesPartitioning=True)

    def items(self, counters: Any) -> Any:
        """One RDD element per item (times and watermarks taken off)."""
        if not self.timed:
            return self.elements(counters)
        return self.chunks(counters).flatMap(_items_of, preservesPartitioning=True)


def _items_of(chunk: list) -> list:
    return [e[2] for e in chunk]
