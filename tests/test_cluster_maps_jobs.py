"""Jobs on a cluster of three real member processes use the cluster's maps and lists: what a
job writes with Sinks.map or Sinks.list every member's client reads in full, Sources.map reads
each entry once across the members, and Sources.map_journal resumed from its saved position
after a suspend gives every event once."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

from support.cluster_processes import ClusterProcesses, three  # noqa: F401 - a fixture
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

WORDS = [f"w{(i * 7919) % 97}" for i in range(5000)]


def _submit(cluster: ClusterProcesses, member, tmp: Path, name: str, body: str,
            *options: str) -> dict:
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return cluster.cli_json(member, "submit", str(path), "--name", name, *options)


def _status(cluster: ClusterProcesses, member, job: str) -> str:
    return cluster.cli_json(member, "status", job)["status"]


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
