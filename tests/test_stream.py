"""Tests of netq.stream: the zero-copy Stream and the Bytes/Pickle serializers."""

from __future__ import annotations

import array
import collections
import copy
import dataclasses
import os
import pickle
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from netq._buffers import LARGE
from netq.stream import (
    ARRAY_MAGIC,
    DEFAULT_SERIALIZER,
    BytesSerializer,
    PickleSerializer,
    Serializer,
    Stream,
)

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


class Evil:
    """Unpickling this runs ``action(*args)``, which creates ``path``."""

    def __init__(self, action: object, args: tuple[object, ...]) -> None:
        self.action = action
        self.args = args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.action, self.args


def evil_payloads(path: str) -> list[Evil]:
    return [
        Evil(os.system, (f"touch {path}",)),
        Evil(exec, (f"open({path!r}, 'w').close()",)),
        Evil(eval, (f"open({path!r}, 'w').close()",)),
        Evil(open, (path, "w")),
    ]


# --------------------------------------------------------------------------------------------
# Stream: construction and chunk normalization
# --------------------------------------------------------------------------------------------


def test_empty_stream() -> None:
    s = Stream()
    assert s.nchunks == 0
    assert s.nbytes == 0
    assert s.empty()
    assert len(s) == 0
    assert not s
    assert s.tobytes() == b""
    assert list(s) == []


def test_constructor_takes_chunks_and_drops_empty_ones() -> None:
    s = Stream([b"ab", bytearray(b"cde"), b"", memoryview(b"f")])
    assert s.nchunks == 3
    assert s.nbytes == 6
    assert not s.empty()
    assert [bytes(c) for c in s] == [b"ab", b"cde", b"f"]


@pytest.mark.parametrize(
    "buffer",
    [b"abc", bytearray(b"abc"), memoryview(b"abc"), array.array("B", b"abc"), np.arange(3)],
    ids=["bytes", "bytearray", "memoryview", "array", "numpy"],
)
def test_a_single_buffer_is_not_taken_for_an_iterable_of_chunks(buffer: object) -> None:
    with pytest.raises(TypeError, match="frombytes"):
        Stream(buffer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="frombytes"):
        Stream().writechunks(buffer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="frombytes"):
        Stream().update(buffer)  # type: ignore[arg-type]
    assert Stream(iter([buffer])).nbytes == memoryview(buffer).nbytes  # type: ignore[arg-type]


def test_frombytes_is_one_view_without_copy() -> None:
    data = bytearray(b"hello")
    s = Stream.frombytes(data)
    assert s.nchunks == 1
    assert s.peekchunk().obj is data
    assert Stream.frombytes(b"").empty()


@pytest.mark.parametrize(
    "buffer",
    [
        array.array("i", [1, 2, 3]),
        np.arange(12, dtype=np.float64).reshape(3, 4),
        np.array(3.5),
        np.zeros(3, dtype=[("a", "<i4"), ("b", ">f8")]),
        np.arange(6, dtype=">u2"),
        memoryview(b"abcdef").cast("B", (2, 3)),
    ],
    ids=["array", "2d-float", "0d", "structured", "big-endian", "2d-memoryview"],
)
def test_chunks_are_flat_unsigned_byte_views(buffer: object) -> None:
    expected = memoryview(buffer).tobytes()  # type: ignore[arg-type]
    s = Stream()
    s.writechunk(buffer)
    chunk = s.peekchunk()
    assert chunk.format == "B"
    assert chunk.ndim == 1
    assert chunk.nbytes == len(expected)
    assert chunk.tobytes() == expected
    assert s.nbytes == len(expected)


@pytest.mark.parametrize(
    "buffer",
    [
        memoryview(b"abcdef")[::2],
        np.arange(10)[::2],
        np.zeros((3, 4), order="F"),
    ],
    ids=["strided-memoryview", "strided-numpy", "fortran-order"],
)
def test_non_contiguous_buffers_are_rejected(buffer: object) -> None:
    s = Stream()
    for write in (s.writechunk, s.unreadchunk, lambda b: s.writechunks([b]), Stream.frombytes):
        with pytest.raises(TypeError, match="contiguous"):
            write(buffer)
    assert s.empty()


@pytest.mark.parametrize("not_a_buffer", [42, "text", None, [1, 2]])
def test_non_buffers_are_rejected(not_a_buffer: object) -> None:
    with pytest.raises(TypeError):
        Stream().writechunk(not_a_buffer)


# --------------------------------------------------------------------------------------------
# Stream: zero copy
# --------------------------------------------------------------------------------------------


def test_written_chunks_view_the_source_memory() -> None:
    source = bytearray(b"aaaa")
    s = Stream()
    s.writechunk(source)
    peeked = s.peekchunk()
    source[0] = ord("X")
    assert peeked[0] == ord("X")
    read = s.readchunk()
    source[1] = ord("Y")
    assert bytes(read) == b"XYaa"
    read[2] = ord("Z")  # and the other way round: the view writes through
    assert source == bytearray(b"XYZa")


def test_numpy_chunks_view_the_array() -> None:
    arr = np.zeros(4, dtype=np.uint32)
    s = Stream([arr])
    arr[1] = 0x01020304
    (chunk,) = s.readchunks()
    assert chunk.obj is arr
    assert chunk[4:8].tobytes() == np.uint32(0x01020304).tobytes()


def test_writing_a_memoryview_survives_its_release() -> None:
    data = bytearray(b"xyz")
    s = Stream()
    with memoryview(data) as view:
        s.writechunk(view)
    assert s.tobytes() == b"xyz"
    data[0] = ord("Q")
    assert s.tobytes() == b"Qyz"


# --------------------------------------------------------------------------------------------
# Stream: every method
# --------------------------------------------------------------------------------------------


def test_write_and_unwrite_are_lifo_at_the_end() -> None:
    s = Stream()
    s.writechunk(b"one")
    s.writechunk(b"")
    s.writechunk(b"three")
    assert (s.nchunks, s.nbytes) == (2, 8)
    assert bytes(s.unwritechunk()) == b"three"
    assert (s.nchunks, s.nbytes) == (1, 3)
    assert bytes(s.unwritechunk()) == b"one"
    assert s.empty() and s.nbytes == 0
    with pytest.raises(IndexError, match="empty"):
        s.unwritechunk()


def test_read_unread_and_peek_work_at_the_front() -> None:
    s = Stream([b"a", b"bb", b"ccc"])
    assert bytes(s.peekchunk()) == b"a"
    assert s.nchunks == 3  # peek does not consume
    assert bytes(s.readchunk()) == b"a"
    assert (s.nchunks, s.nbytes) == (2, 5)
    s.unreadchunk(b"zz")
    s.unreadchunk(b"")  # ignored
    assert (s.nchunks, s.nbytes) == (3, 7)
    assert [bytes(s.readchunk()) for _ in range(3)] == [b"zz", b"bb", b"ccc"]
    assert s.nbytes == 0
    with pytest.raises(IndexError, match="empty"):
        s.readchunk()
    with pytest.raises(IndexError, match="empty"):
        s.peekchunk()


def test_readchunks_removes_everything_in_order() -> None:
    s = Stream([b"a", b"bc"])
    chunks = s.readchunks()
    assert isinstance(chunks, list)
    assert all(isinstance(c, memoryview) for c in chunks)
    assert [bytes(c) for c in chunks] == [b"a", b"bc"]
    assert s.empty() and s.nbytes == 0
    assert s.readchunks() == []


def test_writechunks_takes_any_iterable() -> None:
    s = Stream()
    s.writechunks(bytes([i]) * i for i in range(4))
    assert s.nchunks == 3
    assert s.tobytes() == b"\x01\x02\x02\x03\x03\x03"
    s.writechunks(Stream([b"x"]))
    assert s.tobytes().endswith(b"x")
    s.writechunks(collections.deque([b"y"]))
    assert s.tobytes().endswith(b"xy")


def test_update_shares_views_and_leaves_the_other_unchanged() -> None:
    a = Stream([b"a"])
    b = Stream([b"bb", b"ccc"])
    a.update(b)
    assert (a.nchunks, a.nbytes) == (3, 6)
    assert (b.nchunks, b.nbytes) == (2, 5)
    assert list(a)[1] is list(b)[0]
    a.update([b"d", bytearray(b"e")])
    assert a.tobytes() == b"abbcccde"
    a.update(a)
    assert a.tobytes() == b"abbcccde" * 2
    assert a.nbytes == 16 and a.nchunks == 10


def test_clear() -> None:
    s = Stream([b"a", b"b"])
    s.clear()
    assert s.empty() and s.nbytes == 0 and s.nchunks == 0


def test_iteration_does_not_consume() -> None:
    s = Stream([b"a", b"b"])
    assert [bytes(c) for c in s] == [b"a", b"b"]
    assert [bytes(c) for c in s] == [b"a", b"b"]
    assert s.nchunks == 2


def test_copy_shares_views_but_not_the_chunk_list() -> None:
    source = bytearray(b"abc")
    s = Stream([source, b"de"])
    for dup in (s.copy(), copy.copy(s)):
        assert type(dup) is Stream
        assert dup is not s
        assert dup == s
        assert [c for c in dup] == [c for c in s]
        assert all(x is y for x, y in zip(dup, s, strict=True))
        dup.readchunk()
        assert s.nchunks == 2 and s.nbytes == 5
    dup = s.copy()
    source[0] = ord("Z")
    assert dup.tobytes() == b"Zbcde"


def test_deepcopy_owns_its_bytes() -> None:
    source = bytearray(b"abc")
    s = Stream([source, b"de"])
    dup = copy.deepcopy(s)
    source[0] = ord("Z")
    assert dup.tobytes() == b"abcde"
    assert dup.nchunks == 2
    assert [c.readonly for c in dup] == [False, True]


def test_tobytes_and_bytes() -> None:
    s = Stream([b"ab", bytearray(b"cd"), np.frombuffer(b"ef", dtype=np.uint8)])
    assert s.tobytes() == b"abcdef"
    assert bytes(s) == b"abcdef"
    assert type(s.tobytes()) is bytes


def test_tobytes_of_one_whole_bytes_chunk_is_that_object() -> None:
    data = b"immutable" * 10
    assert Stream([data]).tobytes() is data
    assert Stream([memoryview(data)[1:]]).tobytes() == data[1:]
    mutable = bytearray(b"mutable")
    out = Stream([mutable]).tobytes()
    assert type(out) is bytes
    mutable[0] = ord("X")
    assert out == b"mutable"  # a bytearray is copied, never aliased as bytes


def test_context_manager_clears_on_exit() -> None:
    with Stream([b"abc"]) as s:
        assert s.nbytes == 3
    assert s.empty() and s.nbytes == 0
    with pytest.raises(RuntimeError):
        with Stream([b"abc"]) as s2:
            raise RuntimeError
    assert s2.empty()


def test_repr() -> None:
    assert repr(Stream()) == "Stream(nchunks=0, nbytes=0)"
    assert repr(Stream([b"12345", b"67890"])) == "Stream(nchunks=2, nbytes=10)"


def test_equality_is_by_content() -> None:
    s = Stream([b"ab", b"cd"])
    assert s == Stream([b"a", b"bcd"])
    assert s == b"abcd"
    assert s == bytearray(b"abcd")
    assert s == memoryview(b"abcd")
    assert s != b"abce"
    assert s != b"abc"
    assert s != Stream([b"abcde"])
    assert s != "abcd"
    assert s != 4
    assert Stream() == b""
    with pytest.raises(TypeError):
        hash(s)


def test_stream_has_slots() -> None:
    with pytest.raises(AttributeError):
        Stream().extra = 1  # type: ignore[attr-defined]


chunk_lists = st.lists(st.binary(max_size=40), max_size=12)


@given(chunk_lists)
def test_stream_matches_a_list_model(chunks: list[bytes]) -> None:
    s = Stream(chunks)
    kept = [c for c in chunks if c]
    assert s.nchunks == len(kept)
    assert s.nbytes == len(s) == sum(map(len, kept))
    assert s.tobytes() == b"".join(chunks)
    assert s == b"".join(chunks)
    backwards = []
    while not s.empty():
        backwards.append(bytes(s.unwritechunk()))
    assert backwards == kept[::-1]
    assert s.nbytes == 0


operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.binary(max_size=8)),
        st.tuples(st.just("unread"), st.binary(max_size=8)),
        st.tuples(st.sampled_from(["read", "unwrite", "peek", "readall", "clear"])),
    ),
    max_size=30,
)


@given(operations)
def test_stream_operations_match_a_deque_model(ops: list[tuple[str, ...]]) -> None:
    s = Stream()
    model: collections.deque[bytes] = collections.deque()
    for op, *args in ops:
        if op == "write":
            s.writechunk(args[0])
            if args[0]:
                model.append(args[0])
        elif op == "unread":
            s.unreadchunk(args[0])
            if args[0]:
                model.appendleft(args[0])
        elif op == "readall":
            assert [bytes(c) for c in s.readchunks()] == list(model)
            model.clear()
        elif op == "clear":
            s.clear()
            model.clear()
        elif not model:
            with pytest.raises(IndexError):
                {"read": s.readchunk, "unwrite": s.unwritechunk, "peek": s.peekchunk}[op]()
        elif op == "read":
            assert bytes(s.readchunk()) == model.popleft()
        elif op == "unwrite":
            assert bytes(s.unwritechunk()) == model.pop()
        else:
            assert bytes(s.peekchunk()) == model[0]
        assert s.nchunks == len(model)
        assert s.nbytes == sum(map(len, model))
        assert s.empty() == (not model)


# --------------------------------------------------------------------------------------------
# BytesSerializer
# --------------------------------------------------------------------------------------------


def test_bytes_serializer_round_trips() -> None:
    ser = BytesSerializer()
    data = b"payload" * 1000
    stream = ser.dump(data)
    assert stream.nchunks == 1
    assert stream.peekchunk().obj is data  # no copy on dump
    assert ser.load(stream) is data  # nor on load
    received = transmit(stream)
    out = ser.load(received)
    assert out == data and out is received.peekchunk().obj


@pytest.mark.parametrize(
    "data",
    [bytearray(b"abc"), memoryview(b"abc"), array.array("B", b"abc"), np.frombuffer(b"abc", "u1")],
    ids=["bytearray", "memoryview", "array", "numpy"],
)
def test_bytes_serializer_takes_any_bytes_like(data: object) -> None:
    ser = BytesSerializer()
    out = ser.load(ser.dump(data))
    assert type(out) is bytes and out == b"abc"


def test_bytes_serializer_empty_and_multi_chunk() -> None:
    ser = BytesSerializer()
    assert ser.dump(b"").empty()
    assert ser.load(ser.dump(b"")) == b""
    assert ser.load(Stream()) == b""
    assert ser.load(Stream([b"ab", b"cd"])) == b"abcd"


@pytest.mark.parametrize("size", [LARGE - 1, LARGE, 3 * LARGE])
def test_bytes_serializer_hands_a_lone_read_only_part_back_as_it_arrived(size: int) -> None:
    """get() with BytesSerializer: bytes below LARGE, the read-only view of the receive
    buffer from LARGE (no copy); a writable part or several parts are joined into bytes."""
    ser = BytesSerializer()
    data = os.urandom(size)
    (part,) = [received(p) for p in ser.dump_parts(data)]
    out = ser.load_parts([part])
    assert out is part and out == data
    assert type(out) is (bytes if size < LARGE else memoryview)
    joined = ser.load_parts([bytearray(data)])
    assert type(joined) is bytes and joined == data
    assert ser.load_parts([part, b"x"]) == data + b"x"


def test_pickled_arrays_from_read_only_parts_stay_read_only() -> None:
    """Out-of-band buffers of a pickled (structured) array: read-only when the sender's was."""
    ser = PickleSerializer()
    for writable in (True, False):
        array_ = np.zeros(THRESHOLD, dtype=[("a", "<i4"), ("b", ">f8")])
        array_.flags.writeable = writable
        out = ser.load(transmit(ser.dump(array_)))
        assert out.flags.writeable == writable
        np.testing.assert_array_equal(out, array_)


@given(st.binary(max_size=2000))
def test_bytes_serializer_property(data: bytes) -> None:
    ser = BytesSerializer()
    assert ser.load(transmit(ser.dump(data))) == data


# --------------------------------------------------------------------------------------------
# PickleSerializer: round trips and the out-of-band rule
# --------------------------------------------------------------------------------------------

SIMPLE_OBJECTS = [
    None,
    True,
    0,
    -(2**100),
    3.25,
    "text ünïcödé",
    b"",
    (),
    {"a": [1, 2, (3, {"b": None})], "c": {"d": ("e", 4.5)}},
    [[], {}, (1,), {1, 2}, frozenset({3})],
    complex(1, -2),
    Point(1, 2),
    collections.OrderedDict(a=1),
]


@pytest.mark.parametrize("obj", SIMPLE_OBJECTS, ids=repr)
def test_pickle_round_trips_simple_objects(obj: object) -> None:
    ser = PickleSerializer()
    stream = ser.dump(obj)
    assert stream.nchunks == 1
    assert ser.load(stream) == obj
    assert ser.load(transmit(stream)) == obj


def test_small_bytes_stay_in_band() -> None:
    ser = PickleSerializer()
    data = b"x" * (THRESHOLD - 1)
    stream = ser.dump(data)
    assert stream.nchunks == 1
    out = ser.load(transmit(stream))
    assert type(out) is bytes and out == data


def test_large_bytes_go_out_of_band_and_come_back_as_a_read_only_view_of_the_buffer() -> None:
    ser = PickleSerializer()
    data = os.urandom(THRESHOLD)  # exactly the threshold: out of band
    stream = ser.dump(data)
    assert stream.nchunks == 2
    assert stream.nbytes < THRESHOLD + 100  # not also copied into the pickle
    assert list(stream)[1].obj is data  # the payload itself, not a copy
    assert ser.load(stream) is data
    arrived = transmit(stream)
    out = ser.load(arrived)
    assert type(out) is memoryview and out.readonly
    assert out.obj is list(arrived)[1].obj  # the receive buffer itself, no copy
    assert out == data


def test_large_bytearray_comes_back_as_bytearray() -> None:
    ser = PickleSerializer()
    data = bytearray(os.urandom(THRESHOLD * 2))
    stream = ser.dump(data)
    assert stream.nchunks == 2
    assert ser.load(stream) is data
    received = transmit(stream)
    out = ser.load(received)
    assert type(out) is bytearray and out == data
    assert out is list(received)[1].obj


def test_small_bytearray_comes_back_as_bytearray() -> None:
    ser = PickleSerializer()
    stream = ser.dump(bytearray(b"abc"))
    assert stream.nchunks == 1
    out = ser.load(transmit(stream))
    assert type(out) is bytearray and out == b"abc"


@pytest.mark.parametrize("size", [10, THRESHOLD * 2])
def test_memoryview_comes_back_as_bytes_or_bytearray(size: int) -> None:
    ser = PickleSerializer()
    readonly = memoryview(os.urandom(size))
    writable = memoryview(bytearray(os.urandom(size)))
    for view, kind in ((readonly, bytes if size < LARGE else memoryview),
                       (writable, bytearray)):
        stream = ser.dump(view)
        assert stream.nchunks == (1 if size < THRESHOLD else 2)
        out = ser.load(transmit(stream))
        assert type(out) is kind
        assert out == view.tobytes()


def test_memoryview_of_other_formats_travels_as_raw_bytes() -> None:
    ser = PickleSerializer()
    values = array.array("i", range(5))
    out = ser.load(transmit(ser.dump(memoryview(values))))
    assert out == values.tobytes()


def test_copy_threshold_is_in_bytes_and_configurable() -> None:
    data = b"y" * 100
    assert PickleSerializer(copy_threshold=100).dump(data).nchunks == 2
    assert PickleSerializer(copy_threshold=101).dump(data).nchunks == 1
    everything = PickleSerializer(copy_threshold=0)
    assert everything.dump(b"z").nchunks == 2
    empty = everything.dump(b"")  # an empty buffer never becomes an (empty) chunk
    assert empty.nchunks == 1
    assert everything.load(transmit(empty)) == b""
    arrays = [np.arange(3), np.arange(0), np.ones(2)]
    stream = everything.dump(arrays)
    assert stream.nchunks == 3
    for a, b in zip(arrays, everything.load(transmit(stream)), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("threshold", [0, 1, 100, THRESHOLD])
@pytest.mark.parametrize("size", [0, 1, 99, 100, THRESHOLD])
@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_dump_parts_is_dump_as_a_sequence(threshold: int, size: int, kind: type) -> None:
    """The queue's fast path (dump_parts) sends what dump() would, and a large top-level
    bytes object as itself (no copy, no view)."""
    ser = PickleSerializer(copy_threshold=threshold)
    data = kind(os.urandom(size))
    parts = ser.dump_parts(data)
    assert [bytes(part) for part in parts] == [bytes(chunk) for chunk in ser.dump(data)]
    if kind is bytes and size and size >= threshold:
        assert len(parts) == 2 and parts[1] is data
    # What a transport delivers (received()): a read-only part of LARGE or more as a
    # read-only memoryview, which a top-level bytes payload then comes back as.
    arrived = [received(part) for part in parts]
    out = ser.load_parts(arrived)
    expected = memoryview if kind is bytes and size >= LARGE and size >= threshold else kind
    assert type(out) is expected and out == data


@pytest.mark.parametrize(
    ("array_", "chunks"),
    [
        (np.arange(10, dtype=np.int16), 1),
        (np.arange(THRESHOLD, dtype=np.float64).reshape(256, -1), 2),
        (np.asfortranarray(np.arange(THRESHOLD, dtype=np.int32).reshape(128, -1)), 2),
        (np.zeros(THRESHOLD, dtype=[("a", "<i4"), ("b", ">f8")]), 2),
        (np.array([1 + 2j, 3j], dtype=np.complex64), 1),
        (np.array([True, False]), 1),
    ],
    ids=["small", "large", "fortran", "structured", "complex", "bool"],
)
def test_numpy_arrays_round_trip(array_: np.ndarray, chunks: int) -> None:
    ser = PickleSerializer()
    before = array_.copy()
    stream = ser.dump(array_)
    assert stream.nchunks == chunks
    out = ser.load(transmit(stream))
    assert type(out) is np.ndarray
    assert out.dtype == array_.dtype
    assert out.shape == array_.shape
    np.testing.assert_array_equal(out, array_)
    assert out.flags.writeable
    out[...] = 1  # really writable, and not the sender's memory
    np.testing.assert_array_equal(array_, before)


def test_large_numpy_array_is_not_copied_on_dump_nor_on_load() -> None:
    ser = PickleSerializer()
    arr = np.zeros(THRESHOLD, dtype=np.uint8)
    stream = ser.dump(arr)
    arr[0] = 7
    assert list(stream)[1][0] == 7  # the chunk views the array
    received = transmit(stream)
    out = ser.load(received)
    buffer = list(received)[1].obj
    buffer[1] = 9
    assert out[1] == 9  # the array views the receive buffer


def test_several_buffers_keep_their_order() -> None:
    ser = PickleSerializer()
    big = [np.full(THRESHOLD, i, dtype=np.uint8) for i in range(3)]
    payload = {"arrays": big, "blob": b"b" * THRESHOLD, "small": np.arange(3)}
    stream = ser.dump(payload)
    assert stream.nchunks == 1 + 3  # the top-level rule does not apply to nested bytes
    out = ser.load(transmit(stream))
    for i in range(3):
        assert (out["arrays"][i] == i).all()
    assert out["blob"] == payload["blob"]
    np.testing.assert_array_equal(out["small"], np.arange(3))


def test_load_does_not_consume_the_stream() -> None:
    ser = PickleSerializer()
    stream = ser.dump({"x": 1})
    ser.load(stream)
    assert ser.load(stream) == {"x": 1}
    assert stream.nchunks == 1


def test_load_of_an_empty_stream_fails_clearly() -> None:
    with pytest.raises(pickle.UnpicklingError, match="empty"):
        PickleSerializer().load(Stream())


def test_constructor_validates_arguments() -> None:
    with pytest.raises(ValueError, match="copy_threshold"):
        PickleSerializer(copy_threshold=-1)
    with pytest.raises(ValueError, match="protocol"):
        PickleSerializer(protocol=4)
    with pytest.raises(TypeError, match="restrict"):
        PickleSerializer(restrict="builtins")
    with pytest.raises(TypeError, match="restrict"):
        PickleSerializer(restrict=[""])
    ser = PickleSerializer(restrict=["builtins"], copy_threshold=10)
    assert ser.restrict == frozenset({"builtins"})
    assert ser.copy_threshold == 10
    assert ser.protocol == 5
    assert "copy_threshold=10" in repr(ser)


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5)
    | st.tuples(children, children),
    max_leaves=25,
)


@settings(max_examples=150)
@given(json_like)
def test_pickle_round_trips_arbitrary_json_like_objects(obj: object) -> None:
    for ser in (PickleSerializer(), PickleSerializer(restrict=["builtins"], copy_threshold=0)):
        assert ser.load(transmit(ser.dump(obj))) == obj


def test_serializers_are_thread_safe() -> None:
    ser = PickleSerializer(restrict=["builtins", "numpy"], copy_threshold=64)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(200):
                obj = {"seed": seed, "i": i, "arr": np.full(32, seed, dtype=np.int32)}
                out = ser.load(transmit(ser.dump(obj)))
                assert out["seed"] == seed and out["i"] == i and (out["arr"] == seed).all()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_serializer_protocol_and_default() -> None:
    assert isinstance(PickleSerializer(), Serializer)
    assert isinstance(BytesSerializer(), Serializer)
    assert not isinstance(object(), Serializer)
    assert isinstance(DEFAULT_SERIALIZER, PickleSerializer)
    assert DEFAULT_SERIALIZER.restrict is None
    assert DEFAULT_SERIALIZER.copy_threshold == THRESHOLD
    for ser in (PickleSerializer(), BytesSerializer()):
        assert not hasattr(ser, "__dict__")


# --------------------------------------------------------------------------------------------
# PickleSerializer: restrict
# --------------------------------------------------------------------------------------------


def test_safe_builtins_are_data_only() -> None:
    safe = PickleSerializer.SAFE_BUILTINS
    for name in ("complex", "slice", "range", "ValueError"):
        assert f"builtins.{name}" in safe
    for name in (
        "bytes", "bytearray", "list", "dict", "set", "frozenset",  # built by opcodes instead
        "eval", "exec", "getattr", "setattr", "__import__", "open", "compile", "globals",
        "vars", "type", "input", "breakpoint", "print", "delattr", "__build_class__",
    ):  # fmt: skip
        assert f"builtins.{name}" not in safe
    assert all(name.startswith("builtins.") for name in safe)


@pytest.mark.parametrize(
    "obj",
    [
        complex(1, 2),
        range(1, 10, 3),
        slice(1, None, 2),
        {1, 2},
        frozenset({3}),
        bytearray(b"ab"),
        Ellipsis,
        NotImplemented,
        {"nested": [(1, 2.0, "three", b"four", None, True)]},
    ],
    ids=repr,
)
def test_restrict_builtins_admits_safe_builtins(obj: object) -> None:
    ser = PickleSerializer(restrict=["builtins"])
    assert ser.load(transmit(ser.dump(obj))) == obj


def test_restrict_builtins_admits_exceptions() -> None:
    ser = PickleSerializer(restrict=["builtins"])
    out = ser.load(ser.dump(ValueError("bad", 3)))
    assert type(out) is ValueError and out.args == ("bad", 3)


def test_restrict_builtins_is_only_the_safe_ones() -> None:
    ser = PickleSerializer(restrict=["builtins"])
    for name in ("getattr", "eval", "exec", "open", "__import__", "compile"):
        with pytest.raises(pickle.UnpicklingError, match=f"builtins.{name}"):
            ser.load(Stream.frombytes(global_pickle("builtins", name)))


def test_a_builtin_listed_by_name_is_allowed() -> None:
    ser = PickleSerializer(restrict=["builtins", "builtins.getattr"])
    assert ser.load(Stream.frombytes(global_pickle("builtins", "getattr"))) is getattr
    with pytest.raises(pickle.UnpicklingError):
        ser.load(Stream.frombytes(global_pickle("builtins", "eval")))


@pytest.mark.parametrize(
    "restrict",
    [
        ["builtins"],
        ["builtins", "numpy"],
        sorted(PickleSerializer.NUMPY_GLOBALS),
        ["collections.OrderedDict", POINT],
        [],
    ],
    ids=["builtins", "builtins+numpy", "numpy-globals", "exact-names", "nothing"],
)
def test_malicious_pickles_execute_nothing(tmp_path: object, restrict: list[str]) -> None:
    path = os.path.join(str(tmp_path), "pwned")
    ser = PickleSerializer(restrict=restrict)
    for evil in evil_payloads(path):
        stream = PickleSerializer().dump(evil)
        name = f"{evil.action.__module__}.{evil.action.__qualname__}"  # type: ignore[attr-defined]
        with pytest.raises(pickle.UnpicklingError, match=name):
            ser.load(transmit(stream))
        assert not os.path.exists(path)


def test_malicious_pickles_do_run_when_unrestricted(tmp_path: object) -> None:
    # The control for the test above: each payload really creates the file.
    path = os.path.join(str(tmp_path), "pwned")
    for evil in evil_payloads(path):
        result = PickleSerializer().load(PickleSerializer().dump(evil))
        if hasattr(result, "close"):
            result.close()
        assert os.path.exists(path), evil.action
        os.remove(path)


def test_restrict_exact_names() -> None:
    ser = PickleSerializer(restrict=["collections.OrderedDict", POINT])
    assert ser.load(ser.dump(collections.OrderedDict(a=1))) == {"a": 1}
    assert ser.load(ser.dump(Point(3, 4))) == Point(3, 4)  # plain classes need no copyreg
    with pytest.raises(pickle.UnpicklingError, match="collections.Counter"):
        ser.load(ser.dump(collections.Counter("aab")))
    with pytest.raises(pickle.UnpicklingError, match="Point"):
        PickleSerializer(restrict=["builtins"]).load(ser.dump(Point(3, 4)))


def test_restrict_module_admits_submodules_but_not_lookalikes() -> None:
    ser = PickleSerializer(restrict=["collections"])
    assert ser.load(ser.dump(collections.OrderedDict(a=1))) == {"a": 1}
    abc = sys.modules["collections.abc"]
    assert ser.load(ser.dump(abc.Mapping)) is abc.Mapping
    lookalike = PickleSerializer(restrict=["collection"])
    with pytest.raises(pickle.UnpicklingError):
        lookalike.load(ser.dump(collections.OrderedDict(a=1)))


def test_allowed_module_cannot_leak_what_it_imported() -> None:
    # logging does "import os": logging.os.system is os.system.
    leak = Stream.frombytes(global_pickle("logging", "os.system"))
    assert PickleSerializer().load(leak) is os.system  # the attack is real
    with pytest.raises(pickle.UnpicklingError, match="logging.os.system"):
        PickleSerializer(restrict=["logging"]).load(leak)


def test_allowed_module_cannot_reach_builtins_through_dunders() -> None:
    leak = Stream.frombytes(global_pickle("numpy", "load.__builtins__"))
    assert PickleSerializer().load(leak)["eval"] is eval  # the attack is real
    with pytest.raises(pickle.UnpicklingError, match="__builtins__"):
        PickleSerializer(restrict=["numpy"]).load(leak)


def test_allowed_module_refuses_dunder_attribute_paths() -> None:
    # Counter.__init__ is defined in collections, so only the dunder rule stops this path.
    path = Stream.frombytes(global_pickle("collections", "Counter.__init__"))
    assert PickleSerializer().load(path) is collections.Counter.__init__
    with pytest.raises(pickle.UnpicklingError, match="Counter.__init__"):
        PickleSerializer(restrict=["collections"]).load(path)


def test_allowed_module_does_not_import_dunder_submodules() -> None:
    assert "unittest.__main__" not in sys.modules
    with pytest.raises(pickle.UnpicklingError, match="unittest.__main__"):
        PickleSerializer(restrict=["unittest"]).load(
            Stream.frombytes(global_pickle("unittest.__main__", "main"))
        )
    assert "unittest.__main__" not in sys.modules


@pytest.mark.parametrize(
    "restrict",
    [["numpy", "builtins"], sorted(PickleSerializer.NUMPY_GLOBALS)],
    ids=["numpy-module", "numpy-globals"],
)
def test_restrict_admits_numpy(restrict: list[str]) -> None:
    ser = PickleSerializer(restrict=restrict)
    payload = [
        np.arange(5, dtype=np.float32),
        np.arange(THRESHOLD, dtype=np.uint16),
        np.float64(2.5),
        np.int8(-3),
        np.dtype(">i4"),
        np.array([1, 2, None], dtype=object),
    ]
    out = ser.load(transmit(ser.dump(payload)))
    np.testing.assert_array_equal(out[0], payload[0])
    np.testing.assert_array_equal(out[1], payload[1])
    assert out[2] == 2.5 and type(out[2]) is np.float64
    assert out[3] == -3 and type(out[3]) is np.int8
    assert out[4] == np.dtype(">i4")
    assert list(out[5]) == [1, 2, None]


def test_numpy_globals_do_not_trust_all_of_numpy() -> None:
    ser = PickleSerializer(restrict=sorted(PickleSerializer.NUMPY_GLOBALS))
    with pytest.raises(pickle.UnpicklingError, match="numpy.savetxt"):
        ser.load(Stream.frombytes(global_pickle("numpy", "savetxt")))


def test_empty_is_a_method_as_in_the_seed():
    """The seed's API: ``stream.empty()``; a property would make ``if s.empty()`` fail."""
    s = Stream()
    assert callable(s.empty) and s.empty() is True
    s.writechunk(b"x")
    assert s.empty() is False


# ================================================================== numpy arrays without pickle

PLAIN_ARRAYS = [
    np.arange(10, dtype=np.int16),
    np.arange(THRESHOLD, dtype=np.float64).reshape(256, -1),
    np.asfortranarray(np.arange(THRESHOLD, dtype=np.int32).reshape(128, -1)),
    np.asfortranarray(np.arange(12, dtype=np.uint8).reshape(3, 4)),
    np.array(3.5),
    np.zeros((0, 7), dtype=np.float32),
    np.array([1 + 2j, 3j], dtype=">c16"),
    np.array([True, False]),
    np.array(["netq", "ß"], dtype="<U4"),
    np.array([b"ab", b"c"], dtype="S2"),
    np.array(["2026-11-28T21:00"], dtype="datetime64[ns]"),
    np.arange(6, dtype=np.float16).reshape(1, 2, 1, 3),
]


@pytest.mark.parametrize("array_", PLAIN_ARRAYS,
                         ids=["small", "large", "fortran-large", "fortran-small", "0-d", "empty",
                              "big-endian", "bool", "unicode", "bytes", "datetime", "4-d"])
@pytest.mark.parametrize("writable", [True, False], ids=["writable", "read-only"])
def test_plain_numpy_arrays_travel_as_a_header_and_their_bytes(array_: np.ndarray,
                                                                writable: bool) -> None:
    """No pickle: part 0 is the array header (the array's bytes follow it when small), a large
    array's memory is the second part; dtype, shape, order and values come back, and the array
    is writable when the sender's was (always, when small: it is a copy of the first part)."""
    array_ = array_.copy(order="K")
    array_.flags.writeable = writable
    ser = PickleSerializer()
    parts = ser.dump_parts(array_)
    assert bytes(parts[0][:4]) == ARRAY_MAGIC
    assert len(parts) == (2 if array_.nbytes >= THRESHOLD else 1)
    assert ser.dump(array_).nchunks == len(parts)
    for out in (ser.load(transmit(ser.dump(array_))),
                ser.load_parts([p if not isinstance(p, memoryview) else received(p)
                                for p in parts])):
        assert type(out) is np.ndarray
        assert out.dtype == array_.dtype and out.shape == array_.shape
        assert out.flags.f_contiguous == array_.flags.f_contiguous
        np.testing.assert_array_equal(out, array_)
        assert out.flags.writeable == (writable or len(parts) == 1)


@pytest.mark.parametrize(
    "array_",
    [np.zeros(THRESHOLD, dtype=[("a", "<i4"), ("b", ">f8")]),
     np.array([1, "x", None], dtype=object),
     np.arange(20)[::2],
     np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])],
    ids=["structured", "object", "strided", "subclass"],
)
def test_other_arrays_still_go_through_pickle(array_: np.ndarray) -> None:
    ser = PickleSerializer()
    parts = ser.dump_parts(array_)
    assert bytes(parts[0][:1]) == b"\x80"  # pickle's PROTO opcode
    received = ser.load(transmit(ser.dump(array_)))
    assert type(received) is type(array_) and received.dtype == array_.dtype
    np.testing.assert_array_equal(received, array_)


def test_restrict_decides_for_arrays_as_it_does_for_their_pickles() -> None:
    parts = PickleSerializer().dump_parts(np.arange(4))
    for allowed in (["numpy"], sorted(PickleSerializer.NUMPY_GLOBALS)):
        np.testing.assert_array_equal(PickleSerializer(restrict=allowed).load_parts(parts),
                                      np.arange(4))
    with pytest.raises(pickle.UnpicklingError, match="numpy.ndarray"):
        PickleSerializer(restrict=["builtins"]).load_parts(parts)


def _header(order: int = 0, ndim: int = 1, code: bytes = b"<i8", shape=(4,)) -> bytes:
    return (ARRAY_MAGIC + bytes([order, ndim, len(code)]) + code
            + b"".join(int(n).to_bytes(8, "little") for n in shape))


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        ([ARRAY_MAGIC + b"\x00"], "truncated: 5 bytes"),
        ([_header()[:-3]], "truncated"),
        ([b"\x00nqX" + _header()[4:] + bytes(32)], "not a netq numpy array header"),
        ([_header(order=2) + bytes(32)], "order 2"),
        ([_header(ndim=65, shape=[1] * 65)], "65 dimensions"),
        ([_header(code=b"")], "dtype of 0 bytes"),
        ([_header(code=b"<\xff8") + bytes(32)], "not ASCII"),
        ([_header(code=b"<q9") + bytes(32)], "not a dtype"),
        ([_header(code=b"|O") + bytes(8 * 4)], "not a plain dtype"),
        ([_header() + bytes(31)], "says 32 bytes"),
        ([_header(shape=(2**62,)) + bytes(32)], "says 36893488147419103232 bytes"),
        ([_header(), bytes(33)], "says 32 bytes"),
        ([_header() + b"x", bytes(32)], "trailing bytes"),
        ([_header(), bytes(16), bytes(16)], "3 parts"),
    ],
    ids=["short", "truncated-shape", "magic", "order", "ndim", "no-dtype", "non-ascii",
         "bad-dtype", "object-dtype", "short-data", "huge-shape", "long-data",
         "trailing", "three-parts"],
)
def test_a_hostile_array_header_is_refused_with_what_is_wrong(parts: list, match: str) -> None:
    """Each field checked before it is used: nothing is allocated from what the header claims
    (a shape of 2**62 elements is compared, not allocated)."""
    with pytest.raises(ValueError, match=match):
        PickleSerializer().load_parts(parts)


@settings(max_examples=400)
@given(st.binary(max_size=200), st.lists(st.binary(max_size=64), max_size=2))
def test_arbitrary_bytes_behind_the_array_magic_raise_only_typed_errors(body: bytes,
                                                                         rest: list) -> None:
    try:
        PickleSerializer().load_parts([ARRAY_MAGIC + body, *rest])
    except (ValueError, pickle.UnpicklingError):
        pass


# A fresh interpreter in which one thread's `import numpy` is held half done (in sys.modules,
# nothing bound yet) while other threads serialize and deserialize: what a program sees when
# a get() thread or a put() thread meets numpy being imported by another of its threads.
_HALF_IMPORTED_NUMPY = r"""
import importlib.abc, importlib.util, json, sys, threading
from netq.stream import DEFAULT_SERIALIZER

release, started = threading.Event(), threading.Event()

class HeldNumpy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "numpy":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("numpy")
        real = spec.loader

        class Held(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                started.set()
                release.wait(60)
                real.exec_module(module)

        spec.loader = Held()
        return spec

sys.meta_path.insert(0, HeldNumpy())
importer = threading.Thread(target=lambda: __import__("numpy"))
importer.start()
assert started.wait(60), "numpy's import never started"
assert "numpy" in sys.modules and not hasattr(sys.modules["numpy"], "ndarray")
outcome = {}
try:  # the send side, as put_many() and put() serialize
    DEFAULT_SERIALIZER.dump_parts([b"x" * 10, 1])
    DEFAULT_SERIALIZER.dump([1, 2])
    outcome["dump"] = "ok"
except Exception as error:
    outcome["dump"] = repr(error)

def load():  # the receive side: an array message, as get() deserializes it
    try:
        outcome["load"] = DEFAULT_SERIALIZER.load_parts([bytes.fromhex(sys.argv[1])]).tolist()
    except Exception as error:
        outcome["load"] = repr(error)

loader = threading.Thread(target=load)
loader.start()

def waiting_for_the_import():
    frame = sys._current_frames().get(loader.ident)
    while frame is not None:
        if "importlib._bootstrap" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False

# Release numpy only once the loader has finished or waits for that import (bounded).
for _ in range(6000):
    if not loader.is_alive() or waiting_for_the_import():
        break
    loader.join(0.01)
release.set()
importer.join(60)
loader.join(60)
print(json.dumps(outcome))
"""


@pytest.mark.timeout(90)
def test_numpy_half_imported_by_another_thread_is_waited_for_not_read() -> None:
    import json
    import subprocess

    message = DEFAULT_SERIALIZER.dump_parts(np.arange(6, dtype=np.int32))
    assert len(message) == 1 and bytes(message[0][:4]) == ARRAY_MAGIC
    run = subprocess.run([sys.executable, "-c", _HALF_IMPORTED_NUMPY, bytes(message[0]).hex()],
                         capture_output=True, text=True, timeout=80)
    assert run.returncode == 0, run.stderr
    outcome = json.loads(run.stdout.splitlines()[-1])
    assert outcome == {"dump": "ok", "load": [0, 1, 2, 3, 4, 5]}
