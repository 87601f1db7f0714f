"""Distributed edges over TCP: the data plane between members.

A distributed edge from processor ``src`` (a global processor index, on one member) to
processor ``dst`` (on another) is one *stream*, named by ``(exec_key, (edge, src, dst))``: the
execution's key and the edge's index with the two global indices. Its sending end is a
:class:`RemoteQueue`, which the sender's ``OutboundEdgeStream`` uses like a local
``ChunkQueue``; its receiving end is a plain ``ChunkQueue`` that the transport fills, in order,
and the downstream processor drains as usual. Every stream between two members travels over the
connection the sending member opened to the receiving one (``engine/cluster/peer_network.py``).

What travels:

- ``offer(entry)`` serializes the entry at once, on the caller's thread (a chunk with
  :func:`jetwake.engine.core.serialization.dumps_chunk`, which packs a chunk of tuples of one
  length, such as timestamped items, as one flat array without a Python call per item;
  watermarks, barriers and ``DONE`` as tiny msgpack values), and hands it to the connection's
  writer thread. The writer takes everything
  queued since its last write and packs the entries of all streams into few packets (one frame
  each, up to about :data:`PACKET_TARGET_BYTES`), and the packets into one socket write.
- A packet is ``[TAG_PACKET, [[exec_key, edge, src, dst, [entry, ...]], ...]]`` where an entry
  is ``bytes`` (a chunk), an ``int`` (a watermark's timestamp), ``[snapshot_id, is_terminal]``
  (a barrier) or ``nil`` (``DONE``). The receiving connection's reader decodes it and appends
  the entries to the streams' queues; entries of a stream keep their order, since one stream
  always travels on one connection and a packet keeps the order of each stream's entries.

Flow control, per stream (``engine/cluster/flow_control.py``): the sender stops (``offer``
returns False, which the outbound side treats as a full queue and retries) once the stream's
sent bytes reach the limit the receiver granted. The receiver grants more only for what the
downstream processor has *taken* out of the queue: it keeps a parallel deque of entry sizes, and
every :data:`FLOW_CONTROL_INTERVAL` one thread counts the entries consumed (sizes queued minus
entries still queued), feeds their bytes to the stream's ``ReceiveWindow`` and sends the sender
an ack with the new limit, only for streams where something was consumed. So the processor's hot
path pays nothing, and a processor that stops draining holds at most one window (plus one
entry) of its stream in memory.

Data for a stream nobody registered (an execution already released, or an ``inbound_queue``
registered too late) is dropped and counted in :meth:`EdgeTransport.stats`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from typing import Any, Callable, Protocol

import msgpack

from jetwake.engine.cluster.flow_control import (INITIAL_WINDOW_BYTES, MAX_WINDOW_BYTES,
                                                 MIN_WINDOW_BYTES, ReceiveWindow, SendWindow)
from jetwake.engine.core.serialization import dumps_chunk, loads
from jetwake.engine.core.stream_items import DONE, SnapshotBarrier, Watermark
from jetwake.engine.execution.conveyor import ChunkQueue

__all__ = ["EdgeTransport", "RemoteQueue", "EdgeConnection", "FLOW_CONTROL_INTERVAL",
           "PACKET_TARGET_BYTES", "CONTROL_ENTRY_BYTES", "TAG_PACKET", "TAG_ACKS"]

log = logging.getLogger("jetwake.cluster")

FLOW_CONTROL_INTERVAL = 0.02
"""Seconds between two rounds of acks: short enough that a sender whose window ran out waits
little, long enough that an ack covers many packets."""

PACKET_TARGET_BYTES = 1 << 20
"""A packet is closed once its entries reach this size (a single larger entry is never
split)."""

CONTROL_ENTRY_BYTES = 16
"""What a watermark, barrier or DONE counts for in a stream's window (both ends agree on it)."""

REMOTE_QUEUE_CAPACITY = 1024
"""The nominal ``capacity`` of a :class:`RemoteQueue`: what bounds it is the stream's window,
counted in bytes."""

TAG_PACKET = 3
TAG_ACKS = 4

_RELEASED_REMEMBERED = 4096  # released execution keys kept to tell late data from stray data

_KEPT_PACKER_MAX_BYTES = 8 * PACKET_TARGET_BYTES
"""A thread's packer that packed more than this is dropped rather than kept (its buffer has
grown to that size and would stay allocated)."""

_packers = threading.local()


def _packb(message: list) -> bytes:
    """``msgpack.packb(message)`` with a packer kept by the calling thread (a connection's
    writer, the ack thread). A new packer starts with a 256 KiB buffer and grows it by
    reallocation as a packet of about a megabyte fills it; at that size the allocator maps
    fresh pages each time, and packing one packet took 0.9 ms instead of 0.04 ms with a
    packer whose buffer has already grown."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    try:
        body = packer.pack(message)
    except BaseException:
        _packers.packer = None  # its state is unknown: the next call makes another
        raise
    if len(body) > _KEPT_PACKER_MAX_BYTES:
        _packers.packer = None
    return body


class EdgeConnection(Protocol):
    """What the transport needs of a connection to a peer (``peer_network._Connection``)."""

    peer_id: str
    closed: bool

    def enqueue_entry(self, entry: tuple) -> None:
        """Queues ``(header, data, size, items)`` of one stream entry for the writer."""

    def enqueue_frame(self, body: bytes) -> None:
        """Queues one whole message (a msgpack body) for the writer."""

    def broken_error(self, what: str) -> Exception:
        """The error to raise when ``what`` needed this connection and it has closed."""


def _check_stream(exec_key: Any, stream: Any, where: str) -> tuple[str, int, int, int]:
    if not isinstance(exec_key, str) or not exec_key:
        raise ValueError(f"{where}: exec_key must be a non-empty string, got {exec_key!r}")
    if (not isinstance(stream, tuple) or len(stream) != 3
            or not all(type(i) is int and i >= 0 for i in stream)):
        raise ValueError(f"{where}: stream must be a tuple (edge index, source global index, "
                         f"destination global index) of three ints >= 0, got {stream!r}")
    return (exec_key, stream[0], stream[1], stream[2])


class RemoteQueue:
    """The sending end of one stream, used like a ``ChunkQueue`` by the outbound side.

    ``offer`` returns False when the stream's window is exhausted (the receiver has not
    consumed enough yet); it raises the connection's error (``PeerUnreachableError``) once the
    connection this stream started on has broken, since entries in flight on it are lost and
    the execution cannot go on correctly. ``len()`` is the number of entries sent that the
    receiver has not yet reported as consumed.
    """

    __slots__ = ("name", "capacity", "peer_id", "key", "_conn", "_window", "_inflight")

    def __init__(self, key: tuple[str, int, int, int], peer_id: str, conn: EdgeConnection,
                 initial_limit: int, name: str) -> None:
        self.key = key
        self.peer_id = peer_id
        self.name = name
        self.capacity = REMOTE_QUEUE_CAPACITY
        self._conn = conn
        self._window = SendWindow(initial_limit)
        self._inflight: deque[int] = deque()  # the stream position at the end of each entry

    def offer(self, entry: Any) -> bool:
        conn = self._conn
        if conn.closed:
            raise conn.broken_error(f"stream {self.name}")
        window = self._window
        if window.sent >= window.limit:
            return False
        t = type(entry)
        if t is list:
            data: Any = dumps_chunk(entry)
            size = len(data)
            items = len(entry)
        elif entry is DONE:
            data, size, items = None, CONTROL_ENTRY_BYTES, 0
        elif t is Watermark:
            data, size, items = entry.timestamp, CONTROL_ENTRY_BYTES, 0
        elif t is SnapshotBarrier:
            data, size, items = [entry.snapshot_id, entry.is_terminal], CONTROL_ENTRY_BYTES, 0
        else:
            raise TypeError(f"{self.name}: a queue entry is a chunk (list of items), a Watermark, "
                            f"a SnapshotBarrier or DONE, got {type(entry).__qualname__}")
        window.sent += size
        self._inflight.append(window.sent)
        conn.enqueue_entry((self.key, data, size, items))
        return True

    def _on_ack(self, limit: int, processed: int) -> None:
        self._window.on_ack(limit)
        inflight = self._inflight
        while inflight and inflight[0] <= processed:
            inflight.popleft()

    @property
    def window(self) -> SendWindow:
        """The stream's send window (sent bytes and the granted limit), for metrics."""
        return self._window

    def __len__(self) -> int:
        return len(self._inflight)

    def __bool__(self) -> bool:
        return bool(self._inflight)

    def __repr__(self) -> str:
        w = self._window
        return f"RemoteQueue({self.name} -> {self.peer_id}, sent {w.sent}/{w.limit} bytes)"


class _Inbound:
    """The receiving end of one stream: its queue, the sizes of the entries in it, its
    window and the connection its data comes on (where the acks go back)."""

    __slots__ = ("queue", "sizes", "window", "conn")

    def __init__(self, queue: ChunkQueue, window: ReceiveWindow) -> None:
        self.queue = queue
        self.sizes: deque[int] = deque()
        self.window = window
        self.conn: EdgeConnection | None = None


_STAT_FIELDS = ("bytes_sent", "packets_sent", "entries_sent", "items_sent", "acks_sent",
                "bytes_received", "packets_received", "entries_received", "items_received",
                "acks_received")


class EdgeTransport:
    """Every distributed edge stream of one member, over its peer connections.

    ``connection_for(peer_id, address)`` returns the connection this member opened to that
    peer (made on first use); :class:`~jetwake.engine.cluster.peer_network.PeerNetwork` builds
    the transport and feeds it the packets and acks its connections receive.
    """

    def __init__(self, connection_for: Callable[[str, str], EdgeConnection], *,
                 initial_window: int = INITIAL_WINDOW_BYTES,
                 min_window: int = MIN_WINDOW_BYTES, max_window: int = MAX_WINDOW_BYTES,
                 interval: float = FLOW_CONTROL_INTERVAL) -> None:
        ReceiveWindow(initial_window, min_window, max_window)  # checks the three sizes
        if not 0 < interval <= 1:
            raise ValueError(f"EdgeTransport: interval must be in (0, 1] seconds, got {interval}")
        self._connection_for = connection_for
        self._initial_window = initial_window
        self._min_window = min_window
        self._max_window = max_window
        self._interval = interval
        self._senders: dict[tuple, RemoteQueue] = {}
        self._inbound: dict[tuple, _Inbound] = {}
        self._by_exec: dict[str, set[tuple]] = {}
        self._released: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()  # registration, release and the counters
        self._peer_stats: dict[str, dict[str, int]] = {}
        self._dropped_packets = 0
        self._dropped_entries = 0
        self._warned_unknown: set[str] = set()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- life cycle (driven by PeerNetwork) --------------------------------------------------

    def start(self) -> None:
        """Starts the thread that sends the acks."""
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._ack_loop, name="jetwake-edge-acks",
                                            daemon=True)
            self._ticker.start()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(5)

    # --- the two ends of a stream ------------------------------------------------------------

    def remote_queue(self, exec_key: str, stream: tuple[int, int, int], peer_id: str,
                     address: str) -> RemoteQueue:
        """The sending end of ``stream`` to member ``peer_id`` at ``address``."""
        key = _check_stream(exec_key, stream, "remote_queue")
        if not isinstance(peer_id, str) or not peer_id:
            raise ValueError(f"remote_queue: peer_id must be a non-empty string, got {peer_id!r}")
        conn = self._connection_for(peer_id, address)
        name = f"{exec_key}/{stream[0]}:{stream[1]}->{stream[2]}"
        rq = RemoteQueue(key, peer_id, conn, self._initial_window, name)
        with self._lock:
            if key in self._senders:
                raise ValueError(f"remote_queue: stream {name} already has a sending end; "
                                 "release the execution before reusing its key")
            self._senders[key] = rq
            self._by_exec.setdefault(exec_key, set()).add(key)
            self._released.pop(exec_key, None)
        return rq

    def inbound_queue(self, exec_key: str, stream: tuple[int, int, int],
                      name: str) -> ChunkQueue:
        """The receiving end of ``stream``: a ChunkQueue the transport fills, in order. Register
        it before the sending member starts, since data for an unknown stream is dropped."""
        key = _check_stream(exec_key, stream, "inbound_queue")
        # the window bounds the queue, not its capacity (which only a metric of fill reads)
        queue = ChunkQueue(capacity=1 << 62, name=name)
        inbound = _Inbound(queue, ReceiveWindow(self._initial_window, self._min_window,
                                                self._max_window))
        with self._lock:
            if key in self._inbound:
                raise ValueError(f"inbound_queue: stream {stream} of execution {exec_key} is "
                                 "already registered; release the execution before reusing "
                                 "its key")
            self._inbound[key] = inbound
            self._by_exec.setdefault(exec_key, set()).add(key)
            self._released.pop(exec_key, None)
        return queue

    def release(self, exec_key: str) -> None:
        """Forgets every stream of an execution, both ends: later data for it is dropped (and
        counted), and its sending ends get no more acks."""
        with self._lock:
            for key in self._by_exec.pop(exec_key, ()):
                self._senders.pop(key, None)
                self._inbound.pop(key, None)
            self._released[exec_key] = None
            while len(self._released) > _RELEASED_REMEMBERED:
                self._released.popitem(last=False)

    # --- counters ------------------------------------------------------------------------------

    def _count(self, peer_id: str, **counts: int) -> None:
        with self._lock:
            stats = self._peer_stats.get(peer_id)
            if stats is None:
                stats = self._peer_stats[peer_id] = dict.fromkeys(_STAT_FIELDS, 0)
            for k, v in counts.items():
                stats[k] += v

    def stats(self) -> dict:
        """``{"peers": {peer_id: {bytes/packets/entries/items/acks sent and received}},
        "dropped_packets": n, "dropped_entries": n, "queued_bytes": n}``; bytes are those of
        the packets' frames."""
        with self._lock:
            return {"peers": {p: dict(s) for p, s in self._peer_stats.items()},
                    "dropped_packets": self._dropped_packets,
                    "dropped_entries": self._dropped_entries,
                    "queued_bytes": self._queued_bytes()}

    def queued_bytes(self) -> int:
        """Bytes of entries received and not yet taken by a downstream processor."""
        with self._lock:
            return self._queued_bytes()

    def _queued_bytes(self) -> int:
        total = 0
        for inbound in self._inbound.values():
            sizes = list(inbound.sizes)
            waiting = min(len(inbound.queue), len(sizes))
            total += sum(sizes[len(sizes) - waiting:])
        return total

    # --- the writer's side: packing ----------------------------------------------------------

    def pack_packet(self, entries: list[tuple], peer_id: str) -> bytes:
        """One packet's msgpack body from queued ``(header, data, size, items)`` entries,
        grouped by stream (each stream's entries keep their order); counts it as sent."""
        groups: dict[tuple, list] = {}
        items = 0
        for header, data, _, n in entries:
            group = groups.get(header)
            if group is None:
                groups[header] = [data]
            else:
                group.append(data)
            items += n
        body = _packb([TAG_PACKET, [[*h, datas] for h, datas in groups.items()]])
        self._count(peer_id, bytes_sent=len(body) + 4, packets_sent=1,
                    entries_sent=len(entries), items_sent=items)
        return body

    # --- the reader's side: packets and acks -------------------------------------------------

    def on_packet(self, conn: EdgeConnection, groups: list, frame_bytes: int) -> None:
        """Decodes a packet's entries into their streams' queues (on the connection's reader
        thread)."""
        inbound_streams = self._inbound
        entries = items = dropped = 0
        for group in groups:
            exec_key, edge, src, dst, datas = group
            inbound = inbound_streams.get((exec_key, edge, src, dst))
            if inbound is None:
                dropped += len(datas)
                self._note_unknown(exec_key, (edge, src, dst), conn.peer_id)
                continue
            inbound.conn = conn
            append = inbound.queue.append
            append_size = inbound.sizes.append
            for data in datas:
                t = type(data)
                if t is bytes:
                    try:
                        entry = loads(data)
                    except Exception as e:  # noqa: BLE001 - handed to the processor, see below
                        # an unregistered type, say: the downstream tasklet fails on this
                        # entry with the message, and the job fails with it
                        entry = e
                    else:
                        items += len(entry)
                    size = len(data)
                elif data is None:
                    entry, size = DONE, CONTROL_ENTRY_BYTES
                elif t is int:
                    entry, size = Watermark(data), CONTROL_ENTRY_BYTES
                else:
                    entry, size = SnapshotBarrier(data[0], data[1]), CONTROL_ENTRY_BYTES
                # the entry first, then its size: the ack thread counts consumed entries as
                # len(sizes) - len(queue), which this order never overstates
                append(entry)
                append_size(size)
            entries += len(datas)
        self._count(conn.peer_id, bytes_received=frame_bytes, packets_received=1,
                    entries_received=entries, items_received=items)
        if dropped:
            with self._lock:
                self._dropped_packets += 1
                self._dropped_entries += dropped

    def _note_unknown(self, exec_key: str, stream: tuple, peer_id: str) -> None:
        if exec_key in self._released or exec_key in self._warned_unknown:
            return  # late data of a finished execution: expected, only counted
        self._warned_unknown.add(exec_key)
        log.warning("dropped data from member %s for stream %s of execution %s, which has no "
                    "inbound queue here: register every inbound_queue before the senders start",
                    peer_id, stream, exec_key)

    def on_acks(self, conn: EdgeConnection, acks: list) -> None:
        """Applies acks from a receiver to the sending ends (on the reader thread)."""
        senders = self._senders
        for exec_key, edge, src, dst, limit, processed in acks:
            rq = senders.get((exec_key, edge, src, dst))
            if rq is not None:
                rq._on_ack(limit, processed)
        self._count(conn.peer_id, acks_received=len(acks))

    # --- the ack thread ------------------------------------------------------------------------

    def _ack_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.send_acks()
            except Exception:  # noqa: BLE001 - the acks must go on
                log.exception("sending flow-control acks failed")

    def send_acks(self) -> None:
        """One round of acks: for each stream whose processor consumed something since the
        last round, the new limit goes to the sender over the connection the data came on."""
        by_conn: dict[Any, list] = {}
        for key, inbound in list(self._inbound.items()):
            sizes = inbound.sizes
            consumed = len(sizes) - len(inbound.queue)
            if consumed <= 0:
                continue
            popleft = sizes.popleft
            nbytes = 0
            for _ in range(consumed):
                nbytes += popleft()
            window = inbound.window
            window.on_processed(nbytes)
            limit = window.next_ack()
            conn = inbound.conn
            if conn is not None and not conn.closed:
                by_conn.setdefault(conn, []).append([*key, limit, window.processed])
        for conn, acks in by_conn.items():
            conn.enqueue_frame(_packb([TAG_ACKS, acks]))
            self._count(conn.peer_id, acks_sent=len(acks))
