"""What the serializer tests share (tests/test_serializers.py, test_restricted_pickle.py,
test_numpy_arrays.py): the default copy threshold, a transport's hand-over, a pickle that only
looks up one global, and a plain dataclass."""

from __future__ import annotations

import dataclasses

from netq._buffers import LARGE
from netq.stream import Stream

THRESHOLD = 65536


def received(chunk) -> bytes | bytearray | memoryview:
    """What a transport delivers for a chunk (netq._buffers): a fresh ``bytearray`` for a
    writable one; for a read-only one ``bytes`` below LARGE and from LARGE a read-only
    memoryview of a fresh receive buffer."""
    view = memoryview(chunk)
    if not view.readonly:
        return bytearray(view)
    if view.nbytes < LARGE:
        return bytes(view)
    return memoryview(bytearray(view)).toreadonly()


def transmit(stream: Stream) -> Stream:
    """What a transport hands to ``load``: one fresh receive buffer per chunk (received())."""
    out = Stream()
    for chunk in stream:
        out.writechunk(received(chunk))
    return out


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
