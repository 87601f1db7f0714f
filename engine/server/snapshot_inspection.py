"""Looking into a committed snapshot: ``jetwake snapshot inspect NAME|JOB``.

What a snapshot holds, without starting a job from it: its id, time, job and the checksums
its commit record keeps (entries, CRC-32 and bytes of every processor's data file); per
vertex its kind of stage, entries and bytes, the number of keys and a sample of them, decoded
with the readers of queryable state (engine/jobs/state_reading.py) when the stage's kind is
known; each source's saved position per partition (a Kafka source's offsets and the highest
event time seen in each partition, a map journal's sequence) and the watermarks that stages
saved (windows, ``map_stateful``, joins of two streams; None before the first one). Every entry is decoded with the
codec its processor saves it with; RocksDB checkpoint files are read out (a stage saved
that way also shows its ``checkpoint_files`` and their ``checkpoint_bytes``).

It lives with the server: it reads entries of connectors (the Kafka source's offsets) and of
processors, which lie below it.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from jetwake.connectors.kafka.source import KafkaSourceEntries
from jetwake.connectors.maps import MapJournalEntries
from jetwake.engine.core.errors import SnapshotNotFoundError
from jetwake.engine.core.processor import BroadcastKey
from jetwake.engine.core.serialization import dumps
from jetwake.engine.core.stream_items import NO_WATERMARK
from jetwake.engine.jobs.state_reading import (
    STATEFUL_KINDS, SavedEntry, StatefulStage, decode_stage, snapshot_entries,
    stateful_stages,
)
from jetwake.engine.processors.map_stateful import MapStatefulEntries
from jetwake.engine.processors.stream_join import JoinWatermark
from jetwake.engine.processors.window_entries import WindowEntries
from jetwake.snapshot.store.snapshot_files import SnapshotFiles

__all__ = ["inspect_snapshot", "find_snapshot", "SAMPLE_KEYS"]

SAMPLE_KEYS = 5
"""Keys shown per stage by default."""

# the broadcast keys under which stages save their watermark (one entry per processor; a
# restore takes the lowest)
_WATERMARK_KEYS = {WindowEntries.WATERMARK, MapStatefulEntries.WATERMARK.key,
                   JoinWatermark.KEY.key}


def find_snapshot(member: Any, ref: str) -> tuple[Any, Any]:
    """``(commit record, the job's definition or None)`` of ``ref``: an exported snapshot's
    name, else a job's name or id (its last committed snapshot). The definition, when the
    job that wrote the snapshot is known to the member, decodes its stages' values."""
    store = member.snapshot_store
    rec = store.get_export(ref) if "/" not in ref and "\\" not in ref else None
    coordinator = member.find_coordinator(ref) if rec is None else None
    if rec is None and coordinator is not None:
        rec = coordinator.last_snapshot
        if rec is None:
            found = store.committed(coordinator.job_id)
            rec = found[0] if found else None
        if rec is None:
            raise SnapshotNotFoundError(
                f"job '{coordinator.name}' has no committed snapshot yet (it takes them with "
                "a processing guarantee, every snapshot_interval_ms); inspect it again "
                "later, or export one with `jetwake save-snapshot`")
    if rec is None:
        raise SnapshotNotFoundError(
            f"no exported snapshot and no job named '{ref}'; `jetwake list-snapshots` and "
            "`jetwake list-jobs` list them")
    if coordinator is None:
        coordinator = member.find_coordinator(rec.job_id)
    return rec, coordinator.definition if coordinator is not None else None


def inspect_snapshot(store: Any, rec: Any, definition: Any = None,
                     sample: int = SAMPLE_KEYS) -> dict[str, Any]:
    """What the committed snapshot ``rec`` of ``store`` holds (see the module doc), as a map
    of plain values; ``definition`` (the job's Pipeline, when known) decodes the values of
    every stateful stage's sample keys, else only ``map_stateful`` states are decoded.
    Raises SnapshotDamagedError when the data does not match its commit record."""
    reader = store.reader(rec)
    reader.verify()
    stages = stateful_stages(definition) if definition is not None else None
    out: dict[str, Any] = {
        "name": rec.name, "job_id": rec.job_id, "job_name": rec.job_name,
        "snapshot_id": rec.snapshot_id, "created": rec.created,
        "created_iso": datetime.fromtimestamp(rec.created, timezone.utc).isoformat(
            timespec="seconds"),
        "terminal": rec.terminal, "duration_ms": round(rec.duration_ms, 1),
        "entries": rec.entry_count, "bytes": rec.size_bytes,
        "checksums": {v: {p: {"entries": f[0], "crc32": f"{f[1]:08x}", "bytes": f[2]}
                          for p, f in sorted(procs.items(), key=lambda i: int(i[0]))}
                      for v, procs in sorted(rec.files.items())},
        "stages": [], "sources": [],
    }
    for vertex in sorted(rec.files):
        procs = rec.files[vertex]
        kind = rec.kinds.get(vertex)
        stage = _stage_of(vertex, kind, stages)
        info: dict[str, Any] = {
            "vertex": vertex, "kind": kind, "processors": len(procs),
            "entries": sum(f[0] for f in procs.values()),
            "bytes": sum(f[2] for f in procs.values()),
            "keys": 0, "sample_keys": [], "sample": None, "watermarks": [],
            "completed": rec.vertex_completed(vertex),
        }
        files = _saved_files(reader, vertex)
        if files:  # RocksDB checkpoints: their files hold the state, the entries name them
            info["checkpoint_files"], info["checkpoint_bytes"] = files
        positions: list[dict[str, Any]] = []
        seen: set[int] = set()
        kept: list[SavedEntry] = []  # the entries a decoder needs for the sample keys
        for e in snapshot_entries(reader, [vertex]):
            k = e.key
            if type(k) is BroadcastKey:
                _broadcast_entry(k, e.value, info, positions)
                kept.append(e)
                continue
            h = hash(dumps(k))  # keys counted by their bytes, without keeping them
            if h not in seen:
                seen.add(h)
                if len(info["sample_keys"]) < sample:
                    info["sample_keys"].append(k)
            if k in info["sample_keys"]:
                kept.append(e)
        info["keys"] = len(seen)
        if info["watermarks"]:  # what a restore takes: the lowest (None: none yet)
            wms = info["watermarks"]
            info["watermark"] = None if None in wms else min(wms)
        if stage is not None and info["sample_keys"]:
            decoded = decode_stage(stage, kept)
            info["sample"] = [[k, decoded[k]] for k in info["sample_keys"] if k in decoded]
        out["stages"].append(info)
        if positions:
            out["sources"].append({"vertex": vertex, "kind": kind, "partitions": positions})
    return out


def _saved_files(reader: Any, vertex: str) -> tuple[int, int] | None:
    """``(files, bytes)`` of the RocksDB checkpoints ``vertex`` saved as files; None when it
    saved none."""
    count = size = 0
    for _keys, values in reader.chunks(vertex):
        for v in values:
            if type(v) is SnapshotFiles:
                count += len(v.files)
                size += sum(os.path.getsize(v.path(f)) for f in v.files)
    return (count, size) if count else None


def _stage_of(vertex: str, kind: str | None, stages: dict[str, StatefulStage] | None
              ) -> StatefulStage | None:
    """The stage whose decoder reads ``vertex``'s sample: the job's own when its definition
    is known (only the vertex named after the stage: a two-stage aggregation's partial
    accumulators are not its values), else a ``map_stateful`` stage's, whose states need no
    definition to decode."""
    if stages is not None:
        found = stages.get(vertex)
        return found if found is not None and found.kind in STATEFUL_KINDS else None
    if kind == "map-stateful":
        return StatefulStage(vertex, kind, [vertex], True)
    return None


def _broadcast_entry(key: BroadcastKey, value: Any, info: dict[str, Any],
                     positions: list[dict[str, Any]]) -> None:
    """Adds a broadcast entry (a source's position, a stage's watermark) to ``info``."""
    if KafkaSourceEntries.is_offsets(key):
        offsets, _counts = KafkaSourceEntries.read(value)
        for topic, partition, offset, top in offsets:
            positions.append({"source": "kafka", "topic": topic, "partition": partition,
                              "offset": offset, "top_event_time": top})
    elif MapJournalEntries.is_position(key):
        seq, top = MapJournalEntries.read(value)
        positions.append({"source": "map-journal", "map": key.key[1], "partition": 0,
                          "sequence": seq, "top_event_time": top})
    elif isinstance(key.key, str) and key.key in _WATERMARK_KEYS:
        info["watermarks"].append(None if value == NO_WATERMARK else value)
