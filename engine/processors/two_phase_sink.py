"""The write-ahead log shared by exactly-once sinks that cannot resume a transaction.

A sink processor holds the records it received since the last snapshot. At phase 1 of
snapshot N they become part of N's saved state ("prepared for N"); at phase 2 of N the sink
writes them together with a marker "snapshot N is written" for that processor, in one atomic
step of the external system (one Kafka transaction, one locked list append). After a restore
from N the sink reads its marker: below N, N's phase 2 never happened, so it writes N's saved
records now; at N or above, there is nothing to do. Whenever the member dies, every record is
written once.

:class:`TwoPhaseCommitSink` implements that bookkeeping; a sink subclasses it and supplies
the atomic step (:meth:`~TwoPhaseCommitSink.commit`) and the marker look-up
(:meth:`~TwoPhaseCommitSink.read_marker`).

Saved entries
    Each unconfirmed batch is one entry ``BroadcastKey((tag, writer_index))`` ->
    ``[batch snapshot id, writer id, writer index, parallelism, extra, records]``. Every
    processor of the restored vertex receives every entry and settles those of the old
    indices ``j`` with ``j % parallelism == its index``, so a job restored with another
    parallelism writes (or skips) the batches of every old processor exactly once. A
    processor with nothing prepared still saves one empty entry, which tells the restored
    job that its writer existed (a Kafka sink fences its transactional id). A sink may cut a
    batch into parts (:meth:`~TwoPhaseCommitSink.snapshot_parts`), each saved as its own
    entry, one per ``save_to_snapshot`` call, so each is its own frame in the snapshot file:
    ``[..., records, part index]``; the restore joins the parts of a batch in their order.

Batches and markers
    A snapshot holds every batch not yet written, each under the id of the snapshot it was
    first saved in, and a commit writes the marker of the highest batch it writes; markers
    only grow. So the restore of any snapshot that holds a batch skips it exactly when it was
    written. Only the batches of a snapshot that failed (phase 2 with ``False``: it does not
    exist) go back to the pending records, to be saved again in the next snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jetwake.engine.core.errors import SnapshotError
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext

__all__ = ["TwoPhaseCommitSink", "SavedBatch", "NO_MARKER"]

NO_MARKER = -1
"""What :meth:`TwoPhaseCommitSink.read_marker` returns for a writer that never committed."""


@dataclass(frozen=True)
class SavedBatch:
    """One restored batch: records a processor saved in a snapshot and had not yet written."""

    snapshot_id: int
    writer: str          # the id its marker is kept under (a Kafka transactional id, ...)
    writer_index: int    # the global index of the processor that saved it
    parallelism: int     # the vertex's parallelism when it was saved
    extra: Any           # what the sink adds to each entry (see snapshot_extra)
    records: list
    part: int = 0        # the index of this part of the batch (see snapshot_parts)


class TwoPhaseCommitSink(Processor):
    """Base of exactly-once sinks that write at phase 2 what they received before a barrier.

    Subclasses set :attr:`snapshot_tag` and implement :meth:`writer_id`, :meth:`commit` and
    :meth:`read_marker`; they may override :meth:`to_records` (what is kept per item),
    :meth:`start` (connect, fence) and :meth:`settle_writer` (per-writer resources).
    ``init`` of a subclass must call ``super().init(context)``.
    """

    transactional_sink = True

    #: the first element of every saved key; names the sink kind in snapshots
    snapshot_tag: str = ""

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        if not self.snapshot_tag:
            raise TypeError(f"{type(self).__qualname__} must set snapshot_tag")
        if context.processing_guarantee != "exactly_once":
            raise ValueError(
                f"{type(self).__qualname__} ({context.vertex_name}) writes at snapshot phase "
                f"2 and needs a job with processing_guarantee='exactly_once', but job "
                f"'{context.job_name}' runs with '{context.processing_guarantee}'")
        self._pending: list = []                 # received since the last snapshot's barrier
        self._prepared: dict[int, list] = {}     # snapshot id -> records saved in it
        self._restored: list[SavedBatch] = []    # restored batches this processor settles
        self._started = False
        self._saving: list = []                  # entries of the snapshot being saved ...
        self._saving_sid: int | None = None      # ... and its id, while some are not offered

    # --- what a subclass provides ----------------------------------------------------------

    def writer_id(self) -> str:
        """The id this processor's marker is kept under: stable across restarts of the job,
        distinct per processor index."""
        raise NotImplementedError

    def commit(self, writer: str, marker: int | None, records: list) -> None:
        """Writes ``records`` and records ``marker`` as ``writer``'s last written snapshot, in
        one atomic step (both or neither). ``marker`` None: write the records only (the input
        ended after the last snapshot). Raise RestartableError when it cannot: the job
        restarts from its snapshot, whose restore writes the batch again unless the marker
        says it was written."""
        raise NotImplementedError

    def read_marker(self, writer: str) -> int:
        """The last snapshot id committed for ``writer``; :data:`NO_MARKER` if none."""
        raise NotImplementedError

    def to_records(self, items: list) -> list:
        """What is kept (and saved in snapshots) for the received ``items``."""
        return items

    def record_count(self, records: list) -> int:
        """How many records ``records`` (as kept by :meth:`to_records`) hold, for the log."""
        return len(records)

    def start(self) -> None:
        """Runs once in the processor's thread before anything is settled or written (after
        the restore, if any): connect, fence earlier incarnations."""

    def snapshot_parts(self, records: list) -> list[list]:
        """``records`` of one batch cut into the parts saved as separate entries (and frames);
        one part (the default) saves the batch as one entry. A sink whose batches are
        megabytes cuts them: encoding one huge frame costs several times the parts'."""
        return [records]

    def snapshot_extra(self) -> Any:
        """A value saved with every entry of this processor (restored as SavedBatch.extra)."""
        return None

    def on_restored(self, batch: SavedBatch) -> None:
        """Sees every restored batch of the vertex, also those another processor settles."""

    # --- the processor contract -------------------------------------------------------------

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._started:
            self._ensure_started()
        self._pending.extend(self.to_records(inbox.drain()))

    def try_process(self) -> bool:
        if not self._started:
            self._ensure_started()
        return True

    def save_to_snapshot(self) -> bool:
        if not self._started:
            self._ensure_started()
        sid = self.context.snapshot_id
        if self._saving_sid != sid:
            if self._pending:
                # the records before this barrier: written at this snapshot's phase 2
                self._prepared.setdefault(sid, []).extend(self._pending)
                self._pending = []
            self._saving, self._saving_sid = self._entries(sid), sid
        # one entry per call: each becomes its own frame of the snapshot file (a refused one
        # is offered again by the next call)
        if self._saving and self.outbox.offer_all_to_snapshot(self._saving[:1]):
            del self._saving[0]
        if self._saving:
            return False
        self._saving_sid = None
        return True

    def _entries(self, sid: int) -> list:
        """The entries snapshot ``sid`` saves: every batch not yet written, in parts."""
        batches = sorted(self._prepared.items()) or [(sid, [])]
        key = BroadcastKey((self.snapshot_tag, self.context.global_processor_index))
        head = [self.writer_id(), self.context.global_processor_index,
                self.context.total_parallelism, self.snapshot_extra()]
        entries = []
        for bsid, records in batches:
            parts = self.snapshot_parts(records) if records else [records]
            if len(parts) == 1:
                entries.append((key, [bsid, *head, records]))
            else:
                entries += [(key, [bsid, *head, part, i]) for i, part in enumerate(parts)]
        return entries

    def snapshot_commit_prepare(self) -> bool:
        return True  # the records are in the snapshot: that is the preparation

    def snapshot_commit_finish(self, success: bool) -> bool:
        if not self._started:
            self._ensure_started()
        sid = self.context.snapshot_id
        due = sorted(s for s in self._prepared if s <= sid)
        if not due:
            return True
        if success:
            records = [r for s in due for r in self._prepared[s]]
            if records:
                self.commit(self.writer_id(), sid, records)
            for s in due:
                del self._prepared[s]
        else:
            # the snapshot does not exist: its records go into the next one, in their order
            rolled = [r for s in due for r in self._prepared.pop(s)]
            self._pending[:0] = rolled
        return True

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        index, total = self.context.global_processor_index, self.context.total_parallelism
        for key, value in inbox.drain():
            batch = self._parse(key, value)
            self.on_restored(batch)
            if batch.writer_index % total == index:
                self._restored.append(batch)

    def complete(self) -> bool:
        """The input ended. Records of a snapshot whose phase 2 has not run are written by
        that phase 2 (with the marker), never here: wait for it. What came after the last
        barrier is in no snapshot, so nothing could write it later: write it now."""
        if not self._started:
            self._ensure_started()
        if self._prepared:
            return False
        if self._pending:
            records, self._pending = self._pending, []
            self.commit(self.writer_id(), None, records)
        return True

    # --- helpers ------------------------------------------------------------------------------

    def prepared_snapshot_ids(self) -> list[int]:
        """Ids of the snapshots whose records wait for their phase 2."""
        return sorted(self._prepared)

    def _parse(self, key: Any, value: Any) -> SavedBatch:
        if (type(key) is BroadcastKey and type(key.key) is tuple and len(key.key) == 2
                and key.key[0] == self.snapshot_tag and isinstance(value, (list, tuple))
                and len(value) in (6, 7)):
            sid, writer, windex, total, extra, records = value[:6]
            return SavedBatch(sid, writer, windex, total, extra, list(records),
                              value[6] if len(value) == 7 else 0)
        raise SnapshotError(
            f"{type(self).__qualname__} ({self.context.vertex_name}): the snapshot holds an "
            f"entry it did not save (key {key!r}); was the stage renamed onto another sink?")

    def _ensure_started(self) -> None:
        self.start()
        self._started = True
        restored, self._restored = self._restored, []
        by_writer: dict[str, dict[int, dict[int, SavedBatch]]] = {}
        for b in restored:
            # the same batch may be restored twice (a final state is part of later snapshots):
            # a batch only grows, so the longer of two copies of a part is the later one
            parts = by_writer.setdefault(b.writer, {}).setdefault(b.snapshot_id, {})
            if b.part not in parts or len(b.records) > len(parts[b.part].records):
                parts[b.part] = b
        for writer in sorted(by_writer):
            self.settle_writer(writer, [_joined(by_writer[writer][sid])
                                        for sid in sorted(by_writer[writer])])

    def settle_writer(self, writer: str, batches: list[SavedBatch]) -> None:
        """Writes the restored ``batches`` of ``writer`` (sorted by snapshot id) whose
        snapshot its marker does not cover, in one commit with the highest id as marker."""
        if not any(b.records for b in batches):
            return  # nothing to write, whatever the marker says
        marker = self.read_marker(writer)
        due = [b for b in batches if b.snapshot_id > marker]
        records = [r for b in due for r in b.records]
        if records:
            self.context.logger.info(
                "%s: snapshot(s) %s not written (marker %d): writing their %d records now",
                writer, [b.snapshot_id for b in due], marker, self.record_count(records))
            self.commit(writer, due[-1].snapshot_id, records)


def _joined(parts: dict[int, SavedBatch]) -> SavedBatch:
    """One batch from its restored parts (by part index)."""
    if len(parts) == 1:
        return next(iter(parts.values()))
    first = parts[min(parts)]
    return SavedBatch(first.snapshot_id, first.writer, first.writer_index, first.parallelism,
                      first.extra, [r for i in sorted(parts) for r in parts[i].records])
