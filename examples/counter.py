"""A running count of a stream's events, for `jetwake submit` (docs/cli.md):

    jetwake member start --data-dir ./data &
    jetwake submit examples/counter.py --name counter --guarantee exactly_once \
        --snapshot-interval 1000 -- 500

`pipeline(args)` takes the event rate after `--` (default 100 a second). The count is keyed
state, so a snapshot holds it and a restarted job carries on from it; the map "counter" holds
the latest count of each parity.
"""

from jetwake import AggregateOperations, Pipeline, Sinks, TestSources


def pipeline(args: list[str]) -> Pipeline:
    rate = int(args[0]) if args else 100
    p = Pipeline()
    (p.read_from(TestSources.item_stream(rate))
      .with_native_timestamps(allowed_lag=200)
      .group_by(lambda e: "even" if e.sequence % 2 == 0 else "odd")
      .rolling_aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counter")))
    return p
