"""map_using_service_async under exactly-once, Kafka to Kafka, while the member process is
SIGKILLed with calls in flight and restarted on its data directory: every input record's
result is in the output exactly once (read_committed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.http_service import HttpService
from support.kafka_job import Proc, Reader, produce_slowly
from support.restores import restored_snapshots, wait_for_a_new_snapshot
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support",
                      "service_job_process.py")


class ServiceJob(Proc):
    def __init__(self, *args: str) -> None:
        super().__init__(*args)
        self.args = [sys.executable, SCRIPT, *args]


def test_results_exactly_once_when_killed_with_calls_in_flight(kafka_bootstrap, kafka_topic,
                                                              tmp_path):
    tin, tout = kafka_topic(partitions=2), kafka_topic(partitions=2)
    total = 3000
    data = str(tmp_path / "member")
    reader = Reader(kafka_bootstrap, tout)
    with HttpService(latency_ms=25) as svc:
        proc = ServiceJob(data, kafka_bootstrap, tin, tout, svc.url)
        feeder = None
        kills_in_flight = 0
        try:
            for round_ in range(2):
                proc.start(wait_ready=round_ == 0)
                if round_ == 0:
                    feeder = produce_slowly(kafka_bootstrap, tin, total, 4.0)
                wait_for_a_new_snapshot(data)
                # the fault: calls are in flight at the service when the member dies
                wait_until(lambda: svc.in_flight > 0, timeout=30, interval=0)
                proc.kill()
                kills_in_flight += 1
                reader.poll(0.1)
            feeder.join(60)
            proc.start()
            reader.wait_for(total, 90)
            reader.poll(1.0)  # anything extra (a duplicate) shows up now
        finally:
            proc.kill()
            reader.close()
    assert kills_in_flight == 2
    values = sorted(v for _, v in reader.records)
    assert values == [i * 10 for i in range(total)], (
        f"{len(values)} results for {total} records")
    # calls in flight at a kill were abandoned and made again after the restore
    assert svc.requests > total
    assert len(restored_snapshots(data)) >= 2
