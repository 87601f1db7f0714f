"""A member process running one conformance spec's job exactly-once, for the SIGKILL runtime
of the conformance suite (tests/reference/process_runtimes.py; run as a script, the test
SIGKILLs it).

    python tests/support/conformance_process.py CASE_JSON DATA_DIR [final]

CASE_JSON holds ``{"spec", "inputs", "batch", "order", "seed", "pace",
"snapshot_interval_ms", "local_parallelism"}``. The process opens a Member on DATA_DIR; if
the job "conformance" is not there yet it builds the spec's pipeline with
``reference.generate.build_pipeline`` (each source ``PacedPartitionedSource``, each sink a
``numbered_map_sink`` into the map of the sink's label) and starts it with
``processing_guarantee="exactly_once"``; on a directory where it was killed, the member
resumes the job from its last snapshot by itself.

Next to DATA_DIR it appends what this start found to ``starts.jsonl`` (from the member's log:
whether it resumed the job, which was running when the last process died, and the snapshot
it restored; and the job's status once it runs again) and keeps
``progress.json`` current (this process's pid, the job's status and last snapshot id). With
``final`` it waits until the job completes, then writes every sink's items (and any gap in
their numbering) to ``result.pickle`` next to DATA_DIR and exits 0 (1 if the job failed);
without, it runs until it is killed.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import sys
import time
from pathlib import Path

# run as a script: tests/ (where `reference` and `support` are) is not on sys.path by itself
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jetwake import JobConfig, JobStatus, Member  # noqa: E402

from reference.generate import build_pipeline  # noqa: E402
from reference.process_runtimes import (  # noqa: E402
    inputs_from_json, numbered_map_sink, paced_partitioned, read_numbered_map, sink_labels,
)
from support.waiting import poll_until  # noqa: E402

JOB = "conformance"


class _Captured(logging.Handler):
    """The member's log lines about resuming jobs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a log line must not break the run
            pass


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> int:
    case_path, data_dir = Path(sys.argv[1]), Path(sys.argv[2])
    final = len(sys.argv) > 3 and sys.argv[3] == "final"
    work = data_dir.parent
    case = json.loads(case_path.read_text())
    spec, inputs = case["spec"], inputs_from_json(case["inputs"])

    captured = _Captured()
    for name in ("jetwake.job", "jetwake.member"):
        logging.getLogger(name).addHandler(captured)
        logging.getLogger(name).setLevel(logging.INFO)

    member = Member(str(data_dir), local_parallelism=case["local_parallelism"])
    job = member.get_job(JOB)
    existed = job is not None
    if job is None:
        def source_for(name: str, partitions: list):
            return paced_partitioned(partitions, batch=case["batch"], order=case["order"],
                                     seed=case["seed"], pace=case["pace"])
        pipeline = build_pipeline(spec, inputs, source_for, numbered_map_sink)
        job = member.new_job(pipeline, JobConfig(
            name=JOB, processing_guarantee="exactly_once",
            snapshot_interval_ms=case["snapshot_interval_ms"]))
    # at most a minute: the status is recorded as it is then
    poll_until(lambda: job.status in (JobStatus.RUNNING, JobStatus.COMPLETED, JobStatus.FAILED),
               timeout=60, interval=0.005)
    # what the member's log says: the job was running when the last process died, and the
    # snapshot its execution was restored from
    was = [m.group(1) for line in captured.lines
           for m in [re.search(r"was (\w+) when the member stopped: resuming it", line)] if m]
    restored = [int(m.group(1)) for line in captured.lines
                for m in [re.search(r"restored from snapshot (\d+)", line)] if m]
    with open(work / "starts.jsonl", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "existed": existed, "status": job.status.value,
                            "resumed_from": was[-1] if was else None,
                            "restored_snapshot": restored[-1] if restored else None,
                            "final": final}) + "\n")

    progress = work / "progress.json"
    while True:
        status = job.status
        last = job.last_snapshot
        _write_atomically(progress, json.dumps({
            "pid": os.getpid(), "status": status.value,
            "snapshot": last.snapshot_id if last is not None else -1}))
        if status == JobStatus.FAILED:
            print(f"job failed: {job.failure}", file=sys.stderr)
            member.shutdown()
            return 1
        if status == JobStatus.COMPLETED and final:
            break
        time.sleep(0.005)

    sinks, gaps = {}, []
    for label in sink_labels(spec):
        items, missing = read_numbered_map(member.get_map(label))
        sinks[label] = items
        gaps += [f"{label}: {g}" for g in missing]
    with open(work / "result.pickle.tmp", "wb") as f:
        pickle.dump({"sinks": sinks, "gaps": gaps, "metrics": job.metrics()}, f)
    os.replace(work / "result.pickle.tmp", work / "result.pickle")
    member.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
