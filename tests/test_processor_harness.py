"""The processor test harness (jetwake.testing.verify_processor): it runs a processor in every
mode, passes a correct one, and catches broken ones with a message naming the mode."""

from __future__ import annotations

import re
import time

import pytest

from jetwake import AbstractProcessor, BroadcastKey, Processor
from jetwake.engine.core.chunk_emitter import ChunkEmitter
from jetwake.engine.core.partitioning import partition_of, processor_partition_table
from jetwake.snapshot.protocol.state_saver import StateSaver
from jetwake.testing import verify_processor, wm

RESTORE_MODE = "with a snapshot+restore after every chunk"
SAVE_MODE = "with a snapshot (saved, committed, not restored) after every chunk"


# --- processors under test ------------------------------------------------------------------

class Double(AbstractProcessor):
    def try_process_item(self, ordinal, item):
        return self.try_emit(item * 2)


class RunningCount(Processor):
    """Emits (key, count so far) per item; its state is a dict changed in place, saved with a
    resumable StateSaver and restored by key."""

    def __init__(self):
        self.counts: dict = {}
        self.pending: list = []
        self._saver = None

    def _flush(self) -> bool:
        while self.pending:
            if not self.outbox.offer(-1, self.pending[0]):
                return False
            self.pending.pop(0)
        return True

    def process(self, ordinal, inbox):
        while inbox and self._flush():
            k = inbox.poll()
            self.counts[k] = self.counts.get(k, 0) + 1
            self.pending.append((k, self.counts[k]))
        self._flush()

    def try_process(self):
        return self._flush()

    def complete(self):
        return self._flush()

    def save_to_snapshot(self):
        if not self._flush():
            return False
        if self._saver is None:
            self._saver = StateSaver(list(self.counts.items()))
        if self._saver.save(self.outbox):
            self._saver = None
            return True
        return False

    def restore_from_snapshot(self, inbox):
        for k, v in inbox.drain():
            self.counts[k] = v


KEYS = ["a", "b", "a", "c", "a", "b"]
COUNTS = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("a", 3), ("b", 2)]


class ForgetsState(RunningCount):
    def save_to_snapshot(self):
        return True  # saves nothing: a restored processor starts counting from zero


class RestoreDoubleCounts(RunningCount):
    """Says "not done" after offering everything, then offers it all again; the restore merges
    the two copies of each key and counts twice."""

    def save_to_snapshot(self):
        self._calls = getattr(self, "_calls", 0) + 1
        self.outbox.offer_all_to_snapshot(list(self.counts.items()))
        return self._calls % 2 == 0

    def restore_from_snapshot(self, inbox):
        for k, v in inbox.drain():
            self.counts[k] = self.counts.get(k, 0) + v


class SaveClearsState(RunningCount):
    """Moves its state into the snapshot and forgets it: only a restore gives it back."""

    def save_to_snapshot(self):
        ok = self.outbox.offer_all_to_snapshot(list(self.counts.items()))
        self.counts = {}
        return ok


class Stalls(Processor):
    def process(self, ordinal, inbox):
        inbox.drain()

    def complete(self):
        return False  # never done, never emits


class SumAtEnd(Processor):
    """Sums its input and emits the sum, one digit per complete() call; once it has emitted
    the sum, its saved state says so (a job restored from it must not get the sum twice)."""

    def __init__(self):
        self.total = 0
        self.emitter = None
        self.emitted = False

    def process(self, ordinal, inbox):
        self.total += sum(inbox.drain())

    def complete(self):
        if self.emitted:
            return True
        if self.emitter is None:
            self.emitter = ChunkEmitter(str(self.total), size=1)
        self.emitted = self.emitter.emit(self.outbox)
        return self.emitted

    def save_to_snapshot(self):
        return self.outbox.offer_to_snapshot(BroadcastKey("total"), [self.total, self.emitted])

    def restore_from_snapshot(self, inbox):
        for _, (total, emitted) in inbox.drain():
            self.total, self.emitted = total, emitted


def test_a_processor_that_emits_its_result_again_after_a_restore_of_its_final_state_is_caught():
    class EmitsAgain(SumAtEnd):
        def save_to_snapshot(self):
            return self.outbox.offer_to_snapshot(BroadcastKey("total"), [self.total, False])

    with pytest.raises(AssertionError) as e:
        verify_processor(EmitsAgain).input([100, 20, 3]).expect_output(["1", "2", "3"])
    assert "restored from the state it saved after complete() returned True, it emitted " \
        "['1', '2', '3']." in str(e.value)


# --- a correct processor passes --------------------------------------------------------------

def test_a_stateless_processor_passes_every_mode():
    verify_processor(Double).input([1, 2, 3]).expect_output([2, 4, 6])


def test_a_processor_with_state_changed_in_place_passes_when_it_saves_and_restores_it():
    verify_processor(RunningCount).input(KEYS).expect_output(COUNTS)


def test_a_wrong_expectation_fails_plainly_showing_expected_actual_and_the_first_difference():
    with pytest.raises(AssertionError) as e:
        verify_processor(Double).input([1, 2, 3]).expect_output([2, 4, 7])
    text = str(e.value)
    assert "Double plainly" in text
    assert "expected (3 items): [2, 4, 7]" in text
    assert "actual   (3 items): [2, 4, 6]" in text
    assert "first difference at index 2: expected 7, got 6" in text


def test_a_missing_item_is_named_as_the_first_difference():
    with pytest.raises(AssertionError, match=r"index 3: 8 is missing"):
        verify_processor(Double).input([1, 2, 3]).expect_output([2, 4, 6, 8])


# --- the harness catches broken processors -----------------------------------------------------

def test_a_processor_that_forgets_its_state_in_save_to_snapshot_is_caught():
    with pytest.raises(AssertionError) as e:
        verify_processor(ForgetsState).input(KEYS).expect_output(COUNTS)
    assert RESTORE_MODE in str(e.value)
    assert "first difference at index 2: expected ('a', 2), got ('a', 1)" in str(e.value)


def test_a_processor_whose_restore_double_counts_is_caught():
    with pytest.raises(AssertionError) as e:
        verify_processor(RestoreDoubleCounts).input(KEYS).expect_output(COUNTS)
    assert RESTORE_MODE in str(e.value)


def test_a_processor_whose_save_changes_its_state_is_caught_without_a_restore():
    with pytest.raises(AssertionError) as e:
        verify_processor(SaveClearsState).input(KEYS).expect_output(COUNTS)
    assert SAVE_MODE in str(e.value)


def test_a_stalling_processor_is_caught_by_the_progress_assertion():
    with pytest.raises(AssertionError, match=r"complete\(\) returning False made no progress"):
        verify_processor(Stalls).input([1, 2]).expect_output([])


def test_a_stalling_processor_without_the_progress_assertion_fails_after_the_timeout():
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"stalled: complete\(\) returning False"):
        verify_processor(Stalls).input([1]).disable_progress_assertion().timeout(0.2) \
            .expect_output([])
    assert time.monotonic() - start < 5


def test_a_processor_that_ignores_a_refusing_outbox_is_caught_with_capacity_1():
    class Lossy(Processor):
        def process(self, ordinal, inbox):
            for x in inbox.drain():
                self.outbox.offer(-1, x)  # the result is ignored: refused items are lost

    with pytest.raises(AssertionError, match=r"Lossy with the outbox capacity 1"):
        verify_processor(Lossy).input([1, 2, 3]).expect_output([1, 2, 3])


def test_a_processor_that_drops_items_it_could_not_emit_is_caught():
    class DropsLeftovers(Processor):
        def process(self, ordinal, inbox):
            while inbox and self.outbox.offer(-1, inbox.peek()):
                inbox.poll()
            inbox.clear()  # forgets what the full outbox refused

    with pytest.raises(AssertionError, match="outbox capacity 1"):
        verify_processor(DropsLeftovers).input([1, 2, 3]).expect_output([1, 2, 3])


def test_state_that_cannot_be_serialized_fails_naming_save_to_snapshot():
    class Unserializable(Processor):
        def process(self, ordinal, inbox):
            inbox.drain()

        def save_to_snapshot(self):
            return self.outbox.offer_to_snapshot("lock", object())

    with pytest.raises(AssertionError, match=r"save_to_snapshot\(\) cannot be serialized"):
        verify_processor(Unserializable).input([1]).expect_output([])


def test_a_restore_that_leaves_its_entries_in_the_inbox_is_caught():
    class IgnoresRestore(RunningCount):
        def restore_from_snapshot(self, inbox):
            pass

    with pytest.raises(AssertionError, match=r"restore_from_snapshot\(\) consumed none"):
        verify_processor(IgnoresRestore).input(KEYS).expect_output(COUNTS)


def test_a_slow_cooperative_call_is_caught_and_the_check_can_be_turned_off():
    class Slow(Double):
        def try_process_item(self, ordinal, item):
            time.sleep(0.05)  # the slow call under test
            return super().try_process_item(ordinal, item)

    with pytest.raises(AssertionError, match=r"process\(\) took .* cooperative budget of 0.01"):
        verify_processor(Slow).input([1]).cooperative_timeout(0.01).expect_output([2])
    verify_processor(Slow).input([1]).cooperative_timeout(None).disable_snapshots() \
        .expect_output([2])


def test_a_slow_non_cooperative_processor_is_not_held_to_the_budget():
    class Blocking(Double):
        def is_cooperative(self):
            return False

        def try_process_item(self, ordinal, item):
            time.sleep(0.02)  # blocking work is what a non-cooperative processor may do
            return super().try_process_item(ordinal, item)

    verify_processor(Blocking).input([1, 2]).cooperative_timeout(0.005).disable_snapshots() \
        .expect_output([2, 4])


# --- complete() ------------------------------------------------------------------------------

def test_complete_is_called_until_it_returns_true_and_each_false_must_emit():
    verify_processor(SumAtEnd).input([100, 20, 3]).expect_output(["1", "2", "3"])


def test_complete_returning_false_without_emitting_needs_the_progress_assertion_disabled():
    class Patient(Processor):
        def __init__(self):
            self.calls = 0

        def process(self, ordinal, inbox):
            inbox.drain()

        def save_to_snapshot(self):  # after complete(): "done" was emitted, never again
            return self.outbox.offer_to_snapshot(BroadcastKey("calls"), self.calls)

        def restore_from_snapshot(self, inbox):
            for _, calls in inbox.drain():
                self.calls = calls

        def complete(self):
            self.calls += 1
            if self.calls < 4:
                return False
            return self.calls > 4 or self.outbox.offer(-1, "done")

    with pytest.raises(AssertionError, match="made no progress"):
        verify_processor(Patient).input([1]).expect_output(["done"])
    verify_processor(Patient).input([1]).disable_progress_assertion().expect_output(["done"])


def test_disable_complete_call_checks_the_output_before_the_end():
    verify_processor(SumAtEnd).input([1, 2]).disable_complete_call().expect_output([])


def test_a_source_is_snapshotted_and_restored_between_complete_calls():
    class Counter(Processor):
        """Emits 0..9 one per call; forgets its position unless ``saves``."""

        saves = True

        def __init__(self):
            self.n = 0

        def complete(self):
            if self.n < 10 and self.outbox.offer(-1, self.n):
                self.n += 1
            return self.n >= 10

        def save_to_snapshot(self):
            return not self.saves or self.outbox.offer_to_snapshot(BroadcastKey("n"), self.n)

        def restore_from_snapshot(self, inbox):
            for _, n in inbox.drain():
                self.n = n

    verify_processor(Counter).expect_output(list(range(10)))

    class Forgetful(Counter):
        saves = False

    with pytest.raises(AssertionError, match=re.escape(RESTORE_MODE)):
        verify_processor(Forgetful).expect_output(list(range(10)))


# --- watermarks, inputs and outputs ------------------------------------------------------------

def test_watermarks_in_the_input_go_to_try_process_watermark_in_place():
    verify_processor(Double).input([1, wm(10), 2, wm(20)]) \
        .expect_output([2, wm(10), 4, wm(20)])


def test_a_watermark_refused_at_first_is_offered_again():
    class Hesitant(Double):
        def try_process_watermark(self, watermark):
            self.tries = getattr(self, "tries", 0) + 1
            if self.tries % 2:
                return self.outbox.offer(-1, f"before {watermark.timestamp}") and False
            return super().try_process_watermark(watermark)

    verify_processor(Hesitant).input([1, wm(5)]).expect_output([2, "before 5", wm(5)])


def test_inputs_of_a_lower_priority_number_are_delivered_first_then_each_edge_completes():
    class Tagger(Processor):
        def process(self, ordinal, inbox):
            while inbox and self.outbox.offer(-1, (ordinal, inbox.peek())):
                inbox.poll()

        def complete_edge(self, ordinal):
            return self.outbox.offer(-1, ("end", ordinal))

    verify_processor(Tagger).inputs([["s1", "s2"], ["b1", "b2"]], priorities=[0, -1]) \
        .disable_snapshots() \
        .expect_output([(1, "b1"), (1, "b2"), ("end", 1), (0, "s1"), (0, "s2"), ("end", 0)])


def test_inputs_of_equal_priority_take_turns():
    class Tagger(AbstractProcessor):
        def try_process_item(self, ordinal, item):
            return self.try_emit((ordinal, item))

    verify_processor(Tagger).inputs([[1, 2, wm(5), 3], ["x", wm(5), "y"]]) \
        .disable_snapshots() \
        .expect_output([(0, 1), (0, 2), (1, "x"), wm(5), wm(5), (0, 3), (1, "y")])


def test_expect_outputs_checks_each_output_ordinal():
    class Splitter(AbstractProcessor):
        def try_process_item(self, ordinal, item):
            return self.try_emit(item, item % 2)

    verify_processor(Splitter).input([1, 2, 3, 4]).expect_outputs([[2, 4], [1, 3]])
    with pytest.raises(AssertionError, match="on output ordinal 1"):
        verify_processor(Splitter).input([1, 2, 3]).expect_outputs([[2], [3, 1]])


def test_an_output_checker_replaces_equality():
    class Reverse(Processor):
        def process(self, ordinal, inbox):
            if self.outbox.has_room():
                self.outbox.offer_chunk(-1, inbox.drain()[::-1])

    verify_processor(Reverse).input([1, 2, 3]).disable_snapshots() \
        .output_checker(lambda e, a: sorted(e) == sorted(a)).expect_output([1, 2, 3])


def test_a_sink_runs_with_no_output_ordinals_and_after_each_run_checks_its_effect():
    written: list = []
    runs: list = []

    class ListSink(Processor):
        def process(self, ordinal, inbox):
            written.extend(inbox.drain())

    verify_processor(ListSink).input([1, 2, 3]) \
        .before_each_run(written.clear) \
        .after_each_run(lambda: runs.append(list(written))) \
        .expect_outputs([])
    assert runs == [[1, 2, 3]] * 4  # four modes, each with a fresh list

    with pytest.raises(AssertionError, match=r"ListSink plainly: the after_each_run check"):
        def check():
            assert written == [3, 2, 1]
        verify_processor(ListSink).input([1, 2, 3]).before_each_run(written.clear) \
            .after_each_run(check).expect_outputs([])


# --- context and parallelism -------------------------------------------------------------------

def test_the_context_describes_the_configured_processor_and_job_settings():
    seen: list = []

    class Ctx(Processor):
        def init(self, context):
            super().init(context)
            seen.append(context)

    verify_processor(Ctx).local_parallelism(2).total_parallelism(4).global_processor_index(3) \
        .context(processing_guarantee="at_least_once", vertex_name="v").input([]) \
        .expect_output([])
    c = seen[0]
    assert (c.global_processor_index, c.local_processor_index, c.local_parallelism,
            c.total_parallelism, c.member_index, c.member_count) == (3, 1, 2, 4, 1, 2)
    assert c.processing_guarantee == "at_least_once" and c.vertex_name == "v"
    table = processor_partition_table(2, 2)
    assert sorted(c.owned_partitions) == [p for p in range(len(table)) if table[p] == 3]


def test_a_restore_routes_entries_by_key_partition_and_broadcast_keys_to_all():
    keys = [f"k{i}" for i in range(40)]
    restored: list = []

    class SavesKeys(Processor):
        def process(self, ordinal, inbox):
            inbox.drain()

        def save_to_snapshot(self):
            return self.outbox.offer_all_to_snapshot(
                [(k, 1) for k in keys] + [(BroadcastKey("all"), 2)])

        def restore_from_snapshot(self, inbox):
            restored.extend(k for k, _ in inbox.drain())

    verify_processor(SavesKeys).total_parallelism(2).global_processor_index(1).input([1]) \
        .expect_output([])
    table = processor_partition_table(2, 1)
    mine = [k for k in keys if table[partition_of(k)] == 1]
    assert 0 < len(mine) < len(keys)
    # a restore after the one chunk and one from the final state: processor 1's share each
    assert restored == (mine + [BroadcastKey("all")]) * 2


def test_with_no_processing_guarantee_the_snapshot_modes_are_skipped():
    verify_processor(ForgetsState).context(processing_guarantee="none").input(KEYS) \
        .expect_output(COUNTS)


def test_processors_see_the_snapshot_ids_of_the_snapshot_they_save_and_commit():
    ids: list = []

    class Ids(Processor):
        def process(self, ordinal, inbox):
            inbox.drain()

        def save_to_snapshot(self):
            ids.append(("save", self.context.snapshot_id))
            return True

        def snapshot_commit_finish(self, success):
            ids.append(("commit", self.context.snapshot_id, success))
            return True

    verify_processor(Ids).input([1, 2]).expect_output([])
    # two modes with snapshots; ids grow and each commit follows its save; the state saved
    # after complete() (with a restore) is never committed, as in a job
    assert ids == [("save", 0), ("commit", 0, True), ("save", 1), ("commit", 1, True),
                   ("save", 0), ("commit", 0, True), ("save", 1), ("commit", 1, True),
                   ("save", 2)]


def test_run_until_output_matches_drives_a_source_that_never_completes():
    class Ticker(Processor):
        def init(self, context):
            super().init(context)
            self.n = 0
            self.next_at = time.monotonic()

        def complete(self):
            if self.n < 3 and time.monotonic() >= self.next_at:
                if self.outbox.offer(-1, self.n):
                    self.n += 1
                    self.next_at = time.monotonic() + 0.01
            return False

        def save_to_snapshot(self):
            return self.outbox.offer_to_snapshot(BroadcastKey("n"), self.n)

        def restore_from_snapshot(self, inbox):
            for _, n in inbox.drain():
                self.n = n

    verify_processor(Ticker).run_until_output_matches(5, 0.05).expect_output([0, 1, 2])
    with pytest.raises(AssertionError, match="differs"):
        verify_processor(Ticker).disable_snapshots().run_until_output_matches(0.2) \
            .expect_output([0, 1, 2, 3])


# --- bad usage -----------------------------------------------------------------------------------

def test_a_supplier_returning_the_same_processor_twice_is_refused():
    shared = Double()
    with pytest.raises(TypeError, match="new one on every call"):
        verify_processor(lambda: shared).input([1]).expect_output([2])


def test_a_supplier_returning_something_else_is_refused():
    with pytest.raises(TypeError, match="not a jetwake Processor"):
        verify_processor(lambda: "nope").input([1]).expect_output([2])
    with pytest.raises(TypeError, match="zero-argument callable"):
        verify_processor(Double())


@pytest.mark.parametrize("configure, error", [
    (lambda v: v.outbox_capacity(0), "positive int"),
    (lambda v: v.cooperative_timeout(-1), "positive number"),
    (lambda v: v.context(snapshot=None), "does not take"),
    (lambda v: v.context(processing_guarantee="twice"), "must be one of"),
    (lambda v: v.inputs([[1]], priorities=[0, 1]), "one int per input"),
    (lambda v: v.inputs("abc"), "list of lists"),
    (lambda v: v.total_parallelism(2).global_processor_index(2).expect_output([]),
     "must be below"),
    (lambda v: v.total_parallelism(3).local_parallelism(2).expect_output([]), "multiple of"),
])
def test_bad_options_are_reported_with_what_to_pass(configure, error):
    with pytest.raises((TypeError, ValueError), match=error):
        configure(verify_processor(Double))
