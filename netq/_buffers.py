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
  communicator's :class:`ReceivePool`, which is not filled again. An *array's* part (the
  sender's buffer was writable and no ``bytearray``: the wire's ``ARRAY`` bit) of
  :data:`MMAP_MIN` bytes or more is an anonymous private ``mmap`` instead: the arrays rebuilt
  from it are just as writable, and no zero-filling pass precedes the receive. A
  ``bytearray`` the sender put stays a ``bytearray``.
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
import threading
import time
from typing import cast

__all__ = ("allocate_writable", "allocate_readonly", "ReceivePool", "Part", "LARGE", "MMAP_MIN",
           "POOL_MIN", "POOL_LIMIT")

Part = bytes | bytearray | memoryview  # a received message part: the object the user gets

# Read-only parts at least this large arrive as read-only memoryviews (no copy); smaller ones
# as bytes (copied: a copy of < 64 KiB costs less than the part's own frame handling). The
# same bound as PickleSerializer's default copy_threshold: out-of-band buffers are this large.
LARGE = 64 * 1024
# Read-only and array parts at least this large live in anonymous maps, not bytearrays: no
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
    """The memory of a read-only or an array's part of ``size`` bytes (>= LARGE)."""
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
# Buffers looked at per allocation, least recently used first: the ones get() has released,
# when a caller drops each message after use. One that keeps every message pays this many
# looks, not more.
POOL_SCAN = 8
# The bytes a pool remembers when nobody says otherwise (a connection or carrier of its own,
# outside a communicator): a communicator's pool is bounded by its receive budget instead.
POOL_LIMIT = 64 * 1024 * 1024
# release_idle() drops the buffers unused for this long at least (seconds): every idle link of
# a communicator asks, many in one look at the timers, and one busy link keeps its buffers.
IDLE_AGE = 1.0


def _references_when_free() -> int:
    """What ``sys.getrefcount(buffers[index])`` says of a buffer only the pool's list holds,
    measured here with the expression :meth:`ReceivePool.allocate` uses, or -1 (never reuse)
    if this interpreter does not tell a held buffer from a free one that way.

    The expression is a subscript, not a local variable: an interpreter may pass a local to a
    call without counting a reference for it (CPython 3.14 does, where the optimizer proves the
    local outlives the call), and then a buffer the caller holds would count what a free one
    counted before. A subscript's result is always a counted reference of its own."""
    buffers = [bytearray(1)]
    free = sys.getrefcount(buffers[0])
    held = buffers[0]
    if sys.getrefcount(buffers[0]) != free + 1:
        return -1
    del held
    return free


_REFS_WHEN_FREE = _references_when_free()


class ReceivePool:
    """Large receive buffers, filled again once nothing outside the pool refers to them.

    The parts of a received message are allocated by the thread that reads the link and
    handed to the caller of ``get()``. A large fresh allocation costs a page fault per 4 KiB
    page whenever the allocator has given the memory back to the system, which it does as
    soon as a few large blocks are freed, and a fresh ``bytearray`` is zero-filled too: about
    as much as receiving the bytes. So the pool remembers the buffers behind recent parts of
    :data:`POOL_MIN` bytes or more, and a part of the same size and kind is received into one
    of them if the pool holds the only reference to it. CPython counts every holder: the
    caller's variables, the read-only memoryview a read-only part is, memoryviews and numpy
    arrays built on a part (each holds a reference to the buffer it exports). What is reused
    is a ``bytearray`` or an anonymous map that nothing else can see: writing it is no
    different from writing a fresh one.

    The buffers are kept least recently used first and only the :data:`POOL_SCAN` oldest are
    looked at. A pool remembers every buffer it handed out while messages hold them (a reader
    that runs ahead of ``get()`` has many queued, each holding its buffer; each returns to
    the front as get() consumes in order), so a stream whose queue is deeper than a few
    messages still finds a free buffer instead of a fresh one. Memory:

    * at most ``limit`` bytes of buffers, free or held (a communicator passes its
      ``recv_budget``: what it holds for messages received and not taken plus the free
      buffers stays within the budget, and the messages the caller keeps are the caller's),
      or two buffers of the size just allocated if that is more (a message may be larger than
      the budget: the one the caller holds and the next); the least recently used go first;
    * a free buffer of another size or kind than the one asked for, met among the oldest
      when no buffer fits, is dropped: a stream of varying sizes does not keep buffers it
      will not reuse;
    * :meth:`release_idle` (an idle link) drops the buffers no allocation has used since the
      call before that did (at least :data:`IDLE_AGE` seconds earlier); :meth:`clear` drops
      all of them.

    Thread-safe: a communicator's links share one pool, and a link is read by whichever
    thread drives it (the I/O thread, or a ``get()`` that leads the loop). One lock, taken once
    per large part.
    """

    __slots__ = ("_buffers", "_bytes", "_lock", "limit", "_used", "_aged_at")

    def __init__(self, limit: int = POOL_LIMIT) -> None:
        if limit < 0:
            raise ValueError("a pool's limit is a number of bytes, >= 0")
        self._buffers: list[bytearray | mmap.mmap] = []
        self._bytes = 0  # their total size
        self._lock = threading.Lock()
        self.limit = limit
        # Allocations since release_idle() last dropped: the buffers they used are the last ones.
        self._used = 0
        self._aged_at = -IDLE_AGE  # when release_idle() last dropped (time.monotonic)

    def __len__(self) -> int:
        return len(self._buffers)

    def allocate(self, size: int, readonly: bool, array: bool = False
                 ) -> tuple[Part, memoryview]:
        """A part of ``size`` bytes and a writable view to fill it (release it when full).

        The part is what the user gets (a ``bytearray``; when ``readonly``, a read-only
        memoryview; an ``mmap`` for a writable ``array`` part from :data:`MMAP_MIN`), except
        for a read-only part below :data:`LARGE`: a ``bytearray`` for :func:`seal` to copy
        into ``bytes``."""
        if size < POOL_MIN:
            if readonly:
                return allocate_readonly(size)
            obj = allocate_writable(size)
            return obj, memoryview(obj)
        kind = mmap.mmap if (readonly or array) and size >= MMAP_MIN \
            and _MAP_PRIVATE is not None else bytearray
        getrefcount = sys.getrefcount
        with self._lock:
            buffers = self._buffers
            self._used += 1
            index = 0
            looked = 0
            # Not enumerate(): its tuple would hold a reference.
            while index < len(buffers) and looked < POOL_SCAN:
                looked += 1
                if getrefcount(buffers[index]) != _REFS_WHEN_FREE:
                    index += 1  # a message still holds it
                    continue
                backing = buffers[index]
                if type(backing) is kind and len(backing) == size:
                    del buffers[index]
                    buffers.append(backing)  # most recently used last
                    view = memoryview(backing)
                    if readonly:
                        return memoryview(backing).toreadonly(), view
                    return cast(bytearray, backing), view  # a bytearray, or an array's map
                # Free, older than the buffers in use, and not what this stream asks for.
                del buffers[index]
                self._bytes -= len(backing)
                del backing  # freed now, before the fresh one is allocated
            if readonly:
                part, view = allocate_readonly(size)
                fresh = view.obj  # the bytearray or map it writes
            elif kind is mmap.mmap:
                # A map; a bytearray when no map can be made (out of mappings).
                part = fresh = _backing(size)  # type: ignore[assignment]
                view = memoryview(fresh)
            else:
                part = fresh = allocate_writable(size)
                view = memoryview(fresh)
            # Two of this size at least: the part a caller still holds while the next arrives.
            limit = max(self.limit, 2 * size)
            while buffers and self._bytes + size > limit:
                self._bytes -= len(buffers.pop(0))
            buffers.append(fresh)  # type: ignore[arg-type]  # a bytearray or an mmap
            self._bytes += size
        return part, view

    @property
    def capacity(self) -> int:
        """Bytes of the buffers the pool remembers (some may still be the user's messages)."""
        return self._bytes

    def release_idle(self, now: float | None = None) -> None:
        """Drop the buffers no allocation used since the last call that dropped, if that was
        :data:`IDLE_AGE` seconds ago or more (``now``: time.monotonic()). A link went idle:
        the buffers of the links still receiving stay."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._aged_at < IDLE_AGE:
                return
            self._aged_at = now
            keep = min(self._used, len(self._buffers))
            dropped = self._buffers[: len(self._buffers) - keep]
            del self._buffers[: len(self._buffers) - keep]
            self._bytes -= sum(len(buffer) for buffer in dropped)
            self._used = 0
        del dropped  # outside the lock: freeing a large buffer takes a while

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()
            self._bytes = 0
            self._used = 0
