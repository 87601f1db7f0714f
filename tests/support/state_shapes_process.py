"""A member process running one stateful pipeline whose state is changed in place, for the
exactly-once kill tests (run as a script; the tests SIGKILL it).

    python tests/support/state_shapes_process.py DATA_DIR SHAPE EVENTS BACKEND [check]

The "kafka_*" shapes read the topic ``$STATE_IN_TOPIC`` and write ``$STATE_OUT_TOPIC`` with the
exactly-once Kafka sink, on the broker ``$KAFKA_BOOTSTRAP_SERVERS``; the test produces the input
events and reads the output itself.

It opens a Member on DATA_DIR, writes EVENTS events ``(i, i)`` into the map "in" (continuing
after what a killed process already wrote) and makes sure the job "shape" exists:
``Sources.map_journal("in")`` -> the SHAPE's stateful stage -> ``Sinks.map("out")``, exactly-once,
with keyed state in BACKEND ("memory" or "rocksdb"). Restarted on the same directory, the job
resumes from its last snapshot by itself. With "check" it waits until the output is complete
(or 60 s pass), writes the map "out" as JSON to DATA_DIR/result.json and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

from jetwake import (
    AggregateOperation, AggregateOperations, JobConfig, Member, Pipeline, Processor, Sinks,
    Sources, WindowDefinition,
)

# run as a script: tests/ (where `support` is) is not on sys.path by itself
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.restores import record_restores  # noqa: E402
from support.waiting import poll_until  # noqa: E402

KEYS = 13
WINDOW = 100
LAG = 1000


def _key(e: tuple) -> int:
    return e[0] % KEYS


def _count_and_sum(state: list, key: int, e: tuple) -> tuple:
    state[0] += 1  # the state object is changed in place, never replaced
    state[1] += e[1]
    return key, (state[0], state[1])


def _dict_create() -> dict:
    return {"n": 0, "s": 0}


def _dict_accumulate(acc: dict, e: tuple) -> dict:
    acc["n"] += 1
    acc["s"] += e[1]
    return acc


def _dict_combine(a: dict, b: dict) -> dict:
    a["n"] += b["n"]
    a["s"] += b["s"]
    return a


def _dict_export(acc: dict) -> tuple:
    return acc["n"], acc["s"]


def _value(e: tuple) -> int:
    return e[1]


def rolling_all_of(p: Pipeline) -> Any:
    ops = AggregateOperations
    return (p.read_from(Sources.map_journal("in")).group_by(_key)
            .rolling_aggregate(ops.all_of(ops.counting(), ops.summing(_value))))


def rolling_to_list(p: Pipeline) -> Any:
    return (p.read_from(Sources.map_journal("in")).map(_value).group_by(lambda v: v % KEYS)
            .rolling_aggregate(AggregateOperations.to_list()))


def rolling_dict_accumulator(p: Pipeline) -> Any:
    op = AggregateOperation(_dict_create, _dict_accumulate, _dict_combine, export=_dict_export,
                            finish=_dict_export)
    return p.read_from(Sources.map_journal("in")).group_by(_key).rolling_aggregate(op)


def map_stateful_list(p: Pipeline) -> Any:
    return (p.read_from(Sources.map_journal("in")).group_by(_key)
            .map_stateful(lambda: [0, 0], _count_and_sum))


def window_to_list(p: Pipeline) -> Any:
    return (p.read_from(Sources.map_journal("in")).with_timestamps(_value, LAG)
            .window(WindowDefinition.tumbling(WINDOW)).group_by(_key)
            .aggregate(AggregateOperations.to_list())
            .map(lambda r: ((r.key, r.end), sorted(x[1] for x in r.result))))


class SlowPassThrough(Processor):
    """Forwards items at about 5,000 a second. Downstream of the stateful stage it keeps a
    backlog in front of the sink, so each snapshot's barrier reaches the sink well after the
    stateful stage saved its state and went on changing it: the window in which state saved
    by reference would leak into the snapshot."""

    def process(self, ordinal: int, inbox: Any) -> None:
        if not self.outbox.has_room():
            return
        items = inbox.drain()
        time.sleep(0.0002 * len(items))
        self.outbox.offer_chunk(-1, items)


def _throttled(e: Any) -> Any:
    time.sleep(0.0002)  # Kafka input is all there at once: keep the state changing for seconds
    return e


def _kafka_counter(state: list, key: str, e: tuple) -> tuple:
    state[0] += 1  # the shape: a one-element list counter changed in place
    return key, str(state[0])


def kafka_map_stateful_list(p: Pipeline) -> Any:
    props = {"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]}
    return (p.read_from(Sources.kafka(os.environ["STATE_IN_TOPIC"], props,
                                      key_deserializer="str", value_deserializer="str"))
            .map(_throttled).group_by(lambda kv: kv[0])
            .map_stateful(lambda: [0], _kafka_counter))


SHAPES: dict[str, Callable[[Pipeline], Any]] = {
    "rolling_all_of": rolling_all_of,
    "rolling_to_list": rolling_to_list,
    "rolling_dict_accumulator": rolling_dict_accumulator,
    "map_stateful_list": map_stateful_list,
    "window_to_list": window_to_list,
    "kafka_map_stateful_list": kafka_map_stateful_list,
}


def expected(shape: str, events: int) -> dict:
    """The map "out" after every event was counted exactly once."""
    out: dict = {}
    if shape == "rolling_to_list":
        for i in range(events):
            out.setdefault(i % KEYS, []).append(i)
        return {k: sorted(v) for k, v in out.items()}
    if shape == "window_to_list":
        closed_until = events - 1 - LAG  # the watermark after the last event
        for i in range(events):
            end = (i // WINDOW + 1) * WINDOW
            if end <= closed_until:
                out.setdefault((i % KEYS, end), []).append(i)
        return out
    for i in range(events):
        n, s = out.get(i % KEYS, (0, 0))
        out[i % KEYS] = (n + 1, s + i)
    return out


def normalized(shape: str, value: Any) -> Any:
    return sorted(value) if shape == "rolling_to_list" else list(value)


def main() -> None:
    data_dir, shape, events, backend = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    check = len(sys.argv) > 5 and sys.argv[5] == "check"
    record_restores(data_dir)
    member = Member(data_dir)
    kafka = shape.startswith("kafka_")
    if member.get_job(shape) is None:
        p = Pipeline()
        if kafka:
            SHAPES[shape](p).write_to(Sinks.kafka(
                os.environ["STATE_OUT_TOPIC"],
                {"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]},
                key_serializer="str", value_serializer="str"))
        else:
            (SHAPES[shape](p).custom_transform("slow-pass-through", SlowPassThrough)
             .write_to(Sinks.map("out")))
        member.new_job(p, JobConfig(name=shape, processing_guarantee="exactly_once",
                                    snapshot_interval_ms=150, state_backend=backend))
    source = member.get_map("in") if not kafka else {}
    for i in range(len(source), events if not kafka else 0):
        source.put(i, i)
        if i % 20 == 0:
            # about 4,000 events a second: state keeps changing while snapshots are taken
            # and while the process is killed
            time.sleep(0.005)
    if not check or kafka:  # the test reads the Kafka output itself
        while True:
            time.sleep(1)
    want = expected(shape, events)
    out = member.get_map("out")
    # at most a minute: result.json then says what is there, and the test what is missing
    poll_until(lambda: all(k in out and normalized(shape, out[k]) == normalized(shape, v)
                           for k, v in want.items()), timeout=60, interval=0.05)
    time.sleep(0.3)  # anything still in flight (a duplicate) would land now
    got = {json.dumps(k): normalized(shape, v) for k, v in out.items()}
    with open(os.path.join(data_dir, "result.json"), "w") as f:
        json.dump({"got": got,
                   "want": {json.dumps(k): normalized(shape, v) for k, v in want.items()}}, f)
    member.shutdown()


if __name__ == "__main__":
    main()
