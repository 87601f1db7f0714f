"""The main example: word count over a small text, on an embedded member.

Run it with `make demo`. It reads lines, splits them into words, counts each word in two
stages (local accumulate, then combine by key) and writes the counts to a map.
"""

from __future__ import annotations

from jetwake import AggregateOperations, Member, Pipeline, Sinks, Sources

TEXT = """\
It was the best of times, it was the worst of times,
it was the age of wisdom, it was the age of foolishness,
it was the epoch of belief, it was the epoch of incredulity,
it was the season of Light, it was the season of Darkness,
it was the spring of hope, it was the winter of despair.
"""


def build_pipeline(lines: list[str]) -> Pipeline:
    p = Pipeline()
    (p.read_from(Sources.items(lines))
      .flat_map(lambda line: line.lower().replace(",", " ").replace(".", " ").split())
      .group_by(lambda word: word)
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counts")))
    return p


def pipeline(args: list[str]) -> Pipeline:
    """What `jetwake submit examples/word_count.py` submits."""
    return build_pipeline(TEXT.splitlines())


def main() -> None:
    lines = TEXT.splitlines()
    with Member() as member:
        job = member.new_job(build_pipeline(lines))
        job.join()
        counts = member.get_map("counts")
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
        print(f"job {job.name}: {job.status.value}, {len(counts)} distinct words")
        for word, n in top:
            print(f"  {word:<12} {n}")


if __name__ == "__main__":
    main()
