"""Every kind of large part arrives as the kind the receiver always got, on every road.

A part crosses a Unix socket in a shared-memory segment (``unix``), through the socket
(``unix-noshm``) or over TCP (``tcp``). Whatever the road, ``get()`` hands back the same kind,
dtype, shape, order, writability and bytes (CRC), and over ``unix`` statistics() counts the
message among ``shm_messages_in``. From ``MMAP_MIN`` a writable array's part is received into
an anonymous map instead of a zero-filled bytearray (the wire's ARRAY bit), while a
``bytearray`` the sender put still comes back as one. Real sockets on loopback (the suite's
``transport`` harness), real files for the memory maps.
"""

from __future__ import annotations

import mmap
import zlib

import pytest

import netq as nq
from netq._buffers import MMAP_MIN

np = pytest.importorskip("numpy")

MiB = nq.MiB
T = 30.0
SIZE = 2 * MiB + 16  # a multiple of 24; above shm_threshold (1 MiB): a segment over "unix"
MAPPED = MMAP_MIN + 16  # a multiple of 24 too: received into a map where the kind allows

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.parametrize("transport", ["unix", "unix-noshm", "tcp"],
                                      indirect=True)]


def _values(count: int, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(count).standard_normal(count).astype(dtype)


def _memmap(path, mode: str, size: int, order: str = "C") -> np.ndarray:
    source = _values(size // 4).reshape(-1, 6, order=order)
    source.tofile(path) if order == "C" else source.T.tofile(path)
    return np.memmap(path, np.float32, mode, shape=source.shape, order=order)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


# name -> (make(tmp_path, size), the type get() returns, writable)
KINDS = {
    "array-writable": (lambda _, size: _values(size // 4).reshape(-1, 6), np.ndarray, True),
    "array-fortran": (lambda _, size: np.asfortranarray(
        _values(size // 8, "float64").reshape(-1, 3)), np.ndarray, True),
    "array-frombuffer": (lambda _, size: np.frombuffer(_values(size // 4).tobytes(), np.float32),
                         np.ndarray, False),
    "array-flag-read-only": (lambda _, size: _read_only(_values(size // 2, "int16").reshape(6, -1)),
                             np.ndarray, False),
    "memmap-r": (lambda tmp, size: _memmap(tmp / "r.dat", "r", size), np.ndarray, False),
    "memmap-r-fortran": (lambda tmp, size: _memmap(tmp / "f.dat", "r", size, "F"), np.ndarray,
                         False),
    "memmap-r+": (lambda tmp, size: _memmap(tmp / "rw.dat", "r+", size), np.ndarray, True),
    "bytes": (lambda _, size: _values(size // 4).tobytes(), memoryview, False),
    "bytearray": (lambda _, size: bytearray(_values(size // 4).tobytes()), bytearray, True),
    "memoryview-read-only": (lambda _, size: memoryview(_values(size // 4).tobytes()), memoryview,
                             False),
    "memoryview-writable": (lambda _, size: memoryview(bytearray(_values(size // 4).tobytes())),
                            bytearray, True),
}


def _writable(obj) -> bool:
    if isinstance(obj, np.ndarray):
        return obj.flags.writeable
    return not memoryview(obj).readonly


def _crc(obj) -> int:
    if isinstance(obj, np.ndarray):
        return zlib.crc32(obj.tobytes(order="A"))
    return zlib.crc32(memoryview(obj).cast("B"))


def _memory_of(array: np.ndarray):
    """The object that owns an array's memory (the end of its chain of bases)."""
    owner = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner.obj if type(owner) is memoryview else owner


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_arrives_as_it_always_did(transport, kind, tmp_path):
    _round_trip(transport, kind, tmp_path, SIZE)


@pytest.mark.parametrize("kind", ["array-writable", "memmap-r+", "array-frombuffer", "bytearray",
                                  "memoryview-writable"])
def test_from_mmap_min_an_array_lands_in_a_map_and_a_bytearray_stays_one(transport, kind,
                                                                          tmp_path):
    got = _round_trip(transport, kind, tmp_path, MAPPED)
    if transport.spec.name != "unix" and kind in ("array-writable", "memmap-r+"):
        assert type(_memory_of(got)) is mmap.mmap  # no zero-filled bytearray first


def _round_trip(transport, kind: str, tmp_path, size: int):
    """Send one ``kind`` of ``size`` bytes from a client to its server; check what arrives as
    the module docstring says, and return it."""
    make, expected_type, writable = KINDS[kind]
    sent = make(tmp_path, size)
    server = transport.make_server()
    client = transport.connect(server)
    client.put(sent).result(T)
    got = server.get(timeout=T).data
    assert type(got) is expected_type
    assert _writable(got) == writable
    assert _crc(got) == _crc(sent)
    if isinstance(sent, np.ndarray):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert got.flags.c_contiguous == sent.flags.c_contiguous
        assert got.flags.f_contiguous == sent.flags.f_contiguous
    if writable:  # the receiver's own memory (copy-on-write over a segment)
        if isinstance(got, np.ndarray):
            got[(0,) * got.ndim] += 1
        else:
            got[0] ^= 0xFF
        assert _crc(got) != _crc(sent)
    shm = transport.spec.name == "unix"
    assert server.statistics().shm_messages_in == (1 if shm else 0)
    assert client.statistics().shm_messages_out == (1 if shm else 0)
    return got
