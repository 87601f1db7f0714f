"""msgpack serialization for items on the wire and in snapshots.

Plain msgpack loses the difference between a tuple and a list, cannot carry sets, datetimes
or user classes, and must never fall back to pickle for bytes from a peer. This module packs
those types as msgpack extension types, so every process and host produces the same bytes for
the same value (the partition hash depends on it) and decoding never runs arbitrary code.

Packing is msgpack's (its ``default`` hook keeps a tuple a tuple, which msgspec's encoder,
packing tuples as arrays, cannot). Decoding is msgspec's msgpack decoder with the same
extension hook: the same values from the same bytes, about twice as fast on rows of dicts and
strings. A chunk of items that travels between members is packed by :func:`dumps_chunk`: a
chunk of tuples of one length (timestamped items, ``(key, value)`` pairs) goes as one flat
array of their fields inside a ``_EXT_TUPLE_ROWS`` extension, so neither end makes a Python
call per tuple; :func:`loads` rebuilds the tuples with ``zip``.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import struct
import threading
import uuid as _uuid
from itertools import chain
from typing import Any, Callable

import msgpack
import msgspec

__all__ = ["dumps", "dumps_chunk", "loads", "register_type", "SerializationError",
           "POOLED_RESULT_MAX"]

_EXT_TUPLE = 1
_EXT_SET = 2
_EXT_FROZENSET = 3
_EXT_DATETIME = 4
_EXT_DATE = 5
_EXT_BIGINT = 6
_EXT_REGISTERED = 7
_EXT_TIMEDELTA = 8
# what a database row holds besides the above (PostgreSQL's numeric, uuid and time columns)
_EXT_DECIMAL = 9
_EXT_UUID = 10
_EXT_TIME = 11
# a list of tuples of one length k, packed as [k, flat fields] (dumps_chunk)
_EXT_TUPLE_ROWS = 12

# ids below 100 are jetwake's own; users register theirs from 100 up
BROADCAST_KEY_TYPE_ID = 1
WINDOW_RESULT_TYPE_ID = 2
KEYED_WINDOW_RESULT_TYPE_ID = 3

# type id -> (cls, to_fn, from_fn) and cls -> type id, for classes the user registers
_registered_by_id: dict[int, tuple[type, Callable[[Any], Any], Callable[[Any], Any]]] = {}
_registered_by_cls: dict[type, int] = {}


class SerializationError(TypeError):
    """A value jetwake cannot serialize or bytes it cannot decode."""


def register_type(type_id: int, cls: type, to_fn: Callable[[Any], Any],
                  from_fn: Callable[[Any], Any]) -> None:
    """Make instances of ``cls`` serializable.

    ``to_fn(obj)`` returns a msgpack-able value and ``from_fn(value)`` rebuilds the object.
    Every process that exchanges these objects must register the same id for the same class.
    """
    if not isinstance(type_id, int) or not 0 <= type_id < 2**16:
        raise ValueError(f"register_type: type_id must be an int in [0, 65535], got {type_id!r}")
    if not callable(to_fn) or not callable(from_fn):
        raise TypeError("register_type: to_fn and from_fn must be callables")
    known = _registered_by_id.get(type_id)
    if known is not None and known[0] is not cls:
        raise ValueError(
            f"register_type: id {type_id} is already used by {known[0].__qualname__}; "
            "pick another id")
    _registered_by_id[type_id] = (cls, to_fn, from_fn)
    _registered_by_cls[cls] = type_id


# an ExtType built without its constructor's Python-level argument checks (about a third of the
# cost of a small tuple): the code and the bytes passed here are always valid
_new_ext = tuple.__new__
_ExtType = msgpack.ExtType


def _default(obj: Any) -> Any:
    # strict_types=True sends subclasses and tuples here, so that a tuple stays a tuple;
    # registered classes first, since a NamedTuple is a tuple too
    type_id = _registered_by_cls.get(type(obj))
    if type_id is not None:
        _, to_fn, _ = _registered_by_id[type_id]
        return _new_ext(_ExtType, (_EXT_REGISTERED, _pack([type_id, to_fn(obj)])))
    if isinstance(obj, tuple):
        return _new_ext(_ExtType, (_EXT_TUPLE, _pack(list(obj))))
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        if -(2**63) <= obj < 2**64:
            return int(obj)
        return msgpack.ExtType(_EXT_BIGINT, str(int(obj)).encode())
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, frozenset):
        return msgpack.ExtType(_EXT_FROZENSET, _pack(sorted_if_possible(obj)))
    if isinstance(obj, set):
        return msgpack.ExtType(_EXT_SET, _pack(sorted_if_possible(obj)))
    if isinstance(obj, _dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, obj.isoformat().encode())
    if isinstance(obj, _dt.date):
        return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
    if isinstance(obj, _dt.timedelta):
        return msgpack.ExtType(
            _EXT_TIMEDELTA, _pack([obj.days, obj.seconds, obj.microseconds]))
    if isinstance(obj, _decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, _uuid.UUID):
        return msgpack.ExtType(_EXT_UUID, obj.bytes)
    if isinstance(obj, _dt.time):
        return msgpack.ExtType(_EXT_TIME, obj.isoformat().encode())
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    raise SerializationError(
        f"cannot serialize {type(obj).__qualname__} ({_short(obj)}): use msgpack-able values "
        "(None, bool, int, float, str, bytes, list, tuple, dict, set, datetime, date, time, "
        "timedelta, Decimal, UUID) or call "
        "jetwake.register_type() for this class")


def sorted_if_possible(values: Any) -> list[Any]:
    """Sets are packed in sorted order when their elements allow it, for stable bytes."""
    try:
        return sorted(values)
    except TypeError:
        return list(values)


def _ext_hook(code: int, data: Any) -> Any:
    # ``data`` is a memoryview into the buffer being decoded (msgspec's): used here, never kept
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    if code == _EXT_TUPLE_ROWS:
        k, flat = _unpack(data)
        if type(k) is not int or k < 1 or len(flat) % k:
            raise SerializationError(f"malformed tuple rows: {len(flat)} fields in rows of {k}")
        return list(zip(*[iter(flat)] * k))
    if code == _EXT_SET:
        return set(_unpack(data))
    if code == _EXT_FROZENSET:
        return frozenset(_unpack(data))
    if code == _EXT_DATETIME:
        return _dt.datetime.fromisoformat(str(data, "utf-8"))
    if code == _EXT_DATE:
        return _dt.date.fromisoformat(str(data, "utf-8"))
    if code == _EXT_TIMEDELTA:
        days, seconds, micros = _unpack(data)
        return _dt.timedelta(days=days, seconds=seconds, microseconds=micros)
    if code == _EXT_BIGINT:
        return int(str(data, "utf-8"))
    if code == _EXT_DECIMAL:
        return _decimal.Decimal(str(data, "utf-8"))
    if code == _EXT_UUID:
        return _uuid.UUID(bytes=bytes(data))
    if code == _EXT_TIME:
        return _dt.time.fromisoformat(str(data, "utf-8"))
    if code == _EXT_REGISTERED:
        type_id, payload = _unpack(data)
        entry = _registered_by_id.get(type_id)
        if entry is None:
            raise SerializationError(
                f"received a registered type id {type_id} that this process does not know: "
                "call jetwake.register_type() with the same id in every process")
        return entry[2](payload)
    return msgpack.ExtType(code, bytes(data))


POOLED_RESULT_MAX = 1 << 20
"""A packer that produced more than this many bytes is dropped rather than kept: its buffer
has grown to that size and would stay allocated."""

_packers = threading.local()


def _pack(obj: Any) -> bytes:
    # ``msgpack.packb`` makes a Packer, with a 256 KiB buffer, per call: for a small value that
    # allocation is most of the cost, and a tuple (one nested pack, see _default) made two at
    # once, which the allocator served with mmap and page faults (about 13 µs for ("k", 1)).
    # So each thread keeps its packers: a pack takes a free one (a nested pack, in _default
    # while the outer one is packing, takes another) and gives it back when done.
    try:
        free = _packers.free
    except AttributeError:
        free = _packers.free = []
    packer = free.pop() if free else msgpack.Packer(default=_default, strict_types=True,
                                                    use_bin_type=True)
    data: bytes = packer.pack(obj)  # a packer that raised is not given back: its state is unknown
    if len(data) <= POOLED_RESULT_MAX:
        free.append(packer)
    return data


_unpack: Callable[[bytes | bytearray | memoryview], Any] = msgspec.msgpack.Decoder(
    ext_hook=_ext_hook).decode


_EXT32_HEADER = struct.Struct(">BIb")


def _tuple_rows_width(items: list[Any]) -> int:
    """k when ``items`` are all plain tuples of one length k >= 1, else 0: a few C-level
    passes, no Python call per item."""
    if not items or set(map(type, items)) != {tuple}:
        return 0
    lengths = set(map(len, items))
    if len(lengths) != 1:
        return 0
    (k,) = lengths
    return k


def dumps(obj: Any) -> bytes:
    """Serialize ``obj`` to bytes; the same value gives the same bytes in every process."""
    try:
        return _pack(obj)
    except SerializationError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise SerializationError(f"cannot serialize {_short(obj)}: {e}") from e


def dumps_chunk(items: list[Any]) -> bytes:
    """Serialize a chunk (a list of items) for another member; :func:`loads` reads it back.

    A chunk of tuples of one length goes as a flat array of their fields (see the module's
    doc); any other chunk as :func:`dumps` packs it. The same chunk gives the same bytes."""
    k = _tuple_rows_width(items)
    if not k:
        return dumps(items)
    try:
        payload = _pack([k, list(chain.from_iterable(items))])
    except SerializationError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise SerializationError(f"cannot serialize {_short(items)}: {e}") from e
    # an ext 32 header (valid msgpack for any length): one copy of the payload, no repacking
    return b"".join((_EXT32_HEADER.pack(0xC9, len(payload), _EXT_TUPLE_ROWS), payload))


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes made by :func:`dumps` or :func:`dumps_chunk`. Never executes code from the
    data."""
    try:
        return _unpack(data)
    except SerializationError:
        raise
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise SerializationError(f"cannot decode {len(data)} bytes: {e}") from e


def _short(obj: Any, limit: int = 80) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."
