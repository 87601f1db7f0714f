"""The user functions of the conformance pipelines, in plain Python.

A record is ``(ts, key, value, seq)``: its event time, the key that chose its partition, a small
int and a number unique to the record in its source. A pipeline spec names these functions;
the pipeline builder hands them to jetwake and the model calls the very same ones, so the two
can only disagree about what the engine does with them, never about the user's code. They are
module-level functions so that a pipeline holding them pickles by reference.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["Record", "event_time", "key_of", "value_of", "rank_of", "STATELESS",
           "new_state", "count_and_sum", "evicted_state"]

Record = tuple  # (ts, key, value, seq)


def event_time(r: Record) -> int:
    """The timestamp function of every source."""
    return r[0]


def key_of(r: Record) -> Any:
    """The key of every keyed stage: the key that chose the record's partition."""
    return r[1]


def value_of(r: Record) -> int:
    return r[2]


def rank_of(r: Record) -> tuple:
    """A total order on distinct records (``max`` picks by it: no ties but equal records)."""
    return (r[2], r[3], r[0], r[1])


# --- stateless stages: records in, records (or nothing) out -----------------------------------

def bump(r: Record) -> Record:
    """map: the value plus one."""
    return (r[0], r[1], r[2] + 1, r[3])


def drop_13(r: Record) -> Record | None:
    """map returning None for some records (the map drops them)."""
    return None if r[2] % 13 == 0 else r


def not_multiple_of_5(r: Record) -> bool:
    """filter."""
    return r[2] % 5 != 0


def echo_odd(r: Record) -> list[Record]:
    """flat_map: an odd-valued record twice (the echo's value + 1000), an even one once."""
    if r[2] % 2:
        return [r, (r[0], r[1], r[2] + 1000, r[3])]
    return [r]


def none_on_7(r: Record) -> list[Record] | None:
    """flat_map returning None (no items) for some records."""
    return None if r[2] % 7 == 0 else [r]


STATELESS: dict[str, tuple[str, Callable[[Record], Any]]] = {
    "bump": ("map", bump),
    "drop_13": ("map", drop_13),
    "not_multiple_of_5": ("filter", not_multiple_of_5),
    "echo_odd": ("flat_map", echo_odd),
    "none_on_7": ("flat_map", none_on_7),
}
"""The stateless functions a spec may name: name -> (stage kind, function)."""


# --- map_stateful -----------------------------------------------------------------------------

def new_state() -> list:
    """A key's state: [records seen, sum of their values]."""
    return [0, 0]


def count_and_sum(state: list, key: Any, r: Record) -> Record | None:
    """Counts the key's records and sums their values; emits the record with the running sum
    as its value (so a window can follow), or nothing for a value divisible by 4."""
    state[0] += 1
    state[1] += r[2]
    if r[2] % 4 == 0:
        return None
    return (r[0], key, state[1], r[3])


def evicted_state(state: list, key: Any) -> tuple:
    """on_evict: what the key's state held when it expired (not the watermark, which no test
    controls)."""
    return ("evicted", key, state[0], state[1])
