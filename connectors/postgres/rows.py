"""How items become rows of a PostgreSQL table: one rule for every writer of the sink (a
member's processor and the Spark backfill's tasks).

``value_fn(item)`` (the item itself without one) gives either a ``dict`` of column -> value or
a ``tuple``/``list`` of values in ``columns`` order. ``columns`` is the list the sink writes:
given by the user, or, with ``columns=None``, the table's columns read from the catalog when
the sink starts (:func:`jetwake.connectors.postgres.statements.table_columns`), in their
order, generated columns left out. A dict must name exactly those columns (a column with a
default that is to be left out, such as a ``serial`` id, is left out of ``columns``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["PostgresSinkError", "RowMaker", "describe_item", "row_key_fn"]


class PostgresSinkError(ValueError):
    """A PostgreSQL sink cannot write: bad settings, a table or a row that does not fit."""


def describe_item(item: Any, limit: int = 200) -> str:
    """A short repr of an item for error messages."""
    text = repr(item)
    return text if len(text) <= limit else text[:limit] + "..."


class RowMaker:
    """Turns items into tuples of values in ``columns`` order, or fails naming the item and the
    fix. ``where`` names the sink in messages (``Sinks.postgres('orders')``)."""

    def __init__(self, columns: Sequence[str], value_fn: Callable[[Any], Any] | None,
                 where: str) -> None:
        self.columns = tuple(columns)
        self.value_fn = value_fn
        self.where = where
        self._names = frozenset(self.columns)

    def row(self, item: Any) -> tuple:
        """The row of one item."""
        try:
            value = item if self.value_fn is None else self.value_fn(item)
        except Exception as e:
            raise PostgresSinkError(
                f"{self.where}: value_fn failed on item {describe_item(item)}: "
                f"{type(e).__name__}: {e}") from e
        t = type(value)
        if t is tuple or t is list:
            if len(value) != len(self.columns):
                raise PostgresSinkError(
                    f"{self.where}: the row of item {describe_item(item)} has {len(value)} "
                    f"value(s), the sink writes {len(self.columns)} column(s) "
                    f"{list(self.columns)}; make value_fn return one value per column in "
                    "that order (or a dict by column name), or pass columns=[...]")
            return tuple(value)
        if isinstance(value, dict):
            if len(value) != len(self.columns) or not self._names.issuperset(value):
                missing = [c for c in self.columns if c not in value]
                extra = [k for k in value if k not in self._names]
                raise PostgresSinkError(
                    f"{self.where}: the row of item {describe_item(item)} does not fit the "
                    f"columns {list(self.columns)}: missing {missing}, unknown {extra}; make "
                    "value_fn return a dict with exactly those keys, or pass columns=[...] "
                    "naming the columns it gives")
            return tuple(value[c] for c in self.columns)
        raise PostgresSinkError(
            f"{self.where}: item {describe_item(item)} gives a {t.__qualname__}, not a row; "
            "pass value_fn=... returning a dict (column -> value) or a tuple in columns order")

    def rows(self, items: list[Any]) -> list[Any]:
        """The rows of ``items``, in order. The common case, every value a tuple of the right
        length, costs one pass over them; anything else goes through :meth:`row`, which
        converts a dict or a list and names the item that does not fit."""
        fn = self.value_fn
        if fn is None:
            values = items
        else:
            try:
                values = [fn(item) for item in items]
            except Exception:
                return [self.row(item) for item in items]   # names the failing item
        n = len(self.columns)
        for v in values:
            if type(v) is not tuple or len(v) != n:
                return [self.row(item) for item in items]
        return values


def row_key_fn(value_fn: Callable[[Any], Any] | None, columns: Sequence[str] | None,
               key_columns: Sequence[str], where: str) -> Callable[[Any], Any]:
    """The function giving an item's key values (what an upsert sink partitions items by):
    read by name from a dict row, by position in ``columns`` from a tuple row."""
    positions = None if columns is None else [list(columns).index(k) for k in key_columns]
    keys = tuple(key_columns)

    def key(item: Any) -> Any:
        value = item if value_fn is None else value_fn(item)
        if isinstance(value, dict):
            try:
                return tuple(value[k] for k in keys)
            except KeyError:
                raise PostgresSinkError(
                    f"{where}: the row of item {describe_item(item)} has no value for the key "
                    f"column(s) {[k for k in keys if k not in value]}; make value_fn give "
                    "them") from None
        if isinstance(value, (tuple, list)):
            if positions is None:
                raise PostgresSinkError(
                    f"{where}: item {describe_item(item)} gives a tuple, but with key_columns "
                    "and no columns the key's place in it is unknown; pass columns=[...] "
                    "(the tuple's order) or make value_fn return a dict")
            if len(value) <= max(positions):
                raise PostgresSinkError(
                    f"{where}: the row of item {describe_item(item)} has {len(value)} "
                    f"value(s), the sink writes columns {list(columns or ())}; make value_fn "
                    "return one value per column in that order")
            return tuple(value[i] for i in positions)
        raise PostgresSinkError(
            f"{where}: item {describe_item(item)} gives a {type(value).__qualname__}, not a "
            "row; pass value_fn=... returning a dict (column -> value) or a tuple in columns "
            "order")
    return key
