"""What the serializer tests share (tests/test_serializers.py, test_restricted_pickle.py,
test_numpy_arrays.py): the default copy threshold, a transport's hand-over, a pickle that only
looks up one global, and a plain dataclass."""

from __future__ import annotations

import dataclasses

from netq.stream import Stream

THRESHOLD = 65536


def transmit(stream: Stream) -> Stream:
    """What a transport hands to ``load``: one fresh receive buffer per chunk, ``bytes`` for a
    read-only chunk and ``bytearray`` for a writable one."""
    received = Stream()
    for chunk in stream:
        received.writechunk(bytes(chunk) if chunk.readonly else bytearray(chunk))
    return received


def global_pickle(module: str, name: str) -> bytes:
    """A protocol 4 pickle that only looks up ``module.name`` (STACK_GLOBAL) and returns it."""

    def text(value: str) -> bytes:
        raw = value.encode()
        return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE

    return b"\x80\x04" + text(module) + text(name) + b"\x93."


@dataclasses.dataclass
class Point:
    x: int
    y: int


POINT = f"{Point.__module__}.{Point.__qualname__}"
