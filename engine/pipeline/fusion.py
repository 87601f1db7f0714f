"""Stateless stages (map, filter, flat_map): their semantics, and their fusion into one function
over a chunk.

The semantics are written once, here, as functions over a chunk of items: a map whose function
returns None drops the item (as in Jet), a filter keeps the items its function holds true, a
flat map emits every item of the iterable its function returns (None meaning none). A stage on
timestamped values runs the same functions with its user function adapted to them
(``event_time.adapt_to_timestamped``).

Consecutive stateless stages create no vertex: the planner fuses them into a
:class:`FusedChain` that runs on the edge leaving the upstream processor, before routing, so a
chain costs one list comprehension per stage per chunk and no extra processor or queue hop: in
CPython a call or a queue hop per item costs more than the work of a typical stage
(docs/architecture.md, "Execution"). The chain still answers for each stage the user wrote:

- it counts the items each stage takes and gives, per chunk (``len`` of the lists, never per
  item), in one instance per upstream processor (``EdgeTransform.for_processor``); the job's
  metrics show them under the stage's name (``execution_metrics.stage_counts``);
- an exception raised by a stage's function gets a note naming the stage, its kind and the
  vertex it was fused into (:func:`fused_stage_of` reads it back), and keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from jetwake.engine.core.edge_transform import EdgeTransform
from jetwake.engine.pipeline.event_time import adapt_to_timestamped, unwrap
from jetwake.engine.processors.table_join import drop_table_markers

__all__ = ["FusedStep", "FusedChain", "stateless_function", "stateless_step",
           "unwrap_step", "internal_step", "note_stage", "stage_of_note", "fused_stage_of"]


# --- the semantics, once -------------------------------------------------------------------

def _map(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    # as in Jet, a map function returning None drops the item
    return lambda items: [y for y in map(fn, items) if y is not None]


def _filter(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda items: [x for x in items if fn(x)]


def _flat_map(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda items: [y for x in items for y in (fn(x) or ())]


_KINDS: dict[str, Callable[[Callable[[Any], Any]], Callable[[list[Any]], list[Any]]]] = {
    "map": _map, "filter": _filter, "flat_map": _flat_map,
}


# the same on timestamped values, ``(timestamp, item)``: ``fn`` sees the item and its results
# keep the item's timestamp; written out rather than composed with an adapter
# (``event_time.adapt_to_timestamped``), which would add a Python call per item (about 10 ns
# of the 70 a filter costs an item)
def _map_timestamped(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda values: [(v[0], y) for v in values for y in [fn(v[1])] if y is not None]


def _filter_timestamped(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda values: [v for v in values if fn(v[1])]


_KINDS_TIMESTAMPED: dict[str, Callable[[Callable[[Any], Any]],
                                       Callable[[list[Any]], list[Any]]]] = {
    "map": _map_timestamped, "filter": _filter_timestamped,
    "flat_map": lambda fn: _flat_map(adapt_to_timestamped("flat_map", fn)),
}


def stateless_function(kind: str, fn: Callable[[Any], Any],
                       timestamped: bool = False) -> Callable[[list[Any]], list[Any]]:
    """The function over a chunk of a stateless stage of ``kind`` with user function ``fn``;
    ``timestamped``: the chunk holds timestamped values, which keep their timestamps."""
    make = (_KINDS_TIMESTAMPED if timestamped else _KINDS).get(kind)
    if make is None:
        raise ValueError(f"unknown stateless stage kind {kind!r}: expected one of "
                         f"{sorted(_KINDS)}")
    return make(fn)


# --- fused chains ------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class FusedStep:
    """One step of a fused chain: a stateless stage the user wrote, or a step the planner adds
    for a stage (taking the timestamps off, a window join's pairing).

    ``stage`` and ``kind`` name it in errors; ``user_stage`` steps have their counts shown in
    the metrics under ``stage``.
    """
    stage: str
    kind: str
    apply: Callable[[list[Any]], list[Any]]
    user_stage: bool = True


def stateless_step(stage: str, kind: str, fn: Callable[[Any], Any],
                   timestamped: bool) -> FusedStep:
    """The step of the user's stateless stage ``stage``."""
    return FusedStep(stage, kind, stateless_function(kind, fn, timestamped))


def unwrap_step(stage: str) -> FusedStep:
    """The step that takes the timestamps off the values ``stage`` emits, for a consumer that
    works on items."""
    return FusedStep(stage, "removing timestamps", unwrap, user_stage=False)


def changelog_step(stage: str) -> FusedStep:
    """The step that turns a table source's changelog (``ItemForm.TABLE_CHANGELOG``) into its
    ``(key, value)`` items, for a consumer that is not a table join."""
    return FusedStep(stage, "reading a table changelog", drop_table_markers, user_stage=False)


def internal_step(stage: str, kind: str, fn: Callable[[Any], Any]) -> FusedStep:
    """A flat map the planner adds to the output of ``stage`` (a window join pairs its
    co-grouped results this way); it is part of that stage, not a stage of its own."""
    return FusedStep(stage, kind, _flat_map(fn), user_stage=False)


_NOTE_PREFIX = "jetwake: in "


class FusedChain(EdgeTransform):
    """The steps fused onto one edge, applied in order to each chunk.

    ``vertex``: the vertex whose output the chain runs on. ``reported[i]``: whether step ``i``'s
    counts are this stage's counts in the metrics (a stage whose output feeds two consumers runs
    on both edges and is reported from one). Each processor applies its own instance
    (:meth:`for_processor`), whose ``counts`` hold, for step ``i``, the items in at ``2 * i``
    and the items out at ``2 * i + 1``.
    """

    def __init__(self, steps: Sequence[FusedStep], vertex: str,
                 reported: Sequence[bool] | None = None) -> None:
        if not steps:
            raise ValueError("a fused chain needs at least one step")
        self.steps = tuple(steps)
        self.vertex = vertex
        self.reported = tuple(reported) if reported is not None else \
            tuple(s.user_stage for s in self.steps)
        if len(self.reported) != len(self.steps):
            raise ValueError(f"reported has {len(self.reported)} flags for "
                             f"{len(self.steps)} steps")
        self._applies = tuple(s.apply for s in self.steps)
        self.counts = [0] * (2 * len(self.steps))

    def for_processor(self) -> "FusedChain":
        return FusedChain(self.steps, self.vertex, self.reported)

    def __call__(self, items: list[Any]) -> list[Any]:
        counts = self.counts
        i = 0
        for apply in self._applies:
            counts[i] += len(items)
            try:
                items = apply(items)
            except Exception as e:
                self._name_stage(e, i // 2)
                raise
            counts[i + 1] += len(items)
            if not items:
                break
            i += 2
        return items

    def _name_stage(self, error: Exception, index: int) -> None:
        step = self.steps[index]
        note_stage(error, f"stage {step.stage!r} ({step.kind}) fused into vertex "
                          f"{self.vertex!r}")

    def stage_counts(self) -> Iterator[tuple[FusedStep, int, int]]:
        """``(step, items in, items out)`` of every step reported in the metrics."""
        counts = self.counts
        for i, step in enumerate(self.steps):
            if self.reported[i]:
                yield step, counts[2 * i], counts[2 * i + 1]

    def __repr__(self) -> str:
        return (f"FusedChain({', '.join(f'{s.stage}:{s.kind}' for s in self.steps)} "
                f"on {self.vertex!r})")


def note_stage(error: BaseException, where: str) -> None:
    """Adds the note :func:`fused_stage_of` reads: ``where`` names the stage that raised."""
    error.add_note(_NOTE_PREFIX + where)


def fused_stage_of(error: BaseException) -> str | None:
    """For an exception raised in a fused stage, "stage 'name' (kind) fused into vertex
    'vertex'"; None for any other."""
    for note in getattr(error, "__notes__", ()):
        stage = stage_of_note(note)
        if stage is not None:
            return stage
    return None


def stage_of_note(note: Any) -> str | None:
    """The stage a note of :func:`note_stage` names (also as printed in a traceback's text);
    None for any other note."""
    if isinstance(note, str) and note.startswith(_NOTE_PREFIX):
        return note[len(_NOTE_PREFIX):]
    return None
