"""The sinks into a member's named list.

``ListSinkProcessor`` appends items as they arrive (jobs without exactly-once: a restart may
append the items after the last snapshot again, or, without snapshots, anything again).

``ExactlyOnceListSinkProcessor`` is a :class:`TwoPhaseCommitSink`: items received since the
last snapshot are held back and saved in the snapshot; phase 2 appends them to the list
together with a marker of the snapshot id for that processor, under the list's lock. After a
restore from snapshot N it re-runs N's phase 2 if the list's marker is below N.
"""

from __future__ import annotations

from typing import Any, Protocol

from jetwake.engine.core.processor import Inbox, Processor, ProcessorContext
from jetwake.engine.processors.two_phase_sink import TwoPhaseCommitSink
from jetwake.engine.backfill.connector_forms import SparkWriter

__all__ = ["ListSinkProcessor", "ExactlyOnceListSinkProcessor", "ListSparkWriter", "CommittingList"]


class ListSinkProcessor(Processor):
    """Appends every item to the member's list as it arrives."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._list: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._list = context.member.get_list(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._list.add_all(inbox.drain())


class ExactlyOnceListSinkProcessor(TwoPhaseCommitSink):
    """Appends at snapshot phase 2, with the snapshot id as the processor's marker."""

    snapshot_tag = "list-sink"

    def __init__(self, name: str) -> None:
        self.name = name
        self._list: Any = None
        self._writer = ""

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._list = context.member.get_list(self.name)
        self._writer = f"{context.job_id}/{context.vertex_name}/{context.global_processor_index}"

    def writer_id(self) -> str:
        return self._writer

    def commit(self, writer: str, marker: int | None, records: list) -> None:
        if marker is None:
            self._list.add_all(records)
        else:
            self._list.commit(records, writer, marker)

    def read_marker(self, writer: str) -> int:
        return self._list.committed_snapshot(writer)


class CommittingList(Protocol):
    """A member's list as the Spark backfill writes it: a member's ``NamedList``, a cluster's
    list, or a client's ``RemoteList``, whichever ``member.get_list`` returns."""

    def commit(self, items: list[Any], writer: str, snapshot_id: int) -> bool:
        """Appends ``items`` unless ``writer`` committed ``snapshot_id`` (or a later one)."""


class ListSparkWriter(SparkWriter):
    """``Sinks.list`` on the Spark backfill: the items appended through the member's API on
    the driver, chunk by chunk, in partition order; each chunk a commit of this run's writer,
    so that a request the client sends again (after a lost connection) is applied once."""

    needs_member = True

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, backfill: Any, t: Any, chunks: Any) -> int:
        import uuid

        target: CommittingList = backfill.member.get_list(self.name)
        writer = f"backfill-{uuid.uuid4().hex[:12]}-{t.name}"
        n = 0
        for chunk in chunks.toLocalIterator(prefetchPartitions=True):
            if chunk:
                n += len(chunk)
                target.commit(chunk, writer, n)
        return n
