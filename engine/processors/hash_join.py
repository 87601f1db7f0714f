"""Hash join (Jet's hashJoin): enrich a stream with a batch side loaded into a hash table.

Ordinal 0 is the stream; ordinal 1 the build side, on an edge of lower priority number so it
is consumed completely before the first stream item arrives.
"""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor
from jetwake.snapshot.protocol.state_saver import StateSaver

__all__ = ["HashJoinProcessor"]


class HashJoinProcessor(Processor):
    def __init__(self, key_fn: Callable[[Any], Any], build_key_fn: Callable[[Any], Any],
                 build_value_fn: Callable[[Any], Any], join_fn: Callable[[Any, Any], Any],
                 outer: bool) -> None:
        self.key_fn = key_fn
        self.build_key_fn = build_key_fn
        self.build_value_fn = build_value_fn
        self.join_fn = join_fn
        self.outer = outer
        self.table: dict[Any, list] = {}

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if ordinal == 1:
            table = self.table
            for entry in inbox.drain():
                table.setdefault(self.build_key_fn(entry), []).append(self.build_value_fn(entry))
            return
        if not self.outbox.has_room():
            return
        out = []
        get = self.table.get
        key_fn, join_fn = self.key_fn, self.join_fn
        for item in inbox.drain():
            matches = get(key_fn(item))
            if matches:
                for m in matches:
                    r = join_fn(item, m)
                    if r is not None:
                        out.append(r)
            elif self.outer:
                r = join_fn(item, None)
                if r is not None:
                    out.append(r)
        self.outbox.offer_chunk(-1, out)

    _saver: StateSaver | None = None

    def save_to_snapshot(self) -> bool:
        # every processor holds the same table (the build side is broadcast): one saves it,
        # and the restore gives it to all
        if self.context.global_processor_index != 0:
            return True
        if self._saver is None:
            self._saver = StateSaver((BroadcastKey(("hash-join", k)), v)
                                     for k, v in list(self.table.items()))
        if self._saver.save(self.outbox):
            self._saver = None
            return True
        return False

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, values in inbox.drain():
            self.table[key.key[1]] = values
