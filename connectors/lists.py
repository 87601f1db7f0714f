"""The sink into a member's named list.

Under exactly-once the sink is transactional in the manner of DESIGN.md §5: items received
since the last snapshot are held back and saved in the snapshot; phase 2 appends them to the
list together with a marker of the snapshot id, in one step. After a restore from snapshot N
the sink compares the marker with N and re-runs N's phase 2 if it had not happened. Otherwise
items are appended as they arrive.
"""

from __future__ import annotations

from typing import Any

from ..engine.processor import Inbox, Processor, ProcessorContext

__all__ = ["ListSinkProcessor"]


class ListSinkProcessor(Processor):
    def __init__(self, name: str) -> None:
        self.name = name
        self._list: Any = None
        self._transactional = False
        self._pending: list = []    # received since the last snapshot
        self._prepared: dict[int, list] = {}  # snapshot id -> items to commit in its phase 2
        self._writer = ""

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._list = context.member.get_list(self.name)
        self._transactional = context.processing_guarantee == "exactly_once"
        self._writer = f"{context.job_id}/{context.vertex_name}/{context.global_processor_index}"

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._transactional:
            self._pending.extend(inbox.drain())
        else:
            self._list.add_all(inbox.drain())

    def save_to_snapshot(self) -> bool:
        if not self._transactional:
            return True  # items were appended as they came: nothing to hold back
        sid = self.context.snapshot.requested_id  # type: ignore[union-attr]
        self._prepared[sid] = self._pending
        self._pending = []
        return self.outbox.offer_to_snapshot(self._writer, [sid, self._prepared[sid]])

    def snapshot_commit_finish(self, success: bool) -> bool:
        if not self._transactional:
            return True
        sid = self.context.snapshot.phase2_id  # type: ignore[union-attr]
        items = self._prepared.pop(sid, None)
        if items is not None:
            if success:
                self._list.commit(items, self._writer, sid)
            else:  # the snapshot failed: its items go into the next one
                self._pending[:0] = items
        return True

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for writer, (sid, items) in inbox.drain():
            if self._list.committed_snapshot(writer) < sid:
                self._list.commit(items, writer, sid)

    def complete(self) -> bool:
        # the input ended: nothing can replay what is pending now
        for sid in sorted(self._prepared):
            self._list.commit(self._prepared.pop(sid), self._writer, sid)
        if self._pending:
            self._list.add_all(self._pending)
            self._pending = []
        return True
