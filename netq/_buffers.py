"""Receive buffers: allocated by netq, written by ``recv_into``, handed to the user.

Large messages are bound by memory copies (ANCHORS.md: every extra user-space pass costs about
as much as the socket path), so a large part is received straight into the buffer behind the
object ``get()`` returns. Only buffers the interpreter lets Python code write are written:
``bytearray`` objects and anonymous ``mmap`` maps, through ordinary memoryviews. (An
immutable ``bytes`` object can be neither created uninitialized nor filled afterwards without
going around CPython's C API, so read-only parts that are large are no longer ``bytes``.)

What a received part is, by the sender's buffer and the part's size:

* **writable** (any size): a ``bytearray`` (numpy arrays rebuilt from it are writable). A
  fresh one is zero-filled by ``bytearray(n)``; a large one is usually a reused buffer of the
  link's :class:`ReceivePool`, which is not filled again.
* **read-only, smaller than** :data:`LARGE` (64 KiB): ``bytes``, cut out of the link's staging
  buffer or out of a small ``bytearray`` it was reassembled in: the one copy, of < 64 KiB.
* **read-only, from** :data:`LARGE`: a read-only ``memoryview`` (format ``"B"``, 1-D) of a
  buffer netq owns, received into without a copy: a ``bytearray``, or from :data:`MMAP_MIN`
  (32 MiB) an anonymous private ``mmap`` (the kernel zero-fills its pages lazily, as it
  faults them in, so no user-space pass precedes the receive). Numpy arrays rebuilt from it
  are read-only, and ``bytes(part)`` is the copy for whoever needs a ``bytes`` object.

No ``ctypes``, no private interpreter API: the GC, the allocator and every other thread see
only objects in states CPython itself creates.
"""

from __future__ import annotations

import mmap
import sys
from typing import cast

__all__ = ("allocate_writable", "allocate_readonly", "ReceivePool", "Part", "LARGE", "MMAP_MIN",
           "POOL_MIN")

Part = bytes | bytearray | memoryview  # a received message part: the object the user gets

# Read-only parts at least this large arrive as read-only memoryviews (no copy); smaller ones
# as bytes (copied: a copy of < 64 KiB costs less than the part's own frame handling). The
# same bound as PickleSerializer's default copy_threshold: out-of-band buffers are this large.
LARGE = 64 * 1024
# Read-only parts at least this large live in anonymous maps rather than bytearrays: no
# zero-filling pass of their own. glibc maps blocks this large itself (its mmap threshold
# grows to at most 32 MiB), so a map costs the same page faults and saves the memset (fresh
# allocation and fill, 48 MiB: 25 ms mapped, 27 ms as a bytearray). Below it the heap keeps
# freed blocks resident and a fresh bytearray costs its memset but no page faults, which a
# fresh map always pays (1 MiB: 80 us as a bytearray, 350 us mapped; 16 MiB: 3.8 ms, 8.9 ms).
MMAP_MIN = 32 * 1024 * 1024
_MAP_PRIVATE = getattr(mmap, "MAP_PRIVATE", None)  # not on Windows: bytearrays there


def allocate_writable(size: int) -> bytearray:
    """A writable part of ``size`` bytes (zero-filled: ``bytearray(size)``)."""
    return bytearray(size)


def _backing(size: int) -> bytearray | mmap.mmap:
    """The memory of a read-only part of ``size`` bytes (>= LARGE)."""
    if size >= MMAP_MIN and _MAP_PRIVATE is not None:
        try:
            # Private: a child made by fork() gets its own copy on write, as with heap memory.
            return mmap.mmap(-1, size, flags=_MAP_PRIVATE)
        except OSError:  # out of mappings or address space: the heap may still have room
            pass
    return bytearray(size)


def allocate_readonly(size: int) -> tuple[Part, memoryview]:
    """A read-only part of ``size`` bytes and a writable view to fill it through.

    From :data:`LARGE` bytes the part is a read-only memoryview of the buffer the view
    writes (the object the user gets); below, it is a ``bytearray`` that the caller turns
    into ``bytes`` once it is full (:func:`seal`). Release the view once the part is full."""
    if size < LARGE:
        small = bytearray(size)
        return small, memoryview(small)
    backing = _backing(size)
    return memoryview(backing).toreadonly(), memoryview(backing)


def seal(part: Part, readonly: bool) -> Part:
    """The part the user gets for a filled :func:`allocate_readonly` / ``allocate`` result:
    ``bytes`` for a small read-only one (a copy), the object itself otherwise."""
    if readonly and type(part) is bytearray:
        return bytes(part)
    return part


# ---------------------------------------------------------------------------- reuse

# Parts at least this large are remembered for reuse. glibc gives the top of its heap back
# to the system when a free of 64 KiB or more leaves enough free there, so a stream of
# freshly allocated 64 KiB parts kept faulting its pages in again (several faults a message).
POOL_MIN = LARGE
# How many a pool remembers: at least POOL_BUFFERS (the one being filled, the caller's, one
# queued), and more while they total at most POOL_BYTES. A reader that runs ahead of get()
# has several messages queued, each holding its buffer; the next free one is then the oldest.
POOL_BUFFERS = 4
POOL_BYTES = 1024 * 1024
# Buffers looked at per allocation, oldest first: the ones get() has released, when a caller
# drops each message after use. One that keeps every message pays this many looks, not more.
POOL_SCAN = 8
_REFS_WHEN_FREE = 3  # the pool's list, the local variable and getrefcount()'s argument


class ReceivePool:
    """Large receive buffers, filled again once nothing outside the pool refers to them.

    The parts of a received message are allocated by the I/O thread and handed to the caller
    of ``get()``. A large fresh allocation costs a page fault per 4 KiB page whenever the
    allocator has given the memory back to the system, which it does as soon as a few large
    blocks are freed (for example when the caller keeps the previous message while it takes
    the next), and a fresh ``bytearray`` is zero-filled too: about as much as receiving the
    bytes. So the pool remembers the buffers behind the most recent parts of
    :data:`POOL_MIN` bytes or more (:data:`POOL_BUFFERS` of them, more while they total at
    most :data:`POOL_BYTES`), and a part of the same size is received into one of them if the
    pool holds the only reference to it. CPython counts every holder: the caller's variables,
    the read-only memoryview a read-only part is, memoryviews and numpy arrays built on a part
    (each holds a reference to the buffer it exports). Only the :data:`POOL_SCAN` least
    recently used are looked at. What is reused is a ``bytearray`` or an anonymous map that
    nothing else can see: writing it is no different from writing a fresh one.

    Memory: the pool keeps alive beyond their use at most :data:`POOL_BUFFERS` buffers, or
    :data:`POOL_BYTES` bytes of them if that is more; :meth:`clear` drops them (a link that
    closes or idles). It grows past a few buffers only when every one it looked at was still
    held, which takes a reader that many messages ahead of ``get()`` (as many as the link's
    credit window lets the peer send). One thread only (the link's I/O thread).
    """

    __slots__ = ("_buffers", "_bytes")

    def __init__(self) -> None:
        self._buffers: list[bytearray | mmap.mmap] = []
        self._bytes = 0  # their total size

    def __len__(self) -> int:
        return len(self._buffers)

    def allocate(self, size: int, readonly: bool) -> tuple[Part, memoryview]:
        """A part of ``size`` bytes and a writable view to fill it (release it when full).

        The part is what the user gets (a ``bytearray``; when ``readonly``, a read-only
        memoryview), except for a read-only part below :data:`LARGE`: a ``bytearray`` for
        :func:`seal` to copy into ``bytes``."""
        if size < POOL_MIN:
            if readonly:
                return allocate_readonly(size)
            obj = allocate_writable(size)
            return obj, memoryview(obj)
        kind = mmap.mmap if readonly and size >= MMAP_MIN and _MAP_PRIVATE is not None \
            else bytearray
        buffers = self._buffers
        getrefcount = sys.getrefcount
        # Not enumerate(): its tuple would hold a reference.
        for index in range(min(len(buffers), POOL_SCAN)):
            backing = buffers[index]
            if (type(backing) is kind and len(backing) == size
                    and getrefcount(backing) == _REFS_WHEN_FREE):
                del buffers[index]
                buffers.append(backing)  # most recently used last
                view = memoryview(backing)
                if readonly:
                    return memoryview(backing).toreadonly(), view
                return cast(bytearray, backing), view  # the kind of a writable part
        if readonly:
            part, view = allocate_readonly(size)
            backing = view.obj  # type: ignore[assignment]  # the bytearray or map it writes
        else:
            part = backing = allocate_writable(size)
            view = memoryview(backing)
        buffers.append(backing)
        self._bytes += size
        while len(buffers) > POOL_BUFFERS and self._bytes > POOL_BYTES:
            self._bytes -= len(buffers.pop(0))
        return part, view

    @property
    def capacity(self) -> int:
        """Bytes of the buffers the pool remembers (some may still be the user's messages)."""
        return self._bytes

    def clear(self) -> None:
        self._buffers.clear()
        self._bytes = 0
