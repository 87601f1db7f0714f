"""A member process for the PostgreSQL sink's kill tests (tests/test_postgres_sink_kills.py).

    python tests/support/postgres_job_process.py DATA_DIR DSN EVENTS [check]

Opens ``Member(DATA_DIR)`` and makes sure the job "pg-events" exists:
``map_journal("in") -> Sinks.postgres("events")`` under exactly-once (snapshots every 100 ms,
parallelism 2, batches of 50 rows), each event ``(i, i)`` becoming the row ``(id=i, v=i)`` of
a table without a key, so a row written twice shows. It feeds EVENTS events into the map "in"
(going on after what a killed process wrote). A job that was running there resumes from its
last snapshot by itself.

``JETWAKE_PG_DIE_AT=<point>:<n>`` in the environment: the process kills itself with SIGKILL
the n-th time one of its sink processors passes ``<point>``:

- ``processing``: a batch was written into the open transaction (counted once a snapshot
  was committed, so that the restart has one to restore);
- ``after-prepare``: PREPARE TRANSACTION ran, the snapshot is not committed yet;
- ``during-commit``: processor 0 ran COMMIT PREPARED, processor 1's part of the same
  snapshot is still prepared.

(``JETWAKE_CRASH_AT`` kills at the engine's points, e.g. ``after-commit-record``.)

With ``check`` it waits until the table holds EVENTS rows, suspends the job (its terminal
snapshot commits what is prepared), cancels it and shuts the member down.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.member_feeding import feed_slowly, serve_until_killed  # noqa: E402
from support.restores import record_restores  # noqa: E402
from support.postgres_dying import dying_sink  # noqa: E402
from support.waiting import poll_until  # noqa: E402

JOB = "pg-events"
TABLE = "events"



def row_count(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]


def main() -> None:
    data_dir, dsn, events = sys.argv[1], sys.argv[2], int(sys.argv[3])
    check = "check" in sys.argv[4:]
    from jetwake import JobConfig, Member, Pipeline, Sources

    record_restores(data_dir)
    member = Member(data_dir, local_parallelism=2)
    if member.get_job(JOB) is None:
        p = Pipeline()
        (p.read_from(Sources.map_journal("in", start="current"))
          .map(lambda e: (e[0], e[1]))
          .rebalance(lambda e: e[0])          # rows reach both sink processors
          .write_to(dying_sink(TABLE, dsn)))
        member.new_job(p, JobConfig(name=JOB, processing_guarantee="exactly_once",
                                    snapshot_interval_ms=100))
    feed_slowly(member, "in", events, every=20, pause=0.01)
    if not check:
        serve_until_killed()
    poll_until(lambda: row_count(dsn) >= events, timeout=60, interval=0.05)
    job = member.get_job(JOB)
    job.suspend()
    job.cancel()
    member.shutdown()


if __name__ == "__main__":
    main()
