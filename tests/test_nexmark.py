"""NEXMark (bench/nexmark/): the generator's shape, q0 q1 q2 through Kafka against their
references, and the benchmark's runner end to end on a tiny size."""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.nexmark import generator as gen  # noqa: E402
from bench.nexmark.generator import GeneratorConfig, generate  # noqa: E402
from bench.nexmark.queries import check_output, query  # noqa: E402


def events(n: int = 10_000, **kw: int) -> list:
    return list(generate(GeneratorConfig(n, **kw)))


# --- the generator -------------------------------------------------------------------------------

def test_generator_makes_persons_auctions_and_bids_in_proportion_1_3_46():
    kinds = Counter(k for k, _ in events(5000))
    assert kinds == {"person": 100, "auction": 300, "bid": 4600}


def test_generator_numbers_persons_and_auctions_consecutively_from_1000():
    evs = events(5000)
    assert [e["id"] for k, e in evs if k == "person"] == list(range(1000, 1100))
    assert [e["id"] for k, e in evs if k == "auction"] == list(range(1000, 1300))


def test_generator_bids_name_auctions_and_persons_in_flight_or_just_ahead():
    evs = events(20_000)
    made_auctions = made_persons = 0
    for kind, e in evs:
        if kind == "person":
            made_persons += 1
        elif kind == "auction":
            made_auctions += 1
            assert 1000 <= e["seller"] < 1000 + made_persons + gen.PERSON_ID_LEAD
            assert 10 <= e["category"] <= 14
            assert e["date_time"] < e["expires"] and e["reserve"] > e["initial_bid"]
        else:
            newest = 1000 + made_auctions - 1
            assert newest - gen.NUM_IN_FLIGHT_AUCTIONS <= e["auction"] <= \
                newest + gen.AUCTION_ID_LEAD
            assert 1000 <= e["bidder"] < 1000 + made_persons + max(gen.PERSON_ID_LEAD,
                                                                   gen.HOT_BIDDER_BATCH)
            assert 100 <= e["price"] <= 100_000_000


def test_generator_sends_half_the_bids_to_the_hot_auction_and_most_to_hot_bidders():
    bids = [e for k, e in events(50_000) if k == "bid"]
    hot_auction = sum((e["auction"] - 1000) % gen.HOT_AUCTION_BATCH == 0 for e in bids)
    hot_bidder = sum((e["bidder"] - 1000) % gen.HOT_BIDDER_BATCH == 1 for e in bids)
    # 1 - 1/2 of the bids by choice, plus the few random picks that land there
    assert 0.48 < hot_auction / len(bids) < 0.56
    assert 0.73 < hot_bidder / len(bids) < 0.80


def test_generator_spaces_event_times_by_the_rate_and_bounds_the_disorder():
    ordered = events(3000, rate=2000)
    assert [e["date_time"] for _, e in ordered] == [
        1_700_000_000_000 + n * 1000 // 2000 for n in range(3000)]
    late = events(3000, rate=2000, out_of_order_ms=50)
    shifts = [a["date_time"] - b["date_time"] for (_, a), (_, b) in zip(ordered, late)]
    assert 0 <= min(shifts) and max(shifts) <= 50 and len(set(shifts)) > 10


def test_generator_gives_the_same_events_for_the_same_seed_only():
    assert events(2000, seed=7) == events(2000, seed=7)
    assert events(2000, seed=7) != events(2000, seed=8)


def test_check_output_names_missing_and_unexpected_records():
    from bench.nexmark.queries.q1 import convert

    q1 = query("q1")
    evs = events(500)
    outputs = [convert(e) for k, e in evs if k == "bid"]
    outputs[0] = dict(outputs[0], price=-1.0)
    problems = check_output(q1, evs, outputs[:-1])
    assert len(problems) == 2
    assert problems[0].startswith("q1: 2 expected records missing")
    assert problems[1].startswith("q1: 1 unexpected records")


def test_latency_counts_from_the_newest_event_time_an_output_carries():
    from bench.nexmark.runner import newest_event_time

    low, high = 1_700_000_000_000, 1_700_000_100_000
    bid = {"auction": 1_000, "price": 5_000_000, "date_time": low + 1_234}
    window = {"auction": 1_000, "count": 3, "start": low + 10_000, "end": low + 20_000}
    assert newest_event_time(bid, low, high) == low + 1_234
    assert newest_event_time(window, low, high) == low + 20_000   # the window's end
    assert newest_event_time({"auction": 1_107, "price": 3}, low, high) is None


def test_latency_of_an_output_without_event_time_counts_from_the_newest_input_it_holds():
    from bench.nexmark.runner import InputMatcher

    events = [("bid", {"auction": 1107, "price": 3, "date_time": 1}),
              ("person", {"id": 1107, "date_time": 2}),
              ("bid", {"auction": 1107, "price": 3, "date_time": 3}),
              ("bid", {"auction": 1230, "price": 3, "date_time": 4})]
    matcher = InputMatcher(events, [10, 20, 30, 40], ("bid",))
    assert matcher.produced_at({"auction": 1107, "price": 3}) == 30
    assert matcher.produced_at({"auction": 1230, "price": 3}) == 40
    assert matcher.produced_at({"auction": 1230, "price": 4}) is None


def test_a_peer_is_compared_with_jetwake_at_its_own_guarantee_and_at_exactly_once():
    from bench.bench_nexmark import comparable_guarantees

    measured = {"exactly_once": object(), "at_least_once": object()}
    # Quix Streams runs exactly-once: one like-for-like figure
    assert comparable_guarantees("exactly_once", measured) == ["exactly_once"]
    # Bytewax runs without a guarantee: against the weakest jetwake run, then the headline one
    assert comparable_guarantees("none", measured) == ["at_least_once", "exactly_once"]
    assert comparable_guarantees("none", {"exactly_once": object()}) == ["exactly_once"]


# --- through Kafka ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nexmark_input(kafka_bootstrap):
    from bench.nexmark.kafka_input import fill

    return fill(kafka_bootstrap, GeneratorConfig(4000, seed=3),
                prefix=f"t{uuid.uuid4().hex[:8]}-", partitions=2)


@pytest.fixture(scope="module")
def member(kafka_bootstrap):
    from bench.nexmark.runner import Target

    with Target(kafka_bootstrap, 1, in_process=True) as target:
        yield target


@pytest.mark.kafka
@pytest.mark.integration
@pytest.mark.parametrize("name", ["q0", "q1", "q2"])
def test_query_through_kafka_equals_its_reference(nexmark_input, member, name):
    from bench.nexmark.runner import run_query

    q = query(name)
    run = run_query(q, nexmark_input, member, "exactly_once", timeout=60)
    assert run.problems == [] and run.note == ""
    assert run.outputs == sum(q.reference(nexmark_input.events).values()) > 0
    assert run.events == nexmark_input.counts["bid"] and run.events_per_s > 0


@pytest.mark.kafka
@pytest.mark.integration
def test_benchmark_runs_a_query_end_to_end_with_its_table_and_latency(kafka_bootstrap, capsys):
    from bench.bench_nexmark import parse_args, run

    code = run(parse_args([
        "--events", "2000", "--queries", "q2", "--members", "1", "--guarantees",
        "at_least_once", "--peers", "none", "--rate", "3000", "--latency-seconds", "1.5",
        "--partitions", "2", "--in-process", "--bootstrap", kafka_bootstrap,
        "--topic-prefix", f"e{uuid.uuid4().hex[:8]}-"]))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "q2: selection" in out
    row = next(line for line in out.splitlines() if "1 member, at_least_once" in line)
    assert "OK (" in row and "175.0k" in row    # checked, Flink's per-core figure beside
    assert "latency at 3,000 events/s" in out and "p50/p95/p99" in out


@pytest.mark.kafka
@pytest.mark.integration
def test_benchmark_fails_loudly_when_an_output_differs_from_its_reference(
        kafka_bootstrap, capsys, monkeypatch):
    import dataclasses

    from bench.bench_nexmark import parse_args, run
    from bench.nexmark.queries import q2

    # a reference that expects one record the job never writes, and none of those it writes
    wrong = dataclasses.replace(q2.QUERY, reference=lambda _: Counter({(123, -1): 1}))
    monkeypatch.setattr(q2, "QUERY", wrong)
    code = run(parse_args([
        "--events", "2000", "--queries", "q2", "--members", "1", "--guarantees",
        "at_least_once", "--peers", "none", "--rate", "-1", "--partitions", "2",
        "--in-process", "--bootstrap", kafka_bootstrap,
        "--topic-prefix", f"f{uuid.uuid4().hex[:8]}-"]))
    out = capsys.readouterr().out
    assert code == 1
    assert "CHECK FAILED: q2: 1 expected records missing, e.g. [(123, -1)]" in out
    assert "unexpected records" in out
    assert "!!! 1 run(s) FAILED their output check" in out
