"""What a job started from a snapshot does with the snapshot's saved state, stage by stage.

A snapshot's state is matched to the new job's vertices by name (snapshot/protocol/restore.py).
The commit record also keeps each vertex's kind of stage (:attr:`Vertex.kind`) and the shape
of its state (:attr:`Vertex.shape`: keyed or keyless, a window's definition), so the plan can
tell state a vertex of the new pipeline *takes over* (same name, kind and shape: a record
written before kinds were kept, or a vertex of the core API, matches by name alone) from
state the new job *drops* (no vertex of that name, one of another kind, or one whose state
has another shape), and lists the stateful stages of the new pipeline that *start empty*.

:func:`plan_upgrade` is the one rule: the dry run shows it (``JobConfig(dry_run=True)``,
``jetwake submit --dry-run``), the submission refuses a job that would drop state unless
``JobConfig(allow_state_drop=True)``, and each member's restore skips the dropped vertices.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from jetwake.engine.core.dag import DAG
from jetwake.engine.core.errors import StateDropRefusedError
from jetwake.snapshot.store.snapshot_store import CommitRecord

__all__ = ["UpgradePlan", "StagePlan", "plan_upgrade", "vertex_kinds", "TAKES_OVER", "DROPS",
           "STARTS_EMPTY"]

TAKES_OVER = "takes over"
DROPS = "drops"
STARTS_EMPTY = "starts empty"

#: kinds of stage whose vertices keep no state of their own: a new one is not listed as
#: starting empty (a sink that does save state, a transactional one, is matched like any)
_STATELESS_KINDS = {"map", "filter", "flat_map", "merge", "rebalance", "map-using-map", "sink",
                    "side-sink"}


def vertex_kinds(dag: DAG) -> tuple[dict[str, str], dict[str, str]]:
    """Vertex name -> kind of stage, and vertex name -> shape of its state, for the vertices
    of ``dag`` that have them (what a snapshot's commit record keeps)."""
    kinds, shapes = {}, {}
    for v in dag.vertices:
        kind = getattr(v, "kind", None)  # a DAG pickled by an older version has none
        shape = getattr(v, "shape", None)
        if kind:
            kinds[v.name] = kind
        if shape:
            shapes[v.name] = shape
    return kinds, shapes


@dataclass
class StagePlan:
    """One vertex's fate: ``outcome`` is "takes over", "drops" or "starts empty"; ``entries``
    and ``bytes`` are its saved state (0 when it starts empty); ``why`` explains a drop."""
    vertex: str
    outcome: str
    saved_kind: str | None = None
    new_kind: str | None = None
    entries: int = 0
    bytes: int = 0
    why: str = ""


@dataclass
class UpgradePlan:
    """What a job started from ``snapshot`` keeps, drops and starts empty (see the module
    doc). ``member.new_job(p, JobConfig(initial_snapshot_name=..., dry_run=True))`` returns
    it without starting anything."""
    snapshot: str
    job_name: str
    snapshot_id: int
    stages: list[StagePlan] = field(default_factory=list)
    #: the job was asked to start even if it drops state (JobConfig.allow_state_drop)
    allow_state_drop: bool = False

    @property
    def taken_over(self) -> list[str]:
        """The vertices whose saved state the new job restores."""
        return [s.vertex for s in self.stages if s.outcome == TAKES_OVER]

    @property
    def dropped(self) -> list[str]:
        """The vertices of the snapshot whose saved state the new job would not restore."""
        return [s.vertex for s in self.stages if s.outcome == DROPS]

    @property
    def started_empty(self) -> list[str]:
        """The stateful vertices of the new job that have no saved state to restore."""
        return [s.vertex for s in self.stages if s.outcome == STARTS_EMPTY]

    @property
    def drops_state(self) -> bool:
        return any(s.outcome == DROPS for s in self.stages)

    @property
    def refused(self) -> bool:
        """Whether the job would be refused: it drops state and that was not allowed."""
        return self.drops_state and not self.allow_state_drop

    def refusal(self, job_name: str) -> StateDropRefusedError:
        """The error that refuses to start ``job_name`` with this plan: the dropped stages,
        why, and the fixes."""
        drops = [s for s in self.stages if s.outcome == DROPS]
        listed = "; ".join(f"'{s.vertex}' ({s.entries} entries: {s.why})" for s in drops)
        hints = []
        for s in drops:
            renamed = [e.vertex for e in self.stages if e.outcome == STARTS_EMPTY
                       and e.new_kind is not None and e.new_kind == s.saved_kind]
            if renamed:
                hints.append(f"stage '{renamed[0]}' may be '{s.vertex}' renamed: "
                             f".set_name('{s.vertex}') keeps its state")
        hint = f" ({'; '.join(hints)})" if hints else ""
        return StateDropRefusedError(
            f"job '{job_name}' would drop saved state of snapshot '{self.snapshot}': {listed}. "
            f"Keep a stage's state by giving its stage the same name and kind as before "
            f"(Stage.set_name){hint}, or start without that state with "
            f"JobConfig(allow_state_drop=True) (`jetwake submit --allow-state-drop`); "
            f"`jetwake submit FILE --from-snapshot {self.snapshot} --dry-run` shows the plan")

    def to_dict(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "job_name": self.job_name,
                "snapshot_id": self.snapshot_id, "stages": [asdict(s) for s in self.stages],
                "taken_over": self.taken_over, "dropped": self.dropped,
                "started_empty": self.started_empty, "allow_state_drop": self.allow_state_drop,
                "refused": self.refused}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "UpgradePlan":
        known = StagePlan.__dataclass_fields__
        return cls(d["snapshot"], d["job_name"], d["snapshot_id"],
                   [StagePlan(**{k: v for k, v in s.items() if k in known})
                    for s in d.get("stages", ())], bool(d.get("allow_state_drop")))

    def describe(self) -> str:
        """The plan as lines of text, one per stage, grouped by outcome."""
        lines = [f"Upgrade from snapshot '{self.snapshot}' (job '{self.job_name}', snapshot "
                 f"{self.snapshot_id}):"]
        for outcome in (TAKES_OVER, DROPS, STARTS_EMPTY):
            stages = [s for s in self.stages if s.outcome == outcome]
            lines.append(f"  {outcome}: {len(stages)} stage(s)")
            for s in stages:
                kind = s.new_kind or s.saved_kind or "?"
                what = (f"{s.entries} entries, {s.bytes} bytes" if outcome != STARTS_EMPTY
                        else "no saved state")
                why = f" - {s.why}" if s.why else ""
                lines.append(f"    {s.vertex} [{kind}]: {what}{why}")
        if self.refused:
            lines.append("The job would be refused: it drops saved state (keep the stage's "
                         "name with set_name, or allow the drop: allow_state_drop=True, "
                         "--allow-state-drop)")
        elif self.drops_state:
            lines.append("The job would start, dropping that state (allow_state_drop)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def plan_upgrade(dag: DAG, rec: CommitRecord, allow_state_drop: bool = False) -> UpgradePlan:
    """The plan of a job of ``dag`` started from the snapshot ``rec`` (see the module doc)."""
    new_kinds = {v.name: getattr(v, "kind", None) for v in dag.vertices}
    new_shapes = {v.name: getattr(v, "shape", None) for v in dag.vertices}
    plan = UpgradePlan(rec.name or f"snapshot {rec.snapshot_id}", rec.job_name,
                       rec.snapshot_id, allow_state_drop=allow_state_drop)
    saved = set()
    for vertex in sorted(rec.files):
        procs = rec.files[vertex].values()
        entries = sum(f[0] for f in procs)
        if not entries:
            continue
        saved.add(vertex)
        size = sum(f[2] for f in procs)
        saved_kind = rec.kinds.get(vertex)
        if vertex not in new_kinds:
            plan.stages.append(StagePlan(vertex, DROPS, saved_kind, None, entries, size,
                                         "no stage of this name in the new pipeline"))
            continue
        new_kind = new_kinds[vertex]
        if saved_kind and new_kind and saved_kind != new_kind:
            plan.stages.append(StagePlan(vertex, DROPS, saved_kind, new_kind, entries, size,
                                         f"was a {saved_kind} stage, is a {new_kind} stage "
                                         "now"))
            continue
        saved_shape, new_shape = rec.shapes.get(vertex), new_shapes.get(vertex)
        if saved_kind and saved_shape and new_shape and saved_shape != new_shape:
            plan.stages.append(StagePlan(vertex, DROPS, saved_kind, new_kind, entries, size,
                                         f"its state does not fit: it was {saved_shape}, it "
                                         f"is {new_shape} now"))
            continue
        plan.stages.append(StagePlan(vertex, TAKES_OVER, saved_kind, new_kind, entries, size))
    for v in dag.vertices:
        kind = new_kinds[v.name]
        if v.name not in saved and kind and kind.split("/")[0] not in _STATELESS_KINDS:
            plan.stages.append(StagePlan(v.name, STARTS_EMPTY, None, kind))
    return plan
