"""A snapshot is a true cut: what a processor saves is fixed at the moment it saves it.

State that the processor changes in place after its barrier must not reach the snapshot, even
when the snapshot commits much later (another processor still in phase 1). These tests hold a
downstream processor in phase 1 while the stateful one keeps changing its state in place, then
look at what the committed snapshot holds.
"""

from __future__ import annotations

import threading

from jetwake import DAG, BroadcastKey, Edge, JobConfig, Member, Processor
from support.snapshot_fixtures import CountingSource
from support.waiting import wait_until


class InPlaceList(Processor):
    """Keeps every item in one list, appended in place; saves the list object itself."""

    progress: dict = {}  # shared with the test; the job's definition is pickled

    def __init__(self) -> None:
        self.items: list = []

    def process(self, ordinal, inbox) -> None:
        self.items.extend(inbox.drain())
        self.progress["size"] = len(self.items)

    def save_to_snapshot(self) -> bool:
        self.progress["saved_size"] = len(self.items)
        return self.outbox.offer_to_snapshot(BroadcastKey("items"), self.items)

    def restore_from_snapshot(self, inbox) -> None:
        for _, items in inbox.drain():
            self.items = items


class HeldInPhase1(Processor):
    """Receives nothing but barriers; its phase 1 waits until the test opens the gate."""

    gate = threading.Event()  # shared with the test; the job's definition is pickled

    def process(self, ordinal, inbox) -> None:
        inbox.clear()

    def snapshot_commit_prepare(self) -> bool:
        return self.gate.is_set()


def _dag() -> DAG:
    dag = DAG()
    source = dag.new_vertex("source", lambda: CountingSource(None, per_call=20, pause=0.0005), 1)
    state = dag.new_vertex("in-place", InPlaceList, 1)
    held = dag.new_vertex("held", HeldInPhase1, 1)
    dag.edge(Edge(source, 0, state, 0))
    dag.edge(Edge(state, 0, held, 0))
    return dag


def _snapshot_with_changes_after_the_barrier(data_dir) -> tuple[dict, dict]:
    progress = InPlaceList.progress
    progress.clear()
    gate = HeldInPhase1.gate
    gate.clear()
    with Member(data_dir) as m:
        job = m.new_job(_dag(), JobConfig(
            processing_guarantee="exactly_once", snapshot_interval_ms=3_600_000))
        wait_until(lambda: progress.get("size", 0) > 100)
        taken: dict = {}
        snapshot = threading.Thread(target=lambda: taken.update(rec=job.take_snapshot()))
        snapshot.start()
        # the stateful processor saved, then keeps appending to the saved list in place
        wait_until(lambda: "saved_size" in progress
                    and progress["size"] >= progress["saved_size"] + 1000)
        gate.set()
        snapshot.join(30)
        assert "rec" in taken, "the snapshot did not complete"
        saved = m.snapshot_store.read(taken["rec"])
        job.cancel()
    return saved, progress


def test_state_changed_in_place_after_the_barrier_stays_out_of_the_snapshot(tmp_path):
    saved, progress = _snapshot_with_changes_after_the_barrier(tmp_path)
    items = saved["in-place"][0][1]
    assert len(items) == progress["saved_size"]
    assert progress["size"] >= progress["saved_size"] + 1000


def test_saved_state_matches_the_source_position_of_the_same_snapshot(tmp_path):
    saved, _ = _snapshot_with_changes_after_the_barrier(tmp_path)
    items = saved["in-place"][0][1]
    position = saved["source"][0][1]
    assert items == list(range(position))


def test_snapshot_held_in_memory_is_a_true_cut_too():
    saved, progress = _snapshot_with_changes_after_the_barrier(None)
    assert len(saved["in-place"][0][1]) == progress["saved_size"]
