"""Snapshot data in Kafka, so that every member can restore what any member saved.

Each member writes its part of a snapshot as files under its own data directory (one file per
processor and vertex, RocksDB checkpoint files in ``<index>.files`` directories). After a member
is gone those files are gone with it, so the member also uploads them to the cluster's topic
``__jetwake_NAME_snapshot_data`` during the snapshot's first phase, and the snapshot's commit
record keeps the *refs* :meth:`SnapshotDataTopic.upload` returns. Any member can then fetch
exactly those records again (:meth:`SnapshotDataTopic.download`): an assign and a seek to the
offsets, not a scan of the topic.

A file is written as chunks of :data:`CHUNK_SIZE` bytes keyed ``PREFIX/REL_PATH/N`` (an empty
file is one empty chunk), all to one partition chosen by the file's name, so a file's ref is
``[partition, first offset, last offset, size, crc32]``. The topic is compacted: chunk keys are
never reused by another file, so compaction removes nothing until :meth:`delete` tombstones a
snapshot's chunks, and then removes them.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from jetwake.connectors.kafka.client_log import with_client_log
from jetwake.engine.cluster.cluster_records import (
    TOPIC_MAX_MESSAGE_BYTES, check_bootstrap, ensure_compacted_topic,
)
from jetwake.engine.cluster.membership import check_cluster_name
from jetwake.engine.core.errors import JetwakeError, SnapshotError, SnapshotWriteError

__all__ = ["SnapshotDataTopic", "SnapshotDataMissingError", "snapshot_data_topic", "files_under",
           "CHUNK_SIZE", "PARTITIONS", "TOPIC_CLEANUP_CONFIG"]

log = logging.getLogger("jetwake.cluster")

# The size of one record's value. Part of the stored format: delete() derives a file's chunk
# keys from its size with it.
CHUNK_SIZE = 1024 * 1024
# Partitions of a new topic: uploads of several members (and several files) go to several
# brokers and several log files at once.
PARTITIONS = 6
# What the producer may hold not yet acknowledged: a snapshot larger than that is read from
# disk as fast as Kafka takes it, not all into memory.
_PRODUCER_BUFFER_KB = 256 * 1024
# The cleaner compacts closed segments only, and keeps a tombstone delete.retention.ms: with
# hourly segments and the clusters' day of tombstones, a job snapshotting every second grew this
# topic for hours (7.5 MiB/h in `python -m bench soak`). Segments roll every minute and
# tombstones go a minute after the cleaner met them, so a deleted snapshot's data is reclaimed
# within minutes. Nothing reads this topic from the start: a reader seeks to a live snapshot's
# refs, whose chunks are never tombstoned, so a tombstone has no reader to wait for.
TOPIC_CLEANUP_CONFIG = {"segment.ms": str(60 * 1000), "delete.retention.ms": str(60 * 1000)}
# Ranges of one partition closer than this many records are read as one (skipping a few records
# costs less than a seek and a new fetch).
_MERGE_GAP = 16


class SnapshotDataMissingError(SnapshotError):
    """A snapshot data file cannot be restored from the cluster's topic: its records are gone
    (deleted, compacted away, the topic recreated) or do not match the size and CRC-32 its ref
    recorded. The message names the file and what was wrong."""


def snapshot_data_topic(cluster: str) -> str:
    return f"__jetwake_{cluster}_snapshot_data"


def files_under(directory: str, rel_dirs: list[str]) -> list[str]:
    """Every file below the directories ``rel_dirs`` (relative to ``directory``), as sorted
    paths relative to ``directory`` with '/' separators; a name in ``rel_dirs`` that is a file
    is listed itself. A name that does not exist is an error: a snapshot that silently left out
    its data could not be restored."""
    if not os.path.isdir(directory):
        raise ValueError(f"files_under: {directory!r} is not a directory")
    if isinstance(rel_dirs, str) or not isinstance(rel_dirs, (list, tuple)):
        raise ValueError(f"files_under takes a list of relative directories, got {rel_dirs!r}")
    found: set[str] = set()
    for rel in rel_dirs:
        rel = _check_rel_path(rel)
        top = os.path.join(directory, rel)
        if os.path.isfile(top):
            found.add(rel)
            continue
        if not os.path.isdir(top):
            raise ValueError(f"files_under: {rel!r} does not exist under {directory!r}")
        for root, _dirs, names in os.walk(top):
            for name in names:
                path = os.path.join(root, name)
                found.add(os.path.relpath(path, directory).replace(os.sep, "/"))
    return sorted(found)


def _check_rel_path(rel: Any) -> str:
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"a snapshot data path must be a non-empty relative path, got {rel!r}")
    norm = rel.replace(os.sep, "/")
    parts = norm.split("/")
    if norm.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in norm:
        raise ValueError(f"a snapshot data path must be relative, below its directory, without "
                         f"'.', '..' or empty parts, got {rel!r}")
    return norm


def _check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not prefix or prefix.startswith("/") \
            or prefix.endswith("/"):
        raise ValueError(f"a snapshot data prefix must be a non-empty string not starting or "
                         f"ending with '/', e.g. 'job-1/snapshot-7/member-2', got {prefix!r}")
    return prefix


def _check_refs(refs: Any) -> dict[str, tuple[int, int, int, int, int]]:
    if not isinstance(refs, dict):
        raise ValueError(f"snapshot data refs must be a dict {{path: [partition, first offset, "
                         f"last offset, size, crc32]}}, got {type(refs).__name__}")
    checked = {}
    for rel, ref in refs.items():
        rel = _check_rel_path(rel)
        if (not isinstance(ref, (list, tuple)) or len(ref) != 5
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                           for v in ref) or ref[1] > ref[2]):
            raise ValueError(f"the ref of snapshot data file {rel!r} must be [partition, first "
                             f"offset, last offset, size, crc32] (non-negative integers, first "
                             f"<= last), got {ref!r}")
        checked[rel] = tuple(ref)
    return checked  # type: ignore[return-value]


def _chunk_count(size: int) -> int:
    return max(1, -(-size // CHUNK_SIZE))


@dataclass
class _Download:
    """One file being downloaded: its ref, and what has arrived so far."""

    rel: str
    partition: int
    first: int
    last: int
    size: int
    crc: int
    final_path: str
    key_base: bytes | None = None  # b"PREFIX/REL" once chunk 0 was seen
    next_chunk: int = 0
    written: int = 0
    crc_so_far: int = 0
    tmp_path: str | None = None
    out: BinaryIO | None = None
    done: bool = False


class SnapshotDataTopic:
    """Uploads snapshot files to the cluster's snapshot data topic and downloads them again.

    One producer (idempotent, ``acks=all``) and one consumer serve every call; calls from
    several threads are safe (downloads take turns).
    """

    def __init__(self, bootstrap_servers: str, cluster: str,
                 replication: int | None = None) -> None:
        self.bootstrap_servers = check_bootstrap(bootstrap_servers, "SnapshotDataTopic")
        self.cluster = check_cluster_name(cluster)
        self.topic = snapshot_data_topic(self.cluster)
        self.replication = replication  # of a new topic; None: as many as there are brokers
        self._admin_client: AdminClient | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._partitions: int | None = None
        self._lock = threading.Lock()
        self._download_lock = threading.Lock()
        self._closed = False

    # -- set-up ---------------------------------------------------------------------------

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = AdminClient(with_client_log(
                {"bootstrap.servers": self.bootstrap_servers}))
        return self._admin_client

    def ensure_topic(self, timeout: float = 30.0) -> None:
        """Creates the snapshot data topic unless it exists (any member may)."""
        self._check_open()
        self._partitions = ensure_compacted_topic(
            self._admin(), self.topic, PARTITIONS, timeout,
            extra_config=TOPIC_CLEANUP_CONFIG, replication=self.replication)

    def _partition_count(self, timeout: float) -> int:
        if self._partitions is None:
            md = self._admin().list_topics(topic=self.topic, timeout=timeout).topics.get(self.topic)
            if md is None or md.error is not None or not md.partitions:
                raise JetwakeError(f"the snapshot data topic {self.topic} does not exist; call "
                                   "SnapshotDataTopic.ensure_topic() first")
            self._partitions = len(md.partitions)
        return self._partitions

    def _get_producer(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(with_client_log({
                    "bootstrap.servers": self.bootstrap_servers,
                    "acks": "all",
                    "enable.idempotence": True,
                    "message.max.bytes": TOPIC_MAX_MESSAGE_BYTES,
                    "batch.size": TOPIC_MAX_MESSAGE_BYTES // 2,
                    "linger.ms": 5,
                    "queue.buffering.max.kbytes": _PRODUCER_BUFFER_KB,
                    "delivery.timeout.ms": 120_000,
                }))
            return self._producer

    def _get_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(with_client_log({
                "bootstrap.servers": self.bootstrap_servers,
                # never joins the group: partitions are assigned, nothing is committed
                "group.id": f"jetwake-{self.cluster}-snapshot-data-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # an offset that no longer exists is an error, never a jump to another one
                "auto.offset.reset": "error",
                "fetch.max.bytes": 64 * 1024 * 1024,
                "max.partition.fetch.bytes": 16 * 1024 * 1024,
                "receive.message.max.bytes": 64 * 1024 * 1024 + 1024 * 1024,
                "fetch.wait.max.ms": 50,
            }))
        return self._consumer

    # -- upload ---------------------------------------------------------------------------

    def upload(self, directory: str, rel_paths: list[str], prefix: str,
               timeout: float = 120.0) -> dict[str, list]:
        """Writes the files ``rel_paths`` (relative to ``directory``) as chunks keyed
        ``PREFIX/REL_PATH/N`` and returns once Kafka acknowledged every one of them on all its
        in-sync replicas; returns ``{rel_path: [partition, first offset, last offset, size,
        crc32]}``. Raises SnapshotWriteError naming the file when a chunk could not be written.
        """
        self._check_open()
        prefix = _check_prefix(prefix)
        if isinstance(rel_paths, str) or not isinstance(rel_paths, (list, tuple)):
            raise ValueError(f"upload takes a list of relative paths, got {rel_paths!r}")
        rels = [_check_rel_path(r) for r in rel_paths]
        if len(set(rels)) != len(rels):
            raise ValueError("upload: the same path is listed twice in rel_paths")
        deadline = time.monotonic() + timeout
        partitions = self._partition_count(timeout)
        producer = self._get_producer()
        # per file: [partition, first offset, last offset, size, crc32, chunks not yet acked]
        refs: dict[str, list] = {}
        failures: list[str] = []

        def acked(rel: str) -> Callable[[Any, Any], None]:
            ref = refs[rel]

            def on_delivery(err: Any, msg: Any) -> None:
                if err is not None:
                    failures.append(f"{rel}: {err.str()}")
                    return
                offset = msg.offset()
                ref[1] = offset if ref[1] < 0 else min(ref[1], offset)
                ref[2] = max(ref[2], offset)
                ref[5] -= 1
            return on_delivery

        for rel in rels:
            path = os.path.join(directory, rel)
            key_base = f"{prefix}/{rel}"
            partition = zlib.crc32(key_base.encode()) % partitions
            refs[rel] = [partition, -1, -1, 0, 0, 0]
            callback = acked(rel)
            try:
                f = open(path, "rb")
            except OSError as e:
                raise SnapshotWriteError(f"cannot upload snapshot data file {path!r}: "
                                         f"{e.strerror}") from e
            with f:
                size = 0
                crc = 0
                n = 0
                while True:
                    chunk = f.read(CHUNK_SIZE)
                    if not chunk and n > 0:
                        break
                    size += len(chunk)
                    crc = zlib.crc32(chunk, crc)
                    refs[rel][5] += 1
                    self._produce(producer, partition, f"{key_base}/{n}".encode(), chunk,
                                  callback, deadline)
                    n += 1
                    if len(chunk) < CHUNK_SIZE:
                        break
            refs[rel][3] = size
            refs[rel][4] = crc
            if failures:
                break
        left = producer.flush(max(0.0, deadline - time.monotonic()))
        if failures:
            raise SnapshotWriteError(f"snapshot data could not be written to {self.topic}: "
                                     + "; ".join(failures[:5]))
        unacked = [rel for rel, ref in refs.items() if ref[5] != 0]
        if left or unacked:
            raise SnapshotWriteError(f"snapshot data was not acknowledged by Kafka at "
                                     f"{self.bootstrap_servers} within {timeout:.0f} s (files "
                                     f"{unacked[:5]} ...)")
        return {rel: ref[:5] for rel, ref in refs.items()}

    def _produce(self, producer: Producer, partition: int, key: bytes, value: bytes | None,
                 callback: Callable[[Any, Any], None] | None, deadline: float) -> None:
        """Produces one record, waiting while the producer's buffer is full (the upload then
        goes as fast as Kafka acknowledges)."""
        while True:
            try:
                producer.produce(self.topic, key=key, value=value, partition=partition,
                                 on_delivery=callback)
                producer.poll(0)
                return
            except BufferError:
                if time.monotonic() >= deadline:
                    raise SnapshotWriteError(
                        f"Kafka at {self.bootstrap_servers} did not take snapshot data for "
                        f"{self.topic} fast enough: the producer's buffer stayed full") from None
                producer.poll(0.05)

    # -- download -------------------------------------------------------------------------

    def download(self, refs: dict[str, list], directory: str, timeout: float = 120.0,
                 prefix: str | None = None) -> None:
        """Fetches the records of ``refs`` (what :meth:`upload` returned) and writes each file
        under ``directory`` (atomically: a file appears complete or not at all), checking its
        size and CRC-32. Raises SnapshotDataMissingError naming the first file whose records
        are gone or damaged; files completed before that stay.

        ``prefix``, when given, must be the one the files were uploaded with (checked on every
        chunk); otherwise it is taken from each file's first record.
        """
        self._check_open()
        checked = _check_refs(refs)
        if prefix is not None:
            prefix = _check_prefix(prefix)
        if not isinstance(directory, str) or not directory:
            raise ValueError(f"download needs a target directory, got {directory!r}")
        if not checked:
            return
        deadline = time.monotonic() + timeout
        files = []
        for rel, (partition, first, last, size, crc) in checked.items():
            final_path = os.path.join(directory, *rel.split("/"))
            d = _Download(rel, partition, first, last, size, crc, final_path)
            if prefix is not None:
                d.key_base = f"{prefix}/{rel}".encode()
            files.append(d)
        with self._download_lock:
            self._check_open()
            try:
                _Fetch(self, files, deadline, timeout).run()
            finally:
                for d in files:
                    if d.out is not None:
                        d.out.close()
                        d.out = None
                    if d.tmp_path is not None and not d.done:
                        try:
                            os.unlink(d.tmp_path)
                        except OSError:
                            pass

    def _missing(self, d: _Download, what: str) -> SnapshotDataMissingError:
        return SnapshotDataMissingError(
            f"snapshot data file {d.rel!r} cannot be restored from {self.topic} (partition "
            f"{d.partition}, offsets {d.first}..{d.last}): {what}")

    # -- deletion -------------------------------------------------------------------------

    def delete(self, refs: dict[str, list], prefix: str, timeout: float = 60.0) -> None:
        """Tombstones every chunk of the files of ``refs`` (uploaded with ``prefix``), so that
        compaction removes them; returns once Kafka acknowledged every tombstone."""
        self._check_open()
        checked = _check_refs(refs)
        prefix = _check_prefix(prefix)
        deadline = time.monotonic() + timeout
        producer = self._get_producer()
        failures: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(f"{msg.key()!r}: {err.str()}")

        for rel, (partition, _first, _last, size, _crc) in checked.items():
            # a tombstone only removes a record of the same partition
            for n in range(_chunk_count(size)):
                self._produce(producer, partition, f"{prefix}/{rel}/{n}".encode(), None,
                              on_delivery, deadline)
        left = producer.flush(max(0.0, deadline - time.monotonic()))
        if failures or left:
            raise JetwakeError(f"deleting snapshot data from {self.topic} failed: "
                               + ("; ".join(failures[:5]) or f"{left} tombstones not "
                                  f"acknowledged within {timeout:.0f} s"))

    # -- end ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JetwakeError("this SnapshotDataTopic is closed; make a new one")

    def close(self) -> None:
        """Waits (a little) for anything still being written, then closes the clients."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            if self._producer is not None:
                self._producer.flush(10)
                self._producer = None
        with self._download_lock:
            if self._consumer is not None:
                try:
                    self._consumer.close()
                except Exception:  # noqa: BLE001 - closing regardless
                    log.debug("closing the snapshot data consumer failed", exc_info=True)
                self._consumer = None

    def __enter__(self) -> SnapshotDataTopic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Fetch:
    """One download: every partition holding some of the files is assigned at the start of its
    first range; a partition that passes the end of a range seeks to the next one, and is
    unassigned after its last."""

    def __init__(self, owner: SnapshotDataTopic, files: list[_Download], deadline: float,
                 timeout: float) -> None:
        self.owner = owner
        self.topic = owner.topic
        self.deadline = deadline
        self.timeout = timeout
        self.consumer = owner._get_consumer()
        self.by_partition: dict[int, list[_Download]] = {}
        for d in files:
            self.by_partition.setdefault(d.partition, []).append(d)
        # per partition: the ranges to read (merged), the index of the current one, the files
        # not yet finished by last offset, the files by their first offset, the files whose
        # chunk 0 was seen by key base
        self.ranges: dict[int, list[list[int]]] = {}
        self.current: dict[int, int] = {}
        self.pending: dict[int, list[tuple[int, int, _Download]]] = {}
        self.starting: dict[tuple[int, int], list[_Download]] = {}
        self.active: dict[tuple[int, bytes], _Download] = {}
        for p, ds in self.by_partition.items():
            merged: list[list[int]] = []
            for d in sorted(ds, key=lambda d: d.first):
                if merged and d.first <= merged[-1][1] + _MERGE_GAP:
                    merged[-1][1] = max(merged[-1][1], d.last)
                else:
                    merged.append([d.first, d.last])
                self.starting.setdefault((p, d.first), []).append(d)
            self.ranges[p] = merged
            self.current[p] = 0
            self.pending[p] = [(d.last, i, d) for i, d in enumerate(ds)]
            heapq.heapify(self.pending[p])

    def run(self) -> None:
        consumer = self.consumer
        consumer.assign([TopicPartition(self.topic, p, r[0][0]) for p, r in self.ranges.items()])
        try:
            while self.current:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise JetwakeError(
                        f"downloading snapshot data from {self.topic} at "
                        f"{self.owner.bootstrap_servers} did not finish within "
                        f"{self.timeout:.0f} s (partitions {sorted(self.current)} unfinished)")
                msg = consumer.poll(min(left, 0.5))
                if msg is not None:
                    self._take(msg)
                    for msg in consumer.consume(500, timeout=0):
                        self._take(msg)
        finally:
            consumer.unassign()

    def _take(self, msg: Any) -> None:
        p = msg.partition()
        if p not in self.current:
            return  # a partition already finished, fetched before it was unassigned
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self._finish_partition(p, f"the partition ends at offset {msg.offset()}, before "
                                          "the end of the file's records")
            elif err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                self._finish_partition(p, f"its offsets no longer exist ({err.str()}): the data "
                                          "was deleted or the topic recreated")
            elif err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                               KafkaError._UNKNOWN_PARTITION,
                                               KafkaError.TOPIC_AUTHORIZATION_FAILED):
                raise JetwakeError(f"cannot read snapshot data from {self.topic}: {err.str()}")
            else:
                log.debug("reading %s: %s", self.topic, err.str())
            return
        o = msg.offset()
        ranges = self.ranges[p]
        i = self.current[p]
        if o < ranges[i][0]:
            return  # fetched before the seek to this range
        key = msg.key()
        if key is not None and o <= ranges[i][1]:
            for download in self.starting.get((p, o), ()):
                self._first_record(download, key)
            base, _, n = key.rpartition(b"/")
            d = self.active.get((p, base))
            if d is not None and d.first <= o <= d.last:
                self._chunk(d, n, msg.value())
        pending = self.pending[p]
        while pending and pending[0][0] <= o:
            self._finish(heapq.heappop(pending)[2], None)
        if o >= ranges[i][1]:
            i += 1
            while i < len(ranges) and ranges[i][1] <= o:
                i += 1
            if i == len(ranges):
                self._finish_partition(p, None)
                return
            self.current[p] = i
            if ranges[i][0] > o + 1:
                self.consumer.seek(TopicPartition(self.topic, p, ranges[i][0]))

    def _first_record(self, d: _Download, key: bytes) -> None:
        expected_tail = f"/{d.rel}/0".encode()
        if d.key_base is not None:
            if key != d.key_base + b"/0":
                raise self.owner._missing(d, f"the record at its first offset is {key!r}, not "
                                             f"the file's first chunk {d.key_base + b'/0'!r}")
        elif not key.endswith(expected_tail):
            raise self.owner._missing(d, f"the record at its first offset is {key!r}, not the "
                                         "file's first chunk (the data was deleted and "
                                         "compacted away, or the ref is wrong)")
        else:
            d.key_base = key[:-2]
        self.active[(d.partition, d.key_base)] = d

    def _chunk(self, d: _Download, n_text: bytes, value: bytes | None) -> None:
        if d.done:
            return
        try:
            n = int(n_text)
        except ValueError:
            return
        if value is None:
            raise self.owner._missing(d, f"chunk {n} was deleted (a tombstone)")
        if n < d.next_chunk:
            return  # the same chunk again
        if n > d.next_chunk:
            raise self.owner._missing(d, f"chunk {d.next_chunk} is missing (chunk {n} follows "
                                         f"chunk {d.next_chunk - 1})")
        if d.out is None:
            os.makedirs(os.path.dirname(d.final_path) or ".", exist_ok=True)
            d.tmp_path = f"{d.final_path}.download-{uuid.uuid4().hex[:8]}.tmp"
            d.out = open(d.tmp_path, "wb")
        d.out.write(value)
        d.written += len(value)
        d.crc_so_far = zlib.crc32(value, d.crc_so_far)
        d.next_chunk += 1
        if d.written > d.size:
            raise self.owner._missing(d, f"its records hold more than the {d.size} bytes its "
                                         "ref says")

    def _finish(self, d: _Download, cut_short: str | None) -> None:
        """Checks a file whose range was read (or whose partition ended early, ``cut_short``
        saying how) and moves it into place."""
        if d.done:
            return
        why = f"; {cut_short}" if cut_short else ""
        if d.key_base is None or (d.partition, d.key_base) not in self.active:
            raise self.owner._missing(d, "its first chunk is not in the topic (the data was "
                                         f"deleted and compacted away, or the ref is wrong){why}")
        if d.written != d.size:
            raise self.owner._missing(d, f"its records hold {d.written} bytes, its ref says "
                                         f"{d.size}{why}")
        if d.crc_so_far != d.crc:
            raise self.owner._missing(d, f"its content has CRC-32 {d.crc_so_far:08x}, its ref "
                                         f"says {d.crc:08x} (damaged data or a wrong ref)")
        assert d.out is not None and d.tmp_path is not None
        d.out.flush()
        os.fsync(d.out.fileno())
        d.out.close()
        d.out = None
        os.replace(d.tmp_path, d.final_path)
        d.done = True
        del self.active[(d.partition, d.key_base)]

    def _finish_partition(self, p: int, cut_short: str | None) -> None:
        pending = self.pending.pop(p, [])
        del self.current[p]
        self.consumer.incremental_unassign([TopicPartition(self.topic, p)])
        for _last, _i, d in sorted(pending, key=lambda t: t[0]):
            self._finish(d, cut_short)
