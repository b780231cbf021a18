"""Tests of netq.numpy_arrays: numpy arrays without pickle."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from netq.numpy_arrays import ARRAY_MAGIC
from netq.serializers import DEFAULT_SERIALIZER, PickleSerializer
from serializers_testing import THRESHOLD, received, transmit

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


def test_pickled_arrays_from_read_only_parts_stay_read_only() -> None:
    """Out-of-band buffers of a pickled (structured) array: read-only when the sender's was."""
    ser = PickleSerializer()
    for writable in (True, False):
        array_ = np.zeros(THRESHOLD, dtype=[("a", "<i4"), ("b", ">f8")])
        array_.flags.writeable = writable
        out = ser.load(transmit(ser.dump(array_)))
        assert out.flags.writeable == writable
        np.testing.assert_array_equal(out, array_)


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


@pytest.mark.parametrize("mode", ["r", "r+", "c"])
def test_a_memmap_travels_as_a_plain_array(tmp_path, mode: str) -> None:
    """np.memmap skips pickle like an ndarray (its bytes are all there is to it) and comes
    back as a plain ndarray, read-only when the map was opened "r"."""
    source = np.arange(THRESHOLD, dtype=np.float32).reshape(64, -1)
    source.tofile(tmp_path / "m.dat")
    mapped = np.memmap(tmp_path / "m.dat", np.float32, mode, shape=source.shape)
    ser = PickleSerializer()
    parts = ser.dump_parts(mapped)
    assert bytes(parts[0][:4]) == ARRAY_MAGIC and len(parts) == 2
    out = ser.load_parts([received(parts[0]), received(parts[1])])
    assert type(out) is np.ndarray and out.flags.writeable == (mode != "r")
    np.testing.assert_array_equal(out, source)
    del mapped, parts


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
from netq.serializers import DEFAULT_SERIALIZER

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
