"""Receive buffers that are allocated exactly once, uninitialized, and handed to the user.

Large messages are bound by memory copies (ANCHORS.md: every extra user-space pass costs about
as much as the socket path). ``bytearray(n)`` zero-fills: ~0.5 ms per 16 MiB, for bytes that
``recv_into`` overwrites a moment later. CPython's C API creates both ``bytes`` and
``bytearray`` objects without initializing them (``Py*_FromStringAndSize(NULL, n)``); we call it
through ``ctypes`` and receive straight into the object the user will get:

* ``allocate_writable(n)`` -> an uninitialized ``bytearray`` (numpy arrays rebuilt from it stay
  writable);
* ``allocate_readonly(n)`` -> ``(bytes, view)``: a fresh, not yet shared ``bytes`` object and a
  writable view of its storage. Filling a ``bytes`` object before anyone else has a reference
  to it is what C code does with ``PyBytes_FromStringAndSize(NULL, n)``; the hash is computed
  lazily, so it stays correct. The view must be dropped once the buffer is full (it keeps
  the object alive, as any memoryview does).

Where ``ctypes.pythonapi`` is missing (not CPython) both fall back to zero-filled bytearrays:
read-only parts then arrive as ``bytearray`` instead of ``bytes``.
"""

from __future__ import annotations

import sys

__all__ = ("allocate_writable", "allocate_readonly", "ZERO_COPY_ALLOCATION")

try:
    import ctypes

    _bytearray_new = ctypes.pythonapi.PyByteArray_FromStringAndSize
    _bytearray_new.restype = ctypes.py_object
    _bytearray_new.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    _bytes_new = ctypes.pythonapi.PyBytes_FromStringAndSize
    _bytes_new.restype = ctypes.py_object
    _bytes_new.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    # ob_sval sits at the end of the bytes header; sizeof(b"") includes its NUL terminator.
    _BYTES_DATA_OFFSET = sys.getsizeof(b"") - 1
    ZERO_COPY_ALLOCATION = sys.implementation.name == "cpython"
except (ImportError, AttributeError):  # pragma: no cover - non-CPython
    ZERO_COPY_ALLOCATION = False


if ZERO_COPY_ALLOCATION:

    def allocate_writable(size: int) -> bytearray:
        """An uninitialized bytearray of ``size`` bytes."""
        return _bytearray_new(None, size)

    def allocate_readonly(size: int) -> tuple[bytes | bytearray, memoryview]:
        """A fresh bytes object of ``size`` bytes and a writable view to fill it through."""
        obj = _bytes_new(None, size)
        if size == 0:
            return obj, memoryview(bytearray())
        return obj, _storage_view(obj)

    def _storage_view(obj: bytes) -> memoryview:
        """A writable view of a bytes object's storage that keeps the object alive.

        A ctypes array made with ``from_address`` owns nothing; the reference stored on it
        gives the view what a memoryview of any object has: the memory it writes to cannot be
        freed (and reused by other objects) while the view, or a slice of it, exists."""
        storage = (ctypes.c_char * len(obj)).from_address(id(obj) + _BYTES_DATA_OFFSET)
        storage.owner = obj  # type: ignore[attr-defined]
        return memoryview(storage).cast("B")

else:  # pragma: no cover - non-CPython

    def allocate_writable(size: int) -> bytearray:
        return bytearray(size)

    def allocate_readonly(size: int) -> tuple[bytes | bytearray, memoryview]:
        obj = bytearray(size)
        return obj, memoryview(obj)


# ---------------------------------------------------------------------------- reuse

# Bytes: parts at least this large are remembered for reuse. glibc gives the top of its heap
# back to the system when a free of 64 KiB or more leaves enough free there, so a stream of
# freshly allocated 64 KiB parts kept faulting its pages in again (several faults a message).
POOL_MIN = 64 * 1024
# How many a pool remembers: at least POOL_BUFFERS (the one being filled, the caller's, one
# queued), and more while they total at most POOL_BYTES. A reader that runs ahead of get()
# has several messages queued, each holding its buffer; the next free one is then the oldest.
POOL_BUFFERS = 4
POOL_BYTES = 1024 * 1024
# Buffers looked at per allocation, oldest first: the ones get() has released, when a caller
# drops each message after use. One that keeps every message pays this many looks, not more.
POOL_SCAN = 8
_REFS_WHEN_FREE = 3  # the pool's list, the loop variable and getrefcount()'s argument


def _hash_slot_works() -> bool:
    """True when a bytes object's cached hash sits just before its data (CPython's layout)."""
    if not ZERO_COPY_ALLOCATION:
        return False
    probe, view = allocate_readonly(16)
    view[:] = b"netq hash probe!"
    view.release()
    slot = ctypes.c_ssize_t.from_address(id(probe) + _BYTES_DATA_OFFSET - 8)
    return slot.value == -1 and hash(probe) == slot.value


_BYTES_REUSABLE = _hash_slot_works()


class ReceivePool:
    """Large receive buffers, filled again once nothing outside the pool refers to them.

    The parts of a received message are allocated by the I/O thread and handed to the caller
    of ``get()``. A large fresh allocation costs a page fault per 4 KiB page whenever the
    allocator has given the memory back to the system, which it does as soon as a few large
    blocks are freed (for example when the caller keeps the previous message while it takes
    the next): about as much as receiving the bytes. So the pool remembers the most recent
    parts of :data:`POOL_MIN` bytes or more (:data:`POOL_BUFFERS` of them, more while they
    total at most :data:`POOL_BYTES`), and a part of the same kind and size is received into
    one of them if the pool holds the only reference to it (CPython counts every other
    holder: the caller's variables, memoryviews, numpy arrays built on it). Only the
    :data:`POOL_SCAN` least recently used are looked at. A reused ``bytes`` object gets its
    cached hash reset; where that layout is not CPython's, only ``bytearray`` parts are reused.

    Memory: the pool keeps alive beyond their use at most :data:`POOL_BUFFERS` buffers, or
    :data:`POOL_BYTES` bytes of them if that is more; :meth:`clear` drops them (a link that
    closes or idles). It grows past a few buffers only when every one it looked at was still
    held, which takes a reader that many messages ahead of ``get()`` (as many as the link's
    credit window lets the peer send). One thread only (the link's I/O thread).
    """

    __slots__ = ("_buffers", "_bytes")

    def __init__(self) -> None:
        self._buffers: list[bytes | bytearray] = []
        self._bytes = 0  # their total size

    def __len__(self) -> int:
        return len(self._buffers)

    def allocate(self, size: int, readonly: bool) -> tuple[bytes | bytearray, memoryview]:
        """A buffer of ``size`` bytes (``bytes`` when ``readonly``) and a view to fill it."""
        kind = bytes if readonly and ZERO_COPY_ALLOCATION else bytearray
        if size >= POOL_MIN and (kind is bytearray or _BYTES_REUSABLE):
            buffers = self._buffers
            getrefcount = sys.getrefcount
            # Not enumerate(): its tuple would hold a reference.
            for index in range(min(len(buffers), POOL_SCAN)):
                obj = buffers[index]
                if (type(obj) is kind and len(obj) == size
                        and getrefcount(obj) == _REFS_WHEN_FREE):
                    del buffers[index]
                    buffers.append(obj)  # most recently used last
                    return obj, self._view(obj)
        if readonly:
            obj, view = allocate_readonly(size)
        else:
            obj = allocate_writable(size)
            view = memoryview(obj)
        if size >= POOL_MIN:
            buffers = self._buffers
            buffers.append(obj)
            self._bytes += size
            while len(buffers) > POOL_BUFFERS and self._bytes > POOL_BYTES:
                self._bytes -= len(buffers.pop(0))
        return obj, view

    @staticmethod
    def _view(obj: bytes | bytearray) -> memoryview:
        if type(obj) is bytearray:
            return memoryview(obj)
        # Nobody else can see this bytes object: writing it is what filling a fresh one is.
        ctypes.c_ssize_t.from_address(id(obj) + _BYTES_DATA_OFFSET - 8).value = -1
        return _storage_view(obj)  # type: ignore[arg-type]

    @property
    def capacity(self) -> int:
        """Bytes of the buffers the pool remembers (some may still be the user's messages)."""
        return self._bytes

    def clear(self) -> None:
        self._buffers.clear()
        self._bytes = 0
