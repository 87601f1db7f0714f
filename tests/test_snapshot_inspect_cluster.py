"""Snapshot inspection and the upgrade's dry run on a cluster of member processes (the
session's three): the snapshot's parts written on each member are read through any member's
service, the Kafka source's offsets of every partition are there whichever member read it,
and the dry run plans from the cluster's exported snapshot; the export and cancel that begins
an upgrade returns at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cluster_processes import ClusterProcesses
from support.cluster_sums import new_topic, produce_events, rolling_sums_job
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

PARTITIONS = 3


def job_file(tmp: Path, bootstrap: str, source: str, stage: str) -> Path:
    return rolling_sums_job(tmp, bootstrap, source, "Sinks.noop()", stage=stage,
                            source_stage="events")


def test_inspect_and_dry_run_on_a_cluster(three: ClusterProcesses, tmp_path: Path,
                                          kafka_bootstrap: str) -> None:
    cluster = three
    members = cluster.members
    source = new_topic(kafka_bootstrap, PARTITIONS)
    events = [(f"k{i % 11}", i) for i in range(300)]
    produce_events(kafka_bootstrap, source, events)
    cluster.cli_json(members[0], "submit", str(job_file(tmp_path, kafka_bootstrap, source,
                                                         "totals")),
                     "--name", "totals", "--guarantee", "exactly_once",
                     "--snapshot-interval", "200")

    def offsets(m) -> int:
        """The offsets saved in the job's last snapshot, read through member ``m``;
        -1 while it has none."""
        r = cluster.cli(m, "snapshot", "inspect", "totals", "--json")
        if r.returncode != 0:
            assert "no committed snapshot yet" in r.stderr, r.stderr
            return -1
        doc = json.loads(r.stdout)
        return sum(p["offset"] for s in doc["sources"] for p in s["partitions"])

    # the job's last snapshot, through each member (those that do not coordinate forward to the
    # coordinator, which reads every member's part)
    for m in members:
        wait_until(lambda m=m: offsets(m) == len(events), timeout=60,
                   what="a snapshot past every event")
    doc = cluster.cli_json(members[1], "snapshot", "inspect", "totals")
    [src] = doc["sources"]
    assert src["vertex"] == "events"
    assert sorted(p["partition"] for p in src["partitions"]) == list(range(PARTITIONS))
    stages = {s["vertex"]: s for s in doc["stages"]}
    assert stages["totals"]["kind"] == "rolling-aggregate"
    assert stages["totals"]["keys"] == 11
    assert stages["totals"]["processors"] >= 2  # parts written on both members
    sums: dict[str, int] = {}
    for k, v in events:
        sums[k] = sums.get(k, 0) + v
    assert all(sums[k] == v for k, v in stages["totals"]["sample"])

    # the upgrade's first step: export and cancel (a regular snapshot due meanwhile must
    # not hold the cancel back until its phases time out)
    r = cluster.cli(members[0], "save-snapshot", "totals", "before", "--cancel",
                    "--timeout", "20")
    assert r.returncode == 0, r.stderr
    doc = cluster.cli_json(members[0], "snapshot", "inspect", "before")
    assert doc["name"] == "before" and doc["terminal"]
    assert sum(p["offset"] for p in doc["sources"][0]["partitions"]) == len(events)
    renamed = job_file(tmp_path, kafka_bootstrap, source, "sums")
    r = cluster.cli(members[1], "submit", str(renamed), "--from-snapshot", "before",
                    "--dry-run", "--json")
    assert r.returncode == 1, r.stderr  # it would be refused
    plan = json.loads(r.stdout)
    assert (plan["taken_over"], plan["dropped"], plan["started_empty"]) == (
        ["events"], ["totals"], ["sums"])
