"""Looking into snapshots: what an exported snapshot and a job's last committed snapshot hold
(a Kafka source's offsets per partition with a real broker, a window stage's watermark, a
map_stateful stage's keys), and the commands through a member process: ``jetwake snapshot
inspect`` and ``jetwake submit --from-snapshot --dry-run``."""

from __future__ import annotations

import json
import textwrap

import pytest

from jetwake import (
    AggregateOperations, Client, JobConfig, Member, Pipeline, Sinks, SnapshotNotFoundError,
    Sources, WindowDefinition,
)
from support.cli_member import MemberProc, cli, ok
from support.ordered_producer import ordered_producer
from support.waiting import wait_until

PARTITIONS = 3
PER_PARTITION = 40
KEYS = ["a", "b", "c", "d"]


def count(state, key, item):
    state[0] += 1
    return key, state[0]


def kafka_pipeline(topic: str, props: dict) -> Pipeline:
    """Events {"k", "t"} from Kafka: windows of 100 ms counted per key, and a running count
    per key (map_stateful)."""
    p = Pipeline()
    events = (p.read_from(Sources.kafka(topic, props, value_deserializer="json"))
               .with_timestamps(lambda kv: kv[1]["t"], allowed_lag=0))
    (events.window(WindowDefinition.tumbling(100)).group_by(lambda kv: kv[1]["k"])
           .aggregate(AggregateOperations.counting()).set_name("per-window")
           .write_to(Sinks.noop()))
    (events.group_by(lambda kv: kv[1]["k"]).map_stateful(lambda: [0], count)
           .set_name("counts").write_to(Sinks.map("counts")))
    return p


@pytest.mark.kafka
def test_inspect_shows_kafka_offsets_per_partition_a_window_watermark_and_the_keys(
        kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=PARTITIONS)
    producer = ordered_producer(kafka_bootstrap)
    # each partition's events reach the same last event time, a multiple of the window size
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(topic, partition=p, value=json.dumps(
                {"k": KEYS[(p + i) % len(KEYS)], "t": i * 100}).encode())
    producer.flush()
    top = (PER_PARTITION - 1) * 100
    props = {"bootstrap.servers": kafka_bootstrap}
    with Member(local_parallelism=1) as m:
        job = m.new_job(kafka_pipeline(topic, props),
                        JobConfig(name="events", processing_guarantee="at_least_once",
                                  snapshot_interval_ms=100))
        total = PARTITIONS * PER_PARTITION
        wait_until(lambda: sum(v for _, v in m.get_map("counts").items()) == total,
                   what="every event counted")
        wait_until(lambda: job.last_snapshot is not None
                   and m.inspect_snapshot("events")["sources"], what="a snapshot with offsets")

        # the job's last committed snapshot, by the job's name
        last = m.inspect_snapshot("events")
        assert last["name"] is None and last["job_name"] == "events"
        assert last["snapshot_id"] == job.last_snapshot.snapshot_id

        job.cancel_and_export_snapshot("done")
        doc = m.inspect_snapshot("done")
        assert doc["name"] == "done" and doc["job_id"] == job.id
        [source] = doc["sources"]
        assert source["kind"] == "source"
        assert sorted((p["topic"], p["partition"], p["offset"], p["top_event_time"])
                      for p in source["partitions"]) == [
            (topic, p, PER_PARTITION, top) for p in range(PARTITIONS)]
        stages = {s["vertex"]: s for s in doc["stages"]}
        window = stages["per-window"]
        assert window["kind"] == "window-aggregate"
        assert window["watermark"] == top  # the lowest partition's top, lag 0
        counts = stages["counts"]
        assert counts["kind"] == "map-stateful" and counts["keys"] == len(KEYS)
        assert sorted(counts["sample_keys"]) == KEYS
        per_key = total // len(KEYS)
        assert dict(counts["sample"]) == {k: [per_key] for k in KEYS}
        # the checksums are the commit record's, every processor's data file
        rec = next(r for r in m.snapshots() if r.name == "done")
        assert {v: {p: [c["entries"], int(c["crc32"], 16), c["bytes"]] for p, c in ps.items()}
                for v, ps in doc["checksums"].items()} == rec.files
        assert doc["entries"] == rec.entry_count and doc["bytes"] == rec.size_bytes


def test_inspect_names_the_fix_for_an_unknown_name_and_a_job_without_a_snapshot():
    from support.snapshot_fixtures import counting_source
    with Member() as m:
        with pytest.raises(SnapshotNotFoundError, match="no exported snapshot and no job"):
            m.inspect_snapshot("nothing")
        p = Pipeline()
        p.read_from(counting_source(None)).write_to(Sinks.noop())
        job = m.new_job(p, JobConfig(name="no-snapshots"))
        with pytest.raises(SnapshotNotFoundError, match="no committed snapshot yet"):
            m.inspect_snapshot("no-snapshots")
        job.cancel()


UPGRADE_PY = '''
"""Version 1 (no argument) and version 2 ("v2": the stage renamed, a stage added) of a job."""
from jetwake import AggregateOperations, Pipeline, Sinks, Sources


def add(state, key, kv):
    state[0] += kv[1]
    return key, state[0]


def pipeline(args):
    p = Pipeline()
    numbers = p.read_from(Sources.map_journal("numbers"))
    name = "renamed" if args else "totals"
    (numbers.group_by(lambda kv: kv[0] % 3).map_stateful(lambda: [0], add).set_name(name)
            .write_to(Sinks.map("totals")))
    if args:
        (numbers.group_by(lambda kv: kv[0] % 2)
                .rolling_aggregate(AggregateOperations.counting()).set_name("counts")
                .write_to(Sinks.map("counts")))
    return p
'''


@pytest.mark.integration
def test_inspect_and_the_dry_run_through_the_cli(tmp_path):
    path = tmp_path / "upgrade.py"
    path.write_text(textwrap.dedent(UPGRADE_PY))
    member = MemberProc(tmp_path, tmp_path / "data")
    try:
        a = member.address
        client = Client(a, token=member.token)
        numbers = client.get_map("numbers")
        numbers.put_all({i: i for i in range(30)})
        ok(cli("submit", str(path), "--name", "v1", "--guarantee", "exactly_once",
               "--snapshot-interval", "100", address=a))
        wait_until(lambda: len(client.get_map("totals")) == 3, what="the totals")
        ok(cli("save-snapshot", "v1", "before", "--cancel", address=a))

        doc = json.loads(ok(cli("snapshot", "inspect", "before", "--json", address=a)))
        stages = {s["vertex"]: s for s in doc["stages"]}
        assert stages["totals"]["keys"] == 3
        assert sorted(map(tuple, stages["totals"]["sample"])) == [
            (0, [sum(range(0, 30, 3))]), (1, [sum(range(1, 30, 3))]),
            (2, [sum(range(2, 30, 3))])]
        [journal] = doc["sources"]
        assert journal["partitions"][0]["map"] == "numbers"
        assert journal["partitions"][0]["sequence"] == 30  # every event read
        text = ok(cli("snapshot", "inspect", "before", address=a))
        assert "totals" in text and "map-stateful" in text and "CRC32" in text

        r = cli("submit", str(path), "--from-snapshot", "before", "--dry-run", "--", "v2",
                address=a)
        assert r.returncode == 1, r.stderr  # the job would be refused
        assert "takes over: 1 stage(s)" in r.stdout and "drops: 1 stage(s)" in r.stdout
        assert "totals [map-stateful]" in r.stdout and "renamed [map-stateful]" in r.stdout
        plan = json.loads(ok(cli("submit", str(path), "--from-snapshot", "before",
                                 "--dry-run", "--allow-state-drop", "--json", "--", "v2",
                                 address=a)))
        assert (plan["taken_over"], plan["dropped"], plan["started_empty"]) == (
            ["map-journal-numbers"], ["totals"], ["renamed", "counts"])
        assert not plan["refused"]
        assert [j.name for j in client.jobs()] == ["v1"]  # dry runs submit nothing

        r = cli("submit", str(path), "--name", "v2", "--from-snapshot", "before", "--", "v2",
                address=a)
        assert r.returncode == 1 and "would drop saved state" in r.stderr \
            and "--allow-state-drop" in r.stderr
        ok(cli("submit", str(path), "--name", "v2", "--from-snapshot", "before",
               "--allow-state-drop", "--", "v2", address=a))
        numbers.put(30, 30)  # the journal's position was taken over: only this is new
        wait_until(lambda: len(client.get_map("counts")) == 1, what="the new stage's count")
        assert dict(client.get_map("counts").items()) == {0: 1}
        client.close()
    finally:
        member.kill()
