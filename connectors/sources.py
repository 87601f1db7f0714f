"""Sources: the catalogue of pipeline sources (Jet's ``Sources``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Iterable

from ..engine.meta_supplier import ProcessorMetaSupplier
from ..engine.pipeline.connector import Source
from .files import FileSourceProcessor
from .items import ItemsSourceProcessor
from .maps import MapJournalSourceProcessor, MapSourceProcessor

__all__ = ["Sources"]


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where} needs a non-empty name, got {name!r}")
    return name


class Sources:
    """Factories of pipeline sources."""

    @staticmethod
    def items(items: Iterable[Any]) -> Source:
        """The given items, in order (a batch). The iterable is read when this is called."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise TypeError(f"Sources.items() expects an iterable of items (a list, tuple, "
                            f"range...), got {type(items).__qualname__}")
        data = items if isinstance(items, Sequence) else list(items)
        return Source("items", ProcessorMetaSupplier.of(lambda: ItemsSourceProcessor(data), 1))

    @staticmethod
    def files(pattern: str, encoding: str = "utf-8") -> Source:
        """The lines (without line endings) of every file matching the glob ``pattern``."""
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"Sources.files() needs a glob pattern such as 'data/*.txt', "
                             f"got {pattern!r}")
        directory = os.path.dirname(pattern) or "."
        if not any(c in directory for c in "*?[") and not os.path.isdir(directory):
            raise FileNotFoundError(f"Sources.files({pattern!r}): directory {directory!r} "
                                    "does not exist")
        return Source("files", ProcessorMetaSupplier.of(
            lambda: FileSourceProcessor(pattern, encoding), 1))

    @staticmethod
    def map(name: str) -> Source:
        """The entries of a member's named map as (key, value) tuples (a batch)."""
        _check_name(name, "Sources.map()")
        return Source(f"map-source-{name}",
                      ProcessorMetaSupplier.of(lambda: MapSourceProcessor(name)))

    @staticmethod
    def map_journal(name: str, start: str = "oldest", on_overrun: str = "fail") -> Source:
        """An unbounded stream of ``(key, new_value)`` for each put into the member's map.

        ``start``: "oldest" (every event still in the journal) or "current" (events after the
        job starts). Replayable: the position is saved in snapshots. ``on_overrun``: "fail"
        (default) or "skip" when the bounded journal dropped unread events.
        """
        _check_name(name, "Sources.map_journal()")
        if start not in ("oldest", "current"):
            raise ValueError(f"Sources.map_journal(start=...) must be 'oldest' or 'current', "
                             f"got {start!r}")
        if on_overrun not in ("fail", "skip"):
            raise ValueError(f"Sources.map_journal(on_overrun=...) must be 'fail' or 'skip', "
                             f"got {on_overrun!r}")
        return Source(f"map-journal-{name}", ProcessorMetaSupplier.of(
            lambda: MapJournalSourceProcessor(name, start, on_overrun), 1), is_stream=True)
