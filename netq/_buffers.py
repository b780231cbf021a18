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
  lazily, so it stays correct. The view must be dropped once the buffer is full.

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
        storage = (ctypes.c_char * size).from_address(id(obj) + _BYTES_DATA_OFFSET)
        return obj, memoryview(storage).cast("B")

else:  # pragma: no cover - non-CPython

    def allocate_writable(size: int) -> bytearray:
        return bytearray(size)

    def allocate_readonly(size: int) -> tuple[bytes | bytearray, memoryview]:
        obj = bytearray(size)
        return obj, memoryview(obj)
