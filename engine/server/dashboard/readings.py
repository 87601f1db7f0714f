"""What the dashboard reads from one member: its share of each running job, and its process.

A member runs its share of a job's processors (in a cluster, every member runs one); this
module reads them where they run: per vertex, items in and out (and their rates), the fullest
inbound queue, the watermark and its lag behind the wall clock, the counters processors keep
(late events, dead letters...) and, for a Kafka source, the lag of every partition it reads.

Rates need two readings some time apart, so a :class:`ThroughputSampler` per member reads the
item counters once a second, keeping the last five minutes: the jobs list draws them as
sparklines and the job page shows the current rate per vertex. It starts the first time the
dashboard asks a member for its share (a member nobody looks at samples nothing) and stops when
the member shuts down.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.server.member import Member

__all__ = ["ThroughputSampler", "sampler_of", "local_tasklets", "member_share",
           "process_usage", "merge_shares", "HISTORY_POINTS"]

_NO_WATERMARK = -(2**63)
#: rate points a share carries (one a second): the sparklines' two minutes
HISTORY_POINTS = 120


def local_tasklets(member: "Member") -> dict[str, list]:
    """This member's running processors, per job id: its share of each execution (whichever
    member coordinates it; a member alone coordinates its own)."""
    out: dict[str, list] = {}
    for ex in member.participant.running():
        execution = ex.execution
        if execution is not None and not execution.finished.is_set():
            out.setdefault(ex.job_id, []).extend(execution.tasklets)
    return out


def _vertex_readings(tasklets: list, now_ms: float) -> dict[str, dict]:
    """Per vertex: processors, items in/out, queue fill, watermark, counters, Kafka lag."""
    out: dict[str, dict] = {}
    for t in tasklets:
        name = t.context.vertex_name
        v = out.setdefault(name, {"processors": 0, "items_in": 0, "items_out": 0,
                                  "queue_fill": 0.0, "watermark": None,
                                  "watermark_lag_ms": None, "counters": {}, "kafka": []})
        v["processors"] += 1
        v["items_in"] += t.items_in
        v["items_out"] += t.items_out
        try:
            v["queue_fill"] = max(v["queue_fill"], float(t.input_queue_fill()))
        except Exception:  # noqa: BLE001 - queues being torn down as the execution ends
            pass
        wm = t.coalescer.last_emitted if t.coalescer is not None else None
        if isinstance(wm, int) and wm > _NO_WATERMARK and wm > 0:
            # the vertex's watermark is its slowest processor's
            v["watermark"] = wm if v["watermark"] is None else min(v["watermark"], wm)
            lag = max(0.0, now_ms - wm)
            v["watermark_lag_ms"] = max(v["watermark_lag_ms"] or 0.0, lag)
        for key, value in list(t.context.metrics.items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                v["counters"][key] = v["counters"].get(key, 0) + value
        lags = t.processor.partition_lag()
        if lags:
            v["kafka"].extend(lags)
    return out


class ThroughputSampler:
    """Reads a member's item counters per job and vertex once a second (see the module doc).

    ``series(job_id)`` gives ``[(time, {vertex: (items_in, items_out)})]``, oldest first;
    counters start again at 0 with each execution, which :meth:`rates` takes into account."""

    INTERVAL_S = 1.0
    KEEP = 300  # five minutes of readings

    def __init__(self, member: Any) -> None:
        self._member = weakref.ref(member)
        self._series: dict[str, collections.deque] = {}
        self._lock = threading.Lock()
        self._cpu_last = (time.monotonic(), _cpu_seconds())
        self.cpu_percent: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="jetwake-dashboard-sampler")

    def start(self) -> "ThroughputSampler":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            member = self._member()
            # a member that is gone or shut down has nothing more to show
            if member is None or member.shutting_down:
                return
            del member  # the weak reference must not be kept alive by this frame
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - an execution ending while it is read
                pass

    def sample(self) -> None:
        """Takes one reading of every running job's counters (and the process's CPU)."""
        member = self._member()
        if member is None:
            return
        now = time.time()
        current = {job_id: _counts(tasklets)
                   for job_id, tasklets in local_tasklets(member).items()}
        with self._lock:
            for job_id, counts in current.items():
                series = self._series.get(job_id)
                if series is None:
                    series = self._series[job_id] = collections.deque(maxlen=self.KEEP)
                series.append((now, counts))
            for job_id in [j for j, s in self._series.items()
                           if j not in current and now - s[-1][0] > self.KEEP]:
                del self._series[job_id]  # a job that stopped long ago
        mono, cpu = time.monotonic(), _cpu_seconds()
        last_mono, last_cpu = self._cpu_last
        if mono - last_mono >= 0.5:
            self.cpu_percent = round(100.0 * (cpu - last_cpu) / (mono - last_mono), 1)
            self._cpu_last = (mono, cpu)

    def job_ids(self) -> set[str]:
        """The jobs with readings (running now, or stopped within the last five minutes)."""
        with self._lock:
            return set(self._series)

    def series(self, job_id: str) -> list[tuple[float, dict[str, tuple[int, int]]]]:
        with self._lock:
            return list(self._series.get(job_id, ()))

    def rates(self, job_id: str, points: int = HISTORY_POINTS) -> list[list]:
        """``[[time, {vertex: [in_per_s, out_per_s]}], ...]`` over the last ``points``
        readings; a reading older than three intervals ends with a zero rate (the job stopped
        running here)."""
        series = self.series(job_id)[-(points + 1):]
        out: list[list] = []
        for (t0, c0), (t1, c1) in zip(series, series[1:]):
            dt = max(t1 - t0, 1e-3)
            step = {}
            for vertex, (i1, o1) in c1.items():
                i0, o0 = c0.get(vertex, (0, 0))
                # a new execution starts counting from 0: its count is the rate's numerator
                di = i1 - i0 if i1 >= i0 else i1
                do = o1 - o0 if o1 >= o0 else o1
                step[vertex] = [round(di / dt, 1), round(do / dt, 1)]
            out.append([round(t1, 3), step])
        if series and time.time() - series[-1][0] > 3 * self.INTERVAL_S:
            out.append([round(time.time(), 3), {v: [0.0, 0.0] for v in series[-1][1]}])
        return out[-points:]


def _counts(tasklets: list) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for t in tasklets:
        i, o = out.get(t.context.vertex_name, (0, 0))
        out[t.context.vertex_name] = (i + t.items_in, o + t.items_out)
    return out


_samplers: "weakref.WeakKeyDictionary[Any, ThroughputSampler]" = weakref.WeakKeyDictionary()
_samplers_lock = threading.Lock()


def sampler_of(member: Any) -> ThroughputSampler:
    """The member's sampler, started the first time it is asked for."""
    with _samplers_lock:
        sampler = _samplers.get(member)
        if sampler is None:
            sampler = _samplers[member] = ThroughputSampler(member).start()
        return sampler


def member_share(member: "Member", job_id: str | None = None) -> dict[str, dict]:
    """This member's share of its running jobs (or of ``job_id`` only): per job id, the
    readings of each vertex (see the module doc) with its current rates, and the rates over
    the last two minutes (``history``)."""
    sampler = sampler_of(member)
    now_ms = time.time() * 1000
    out: dict[str, dict] = {}
    running = local_tasklets(member)
    jobs = [job_id] if job_id is not None else sorted(set(running) | sampler.job_ids())
    for j in jobs:
        history = sampler.rates(j)
        vertices = _vertex_readings(running.get(j, []), now_ms)
        latest = history[-1][1] if history else {}
        for name, v in vertices.items():
            v["in_per_s"], v["out_per_s"] = latest.get(name, [0.0, 0.0])
        if vertices or history:
            out[j] = {"vertices": vertices, "history": history}
    return out


def merge_shares(shares: list[dict]) -> dict:
    """One job's readings over the shares of several members: counts and rates add up, the
    fullest queue and the largest watermark lag count, the watermark is the lowest, Kafka
    partitions are listed from every member; histories add up point by point from the
    newest (each member reads its own counters once a second)."""
    vertices: dict[str, dict] = {}
    for share in shares:
        for name, v in share.get("vertices", {}).items():
            m = vertices.get(name)
            if m is None:
                vertices[name] = {**v, "counters": dict(v["counters"]),
                                  "kafka": list(v["kafka"])}
                continue
            for key in ("processors", "items_in", "items_out", "in_per_s", "out_per_s"):
                m[key] = m.get(key, 0) + v.get(key, 0)
            m["queue_fill"] = max(m["queue_fill"], v["queue_fill"])
            if v["watermark"] is not None:
                m["watermark"] = v["watermark"] if m["watermark"] is None \
                    else min(m["watermark"], v["watermark"])
                m["watermark_lag_ms"] = max(m["watermark_lag_ms"] or 0.0,
                                            v["watermark_lag_ms"] or 0.0)
            for key, value in v["counters"].items():
                m["counters"][key] = m["counters"].get(key, 0) + value
            m["kafka"].extend(v["kafka"])
    histories = [s.get("history", []) for s in shares if s.get("history")]
    history: list[list] = []
    if histories:
        longest = max(histories, key=len)
        for back in range(1, len(longest) + 1):
            step: dict[str, list[float]]
            t, step = longest[-back][0], {}
            for h in histories:
                if back <= len(h):
                    for vertex, (ri, ro) in h[-back][1].items():
                        si, so = step.get(vertex, [0.0, 0.0])
                        step[vertex] = [round(si + ri, 1), round(so + ro, 1)]
            history.append([t, step])
        history.reverse()
    return {"vertices": vertices, "history": history}


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


_usage_lock = threading.Lock()
_usage_last: list[float] = []  # [monotonic, cpu seconds] of the last reading


def process_usage(member: Any | None = None) -> dict:
    """This process: pid, resident memory (bytes; None where /proc is not there), CPU use
    (percent of one core over the last reading interval) and threads."""
    rss = None
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    cpu = None
    if member is not None:
        cpu = sampler_of(member).cpu_percent
    if cpu is None:  # no sampler reading yet: since the last call, or since the start
        with _usage_lock:
            mono, used = time.monotonic(), _cpu_seconds()
            if _usage_last and mono - _usage_last[0] > 0.05:
                cpu = round(100.0 * (used - _usage_last[1]) / (mono - _usage_last[0]), 1)
            _usage_last[:] = [mono, used]
    return {"pid": os.getpid(), "rss_bytes": rss, "cpu_percent": cpu,
            "threads": threading.active_count()}
