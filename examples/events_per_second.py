"""A streaming job for the `jetwake` command line: events per second, by parity.

    jetwake member start --data-dir ./data &
    jetwake submit examples/events_per_second.py --name eps --guarantee exactly_once -- 200

The CLI runs this file and takes its `pipeline`: here a function `pipeline(args)` that receives
the words after `--` (the event rate; default 100 events a second).
"""

from jetwake import AggregateOperations, Pipeline, Sinks, TestSources, WindowDefinition


def pipeline(args: list[str]) -> Pipeline:
    rate = int(args[0]) if args else 100
    p = Pipeline()
    (p.read_from(TestSources.item_stream(rate))
      .with_native_timestamps(allowed_lag=200)
      .window(WindowDefinition.tumbling(1_000))
      .group_by(lambda e: "even" if e.sequence % 2 == 0 else "odd")
      .aggregate(AggregateOperations.counting())
      # key: (window start, parity) -> count; idempotent, so exactly-once end to end
      .write_to(Sinks.map("events-per-second", key_fn=lambda r: (r.start, r.key),
                          value_fn=lambda r: r.result)))
    return p
