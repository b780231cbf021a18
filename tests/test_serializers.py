"""Tests of netq.serializers: the Bytes/Pickle serializers."""

from __future__ import annotations

import array
import collections
import os
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from netq._buffers import LARGE
from netq.serializers import (
    DEFAULT_SERIALIZER,
    BytesSerializer,
    PickleSerializer,
    Serializer,
)
from netq.stream import Stream
from serializers_testing import THRESHOLD, Point, received, transmit

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


def test_bytes_serializer_empty_and_multi_chunk() -> None:
    ser = BytesSerializer()
    assert ser.dump(b"").empty()
    assert ser.load(ser.dump(b"")) == b""
    assert ser.load(Stream()) == b""
    assert ser.load(Stream([b"ab", b"cd"])) == b"abcd"


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
    arrived = transmit(stream)
    out = ser.load(arrived)
    assert type(out) is bytearray and out == data
    assert out is list(arrived)[1].obj


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


# --------------------------------------------------------------------------- inline forms


@pytest.mark.parametrize("threshold", [0, 1, 100, 65536])
def test_the_inline_forms_make_what_dump_parts_and_load_parts_make(threshold) -> None:
    """What put() and get() do inline (InlineForms) gives the same parts and objects as the
    serializer's dump_parts() and load_parts(), and leaves alone what they would not pickle
    whole: bytes sent by reference, and every other type."""
    serializer = PickleSerializer(copy_threshold=threshold)
    inline = serializer.inline_forms()
    objects = [0, -7, 2**70, 1.5, True, None, 3 + 4j, "", "netq", b"", b"x", b"y" * 99,
               b"z" * 100, b"w" * 65536, [1, 2], {"a": b"b"}, bytearray(b"q")]
    inlined = 0
    for obj in objects:
        kind = type(obj)
        parts = tuple(serializer.dump_parts(obj))
        if kind in inline.types and (kind is not bytes
                                     or len(obj) < inline.bytes_by_reference_from):
            assert (inline.dumps(obj),) == parts, obj
            inlined += 1
        else:
            assert kind not in inline.types or len(parts) == 2, obj  # bytes by reference
        received = [bytes(part) for part in parts]
        if len(received) == 1 and received[0][:1] != b"\x00":
            assert inline.loads is not None
            assert inline.loads(received[0]) == serializer.load_parts(received) == obj
    assert inlined >= 9


def test_a_restricting_serializer_has_no_inline_load() -> None:
    assert PickleSerializer(restrict=["builtins"]).inline_forms().loads is None
    assert PickleSerializer().inline_forms().loads is pickle.loads


def test_a_communicator_leaves_a_subclass_its_own_dump_and_load() -> None:
    """A PickleSerializer subclass may dump or load its own way: no inline forms for it."""
    from netq.communicator import _part_codecs
    from netq.options import SerializationOptions

    class Tagged(PickleSerializer):
        def dump_parts(self, obj):
            return super().dump_parts(("tagged", obj))

    tagged = Tagged()
    for options in (SerializationOptions(dump=tagged.dump, load=tagged.load),
                    SerializationOptions(dump=PickleSerializer().dump,
                                         load=PickleSerializer(restrict=["builtins"]).load)):
        _dump, _load, inline = _part_codecs(options)
        assert not inline.types and inline.loads is None
    _dump, _load, inline = _part_codecs(SerializationOptions())
    assert int in inline.types and inline.loads is pickle.loads
