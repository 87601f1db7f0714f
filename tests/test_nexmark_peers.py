"""The NEXMark peers (bench/nexmark/peers.py): Quix Streams and Bytewax run a query as a
process of their own on the NEXMark topics of a real broker, and their output is the query's.

The peers live in virtual environments of their own, made by ``python -m bench kafka-peers``
(``.cache/bench-peers/``); a peer whose environment is not there is skipped, never installed
by the tests.
"""
from __future__ import annotations

import importlib.util
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from bench.bench_kafka_peers import PEERS_DIR
from bench.nexmark.generator import GeneratorConfig
from bench.nexmark.kafka_input import fill
from bench.nexmark.peers import run_peer
from bench.nexmark.queries import check_output, query

EVENTS = 5_000   # half a second of event time: every window is closed by the end of the input


def _installed(peer: str) -> None:
    if not (PEERS_DIR / peer / ".installed").exists():
        pytest.skip(f"{peer} is not installed (python -m bench kafka-peers installs it)")


@pytest.fixture(scope="module")
def nexmark_topics(kafka_bootstrap):
    """The NEXMark topics under a prefix of this module, filled with EVENTS generated events:
    (prefix, events, bids)."""
    prefix = f"peers-test-{uuid.uuid4().hex[:6]}-"
    inp = fill(kafka_bootstrap, GeneratorConfig(EVENTS, seed=26), prefix=prefix, partitions=2)
    return prefix, inp.events, inp.counts["bid"]


def _output_topic(bootstrap: str, name: str) -> str:
    topic = f"{name}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "-1"})])[topic].result(30)
    return topic


@pytest.mark.skipif(importlib.util.find_spec("bench.nexmark.queries.q11") is None,
                    reason="q11 is not in this tree yet")
def test_quix_q11_closes_every_session_at_the_end_markers(kafka_bootstrap, nexmark_topics):
    """Quix Streams re-keys the bids by bidder through a repartition topic: the end markers
    reach each of its partitions, which close the last sessions when every marker is in."""
    _installed("quix")
    prefix, events, bids = nexmark_topics
    out = _output_topic(kafka_bootstrap, "quix-q11")
    run = run_peer("quix", "q11", kafka_bootstrap, out, bids, 90, topic_prefix=prefix)
    assert run.outputs, "no session was written"
    assert check_output(query("q11"), events, run.outputs) == []
    assert run.late == 0
    assert run.events_per_s == pytest.approx(bids / run.wall_s)
    assert run.cpu_s > 0


@pytest.mark.skipif(importlib.util.find_spec("bench.nexmark.queries.q7") is None,
                    reason="q7 is not in this tree yet")
def test_bytewax_q7_writes_the_highest_bids_of_every_window(kafka_bootstrap, nexmark_topics):
    _installed("bytewax")
    prefix, events, bids = nexmark_topics
    out = _output_topic(kafka_bootstrap, "bytewax-q7")
    run = run_peer("bytewax", "q7", kafka_bootstrap, out, bids, 90, topic_prefix=prefix)
    assert run.outputs, "no window was written"
    assert check_output(query("q7"), events, run.outputs) == []
    assert run.late == 0


def test_a_query_a_peer_cannot_run_fails_before_starting_it():
    with pytest.raises(ValueError, match=r"quix does not run NEXMark q3 \(it runs q0, q1"):
        run_peer("quix", "q3", "127.0.0.1:1", "out", 1, 1)
