"""Kafka record (de)serialization for the Kafka source and sinks, and the record view that a
source's ``projection`` receives.

A deserializer turns the raw bytes of a key or value into an object: ``None`` (the raw bytes),
``"str"`` (UTF-8), ``"json"``, ``"msgpack"`` or a callable ``bytes -> object``. A serializer
does the opposite: ``None`` (bytes, bytearray or str as they are), ``"str"`` (``str(x)`` in
UTF-8), ``"json"``, ``"msgpack"`` or a callable ``object -> bytes``. A null key or value (a
tombstone) stays ``None`` both ways.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import msgpack

__all__ = ["KafkaRecord", "make_deserializer", "make_serializer", "DESERIALIZERS",
           "SERIALIZERS"]

DESERIALIZERS = (None, "str", "json", "msgpack")
SERIALIZERS = (None, "str", "json", "msgpack")


class KafkaRecord:
    """One consumed record, as a source's ``projection(record)`` sees it.

    ``key`` and ``value`` are deserialized; ``timestamp`` is the record's timestamp in ms
    (create or log-append time, -1 when the record has none); ``headers`` a list of
    ``(name, bytes)`` pairs (empty when none).
    """

    __slots__ = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")

    def __init__(self, topic: str, partition: int, offset: int, timestamp: int, key: Any,
                 value: Any, headers: list) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return (f"KafkaRecord({self.topic}[{self.partition}]@{self.offset}, "
                f"ts={self.timestamp}, key={self.key!r}, value={self.value!r})")


def _utf8(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8")


def _json_loads(b: bytes | None) -> Any:
    return None if b is None else json.loads(b)


def _msgpack_loads(b: bytes | None) -> Any:
    return None if b is None else msgpack.unpackb(b, raw=False, strict_map_key=False)


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
    return None if x is None else json.dumps(x, separators=(",", ":")).encode("utf-8")


def _msgpack_dumps(x: Any) -> bytes | None:
    return None if x is None else msgpack.packb(x, use_bin_type=True)


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
