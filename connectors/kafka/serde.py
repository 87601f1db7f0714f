"""Kafka record (de)serialization for the Kafka source and sinks, and the record view that a
source's ``projection`` receives.

A deserializer turns the raw bytes of a key or value into an object: ``None`` (the raw bytes),
``"str"`` (UTF-8), ``"json"``, ``"msgpack"`` or a callable ``bytes -> object``. A serializer
does the opposite: ``None`` (bytes, bytearray or str as they are), ``"str"`` (``str(x)`` in
UTF-8), ``"json"``, ``"msgpack"`` or a callable ``object -> bytes``. A null key or value (a
tombstone) stays ``None`` both ways.

``"json"`` is msgspec's JSON encoder and decoder, made once: about 0.25 µs for a record of 100
bytes each way, where the standard library's ``json`` takes 2-3 µs (``json.dumps`` builds an
encoder per call) and orjson's ``dumps`` slows to 2.4 µs per call when a chunk's results are
kept in a list (docs/performance.md). The JSON written is compact UTF-8; beyond what ``json``
writes, msgspec also writes bytes (base64), sets and frozensets (arrays), and NaN/infinity as
``null``; a record that is not valid JSON raises :class:`json.JSONDecodeError`, as before.

A chunk of records is converted with :func:`deserialize_all` / :func:`serialize_all`: for the
built-in formats that is one C-level ``map`` over the chunk, not a Python call per record;
only a chunk that holds a tombstone or a bad record takes the per-record path.
"""

from __future__ import annotations

import json
import re
from functools import partial
from operator import methodcaller
from typing import Any, Callable

import msgpack
import msgspec

__all__ = ["KafkaRecord", "make_deserializer", "make_serializer", "deserialize_all",
           "serialize_all", "DESERIALIZERS", "SERIALIZERS", "JSON_LIBRARY"]

DESERIALIZERS = (None, "str", "json", "msgpack")
SERIALIZERS = (None, "str", "json", "msgpack")

JSON_LIBRARY = "msgspec"
"""The library behind ``"json"`` (the benchmark's raw loop uses the same one)."""

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode
_BYTE_POSITION = re.compile(r"\s*\(byte (\d+)\)$")


class KafkaRecord(msgspec.Struct, gc=False):
    """One consumed record, as a source's ``projection(record)`` sees it.

    ``key`` and ``value`` are deserialized; ``timestamp`` is the record's timestamp in ms
    (create or log-append time, -1 when the record has none); ``headers`` a list of
    ``(name, bytes)`` pairs (empty when none).

    A msgspec ``Struct``: made by C code (``map(KafkaRecord, ...)`` over a chunk's columns runs
    no Python frame per record, where a class with an ``__init__`` took about 160 ns a record),
    and not tracked by the cyclic garbage collector (``gc=False``), as the records of a chunk
    never form cycles through themselves.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Any
    value: Any
    headers: list

    def __repr__(self) -> str:
        return (f"KafkaRecord({self.topic}[{self.partition}]@{self.offset}, "
                f"ts={self.timestamp}, key={self.key!r}, value={self.value!r})")


#: the fields of a :class:`KafkaRecord`, which a projection ``operator.attrgetter(field)``
#: reads as a column (connectors/kafka/source.py)
RECORD_FIELDS = KafkaRecord.__struct_fields__


def _utf8(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8")


def _json_loads(b: bytes | None) -> Any:
    if b is None:
        return None
    try:
        return _json_decode(b)
    except msgspec.DecodeError as e:
        raise _json_error(b, e) from None


def _json_error(b: Any, error: msgspec.DecodeError) -> json.JSONDecodeError:
    """msgspec's decode error as the standard library's, with the position it names."""
    doc = bytes(b).decode("utf-8", "replace") if not isinstance(b, str) else b
    message = str(error)
    found = _BYTE_POSITION.search(message)
    pos = len(doc) if "truncated" in message else 0
    if found:
        message = message[:found.start()]
        pos = len(bytes(b)[:int(found.group(1))].decode("utf-8", "replace")) \
            if not isinstance(b, str) else int(found.group(1))
    return json.JSONDecodeError(message, doc, min(pos, len(doc)))


_msgpack_unpack = partial(msgpack.unpackb, raw=False, strict_map_key=False)


def _msgpack_loads(b: bytes | None) -> Any:
    return None if b is None else _msgpack_unpack(b)


# deserializer -> a C-level callable doing the same for a record that is not a tombstone
# (raising for a tombstone or a bad record, which then take the per-record path)
_FAST_DESERIALIZERS: dict[Callable, Callable] = {
    _utf8: methodcaller("decode", "utf-8"),
    _json_loads: _json_decode,
    _msgpack_loads: _msgpack_unpack,
}


def deserialize_all(deserializer: Callable[[Any], Any] | None, raw: list) -> list:
    """``deserializer`` applied to every element of ``raw`` (None: ``raw`` itself). Raises
    what the deserializer raises for the first bad record; the caller can then find it with
    per-record calls."""
    if deserializer is None:
        return raw
    fast = _FAST_DESERIALIZERS.get(deserializer)
    if fast is not None:
        try:
            return list(map(fast, raw))
        except Exception:  # noqa: BLE001 - a tombstone or a bad record: one by one below
            pass
    return list(map(deserializer, raw))


def make_deserializer(spec: Any, where: str) -> Callable[[Any], Any] | None:
    """The function for a deserializer spec; None means "the raw bytes" (no call at all)."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec == "str":
            return _utf8
        if spec == "json":
            return _json_loads
        if spec == "msgpack":
            return _msgpack_loads
        raise ValueError(f"{where}: unknown deserializer {spec!r}; use None (raw bytes), 'str', "
                         "'json', 'msgpack' or a callable bytes -> object")
    if callable(spec):
        user = spec
        return lambda b: None if b is None else user(b)
    raise TypeError(f"{where}: a deserializer is None, 'str', 'json', 'msgpack' or a callable, "
                    f"got {type(spec).__qualname__}")


def _raw(x: Any) -> bytes | None:
    t = type(x)
    if t is bytes or x is None:
        return x
    if t is str:
        return x.encode("utf-8")
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode("utf-8")
    raise TypeError(f"cannot write a {type(x).__qualname__} to Kafka without a serializer: "
                    f"{_short(x)}; pass key_serializer/value_serializer ('str', 'json', "
                    "'msgpack' or a callable), or produce bytes or str")


def _str(x: Any) -> bytes | None:
    return None if x is None else (x if type(x) is bytes else str(x).encode("utf-8"))


def _json_dumps(x: Any) -> bytes | None:
    return None if x is None else _json_encode(x)


def _msgpack_dumps(x: Any) -> bytes | None:
    return None if x is None else msgpack.packb(x, use_bin_type=True)


_BYTES_OR_NONE = frozenset((bytes, type(None)))
_FAST_SERIALIZERS: dict[Callable, Callable] = {
    _json_dumps: _json_encode,
    _msgpack_dumps: partial(msgpack.packb, use_bin_type=True),
}


def serialize_all(serializer: Callable[[Any], bytes | None], items: list) -> list:
    """``serializer`` applied to every element of ``items``, with as few Python calls per
    record as the format allows: none for bytes written as they are, one C call for the
    built-in formats."""
    if serializer is _raw and _BYTES_OR_NONE.issuperset(map(type, items)):
        return items
    fast = _FAST_SERIALIZERS.get(serializer)
    if fast is not None:
        if None not in items:  # one C-level map; None (a tombstone) stays None
            return list(map(fast, items))
        return [None if x is None else fast(x) for x in items]
    return list(map(serializer, items))


def make_serializer(spec: Any, where: str) -> Callable[[Any], bytes | None]:
    if spec is None:
        return _raw
    if isinstance(spec, str):
        if spec == "str":
            return _str
        if spec == "json":
            return _json_dumps
        if spec == "msgpack":
            return _msgpack_dumps
        raise ValueError(f"{where}: unknown serializer {spec!r}; use None (bytes or str as "
                         "they are), 'str', 'json', 'msgpack' or a callable object -> bytes")
    if callable(spec):
        user = spec

        def call(x: Any) -> bytes | None:
            if x is None:
                return None
            out = user(x)
            return out if type(out) is bytes or out is None else _raw(out)
        return call
    raise TypeError(f"{where}: a serializer is None, 'str', 'json', 'msgpack' or a callable, "
                    f"got {type(spec).__qualname__}")


def _short(x: Any, n: int = 80) -> str:
    r = repr(x)
    return r if len(r) <= n else r[:n - 3] + "..."
