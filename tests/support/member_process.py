"""A member process for fault-injection tests (run as a script; the tests SIGKILL it).

    python tests/support/member_process.py DATA_DIR EVENTS GUARANTEE [check] [rocksdb]

It opens a Member on DATA_DIR, feeds EVENTS events into the map "in" (continuing after what a
previous, killed, process already wrote), and makes sure the job "sums" exists: map_journal("in")
-> a keyed running (sum, count) per key -> Sinks.map("out"). Restarted on the same directory,
the job resumes from its last snapshot by itself. With "check" it waits until the output is
complete, writes it as JSON to DATA_DIR/result.json and exits cleanly. With "rocksdb" the
running sums are keyed state in RocksDB (``map_stateful`` with state_backend="rocksdb").
"""

from __future__ import annotations

import json
import os
import sys
import time

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources

# run as a script: tests/ (where `support` is) is not on sys.path by itself
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.member_feeding import feed_slowly, serve_until_killed  # noqa: E402
from support.restores import record_restores  # noqa: E402
from support.snapshot_fixtures import RunningSum  # noqa: E402
from support.waiting import poll_until  # noqa: E402

KEYS = 13


def build_pipeline(rocksdb: bool = False) -> Pipeline:
    p = Pipeline()
    # "current": a restart that failed to restore the saved position would miss events
    keyed = (p.read_from(Sources.map_journal("in", start="current"))
             .map(lambda e: (e[0] % KEYS, e[1])))
    if rocksdb:
        def add(state: list, key, item):
            state[0] += item[1]
            state[1] += 1
            return (key, (state[0], state[1]))
        sums = keyed.group_by(lambda e: e[0]).map_stateful(lambda: [0, 0], add)
    else:
        sums = keyed.rebalance(lambda e: e[0]).custom_transform("running-sum", RunningSum)
    sums.write_to(Sinks.map("out"))
    return p


def expected(events: int) -> dict:
    out: dict = {}
    for i in range(events):
        s, c = out.get(i % KEYS, (0, 0))
        out[i % KEYS] = (s + i, c + 1)
    return out


def main() -> None:
    data_dir, events, guarantee = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    check = "check" in sys.argv[4:]
    rocksdb = "rocksdb" in sys.argv[4:]
    record_restores(data_dir)
    member = Member(data_dir, local_parallelism=2)
    if member.get_job("sums") is None:
        member.new_job(build_pipeline(rocksdb), JobConfig(
            name="sums", processing_guarantee=guarantee, snapshot_interval_ms=100,
            state_backend="rocksdb" if rocksdb else "memory"))
    feed_slowly(member, "in", events, every=50, pause=0.002)
    if not check:
        serve_until_killed()
    want = {k: list(v) for k, v in expected(events).items()}
    out = member.get_map("out")
    # at most a minute: result.json then says what is there, and the test what is missing
    poll_until(lambda: sum(c for _, c in out.values()) >= events, timeout=60, interval=0.05)
    time.sleep(0.3)  # anything still in flight (a duplicate) would land now
    got = {k: list(v) for k, v in out.items()}
    with open(os.path.join(data_dir, "result.json"), "w") as f:
        json.dump({"got": {str(k): v for k, v in got.items()},
                   "want": {str(k): v for k, v in want.items()}}, f)
    member.shutdown()


if __name__ == "__main__":
    main()
