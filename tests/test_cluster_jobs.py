"""A cluster of real member processes runs each job on every member: a batch word count and a
Kafka -> rolling sum -> Kafka exactly-once job give the one-member results; every job command
works from any member; light jobs; members with another token or cluster name are refused."""

from __future__ import annotations

import textwrap
import uuid
from collections import Counter
from pathlib import Path

import pytest

from support.cluster_processes import ClusterProcesses
from support.cluster_sums import (
    Output, new_topic, produce_events, running_sums, sums_job_file,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

WORDS = [f"w{(i * 7919) % 211}" for i in range(20_000)]


@pytest.fixture
def cluster(tmp_path: Path, kafka_bootstrap: str):
    c = ClusterProcesses(tmp_path, kafka_bootstrap)
    yield c
    c.stop_all()


def _word_count_file(tmp: Path, out_dir: Path) -> Path:
    path = tmp / f"wc_{uuid.uuid4().hex[:6]}.py"
    path.write_text(textwrap.dedent(f"""
        from jetwake import AggregateOperations, Pipeline, Sinks, Sources
        WORDS = {WORDS!r}
        pipeline = Pipeline()
        (pipeline.read_from(Sources.items(WORDS))
            .map(lambda w: w.upper())
            .group_by(lambda w: w).aggregate(AggregateOperations.counting())
            .write_to(Sinks.files({str(out_dir)!r})))
    """))
    return path


def _read_pairs(out_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in out_dir.iterdir():
        for line in f.read_text().splitlines():
            word, count = eval(line)  # the file sink writes str(item) of (word, count) tuples
            assert word not in out, f"{word} counted by two processors"
            out[word] = count
    return out


def _expected_words() -> dict[str, int]:
    return dict(Counter(w.upper() for w in WORDS))


def test_a_batch_word_count_runs_on_every_member_and_equals_the_one_member_result(
        three: ClusterProcesses, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    job = three.cli_json(three.members[1], "submit", str(_word_count_file(tmp_path, out_dir)),
                         "--name", "wc")
    wait_until(lambda: three.status(three.members[2], job["id"])["status"]
               == "COMPLETED", what="the word count to complete", timeout=60, interval=0.2)
    assert _read_pairs(out_dir) == _expected_words()
    # every member wrote part of the result: the job ran on all three
    writers = [f for f in out_dir.iterdir() if f.stat().st_size > 0]
    assert len(writers) == 3


def test_every_job_command_works_from_any_member_with_the_same_answers(
        three: ClusterProcesses, tmp_path: Path) -> None:
    a, b, c = three.members
    src = tmp_path / "counter.py"
    src.write_text(textwrap.dedent("""
        from jetwake import Pipeline, Sinks, TestSources
        pipeline = Pipeline()
        (pipeline.read_from(TestSources.item_stream(200))
            .map(lambda x: x).write_to(Sinks.noop()))
    """))
    job = three.cli_json(b, "submit", str(src), "--name", "counter", "--guarantee",
                         "exactly_once", "--snapshot-interval", "200")
    assert job["status"] == "RUNNING"
    listed = [three.cli_json(m, "list-jobs") for m in (a, b, c)]
    assert all(any(j["id"] == job["id"] for j in jobs) for jobs in listed)
    statuses = [three.cli_json(m, "status", "counter") for m in (a, b, c)]
    assert {s["id"] for s in statuses} == {job["id"]}
    assert three.cli(c, "suspend", "counter").returncode == 0
    assert three.cli_json(a, "status", "counter")["status"] == "SUSPENDED"
    assert three.cli(a, "resume", "counter").returncode == 0
    wait_until(lambda: three.status(b, "counter")["status"] == "RUNNING",
               what="the job to run again", timeout=30, interval=0.2)
    assert three.cli(b, "restart", "counter").returncode == 0
    wait_until(lambda: three.status(c, "counter")["restart_count"] >= 1,
               what="the restart", timeout=30, interval=0.2)
    saved = three.cli(c, "save-snapshot", "counter", "counter-snap")
    assert saved.returncode == 0, saved.stderr
    names = [{s["name"] for s in three.cli_json(m, "list-snapshots")} for m in (a, b, c)]
    assert all("counter-snap" in n for n in names)
    assert three.cli(a, "cancel", "counter").returncode == 0
    wait_until(lambda: three.status(b, "counter")["status"] == "FAILED",
               what="the job to end cancelled", timeout=30, interval=0.2)


def test_a_light_job_starts_on_every_member_and_is_listed_and_cancelled_from_any(
        three: ClusterProcesses, tmp_path: Path) -> None:
    a, b, c = three.members
    # the shared cluster runs nothing else (what earlier tests cancelled has ended), so that
    # a member running a job below runs this one
    wait_until(lambda: all(m["jobs"] == 0 for m in three.cluster(a)["members"]),
               what="no job running on the shared cluster", timeout=30, interval=0.05)
    src = tmp_path / "light.py"
    src.write_text(textwrap.dedent("""
        from jetwake import Pipeline, Sinks, TestSources
        pipeline = Pipeline()
        (pipeline.read_from(TestSources.item_stream(100))
            .map(lambda x: x).write_to(Sinks.noop()))
    """))
    job = three.cli_json(c, "submit", str(src), "--light", "--name", "light-one")
    assert job["light"] is True and job["status"] == "RUNNING"
    for m in (a, b, c):
        assert any(j["id"] == job["id"] for j in three.cli_json(m, "list-jobs"))
    # it runs on every member, none of which keeps a record of it
    info = three.cluster(a)
    assert all(m["jobs"] >= 1 for m in info["members"])
    assert three.cli(a, "cancel", job["id"]).returncode == 0
    wait_until(lambda: three.status(b, job["id"])["status"] == "FAILED",
               what="the light job to end", timeout=30, interval=0.2)


def test_cluster_json_names_the_coordinator_the_quorum_and_every_member(
        three: ClusterProcesses) -> None:
    infos = [three.cli_json(m, "cluster") for m in three.members]
    first = infos[0]
    assert first["name"] == three.name
    assert first["quorum"] == 2
    assert sorted(m["address"] for m in first["members"]) == \
        sorted(m.address for m in three.members)
    assert sum(1 for m in first["members"] if m["coordinator"]) == 1
    assert first["coordinator"] in {m["id"] for m in first["members"]}
    assert all(m["state"] == "ACTIVE" for m in first["members"])
    assert all(i["coordinator"] == first["coordinator"] for i in infos)


def test_a_member_with_another_token_is_refused_with_the_reason_on_both_sides(
        cluster: ClusterProcesses) -> None:
    (first,) = cluster.start(1)
    intruder = cluster.start_member(token="another-token")
    code = intruder.proc.wait(60)
    assert code != 0
    assert "token" in intruder.log and "cannot join cluster" in intruder.log
    wait_until(lambda: "token" in first.log and "refused" in first.log,
               what="the coordinator to log the refusal", timeout=10)
    assert len(cluster.cluster(first)["members"]) == 1


def test_kafka_rolling_sum_exactly_once_on_three_members_equals_the_one_member_result(
        three: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    source, sink = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    events = [(f"k{i % 17}", i) for i in range(3000)]
    produce_events(kafka_bootstrap, source, events)
    job = three.cli_json(three.members[2], "submit",
                         str(sums_job_file(tmp_path, kafka_bootstrap, source, sink)),
                         "--name", "sums", "--guarantee", "exactly_once",
                         "--snapshot-interval", "300")
    out = Output(kafka_bootstrap, sink)
    wait_until(lambda: out.has(len(events)), what="every rolling sum in the sink topic", timeout=90,
               interval=0)
    out.close()
    three.cli(three.members[0], "cancel", job["id"])
    by_key: dict[str, list[int]] = {}
    for k, v in out.records:
        by_key.setdefault(k, []).append(v)
    assert len(out.records) == len(events)  # exactly once: nothing twice
    assert by_key == running_sums(events)  # the one-member result, key by key in order

def test_a_snapshot_taken_on_three_members_restores_on_two_and_then_on_four(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    members = cluster.start(3)
    source, sink = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    batches = [[(f"k{i % 23}", i) for i in range(n, n + 1000)] for n in (0, 1000, 2000)]
    produce_events(kafka_bootstrap, source, batches[0])
    job = cluster.cli_json(members[0], "submit", str(sums_job_file(tmp_path, kafka_bootstrap,
                                                                   source, sink)),
                           "--name", "sums", "--guarantee", "exactly_once",
                           "--snapshot-interval", "300")
    out = Output(kafka_bootstrap, sink)
    wait_until(lambda: out.has(1000), what="the first 1000 sums", timeout=60, interval=0)
    # suspended on three members: the terminal snapshot holds every key's sum
    assert cluster.cli(members[1], "suspend", "sums").returncode == 0
    coordinator = cluster.coordinator()
    leaving = next(m for m in members if m is not coordinator)
    assert leaving.stop() == 0
    wait_until(lambda: len(cluster.cluster(coordinator)["members"]) == 2,
               what="two members", timeout=30, interval=0.2)
    produce_events(kafka_bootstrap, source, batches[1])
    assert cluster.cli(coordinator, "resume", "sums").returncode == 0
    wait_until(lambda: out.has(2000), what="the sums after resuming on two members", timeout=60,
               interval=0)
    assert cluster.cli(coordinator, "suspend", "sums").returncode == 0
    cluster.start(2)  # four members now
    produce_events(kafka_bootstrap, source, batches[2])
    assert cluster.cli(coordinator, "resume", "sums").returncode == 0
    wait_until(lambda: out.has(3000), what="the sums after resuming on four members", timeout=60,
               interval=0)
    status = cluster.status(coordinator, job["id"])
    out.close()
    assert len(out.records) == 3000  # nothing twice
    by_key: dict[str, list[int]] = {}
    for k, v in out.records:
        by_key.setdefault(k, []).append(v)
    assert by_key == running_sums(batches[0] + batches[1] + batches[2])
    assert status["status"] == "RUNNING"
    assert len(cluster.cluster(coordinator)["members"]) == 4


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_a_slow_consumer_member_keeps_its_senders_memory_flat(
        cluster: ClusterProcesses, tmp_path: Path) -> None:
    """Both members produce 1 KB items for the second member's slow stage (about 1 ms an
    item), ten times faster than it takes them: without flow control the first member would
    pile up ~100 MB in 10 s (in its send queue or in the receiver's); it must be held back."""
    members = cluster.start(2)
    src = tmp_path / "slow.py"
    src.write_text(textwrap.dedent("""
        import time
        from jetwake import Pipeline, Sinks, TestSources
        from jetwake.engine.core.partitioning import member_partitions, partition_of

        # keys of the second member's partitions only: the first member's source sends
        # everything over the network, so nothing local slows it down but flow control
        SECOND = set(member_partitions(1, 2))
        KEYS = [k for k in range(2000) if partition_of(k) in SECOND][:50]

        def slow(item):
            time.sleep(0.001)
            return item[0]

        pipeline = Pipeline()
        (pipeline.read_from(TestSources.item_stream(20_000))
            .map(lambda e: (KEYS[e.sequence % len(KEYS)], "x" * 1024))
            .rebalance(lambda kv: kv[0])
            .map(slow)
            .write_to(Sinks.noop()))
    """))
    job = cluster.cli_json(members[0], "submit", str(src), "--name", "slow")
    pids = [m.proc.pid for m in members]
    wait_until(lambda: all(m["jobs"] >= 1 for m in cluster.cluster(members[0])["members"]),
               what="the job to run on both members", timeout=30, interval=0.2)
    samples: list[list[float]] = []

    def sampled_enough() -> bool:
        samples.append([_rss_mb(p) for p in pids])
        return len(samples) >= 40

    wait_until(sampled_enough,
               what="40 memory samples", timeout=60, interval=0.25)  # ~10 s of running
    cluster.cli(members[1], "cancel", job["id"])
    offered_mb = 20_000 * 1024 * 10 / 1e6  # what the sources would emit unthrottled in 10 s
    for i, pid in enumerate(pids):
        after_warmup = [s[i] for s in samples[8:]]
        growth = max(after_warmup) - min(after_warmup)
        assert growth < 50, (f"member {pid}'s memory grew {growth:.0f} MB while the sources "
                             f"offered up to {offered_mb:.0f} MB: {after_warmup}")
