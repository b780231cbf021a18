"""Tests of netq.stream: the zero-copy Stream."""

from __future__ import annotations

import array
import collections
import copy

import numpy as np
import pytest
from hypothesis import given, strategies as st

from netq.stream import Stream

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


def test_from_flat_views_keeps_the_views_and_the_size_it_is_given() -> None:
    head, body = bytearray(b"head"), bytearray(b"body-bytes")
    stream = Stream.from_flat_views([memoryview(head), memoryview(body)], 14)
    assert (stream.nchunks, stream.nbytes) == (2, 14)
    body[0:4] = b"BODY"  # the views are the caller's memory, not copies
    assert stream.tobytes() == b"headBODY-bytes"
    assert [chunk.obj for chunk in stream] == [head, body]


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


def test_empty_is_a_method_as_in_the_seed():
    """The seed's API: ``stream.empty()``; a property would make ``if s.empty()`` fail."""
    s = Stream()
    assert callable(s.empty) and s.empty() is True
    s.writechunk(b"x")
    assert s.empty() is False
