"""A streaming job on an embedded member: events per second, by parity, in tumbling windows.

Run by `make demo` after the word count. The source generates 2,000 events a second with
timestamps; the job counts them in one-second windows per key and writes each window's result
to a list as the watermark closes it. After a few seconds the job is cancelled.
"""

from __future__ import annotations

import time

from jetwake import AggregateOperations, Member, Pipeline, Sinks, TestSources, WindowDefinition

RATE = 2_000
SECONDS = 3.5


def build_pipeline() -> Pipeline:
    p = Pipeline()
    (p.read_from(TestSources.item_stream(RATE))
      .with_native_timestamps(allowed_lag=100)
      .window(WindowDefinition.tumbling(1_000))
      .group_by(lambda e: "even" if e.sequence % 2 == 0 else "odd")
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.list("windows")))
    return p


def main() -> None:
    with Member() as member:
        job = member.new_job(build_pipeline())
        print(f"streaming job {job.name}: {RATE} events/s, one-second windows")
        windows = member.get_list("windows")
        shown = 0
        end = time.time() + SECONDS
        while time.time() < end:
            time.sleep(0.1)
            for r in list(windows)[shown:]:
                print(f"  window [{r.start}, {r.end}) {r.key:<4} {r.result} events")
            shown = len(windows)
        job.cancel()
        # as in Jet, a cancelled job ends in FAILED status with a cancellation error
        print(f"job {job.name} cancelled after {SECONDS} s (status {job.status.value})")


if __name__ == "__main__":
    main()
