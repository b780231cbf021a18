"""netq._buffer_address: the address of a buffer's bytes for a copy that releases the GIL."""

from __future__ import annotations

import array
import ctypes
import mmap

import pytest

from netq._buffer_address import ExportedAddress

pytestmark = pytest.mark.timeout(30)

DATA = bytes(range(256)) * 64


@pytest.mark.parametrize("make", [
    lambda: DATA,
    lambda: memoryview(DATA)[1000:],
    lambda: bytearray(DATA),
    lambda: memoryview(bytearray(DATA)).toreadonly(),
    lambda: memoryview(array.array("d", range(512))).toreadonly(),
], ids=["bytes", "bytes-slice", "bytearray", "read-only-view", "read-only-doubles"])
def test_the_address_is_that_of_the_buffers_bytes(make):
    part = make()
    expected = memoryview(part).cast("B").tobytes()
    with ExportedAddress(part) as address:
        assert address is not None
        assert ctypes.string_at(address, len(expected)) == expected


def test_a_read_only_map_gives_its_address():
    with mmap.mmap(-1, len(DATA)) as writable:
        writable[:] = DATA
        view = memoryview(writable).toreadonly()
        with ExportedAddress(view) as address:
            assert address is not None and ctypes.string_at(address, 16) == DATA[:16]
        view.release()


def test_the_buffer_stays_exported_for_the_block_only():
    """Its owner cannot resize (and so move) the bytes while the copy runs."""
    owner = bytearray(DATA)
    with ExportedAddress(memoryview(owner).toreadonly()) as address:
        assert address is not None
        with pytest.raises(BufferError):
            owner.extend(b"x")
    owner.extend(b"x")  # released: free to resize again


def test_a_buffer_with_no_contiguous_address_gives_none():
    strided = memoryview(DATA)[::2]
    with ExportedAddress(strided) as address:
        assert address is None
