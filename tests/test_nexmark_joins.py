"""The NEXMark join queries q3, q4, q6 and q8: each equals its plain-Python reference over
generated events, in memory and through Kafka, whatever order the input streams arrive in."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from jetwake import JobConfig, Member, Pipeline, Sinks
from bench.nexmark.generator import GeneratorConfig, generate
from bench.nexmark.queries import TOPICS, NexmarkInputs, check_output, query
from bench.nexmark.queries.q6 import LAST
from bench.nexmark.queries.winning_bids import MAX_AUCTION_MS
from support.kafka_broker import wait_for_topic
from support.ordered_producer import ordered_producer
from support.spark_fixtures import spark_runner  # noqa: F401 - a fixture
from support.waiting import wait_until

# 4000 events over 8 s of event time with 300 ms of disorder: 80 persons, 240 auctions and
# their bids; auctions last seconds, so many close as the watermark passes them and the rest
# when the input ends
LAG_MS = 300
EVENTS = list(generate(GeneratorConfig(4_000, rate=500, out_of_order_ms=LAG_MS, seed=3)))


def run_in_memory(name: str, events: list, parallelism: int = 2, data_dir: str | None = None,
                  config: JobConfig | None = None) -> list:
    """The query's outputs over ``events`` read from memory, after a JSON round trip."""
    p = Pipeline()
    query(name).build(NexmarkInputs(p, events=events, allowed_lag_ms=LAG_MS)) \
        .write_to(Sinks.list("out"))
    with Member(data_dir, local_parallelism=parallelism) as m:
        m.new_job(p, config).join()
        return [json.loads(json.dumps(r)) for r in m.get_list("out")]


def assert_equals_reference(name: str, outputs: list, events: list = EVENTS) -> None:
    problems = check_output(query(name), events, outputs)
    assert not problems, "\n".join(problems)
    assert outputs, f"{name}: no output at all, the comparison proves nothing"


def test_q3_local_item_suggestion_equals_its_reference():
    assert_equals_reference("q3", run_in_memory("q3", EVENTS))


def test_q4_average_price_per_category_equals_its_reference_on_four_processors():
    outputs = run_in_memory("q4", EVENTS, parallelism=4)
    assert_equals_reference("q4", outputs)
    # every category has several closed auctions, so the running averages' order matters
    assert all(n > 3 for n in _count_by(outputs, "category").values())


def test_q6_average_selling_price_per_seller_equals_its_reference_on_four_processors():
    outputs = run_in_memory("q6", EVENTS, parallelism=4)
    assert_equals_reference("q6", outputs)
    # some sellers close more than the 10 auctions averaged, so the window slides
    assert max(_count_by(outputs, "seller").values()) > LAST


def test_q6_with_its_state_in_rocksdb_equals_its_reference(tmp_path):
    """The keyed states of the map_stateful stages (each auction with its waiting bids and
    best candidate, each seller's last prices) written to and read back from RocksDB."""
    outputs = run_in_memory("q6", EVENTS, data_dir=str(tmp_path),
                            config=JobConfig(state_backend="rocksdb"))
    assert_equals_reference("q6", outputs)


def test_q6_on_the_spark_backfill_equals_its_reference(spark_runner):
    """The winning bids' keyed states and sliding windows, and the sellers' last prices, as
    Spark runs them: the same closing order, so the same running averages."""
    p = Pipeline()
    query("q6").build(NexmarkInputs(p, events=EVENTS, allowed_lag_ms=LAG_MS)) \
        .write_to(Sinks.list("q6-spark"))
    with Member() as m:
        spark_runner.run(p, member=m)
        outputs = [json.loads(json.dumps(r)) for r in m.get_list("q6-spark")]
    assert_equals_reference("q6", outputs)


def test_q8_monitor_new_users_equals_its_reference():
    assert_equals_reference("q8", run_in_memory("q8", EVENTS))


def test_an_auction_longer_than_the_closing_window_fails_the_job_naming_the_fix():
    auction = next(e for kind, e in EVENTS if kind == "auction")
    too_long = dict(auction, expires=auction["date_time"] + MAX_AUCTION_MS + 1)
    with pytest.raises(ValueError, match=rf"auction \d+ lasts {MAX_AUCTION_MS + 1} ms.*"
                                         r"raise .*MAX_AUCTION_MS"):
        run_in_memory("q4", [("auction", too_long)])


def _count_by(outputs: list, field: str) -> dict:
    counts: dict = {}
    for r in outputs:
        counts[r[field]] = counts.get(r[field], 0) + 1
    return counts


# --- through Kafka ---------------------------------------------------------------------------

@pytest.fixture
def nexmark_topics(kafka_bootstrap):
    """A fresh topic prefix with the three NEXMark topics created under it."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    prefix = f"jetwake-nexj-{uuid.uuid4().hex[:10]}-"
    names = [prefix + t for t in TOPICS.values()]
    for fut in admin.create_topics([NewTopic(n, num_partitions=2, replication_factor=1,
                                             config={"retention.ms": "-1"})
                                    for n in names], operation_timeout=30).values():
        fut.result(timeout=60)
    for n in names:
        wait_for_topic(admin, n, 2)
    yield prefix
    try:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            fut.result(timeout=30)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def produce(bootstrap: str, prefix: str, events: list) -> None:
    """Each event as a JSON record on its kind's topic, keyed by nothing."""
    p = ordered_producer(bootstrap, {"linger.ms": 5})
    for kind, e in events:
        p.produce(prefix + TOPICS[kind], value=json.dumps(e).encode())
    assert p.flush(30) == 0


def q3_job(m: Member, bootstrap: str, prefix: str, config: JobConfig | None = None):
    """q3 reading the topics under ``prefix``, into the list ``q3``."""
    p = Pipeline()
    inputs = NexmarkInputs(p, kafka={"bootstrap.servers": bootstrap}, topic_prefix=prefix,
                           allowed_lag_ms=LAG_MS)
    query("q3").build(inputs).write_to(Sinks.list("q3"))
    return m.new_job(p, config)


def outputs_matching(m: Member, events: list):
    """The outputs once they equal the reference (else a false value, to wait on)."""
    def check() -> list | None:
        outputs = [json.loads(json.dumps(r)) for r in m.get_list("q3")]
        return outputs if not check_output(query("q3"), events, outputs) else None
    return check


def test_q3_through_kafka_equals_its_reference(kafka_bootstrap, nexmark_topics):
    produce(kafka_bootstrap, nexmark_topics, [e for e in EVENTS if e[0] != "bid"])
    with Member() as m:
        job = q3_job(m, kafka_bootstrap, nexmark_topics)
        outputs = wait_until(outputs_matching(m, EVENTS), timeout=60,
                             what=lambda: "\n".join(check_output(
                                 query("q3"), EVENTS, list(m.get_list("q3")))))
        job.cancel()
    assert outputs


@pytest.mark.parametrize("first, then", [("auction", "person"), ("person", "auction")],
                         ids=["auctions-first", "persons-first"])
def test_q3_with_one_stream_read_entirely_before_the_other_is_written_equals_its_reference(
        kafka_bootstrap, nexmark_topics, first, then):
    """Every record of one kind read before any of the other exists: nothing comes out until
    the other kind is written, and then every pair, whichever side waited."""
    early = [e for e in EVENTS if e[0] == first]
    produce(kafka_bootstrap, nexmark_topics, early)
    with Member() as m:
        job = q3_job(m, kafka_bootstrap, nexmark_topics)
        wait_until(lambda: records_read(job.metrics(), TOPICS[first]) == len(early),
                   timeout=60, what=lambda: f"the job reading every {first}: {job.metrics()}")
        assert list(m.get_list("q3")) == []  # no pair is complete yet
        produce(kafka_bootstrap, nexmark_topics, [e for e in EVENTS if e[0] == then])
        outputs = wait_until(outputs_matching(m, EVENTS), timeout=60,
                             what=lambda: "\n".join(check_output(
                                 query("q3"), EVENTS, list(m.get_list("q3")))))
        job.cancel()
    assert outputs


def records_read(metrics: dict, topic: str) -> int:
    """The records the job's source of ``topic`` has read."""
    return sum(v.get("records_in", 0) for k, v in metrics.items() if k.endswith(topic))


def test_q3_auctions_waiting_for_their_seller_are_carried_by_a_snapshot_into_a_new_job(
        kafka_bootstrap, nexmark_topics, tmp_path):
    """The first job reads every auction and stops with an exported snapshot; the second
    starts from it and reads only the persons: every suggestion comes from auctions that
    waited in the snapshot's keyed state (RocksDB), each exactly once."""
    auctions = [e for e in EVENTS if e[0] == "auction"]
    produce(kafka_bootstrap, nexmark_topics, auctions)
    config = dict(processing_guarantee="exactly_once", snapshot_interval_ms=300,
                  state_backend="rocksdb")
    with Member(str(tmp_path)) as m:
        first = q3_job(m, kafka_bootstrap, nexmark_topics, JobConfig(**config))
        wait_until(lambda: records_read(first.metrics(), TOPICS["auction"]) == len(auctions),
                   timeout=60, what="the first job reading every auction")
        first.cancel_and_export_snapshot("q3-waiting")
        produce(kafka_bootstrap, nexmark_topics, [e for e in EVENTS if e[0] == "person"])
        second = q3_job(m, kafka_bootstrap, nexmark_topics,
                        JobConfig(initial_snapshot_name="q3-waiting", **config))
        outputs = wait_until(outputs_matching(m, EVENTS), timeout=60,
                             what=lambda: "\n".join(check_output(
                                 query("q3"), EVENTS, list(m.get_list("q3")))))
        assert records_read(second.metrics(), TOPICS["auction"]) == 0
        second.cancel()
    assert outputs
