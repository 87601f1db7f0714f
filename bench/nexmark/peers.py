"""The NEXMark queries on the peers, Quix Streams and Bytewax, for ``python -m bench nexmark``.

``run_peer(peer, query, ...)`` runs one peer's query (``peers_quix.py``, ``peers_bytewax.py``)
as a process of its own, with the Python of the virtual environment ``python -m bench
kafka-peers`` makes for that peer (``.cache/bench-peers/<peer>``, pinned versions), on the
topics the generator filled, and returns its events/s, CPU time and output records.

The peer processes import this module too (at its top it loads only the standard library and
``bench`` files that import nothing more), for what both peers must compute alike: the query
constants, the shape of each query's output record, the folds of the windowed queries, and
``Progress``, the peer's own counters that ``run_peer`` reads to know when the input is
consumed.

How a run is timed: the peer notes the wall time it processes its first event (``t_first``)
and its ``input_events``-th (``t_read``), and the wall time it hands its last output record to
its Kafka producer (``t_out``). The run is over when the peer has processed every event and
either exits (Bytewax ends its input at the end of the topics, then flushes every window) or
has no record in flight through its own topics and its counters have settled for
``SETTLE_S`` (Quix Streams), and the output topic holds every record it wrote. ``wall_s`` is
from ``t_first`` to the later of ``t_read`` and ``t_out`` (start-up does not count; an
exactly-once producer's commit latency does not either); ``cpu_s`` is the peer process's CPU
time (all threads) over the same interval.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.kafka_spec import write_report
# the queries' constants, shared with jetwake's queries (the peers' modules read them here)
from bench.nexmark.constants import (
    AUCTION_MODULUS, EURO_MILLS, Q5_SIZE_MS, Q5_SLIDE_MS, Q7_SIZE_MS, Q11_GAP_MS,
)
from bench.nexmark.events import BID_TOPIC
from bench.nexmark.kafka_input import is_end_marker

PEERS = ("quix", "bytewax")
# the queries each peer runs; the others need joins or processing-time windows (see
# docs/nexmark.md ("The peers") for why each is left out)
SUPPORTED: dict[str, tuple[str, ...]] = {
    "quix": ("q0", "q1", "q2", "q5", "q7", "q11"),
    "bytewax": ("q0", "q1", "q2", "q5", "q7", "q11"),
}
# every query a peer runs reads the bids only (input_events counts bids)
READS = BID_TOPIC

# --- the queries' output records, shared by both peers ------------------------------------------

# the event-time disorder each peer's windows wait for before closing (Quix: grace_ms; Bytewax:
# the EventClock's wait_for_system_duration). Besides the generator's own disorder, a peer reads
# the topic's partitions in turns, which disorders the bids it sees by up to a few fetches.
LAG_MS = int(os.environ.get("BENCH_NEXMARK_PEER_LAG_MS", "3000"))
# Quix Streams' processing guarantee (jetwake's headline figures are exactly-once); Bytewax
# offers no exactly-once Kafka sink and runs without a guarantee
QUIX_GUARANTEE = os.environ.get("BENCH_NEXMARK_QUIX_GUARANTEE", "exactly-once")
# each peer's guarantee in jetwake's words, so that it is compared with jetwake's run of the
# same guarantee (or of the weakest stronger one measured)
PEER_GUARANTEES = {"quix": QUIX_GUARANTEE.replace("-", "_"), "bytewax": "none"}
COMMIT_INTERVAL_S = 1.0


def q1_row(bid: dict) -> dict:
    """q1: the bid with its price converted from dollars to euros, ``0.908 * price`` as
    Flink's exact decimal, as the nearest float (bench/nexmark/queries/q1.py's ``euros``,
    which the peers cannot import: it imports jetwake)."""
    return {"auction": bid["auction"], "bidder": bid["bidder"],
            "price": bid["price"] * EURO_MILLS / 1000, "date_time": bid["date_time"],
            "extra": bid["extra"]}


def q2_keep(bid: dict) -> bool:
    """q2: the bids on the auctions whose id is a multiple of 123."""
    return bid["auction"] % AUCTION_MODULUS == 0


def q2_row(bid: dict) -> dict:
    return {"auction": bid["auction"], "price": bid["price"]}


def q5_row(auction: int, num: int, start: int) -> dict:
    """q5: one hottest auction of the window starting at ``start`` and its bid count."""
    return {"auction": auction, "num": num, "starttime": start, "endtime": start + Q5_SIZE_MS}


def q5_first(count: list) -> list:
    """q5's top of a window from its first ``[auction, bids]`` count: ``[highest count,
    [auctions with it]]``."""
    return [count[1], [count[0]]]


def q5_fold(acc: list, count: list) -> list:
    """q5: keeps the highest bid count of the window and every auction tied at it (the
    standard query keeps each auction whose count is ``>= max``)."""
    auction, num = count[0], count[1]
    if num > acc[0]:
        return [num, [auction]]
    if num == acc[0]:
        acc[1].append(auction)
    return acc


def q5_rows(top: list, start: int) -> list[dict]:
    """q5's output records of one window from its top (``q5_fold``)."""
    return [q5_row(auction, top[0], start) for auction in top[1]]


def q7_first(bid: dict) -> list:
    """q7's accumulator from a window's first bid: ``[highest price, [bids at that price]]``."""
    return [bid["price"], [bid]]


def q7_fold(acc: list, bid: dict) -> list:
    """q7: keeps the highest price of the window and every bid at it (all ties, as the
    standard query's join of the bids with each window's highest price gives)."""
    price = bid["price"]
    if price > acc[0]:
        return [price, [bid]]
    if price == acc[0]:
        acc[1].append(bid)
    return acc


def q7_merge(a: list, b: list) -> list:
    if a[0] != b[0]:
        return a if a[0] > b[0] else b
    return [a[0], a[1] + b[1]]


def q7_rows(acc: list, end: int) -> list[dict]:
    """q7's output records of one window (ending at ``end``) from its accumulator."""
    return [{"auction": b["auction"], "bidder": b["bidder"], "price": b["price"],
             "channel": b["channel"], "url": b["url"], "date_time": b["date_time"],
             "extra": b["extra"], "endtime": end} for b in acc[1]]


def q11_row(bidder: int, count: int, first_ms: int, last_ms: int) -> dict:
    """q11: one session of a bidder: its bids, its first bid's time and the time it ends, one
    gap after its last bid (the standard SESSION_START and SESSION_END)."""
    return {"bidder": bidder, "bid_count": count, "starttime": first_ms,
            "endtime": last_ms + Q11_GAP_MS}


# Quix Streams has no watermark across partitions: a window after a repartition (q7, q11) or
# over q5's counts from every input partition gets the input partitions' records as each is
# processed, the slowest partition many seconds of event time behind the fastest (Quix Streams
# reads a partition by fetches of up to a megabyte, and the partitions' event rates differ
# with the hot auctions); such a window waits this long (its grace) before closing. The end
# markers close the last windows at the end.
QUIX_MIXED_GRACE_MS = 60_000


# --- the peer process's own counters -----------------------------------------------------------

class Progress:
    """A peer process's counters: events read, records written, late records dropped by its
    windows, and the times ``run_peer`` needs. A daemon thread writes them to the report file
    every 0.1 s (and ``flush`` at the end), so that counting costs the peer an increment."""

    def __init__(self, report_path: str, events: int) -> None:
        self.path = report_path
        self.events = events
        self.n_read = 0
        self.n_written = 0
        self.n_late = 0
        self.n_relayed = 0
        self.t_first: float | None = None
        self.t_read: float | None = None
        self.t_out: float | None = None
        self._lock = threading.Lock()   # the reporting thread and a milestone write alike
        threading.Thread(target=self._report, daemon=True, name="progress").start()

    def read(self, *_: Any) -> None:
        """One input event read (by the stage that processes it: after a repartition topic,
        not where it is first consumed)."""
        self.n_read += 1
        if self.n_read == 1:
            self.t_first = time.time()
            self.flush()
        if self.n_read == self.events:
            self.t_read = time.time()
            self.flush()

    def wrote(self, value: Any) -> Any:
        """One output record handed to the sink (returns it, to sit in a map)."""
        self.n_written += 1
        self.t_out = time.time()
        return value

    def read_event(self, record: Any) -> None:
        """``read`` if ``record`` is an event, not an end marker."""
        if not is_end_marker(record):
            self.read()

    def relay(self, n: int) -> None:
        """Records written to (+1) or read back from (-1) a peer's own intermediate topic:
        the run is not over while some are on their way."""
        self.n_relayed += n

    def late(self, *_: Any) -> bool:
        """One record a window dropped as late (also Quix Streams' ``on_late``: returning
        False, the count replaces its log line)."""
        self.n_late += 1
        return False

    def flush(self, done: bool = False) -> None:
        with self._lock:
            write_report(self.path, {"t_first": self.t_first, "t_read": self.t_read,
                                     "t_out": self.t_out, "read": self.n_read,
                                     "written": self.n_written, "late": self.n_late,
                                     "relayed": self.n_relayed,
                                     "done": done})

    def _report(self) -> None:
        while True:
            time.sleep(0.1)
            self.flush()


# --- running a peer ----------------------------------------------------------------------------

SETTLE_S = 0.5    # the counters unchanged this long after the input is processed: done
POLL_S = 0.05
# Bytewax ends its input at the end of the topic and exits once it has flushed every window:
# its run is over when it exits. Quix Streams runs on: its run is over once it has processed
# every event, relayed every record of its own topics and its counters settle.
ENDS_AT_END_OF_INPUT = {"quix": False, "bytewax": True}


@dataclass
class PeerRun:
    """One peer's run of one query: ``events_per_s`` is ``input_events / wall_s``; ``cpu_s``
    the peer process's CPU time over ``wall_s``; ``outputs`` the output topic's records
    decoded from JSON. ``late`` counts the records the peer's windows dropped as late,
    ``startup_s`` the time from launching the process to its first event."""

    events_per_s: float
    cpu_s: float
    wall_s: float
    outputs: list = field(default_factory=list)
    late: int = 0
    startup_s: float = 0.0


def check_peer_query(peer: str, query_name: str) -> None:
    """Fails with the fix when ``peer`` is unknown or cannot run ``query_name``."""
    if peer not in PEERS:
        raise ValueError(f"run_peer(): unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    if query_name not in SUPPORTED[peer]:
        raise ValueError(f"run_peer(): {peer} does not run NEXMark {query_name} (it runs "
                         f"{', '.join(SUPPORTED[peer])}; docs/nexmark.md, 'The peers', says why)")


def peer_command(peer: str, python: str, query_name: str, bootstrap: str, output_topic: str,
                 input_events: int, scratch: str, topic_prefix: str = "") -> list[str]:
    return [python, "-m", f"bench.nexmark.peers_{peer}", query_name, "--bootstrap", bootstrap,
            "--output", output_topic, "--events", str(input_events),
            "--topic-prefix", topic_prefix,
            "--report", os.path.join(scratch, "report.json"),
            "--state-dir", os.path.join(scratch, "state")]


def run_peer(peer: str, query_name: str, bootstrap: str, output_topic: str,
             input_events: int | Sequence[tuple[str, Any]], timeout_s: float, *,
             topic_prefix: str = "") -> PeerRun:
    """Runs ``peer``'s ``query_name`` on the NEXMark topics (already filled) until it has read
    ``input_events`` events (the bids: every query a peer runs reads only those) and written
    its output to ``output_topic``; stops it and returns the figures and outputs. Raises
    RuntimeError when the peer cannot be installed or fails, TimeoutError after
    ``timeout_s``. ``input_events`` may also be the generated ``(kind, record)`` events
    (their bids are counted). ``topic_prefix`` is put before the topics' names, as
    ``NexmarkInputs.topic_prefix``."""
    from bench.bench_kafka_peers import REPO, _cpu_at, _cpu_seconds, _stop, _tail, peer_python

    check_peer_query(peer, query_name)
    if not isinstance(input_events, int):
        input_events = sum(1 for kind, _ in input_events if kind == "bid")
    if input_events < 1:
        raise ValueError(f"run_peer(): input_events must be at least 1, got {input_events}")
    python, why = peer_python(peer)
    if python is None:
        raise RuntimeError(f"{peer} cannot run: {why}")
    scratch = tempfile.mkdtemp(prefix=f"nexmark-{peer}-{query_name}-")
    report = os.path.join(scratch, "report.json")
    log_path = os.path.join(scratch, "peer.log")
    cmd = peer_command(peer, python, query_name, bootstrap, output_topic, input_events, scratch,
                       topic_prefix)
    reader = _OutputReader(bootstrap, output_topic)
    samples: list[tuple[float, float]] = []
    state: dict[str, Any] = {}
    exited = False
    with open(log_path, "w") as log:
        t_launch = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        last_counts, quiet_since = None, time.monotonic()
        while True:
            if not exited:
                cpu = _cpu_seconds(proc.pid)
                if cpu is not None:
                    samples.append((time.time(), cpu))
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    # reaped here, for the CPU time of its whole life (from /proc until now)
                    exited = True
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    samples.append((time.time(), usage.ru_utime + usage.ru_stime))
                    if proc.returncode != 0:
                        raise RuntimeError(f"{peer} {query_name} exited ({proc.returncode}): "
                                           f"{_tail(log_path)}")
            state = _read_report(report) or state
            reader.poll()
            written = state.get("written", 0)
            counts = (state.get("read"), written, state.get("relayed"))
            if counts != last_counts:
                last_counts, quiet_since = counts, time.monotonic()
            if exited and not (ENDS_AT_END_OF_INPUT[peer] and state.get("t_read") is not None):
                raise RuntimeError(f"{peer} {query_name} exited before its end (read "
                                   f"{state.get('read', 0):,} of {input_events:,} events): "
                                   f"{_tail(log_path)}")
            if (state.get("t_read") is not None and not state.get("relayed")
                    and len(reader.values) >= written):
                if exited or (not ENDS_AT_END_OF_INPUT[peer]
                               and time.monotonic() - quiet_since >= SETTLE_S):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{peer} {query_name}: not done after {timeout_s:.0f} s (read "
                    f"{state.get('read', 0):,} of {input_events:,} events, "
                    f"{len(reader.values):,} output records); {_tail(log_path)}")
            time.sleep(POLL_S)
    finally:
        if not exited:
            _stop(proc)
        reader.close()
    t_first = state["t_first"]
    t_end = max(state["t_read"], state.get("t_out") or 0.0)
    wall = t_end - t_first
    cpu_s = _cpu_at(samples, t_end) - _cpu_at(samples, t_first) if samples else 0.0
    outputs = [json.loads(v) for v in reader.values]
    shutil.rmtree(scratch, ignore_errors=True)   # kept (with the peer's log) when it failed
    return PeerRun(events_per_s=input_events / wall, cpu_s=cpu_s, wall_s=wall, outputs=outputs,
                   late=state.get("late", 0), startup_s=t_first - t_launch)


def _read_report(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class _OutputReader:
    """Reads the output topic from its beginning as it fills (committed records only)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.values: list[bytes] = []
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  "isolation.level": "read_committed",
                                  "fetch.queue.backoff.ms": 0})
        self.consumer.subscribe([topic])

    def poll(self) -> None:
        while True:
            msgs = self.consumer.consume(10_000, 0.01)
            self.values.extend(m.value() for m in msgs if m.error() is None)
            if len(msgs) < 10_000:
                return

    def close(self) -> None:
        self.consumer.close()


# --- measuring the peers alone -----------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    """``python -m bench.nexmark.peers [--events N] [--peers quix,bytewax] [--queries ...]
    [--bootstrap HOST:PORT]``: each peer's queries on the same generated events, each output
    checked against the query's reference."""
    import argparse

    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.bench_kafka_peers import _kafka_local
    from bench.nexmark.generator import GeneratorConfig
    from bench.nexmark.kafka_input import DEFAULT_PARTITIONS, fill
    from bench.nexmark.queries import check_output, query

    ap = argparse.ArgumentParser(prog="python -m bench.nexmark.peers")
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--queries", default=",".join(SUPPORTED["quix"]))
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    ap.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    args = ap.parse_args(argv)
    kl = port = None
    bootstrap = args.bootstrap
    if not bootstrap:
        kl = _kafka_local()
        port = kl.free_port()
        bootstrap = kl.start_broker(port)
    try:
        prefix = f"peers-{uuid.uuid4().hex[:6]}-"
        inp = fill(bootstrap, GeneratorConfig(args.events), prefix=prefix,
                   partitions=args.partitions)
        events, bids = inp.events, inp.counts["bid"]
        print(f"   broker {bootstrap}: {args.events:,} events ({bids:,} bids) written in "
              f"{inp.write_s:.1f} s; load average {os.getloadavg()[0]:.2f}", flush=True)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        print(f"   {'peer':<8} {'query':<5} {'events/s':>9} {'CPU s':>6} {'wall s':>6} "
              f"{'ev/CPU-s':>9} {'late':>5} {'outputs':>8}  check")
        for peer in args.peers.split(","):
            for name in args.queries.split(","):
                if name not in SUPPORTED[peer]:
                    continue
                out = f"{prefix}out-{peer}-{name}"
                admin.create_topics([NewTopic(out, args.partitions, 1, config={
                    "retention.ms": "-1"})])[out].result(30)
                try:
                    run = run_peer(peer, name, bootstrap, out, bids, 600,
                                   topic_prefix=prefix)
                except (RuntimeError, TimeoutError) as e:
                    print(f"   {peer:<8} {name:<5} failed: {e}", flush=True)
                    continue
                try:
                    problems = check_output(query(name), events, run.outputs)
                except ImportError as e:  # a query module not written yet
                    problems = [f"no reference ({e})"]
                print(f"   {peer:<8} {name:<5} {run.events_per_s:>9,.0f} {run.cpu_s:>6.1f} "
                      f"{run.wall_s:>6.1f} {bids / max(run.cpu_s, 1e-9):>9,.0f} "
                      f"{run.late:>5} {len(run.outputs):>8}  "
                      f"{'; '.join(problems)[:300] or 'ok'}", flush=True)
        print(f"   load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if kl is not None:
            kl.stop_broker(port)


if __name__ == "__main__":
    main()
