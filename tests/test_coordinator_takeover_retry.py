"""A member Kafka made coordinator keeps trying to take over while Kafka fails its fenced
producer (a broker just killed or restarting): no new election follows such a failure, so
giving up after one try left the cluster without a working coordinator for minutes (seen
under `python -m bench chaos`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jetwake.engine.cluster import coordinator_role
from jetwake.engine.cluster.coordinator_role import CoordinatorRole


class Records:
    """Fails ``failures`` times, like a fenced producer whose init_transactions times out."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def open_writer(self, on_fenced=None) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise TimeoutError()


def _place(records: Records, coordinator: bool = True) -> SimpleNamespace:
    resumed: list[bool] = []
    return SimpleNamespace(
        member_id="m-1", cluster_name="c", records=records,
        detector=SimpleNamespace(stopped=False),
        membership=SimpleNamespace(is_coordinator=coordinator),
        member=SimpleNamespace(recover_jobs=lambda: resumed.append(True)), resumed=resumed)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(coordinator_role, "TAKE_OVER_RETRY_S", 0.01)


def test_a_coordinator_takes_over_once_kafka_answers_after_failing():
    place = _place(Records(failures=3))
    role = CoordinatorRole(place)  # type: ignore[arg-type]
    role._take_over()
    assert place.records.calls == 4
    assert place.resumed == [True]
    assert role._took_over.is_set()


def test_a_member_that_loses_the_role_while_retrying_stops_trying():
    place = _place(Records(failures=100))
    role = CoordinatorRole(place)  # type: ignore[arg-type]

    def fail_and_lose_the_role(on_fenced=None) -> None:
        place.records.calls += 1
        place.membership.is_coordinator = False  # Kafka moved partition 0 on meanwhile
        raise TimeoutError()
    place.records.open_writer = fail_and_lose_the_role
    role._take_over()
    assert place.records.calls == 1
    assert place.resumed == []
    assert not role._took_over.is_set()


def test_a_take_over_queued_before_the_role_moved_on_fences_nothing():
    place = _place(Records(failures=0), coordinator=False)
    role = CoordinatorRole(place)  # type: ignore[arg-type]
    role._take_over()
    assert place.records.calls == 0  # opening the writer would fence the real coordinator
    assert place.resumed == []
    assert not role._took_over.is_set()
