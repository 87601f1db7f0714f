"""How commands print: times, sizes, durations, aligned tables and the JSON of jobs and
snapshots (``--json``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

__all__ = ["format_time", "format_size", "format_duration", "table", "snapshot_json",
           "job_json", "print_json"]


def format_time(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def format_size(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def format_duration(s: float) -> str:
    """``1h2m5s``: the largest unit first, no zero units before it."""
    s = int(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d"] if d else []
    if d or h:
        parts.append(f"{h}h")
    if d or h or m:
        parts.append(f"{m}m")
    parts.append(f"{s}s")
    return "".join(parts)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns aligned on the widest cell, two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def snapshot_json(d: dict | None) -> dict | None:
    """The JSON form of a snapshot's commit record (``list-snapshots --json``)."""
    if d is None:
        return None
    return {"name": d.get("name"), "job_id": d.get("job_id"), "job_name": d.get("job_name"),
            "snapshot_id": d.get("snapshot_id"),
            "created": datetime.fromtimestamp(d["created"]).isoformat(timespec="seconds"),
            "created_time": d.get("created"), "duration_ms": round(d.get("duration_ms", 0), 3),
            "entry_count": d.get("entry_count"), "size_bytes": d.get("size_bytes"),
            "terminal": d.get("terminal")}


def job_json(info: dict) -> dict:
    """The JSON form of a job (``status --json``, ``list-jobs --json``)."""
    cfg = info.get("config") or {}
    return {"id": info["id"], "name": info["name"], "status": info["status"],
            "submitted": info.get("submitted"), "submission_time": info.get("submission_time"),
            "completion_time": info.get("completion_time"), "failure": info.get("failure"),
            "processing_guarantee": cfg.get("processing_guarantee"),
            "snapshot_interval_ms": cfg.get("snapshot_interval_ms"),
            "initial_snapshot_name": cfg.get("initial_snapshot_name"),
            "last_snapshot": snapshot_json(info.get("last_snapshot")),
            "snapshot_count": info.get("snapshot_count"),
            "restart_count": info.get("restart_count"), "light": bool(info.get("light"))}


def print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, default=str))
