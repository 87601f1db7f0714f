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
from bench.nexmark.generator import GeneratorConfig, generate
from bench.nexmark.peers import fill_topics, run_peer
from bench.nexmark.queries import check_output, query

EVENTS = 5_000   # half a second of event time: one window of q7, flushed at the end by Bytewax


def _installed(peer: str) -> None:
    if not (PEERS_DIR / peer / ".installed").exists():
        pytest.skip(f"{peer} is not installed (python -m bench kafka-peers installs it)")


@pytest.fixture(scope="module")
def nexmark_topics(kafka_bootstrap):
    """The NEXMark topics under a prefix of this module, filled with EVENTS generated events:
    (prefix, events, bids)."""
    events = list(generate(GeneratorConfig(events=EVENTS, seed=26)))
    prefix = f"peers-test-{uuid.uuid4().hex[:6]}-"
    bids = fill_topics(kafka_bootstrap, events, prefix, partitions=2)
    return prefix, events, bids


def _output_topic(bootstrap: str, name: str) -> str:
    topic = f"{name}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    return topic


def test_quix_q0_writes_every_bid_once(kafka_bootstrap, nexmark_topics):
    _installed("quix")
    prefix, events, bids = nexmark_topics
    out = _output_topic(kafka_bootstrap, "quix-q0")
    run = run_peer("quix", "q0", kafka_bootstrap, out, bids, 90, topic_prefix=prefix)
    assert check_output(query("q0"), events, run.outputs) == []
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
