"""A received message's parts: filled while its body arrives, or cut out of staging whole.

The parts are allocated once, from the sizes in the message's descriptor, and are the objects
the user gets (:mod:`netq._buffers` says which type for which part): :class:`Incoming` holds
them while the body arrives, chunk by chunk and read by read (the I/O layer may write
straight into them: :meth:`Incoming.target`); :func:`cut_whole` makes them from a body that
is whole in the link's staging buffer. Used by the core
(:class:`netq.protocol.connection.Connection`) and its shared-memory side
(:mod:`netq.protocol.segments`).
"""

from __future__ import annotations

from .. import _buffers
from .._buffers import LARGE, POOL_MIN, Part
from .events import MessageReceived
from .frames import ARRAY_BIT, PART_SIZE_MASK, READONLY_BIT

__all__ = ("Incoming", "cut_whole")

_SIZE_MASK = PART_SIZE_MASK


class Incoming:
    """A message being reassembled from chunks."""

    __slots__ = ("seq", "batch", "objects", "views", "index", "pos", "remaining", "size",
                 "segments", "copies")

    def __init__(self, seq: int, batch: bool, sizes: list[int], total: int,
                 pool: _buffers.ReceivePool) -> None:
        self.segments: list[tuple[int, Part]] | None = None  # (index, mapped part), in order
        self.copies: list[int] | None = None  # small read-only parts: bytes once full
        self.seq = seq
        self.batch = batch
        self.objects: list[Part] = []
        self.views: list[memoryview] = []
        allocate = pool.allocate
        for raw in sizes:
            size = raw & _SIZE_MASK
            readonly = bool(raw & READONLY_BIT)
            obj, view = allocate(size, readonly, bool(raw & ARRAY_BIT))
            if readonly and size < LARGE:
                if self.copies is None:
                    self.copies = []
                self.copies.append(len(self.objects))
            self.objects.append(obj)
            self.views.append(view)
        self.index = 0
        self.pos = 0
        self.remaining = total
        self.size = total
        self._skip_empty()

    def _skip_empty(self) -> None:
        views = self.views
        while self.index < len(views) and self.pos == len(views[self.index]):
            self.index += 1
            self.pos = 0

    def fill(self, data: memoryview) -> None:
        """Copy ``data`` (at most ``remaining`` bytes) into the parts."""
        taken = 0
        size = len(data)
        while taken < size:
            target = self.views[self.index]
            count = min(len(target) - self.pos, size - taken)
            target[self.pos : self.pos + count] = data[taken : taken + count]
            taken += count
            self.pos += count
            self._skip_empty()
        self.remaining -= size

    def target(self, limit: int) -> memoryview:
        """Where the next bytes of the body go, at most ``limit`` of them."""
        view = self.views[self.index]
        return view[self.pos : self.pos + min(len(view) - self.pos, limit)]

    def adopt(self, data: memoryview) -> bool:
        """Take ``data`` as the part now being filled, when it is all of that part and the
        part is a large read-only one (a read-only memoryview, whose object the user gets):
        the part becomes a view of ``data``, not a copy, and the caller then moves past it
        (:meth:`advance`). False, with nothing changed, otherwise."""
        index = self.index
        part = self.objects[index]
        if self.pos or type(part) is not memoryview or not part.readonly \
                or len(part) != len(data) or self.segments is not None:
            return False
        self.views[index].release()  # the pool's buffer goes back to the pool
        self.views[index] = data
        self.objects[index] = data.toreadonly()
        return True

    def advance(self, count: int) -> None:
        self.pos += count
        self.remaining -= count
        self._skip_empty()

    def finish(self) -> MessageReceived:
        for view in self.views:
            view.release()
        self.views = []
        objects = self.objects
        if self.copies is not None:
            for index in self.copies:  # a read-only part below LARGE: bytes, a small copy
                objects[index] = bytes(objects[index])
        if self.segments is not None:
            for index, part in self.segments:
                objects.insert(index, part)
        return MessageReceived(self.seq, self.batch, objects, self.size)


def cut_whole(view: memoryview, buffer: bytearray, position: int, sizes: tuple[int, ...],
              pool: _buffers.ReceivePool) -> list[Part]:
    """The parts of a message whose body is whole in the staging buffer at ``position``.

    Small parts are cut out by slicing (``bytes`` for a read-only one, ``bytearray`` for a
    writable one); a large one is copied into a reused pool buffer, with no reassembly state
    for it (:class:`Incoming` is for a body still arriving).
    """
    parts: list[Part] = []
    for raw in sizes:
        size = raw & _SIZE_MASK
        stop = position + size
        if size >= POOL_MIN:
            part, target = pool.allocate(size, bool(raw & READONLY_BIT), bool(raw & ARRAY_BIT))
            target[:] = view[position:stop]
            target.release()
            parts.append(part)
        elif raw & READONLY_BIT:
            parts.append(bytes(view[position:stop]))
        else:
            parts.append(buffer[position:stop])
        position = stop
    return parts
