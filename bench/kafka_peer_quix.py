"""Workloads A and B of ``python -m bench kafka-peers`` as a Quix Streams application, written
as Quix Streams' documentation shows (``Application``, ``app.topic``, a ``StreamingDataFrame``
with ``apply`` / ``tumbling_window(...).count().final()``, ``to_topic``). Runs with the Python
of the virtual environment the benchmark made for Quix Streams; only the standard library,
Quix Streams and ``kafka_spec.py`` (loaded from beside this file) are imported.

    python kafka_peer_quix.py A|B --bootstrap ... --input ... --output ... --report ...
        [--guarantee at-least-once|exactly-once] [--commit-interval 1.0] [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_spec as spec  # noqa: E402

from quixstreams import Application  # noqa: E402
from quixstreams.models.serializers.json import JSONDeserializer  # noqa: E402
from quixstreams.models.serializers.simple_types import BytesDeserializer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=["A", "B"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--guarantee", default="at-least-once")
    ap.add_argument("--commit-interval", type=float, default=1.0)
    ap.add_argument("--state-dir", required=True)
    args = ap.parse_args()
    first = spec.FirstRecord(args.report)

    # the first record is noted in the value deserializer, which Quix Streams calls for every
    # message anyway (the defaults are the same classes without the check)
    class FirstJSON(JSONDeserializer):
        def __call__(self, value, ctx):
            if not first.seen:
                first.mark()
            return super().__call__(value, ctx)

    class FirstBytes(BytesDeserializer):
        def __call__(self, value, ctx):
            if not first.seen:
                first.mark()
            return value

    app = Application(broker_address=args.bootstrap,
                      consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
                      auto_offset_reset="earliest",
                      processing_guarantee=args.guarantee,
                      commit_interval=args.commit_interval,
                      state_dir=args.state_dir,
                      loglevel=logging.WARNING)
    out = app.topic(args.output, value_serializer="json")
    if args.workload == "A":
        sdf = app.dataframe(app.topic(args.input, value_deserializer=FirstJSON()))
        sdf = sdf.apply(spec.enrich)
    else:
        sdf = app.dataframe(app.topic(args.input, value_deserializer=FirstBytes()))
        sdf = (sdf.tumbling_window(duration_ms=spec.WINDOW_MS).count()
               .final(closing_strategy="partition"))
        sdf = sdf.apply(lambda w: spec.window_value(w["start"], w["end"], w["value"]))
    sdf.to_topic(out)
    app.run()


if __name__ == "__main__":
    main()
