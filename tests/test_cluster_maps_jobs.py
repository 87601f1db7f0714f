"""Jobs on a cluster of three real member processes use the cluster's maps and lists: what a
job writes with Sinks.map or Sinks.list every member's client reads in full, Sources.map reads
each entry once across the members, and Sources.map_journal resumed from its saved position
after a suspend gives every event once."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

from support.cluster_processes import ClusterProcesses
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

WORDS = [f"w{(i * 7919) % 97}" for i in range(5000)]


def _submit(cluster: ClusterProcesses, member, tmp: Path, name: str, body: str,
            *options: str) -> dict:
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return cluster.cli_json(member, "submit", str(path), "--name", name, *options)


def _status(cluster: ClusterProcesses, member, job: str) -> str:
    return cluster.status(member, job)["status"]


def test_a_map_a_job_wrote_on_three_members_is_read_in_full_from_every_member(
        three: ClusterProcesses, tmp_path: Path) -> None:
    a, b, c = three.members
    _submit(three, b, tmp_path, "count-to-map", f"""
        from jetwake import AggregateOperations, Pipeline, Sinks, Sources
        pipeline = Pipeline()
        (pipeline.read_from(Sources.items({WORDS!r}))
            .group_by(lambda w: w).aggregate(AggregateOperations.counting())
            .write_to(Sinks.map("counts")))
    """)
    wait_until(lambda: _status(three, c, "count-to-map") == "COMPLETED",
               what="the counting job to complete", timeout=60, interval=0.2)
    expected = dict(Counter(WORDS))
    for m in (a, b, c):
        with m.client() as client:
            counts = client.get_map("counts")
            assert dict(counts.items()) == expected
            assert len(counts) == len(expected) and counts.get("w0") == expected["w0"]
    # a batch job reading the map on three members reads each entry once, into a list that
    # every member reads the same
    _submit(three, a, tmp_path, "map-to-list", """
        from jetwake import Pipeline, Sinks, Sources
        pipeline = Pipeline()
        pipeline.read_from(Sources.map("counts")).write_to(Sinks.list("copied"))
    """)
    wait_until(lambda: _status(three, b, "map-to-list") == "COMPLETED",
               what="the copying job to complete", timeout=60, interval=0.2)
    for m in (a, b, c):
        with m.client() as client:
            copied = client.get_list("copied").to_list()
            assert sorted(tuple(e) for e in copied) == sorted(expected.items())


def test_a_map_journal_job_resumed_after_a_suspend_gives_every_event_once(
        three: ClusterProcesses, tmp_path: Path) -> None:
    a, b, c = three.members
    with a.client() as client:
        client.get_map("events").put_all([(f"e{i}", i) for i in range(500)])
    _submit(three, c, tmp_path, "journal", """
        from jetwake import Pipeline, Sinks, Sources
        pipeline = Pipeline()
        (pipeline.read_from(Sources.map_journal("events", start="oldest"))
            .map(lambda kv: kv[1]).write_to(Sinks.list("seen")))
    """, "--guarantee", "exactly_once", "--snapshot-interval", "200")

    def seen(member) -> list:
        with member.client() as cl:
            return cl.get_list("seen").to_list()

    wait_until(lambda: len(seen(b)) >= 500,
               what="the first events in the list", timeout=60, interval=0.2)
    assert three.cli(a, "suspend", "journal").returncode == 0
    wait_until(lambda: _status(three, b, "journal") == "SUSPENDED",
               what="the suspension", timeout=30, interval=0.2)
    # written while the job is suspended: read from the position its snapshot saved
    with b.client() as client:
        client.get_map("events").put_all([(f"e{i}", i) for i in range(500, 1000)])
    assert three.cli(c, "resume", "journal").returncode == 0
    wait_until(lambda: len(seen(a)) >= 1000,
               what="every event in the list", timeout=60, interval=0.2)
    with c.client() as client:
        client.get_map("events").put("e1000", 1000)  # and while it runs again
    wait_until(lambda: len(seen(c)) >= 1001,
               what="the last event in the list", timeout=60, interval=0.2)
    three.cli(a, "cancel", "journal")
    for m in (a, b, c):
        got = seen(m)
        assert sorted(got) == list(range(1001)), \
            f"duplicates: {[v for v, n in Counter(got).items() if n > 1][:10]}"


def test_map_using_map_on_three_members_reads_the_clusters_map(
        three: ClusterProcesses, tmp_path: Path) -> None:
    """Items spread over the three members are each looked up in the cluster's map, which a
    client of one member wrote: a member's own map would answer None."""
    a, b, c = three.members
    prices = {f"w{i}": i * 10 for i in range(0, 97, 2)}
    with a.client() as client:
        client.get_map("prices").put_all(prices)
    _submit(three, b, tmp_path, "priced", f"""
        from jetwake import Pipeline, Sinks, Sources
        pipeline = Pipeline()
        (pipeline.read_from(Sources.items({WORDS[:600]!r}))
            .rebalance()
            .map_using_map("prices", lambda w: w, lambda w, price: (w, price))
            .write_to(Sinks.list("priced")))
    """)
    wait_until(lambda: _status(three, c, "priced") == "COMPLETED",
               what="the lookup job to complete", timeout=60, interval=0.2)
    with c.client() as client:
        priced = client.get_list("priced").to_list()
    assert sorted(tuple(x) for x in priced) == sorted((w, prices.get(w)) for w in WORDS[:600])


def test_join_table_on_three_members_joins_each_item_to_the_whole_table(
        three: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    """A table from a compacted topic joined on three members, partitioned and broadcast: every
    join processor waits for the "table ready" markers of the table source processors of all
    three members (one of which reads no partition), so each item meets the whole table."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from support.kafka_broker import wait_for_topic
    from test_tables import joined, latest, produce_json, stream_records, table_records

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    table_topic, stream_topic = f"tables-{tmp_path.name}-t", f"tables-{tmp_path.name}-s"
    for topic, n, policy in ((table_topic, 2, "compact"), (stream_topic, 3, "delete")):
        admin.create_topics([NewTopic(topic, n, 1, config={"cleanup.policy": policy})])[
            topic].result(60)
        wait_for_topic(admin, topic, n)
    trecs, srecs = table_records(), stream_records(300)
    produce_json(kafka_bootstrap, table_topic, trecs)
    produce_json(kafka_bootstrap, stream_topic, srecs)
    a, b, c = three.members
    _submit(three, a, tmp_path, "joined", f"""
        from jetwake import Pipeline, Sinks, Sources
        props = {{"bootstrap.servers": {kafka_bootstrap!r}}}
        pipeline = Pipeline()
        table = pipeline.read_from(Sources.kafka_table({table_topic!r}, props,
                                   key_deserializer="str", value_deserializer="json"))
        stream = pipeline.read_from(Sources.kafka({stream_topic!r}, props,
                                    key_deserializer="str", value_deserializer="json"))
        pair = lambda kv, value: [kv[0], kv[1]["n"], value]
        stream.join_table(table, lambda kv: kv[0], pair).write_to(Sinks.list("joined"))
        stream.join_table(table, lambda kv: kv[0], pair, how="left", broadcast=True) \\
            .write_to(Sinks.list("joined-global"))
    """)
    table = latest(trecs)
    want = {"joined": joined(srecs, table, "inner"), "joined-global": joined(srecs, table, "left")}

    def got(name: str) -> list:
        with b.client() as client:
            return sorted((list(x) for x in client.get_list(name).to_list()), key=repr)
    wait_until(lambda: all(len(got(n)) >= len(w) for n, w in want.items()),
               what="every item joined", timeout=60, interval=0.2)
    three.cli(c, "cancel", "joined")
    for name, expected in want.items():
        assert got(name) == expected, name
