"""job.state(stage): reads of a running job's stateful stages, from the last committed
snapshot and live (docs/state.md, "Reading a running job's state")."""

from __future__ import annotations

import json

import pytest

from jetwake import (
    AggregateOperations, JobConfig, Member, Pipeline, Sinks, Sources, StateQueryError,
    WindowDefinition,
)
from jetwake.engine.server.cli.state_command import parse_key
from support.ordered_producer import ordered_producer
from support.waiting import wait_until


def _totals_pipeline() -> Pipeline:
    """``(key, amount)`` puts into the map "in" -> a running sum per key ("totals") and a
    count per key in a state object ("counts")."""
    p = Pipeline()
    events = p.read_from(Sources.map_journal("in")).map(lambda e: e[1])
    keyed = events.group_by(lambda kv: kv[0])
    keyed.rolling_aggregate(AggregateOperations.summing(lambda kv: kv[1])) \
        .set_name("totals").write_to(Sinks.list("totals-out"))
    keyed.map_stateful(lambda: {"n": 0}, _count).set_name("counts") \
        .write_to(Sinks.list("counts-out"))
    return p


def _count(state: dict, key: str, item: tuple) -> None:
    state["n"] += 1


def _start(m: Member, backend: str = "memory", guarantee: str = "exactly_once"):
    return m.new_job(_totals_pipeline(), JobConfig(
        processing_guarantee=guarantee, snapshot_interval_ms=3_600_000, state_backend=backend))


def _put(m: Member, events: list[tuple[str, int]], first: int) -> None:
    mp = m.get_map("in")
    for i, e in enumerate(events):
        mp.put(first + i, e)


def _sums(events: list[tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in events:
        out[k] = out.get(k, 0) + v
    return out


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_snapshot_reads_match_the_running_totals_at_each_committed_snapshot(tmp_path, backend):
    rounds = [[(f"k{i % 7}", i) for i in range(r * 40, r * 40 + 40)] for r in range(3)]
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = _start(m, backend)
        live = job.state("totals", consistency="latest")
        seen: list[tuple[str, int]] = []
        for r, events in enumerate(rounds):
            _put(m, events, len(seen))
            seen += events
            expected = _sums(seen)
            wait_until(lambda: dict(live.items()) == expected, timeout=20,
                       what=f"the live totals of round {r}")
            rec = job.take_snapshot()
            _put(m, [("k0", 1000)], len(seen) + 10_000 + r)  # after the cut: not in it
            view = job.state("totals")
            assert dict(view.items()) == expected
            assert view.snapshot_id == rec.snapshot_id
            assert view.count() == len(expected)
            assert job.state("counts").get("k3") == {"n": sum(1 for k, _ in seen if k == "k3")}
            seen.append(("k0", 1000))
        job.cancel()


def test_latest_reads_see_the_live_value_before_any_snapshot(tmp_path):
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = _start(m)
        _put(m, [("alice", 5), ("bob", 7), ("alice", 1)], 0)
        live = job.state("totals", consistency="latest")
        wait_until(lambda: live.get("alice") == 6, timeout=20, what="alice's live total")
        assert live.get_all(["alice", "bob", "carol"]) == {"alice": 6, "bob": 7}
        assert live.get("carol") is None
        with pytest.raises(StateQueryError, match="no committed snapshot yet.*take_snapshot"):
            job.state("totals").get("alice")
        job.cancel()


def test_items_take_a_prefix_and_a_limit(tmp_path):
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = _start(m)
        _put(m, [("eu-1", 1), ("eu-2", 2), ("us-1", 3), ("eu-3", 4)], 0)
        live = job.state("totals", consistency="latest")
        wait_until(lambda: live.count() == 4, timeout=20, what="four keys")
        assert list(live.items(prefix="eu-")) == [("eu-1", 1), ("eu-2", 2), ("eu-3", 4)]
        assert list(live.items(limit=2)) == [("eu-1", 1), ("eu-2", 2)]
        job.cancel()


def test_a_tumbling_window_stage_shows_each_keys_open_windows(tmp_path):
    p = Pipeline()
    (p.read_from(Sources.map_journal("in")).map(lambda e: e[1])
        .with_timestamps(lambda kv: kv[1], allowed_lag=0)
        .group_by(lambda kv: kv[0])
        .window(WindowDefinition.tumbling(100))
        .aggregate(AggregateOperations.counting()).set_name("per-window")
        .write_to(Sinks.list("out")))
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=3_600_000))
        _put(m, [("a", 10), ("a", 20), ("b", 150), ("a", 160)], 0)
        live = job.state("per-window", consistency="latest")
        # the watermark (160, no lag) closed a's window [0, 100): [100, 200) stays open
        wait_until(lambda: live.get("a") == {(100, 200): 1}, timeout=20, what="a's window")
        assert live.get("b") == {(100, 200): 1}
        job.take_snapshot()
        assert job.state("per-window").get("b") == {(100, 200): 1}
        job.cancel()


def test_bad_reads_name_the_problem_and_the_fix(tmp_path):
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = _start(m)
        _put(m, [("alice", 5)], 0)
        wait_until(lambda: job.state("totals", "latest").get("alice") == 5, timeout=20,
                   what="alice's total")
        job.take_snapshot()
        with pytest.raises(StateQueryError, match="no stage 'nope'.*'totals'.*'counts'"):
            job.state("nope")
        stages = [t.name for t in job._c.definition.transforms]
        stateless = next(n for n in stages if n.startswith("map"))
        with pytest.raises(StateQueryError, match=f"stage '{stateless}'.*keeps no state"):
            job.state(stateless)
        with pytest.raises(StateQueryError, match="keys of type str; the key 42 is an int"):
            job.state("totals").get(42)
        with pytest.raises(ValueError, match="consistency"):
            job.state("totals", consistency="eventual")
        job.cancel()


def test_a_job_without_snapshots_says_to_read_latest_or_add_a_guarantee(tmp_path):
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = _start(m, guarantee="none")
        with pytest.raises(StateQueryError, match="takes no snapshots.*consistency='latest'"):
            job.state("totals").count()
        job.cancel()


def test_command_line_keys_are_json_when_they_parse():
    assert parse_key("42") == 42
    assert parse_key('"42"') == "42"
    assert parse_key("alice") == "alice"
    assert parse_key('["eu", 1]') == ("eu", 1)


def test_the_state_command_reads_through_a_member_process(tmp_path):
    from support.cli_member import MemberProc, cli, ok
    member = MemberProc(tmp_path, tmp_path / "data")
    try:
        job_file = tmp_path / "totals.py"
        job_file.write_text(
            "from jetwake import AggregateOperations, Pipeline, Sinks, Sources\n"
            "pipeline = Pipeline()\n"
            "(pipeline.read_from(Sources.map_journal('in')).map(lambda e: e[1])\n"
            "    .group_by(lambda kv: kv[0])\n"
            "    .rolling_aggregate(AggregateOperations.summing(lambda kv: kv[1]))\n"
            "    .set_name('totals').write_to(Sinks.list('out')))\n")
        ok(cli("submit", str(job_file), "--name", "t", "--guarantee", "exactly_once",
               "--snapshot-interval", "200", address=member.address))
        client = member.client()
        client.get_map("in").put(1, ("alice", 5))
        client.get_map("in").put(2, (42, 7))
        job = client.job("t")
        wait_until(lambda: _committed_count(job) == 2, timeout=30,
                   what="both keys in a committed snapshot")
        doc = json.loads(ok(cli("state", "t", "totals", "alice", "42", "--json",
                                address=member.address)))
        assert {(e["key"], e["value"]) for e in doc["entries"]} == {("alice", 5), (42, 7)}
        text = ok(cli("state", "t", "totals", "--latest", address=member.address))
        assert "'alice'" in text and "5" in text
    finally:
        member.stop()


def _committed_count(job) -> int | None:
    try:
        return job.state("totals").count()
    except StateQueryError:  # no snapshot committed yet
        return None


def _windowed(wdef, op) -> Pipeline:
    """Windows that stay open: the watermark stays 1000 behind the events."""
    p = Pipeline()
    (p.read_from(Sources.map_journal("in")).map(lambda e: e[1])
        .with_timestamps(lambda kv: kv[1], allowed_lag=1000)
        .group_by(lambda kv: kv[0])
        .window(wdef).aggregate(op).set_name("w")
        .write_to(Sinks.list("out")))
    return p


@pytest.mark.parametrize("wdef, op, expected", [
    # sessions of a key: (first event, last event + gap) -> the count so far
    (WindowDefinition.session(100), AggregateOperations.counting(),
     {(10, 150): 2, (400, 500): 1}),
    # sliding windows of an operation that cannot combine (one stage, a window per end)
    (WindowDefinition.sliding(100, 50), AggregateOperations.to_list(),
     {(-50, 50): [("a", 10)], (0, 100): [("a", 10), ("a", 50)], (50, 150): [("a", 50)],
      (350, 450): [("a", 400)], (400, 500): [("a", 400)]}),
    # sliding windows of an operation that combines: frames, then windows (two stages); the
    # frames are still in the accumulating processors, none closed
    (WindowDefinition.sliding(100, 50), AggregateOperations.counting(),
     {(-50, 50): 1, (0, 100): 2, (50, 150): 1, (350, 450): 1, (400, 500): 1}),
], ids=["session", "sliding-one-stage", "sliding-two-stages"])
def test_window_stages_read_as_the_open_windows_of_a_key(tmp_path, wdef, op, expected):
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = m.new_job(_windowed(wdef, op), JobConfig(processing_guarantee="exactly_once",
                                                       snapshot_interval_ms=3_600_000))
        _put(m, [("a", 10), ("a", 50), ("a", 400)], 0)
        live = job.state("w", consistency="latest")
        wait_until(lambda: live.get("a") == expected, timeout=20,
                   what=f"a's open windows {expected}, got {live.get('a')}")
        job.take_snapshot()
        assert job.state("w").get("a") == expected
        job.cancel()


@pytest.mark.kafka
@pytest.mark.parametrize("broadcast", [False, True], ids=["partitioned", "broadcast"])
def test_a_table_join_reads_as_the_table(tmp_path, kafka_bootstrap, broadcast):
    from support.cluster_sums import new_topic
    topic = new_topic(kafka_bootstrap, 2)
    producer = ordered_producer(kafka_bootstrap)
    for k, v in [("apple", 3), ("pear", 5), ("apple", 4), ("plum", 1)]:
        producer.produce(topic, key=k.encode(), value=json.dumps({"price": v}).encode())
    producer.produce(topic, key=b"plum", value=None)  # a tombstone: plum leaves the table
    producer.flush(30)
    p = Pipeline()
    table = p.read_from(Sources.kafka_table(topic, {"bootstrap.servers": kafka_bootstrap},
                                            key_deserializer="str", value_deserializer="json"))
    (p.read_from(Sources.map_journal("in")).map(lambda e: e[1])
        .join_table(table, lambda x: x, broadcast=broadcast).set_name("prices")
        .write_to(Sinks.list("out")))
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=3_600_000))
        live = job.state("prices", consistency="latest")
        want = {"apple": {"price": 4}, "pear": {"price": 5}}
        wait_until(lambda: dict(live.items()) == want, timeout=30, what="the table read")
        assert live.get_all(["apple", "plum"]) == {"apple": {"price": 4}}
        job.take_snapshot()
        assert dict(job.state("prices").items()) == want
        job.cancel()


def test_a_job_that_ended_says_its_state_is_gone(tmp_path):
    p = Pipeline()
    (p.read_from(Sources.items([("a", 1), ("b", 2)])).group_by(lambda kv: kv[0])
        .rolling_aggregate(AggregateOperations.summing(lambda kv: kv[1])).set_name("totals")
        .write_to(Sinks.list("out")))
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once"))
        job.join(30)
        with pytest.raises(StateQueryError, match="has ended \\(COMPLETED\\).*export a snapshot"):
            job.state("totals").get("a")


def _sum_of_first(n: int, first: int, step: int) -> int:
    """The sum of the first ``n`` values ``first, first + step, ...`` of one key."""
    return n * first + step * n * (n - 1) // 2


def test_every_snapshot_read_during_processing_is_one_consistent_cut(tmp_path):
    """While events flow in rounds and snapshots commit every 50 ms, the two stages read from
    one snapshot agree key by key: a key's total is the sum of exactly as many of its events
    as its count says (event i of key k{i % 7} carries the value i)."""
    keys, rounds, per_round = 7, 6, 400
    with Member(local_parallelism=2, data_dir=str(tmp_path)) as m:
        job = m.new_job(_totals_pipeline(), JobConfig(processing_guarantee="exactly_once",
                                                      snapshot_interval_ms=50))
        totals, counts = job.state("totals"), job.state("counts")
        cuts: dict[int, int] = {}  # snapshot id -> events in it

        def read_a_cut() -> int | None:
            """The snapshot id of a consistent read of both stages; None when none is yet."""
            try:
                t, c = dict(totals.items()), dict(counts.items())
            except StateQueryError:  # no snapshot yet
                return None
            if totals.snapshot_id != counts.snapshot_id:
                return None  # a snapshot committed between the two reads
            for k, state in c.items():
                n = state["n"]
                assert t[k] == _sum_of_first(n, int(k[1:]), keys), (k, n, t[k])
            cuts[totals.snapshot_id] = sum(s["n"] for s in c.values())
            return totals.snapshot_id

        for r in range(rounds):
            _put(m, [(f"k{i % keys}", i) for i in range(r * per_round, (r + 1) * per_round)],
                 r * per_round)
            last = max(cuts, default=-1)
            wait_until(lambda: (sid := read_a_cut()) is not None and sid > last, timeout=30,
                       what=f"a snapshot newer than {last} after round {r}")
        total = rounds * per_round
        wait_until(lambda: read_a_cut() is not None and cuts[max(cuts)] == total, timeout=30,
                   what="a snapshot of every event")
        assert len({n for n in cuts.values() if 0 < n < total}) >= 2, cuts  # mid-stream cuts
        job.cancel()
