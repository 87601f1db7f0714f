"""A word count backfilled on Spark (`make demo-backfill`): the same Pipeline a member runs,
on Spark local[2], writing into an embedded member's map. See docs/backfill.md."""

import os
import tempfile

from jetwake import AggregateOperations, Member, Pipeline, Sinks, Sources, SparkRunner

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

directory = tempfile.mkdtemp(prefix="jetwake-demo-")
for n in range(4):
    with open(os.path.join(directory, f"part-{n}.txt"), "w") as f:
        f.write("to be or not to be that is the question\n" * (n + 1) * 1000)

p = Pipeline()
(p.read_from(Sources.files(os.path.join(directory, "*.txt")))
  .flat_map(str.split)
  .group_by(lambda w: w)
  .aggregate(AggregateOperations.counting())
  .write_to(Sinks.map("counts")))

with Member() as member, SparkRunner(master="local[2]") as runner:
    runner.spark.sparkContext.setLogLevel("ERROR")
    result = runner.run(p, member=member)
    counts = dict(member.get_map("counts").items())
    print("top words:", sorted(counts.items(), key=lambda kv: -kv[1])[:4])
    for stage, c in result.counters["stages"].items():
        print(f"  {stage}: {c['items_in']} in, {c['items_out']} out")
    print(f"ran in {result.seconds:.1f} s on Spark (start-up {runner.startup_seconds:.1f} s)")
