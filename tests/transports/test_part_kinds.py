"""Every kind of large part arrives as the kind the receiver always got, on every road.

A part crosses a Unix socket in a shared-memory segment (``unix``), through the socket
(``unix-noshm``) or over TCP (``tcp``). Whatever the road, ``get()`` hands back the same kind,
dtype, shape, order, writability and bytes (CRC), and over ``unix`` statistics() counts the
message among ``shm_messages_in``. Real sockets on loopback (the suite's ``transport``
harness), real files for the memory maps.
"""

from __future__ import annotations

import zlib

import pytest

import netq as nq

np = pytest.importorskip("numpy")

MiB = nq.MiB
T = 30.0
SIZE = 2 * MiB + 16  # a multiple of 24; above shm_threshold (1 MiB): a segment over "unix"

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.parametrize("transport", ["unix", "unix-noshm", "tcp"],
                                      indirect=True)]


def _values(count: int, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(count).standard_normal(count).astype(dtype)


def _memmap(path, mode: str, order: str = "C") -> np.ndarray:
    source = _values(SIZE // 4).reshape(-1, 6, order=order)
    source.tofile(path) if order == "C" else source.T.tofile(path)
    return np.memmap(path, np.float32, mode, shape=source.shape, order=order)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


# name -> (make(tmp_path), the type get() returns, writable)
KINDS = {
    "array-writable": (lambda _: _values(SIZE // 4).reshape(-1, 6), np.ndarray, True),
    "array-fortran": (lambda _: np.asfortranarray(_values(SIZE // 8, "float64").reshape(-1, 3)),
                      np.ndarray, True),
    "array-frombuffer": (lambda _: np.frombuffer(_values(SIZE // 4).tobytes(), np.float32),
                         np.ndarray, False),
    "array-flag-read-only": (lambda _: _read_only(_values(SIZE // 2, "int16").reshape(6, -1)),
                             np.ndarray, False),
    "memmap-r": (lambda tmp: _memmap(tmp / "r.dat", "r"), np.ndarray, False),
    "memmap-r-fortran": (lambda tmp: _memmap(tmp / "f.dat", "r", "F"), np.ndarray, False),
    "memmap-r+": (lambda tmp: _memmap(tmp / "rw.dat", "r+"), np.ndarray, True),
    "bytes": (lambda _: _values(SIZE // 4).tobytes(), memoryview, False),
    "bytearray": (lambda _: bytearray(_values(SIZE // 4).tobytes()), bytearray, True),
    "memoryview-read-only": (lambda _: memoryview(_values(SIZE // 4).tobytes()), memoryview,
                             False),
    "memoryview-writable": (lambda _: memoryview(bytearray(_values(SIZE // 4).tobytes())),
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


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_arrives_as_it_always_did(transport, kind, tmp_path):
    make, expected_type, writable = KINDS[kind]
    sent = make(tmp_path)
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
    del got, sent
