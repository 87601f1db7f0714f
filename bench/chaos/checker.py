"""The exactly-once check of a chaos run: the job keeps a running ``[sum, count]`` per key
(its state) and writes it after each input record, so a ``read_committed`` reader must read,
key by key and in order, exactly the running sums of the acknowledged input: a record lost
or counted twice shifts every later count of its key, and a wrong restore of the state shifts
every later sum."""

from __future__ import annotations

from typing import Any


def running_states(events: list[tuple[str, int]]) -> dict[str, list[list[int]]]:
    """Key -> the state after each of its records, in order: ``[sum, count]``."""
    out: dict[str, list[list[int]]] = {}
    state: dict[str, list[int]] = {}
    for key, value in events:
        s = state.setdefault(key, [0, 0])
        s[0] += value
        s[1] += 1
        out.setdefault(key, []).append(list(s))
    return out


def check_output(events: list[tuple[str, int]], records: list[tuple[str, Any]],
                 state: dict[str, Any] | None) -> list[str]:
    """What is wrong (an empty list when nothing is): the output records ``(key, [sum,
    count])`` against the input ``events``, and the job's final ``state`` (key -> [sum,
    count]; None when it could not be read, which is a failure too)."""
    problems: list[str] = []
    want = running_states(events)
    got: dict[str, list[list[int]]] = {}
    for key, value in records:
        got.setdefault(key, []).append(list(value))
    if len(records) != len(events):
        problems.append(f"{len(records):,} output records for {len(events):,} input records")
    for key in sorted(set(want) | set(got)):
        w, g = want.get(key, []), got.get(key, [])
        if w == g:
            continue
        first = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
        problems.append(f"key {key}: {len(g)} outputs for {len(w)} inputs; first difference at "
                        f"its output {first}: got {g[first] if first < len(g) else 'nothing'}, "
                        f"want {w[first] if first < len(w) else 'nothing'}")
    final = {k: v[-1] for k, v in want.items()}
    if state is None:
        problems.append("the job's final state could not be read")
    else:
        got_state = {str(k): list(v) for k, v in state.items()}
        if got_state != final:
            wrong = sorted(k for k in set(final) | set(got_state)
                           if final.get(k) != got_state.get(k))
            problems.append(f"final state differs for {len(wrong)} key(s), e.g. {wrong[0]}: "
                            f"got {got_state.get(wrong[0])}, want {final.get(wrong[0])}")
    return problems
