"""Batch sources save their position in snapshots, so a restored job does not re-read what was
already emitted."""

from __future__ import annotations

from jetwake import Inbox, Outbox, ProcessorContext
from jetwake.connectors.files import FileSourceProcessor
from jetwake.connectors.items_source import ItemsSourceProcessor


def context() -> ProcessorContext:
    return ProcessorContext(job_id="j", job_name="j", vertex_name="src",
                            global_processor_index=0, local_processor_index=0,
                            local_parallelism=1, total_parallelism=1, member_index=0,
                            member_count=1)


def run_until_full(proc, capacity: int) -> list:
    proc.outbox = Outbox(1, capacity)
    proc.init(context())
    proc.complete()
    return proc.outbox.drain(0)


def snapshot(proc) -> list:
    assert proc.save_to_snapshot()
    return proc.outbox.drain_snapshot()


def drain_all(proc) -> list:
    out = []
    while True:
        done = proc.complete()
        out += proc.outbox.drain(0)
        if done:
            return out


def resume(make, saved: list) -> list:
    proc = make()
    proc.outbox = Outbox(1, 1 << 20)
    proc.init(context())
    proc.restore_from_snapshot(Inbox(list(saved)))
    return drain_all(proc)


def test_file_source_resumes_after_the_lines_it_emitted(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("".join(f"{name}:{i}\n" for i in range(5000)))
    pattern = str(tmp_path / "*.txt")
    make = lambda: FileSourceProcessor(pattern, "utf-8")  # noqa: E731
    first = make()
    emitted = run_until_full(first, capacity=1)  # stops after one chunk
    assert 0 < len(emitted) < 10_000
    rest = resume(make, snapshot(first))
    expected = [f"{n}:{i}" for n in ("a.txt", "b.txt") for i in range(5000)]
    assert emitted + rest == expected


def test_items_source_resumes_after_the_items_it_emitted():
    items = list(range(10_000))
    make = lambda: ItemsSourceProcessor(items)  # noqa: E731
    first = make()
    emitted = run_until_full(first, capacity=1)
    assert 0 < len(emitted) < len(items)
    assert emitted + resume(make, snapshot(first)) == items
