"""The address of a buffer's bytes, for a copy that releases the GIL (``ctypes.memmove``).

ctypes gives the address of a writable buffer (``c_char.from_buffer``) and refuses a
read-only one; a read-only buffer's (``bytes``, a read-only array, a read-only map) comes
from the buffer protocol's public C API (``PyObject_GetBuffer``), which also keeps the
buffer exported, so its owner can neither resize nor free it while the copy runs.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ("address", "ExportedAddress")


def address(view: memoryview) -> int:
    """The address of a writable, C-contiguous view's first byte (TypeError otherwise)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (the buffer protocol's public C struct)."""

    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_PyBUF_SIMPLE = 0  # contiguous bytes, read-only allowed


def _buffer_api() -> tuple[Any, Any] | None:
    """PyObject_GetBuffer and PyBuffer_Release through ctypes, None where the interpreter
    has no ``pythonapi`` (not CPython)."""
    api = getattr(ctypes, "pythonapi", None)
    if api is None:
        return None
    try:
        get, release = api.PyObject_GetBuffer, api.PyBuffer_Release
    except AttributeError:
        return None
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    get.restype = ctypes.c_int
    release.argtypes = [ctypes.POINTER(_PyBuffer)]
    release.restype = None
    return get, release


_BUFFER_API = _buffer_api()


class ExportedAddress:
    """The address of a contiguous buffer's bytes, held exported (its owner can neither
    resize nor free them) for the ``with`` block; None where none can be had. A writable
    buffer's address comes from ctypes itself; a read-only one's (``bytes``, a read-only
    array's view, a read-only map's) through the buffer protocol's C API, which ctypes
    offers for writable buffers only."""

    __slots__ = ("_part", "_buffer")

    def __init__(self, part: Any) -> None:
        self._part = part
        self._buffer: _PyBuffer | None = None

    def __enter__(self) -> int | None:
        part = self._part
        view = part if type(part) is memoryview else memoryview(part)
        if not view.readonly:
            try:
                return address(view)
            except (TypeError, ValueError):
                return None
        if _BUFFER_API is None or not view.contiguous:
            return None
        buffer = _PyBuffer()
        try:
            _BUFFER_API[0](part, ctypes.byref(buffer), _PyBUF_SIMPLE)
        except (TypeError, ValueError, BufferError):
            return None
        self._buffer = buffer
        return buffer.buf or None

    def __exit__(self, *_: object) -> None:
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            assert _BUFFER_API is not None  # it made the buffer
            _BUFFER_API[1](ctypes.byref(buffer))
