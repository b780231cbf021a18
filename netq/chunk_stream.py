"""Zero-copy byte streams: what the serializers (:mod:`netq.serializers`) produce and consume.

The chunk model
---------------
A message travels as a :class:`Stream`: an ordered list of *chunks*, each a flat, C-contiguous
``memoryview`` of unsigned bytes (format ``"B"``) over someone else's memory. Writing a chunk
takes a view of the buffer and reading one hands that view back; neither copies. The transport
sends every chunk as a separate part, and the receiver rebuilds a :class:`Stream` whose chunks
view *the exact receive buffers*: a ``bytearray`` where the sender's chunk was writable; where
it was read-only, a ``bytes`` object below 64 KiB (copied out of the link's staging buffer) and
from 64 KiB a read-only ``memoryview`` of the buffer it was received into, with no copy
(``netq._buffers``). :meth:`Stream.tobytes` is the one operation that copies.

Because chunks are views, whatever owns the memory must not change it until the stream has
been sent, and memory seen through a received stream belongs to the object that was loaded
from it. Empty chunks are dropped on write: a zero-length part carries nothing and would only
cost a frame.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, TypeAlias

__all__ = (
    "Buffer",
    "Stream",
)

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    # Python 3.11 has no way to spell "supports the buffer protocol" in a type hint. For
    # annotations only: isinstance(x, Buffer) works on 3.12+ alone.
    Buffer: TypeAlias = Any


def as_view(buffer: Buffer) -> memoryview:
    # A fresh view even for memoryview inputs: it shares the caller's buffer, but survives the
    # caller releasing its own view (``with memoryview(x) as v: stream.writechunk(v)``).
    kind = type(buffer)
    if kind is bytes or kind is bytearray:
        return memoryview(buffer)  # always flat "B": no checks needed
    view = memoryview(buffer)
    if not view.c_contiguous:
        raise TypeError(
            f"Stream chunks must be C-contiguous buffers; got a non-contiguous "
            f"{type(buffer).__name__} (make a contiguous copy first)"
        )
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _reject_single_buffer(chunks: object) -> None:
    # A buffer is often also an iterable (of ints, of numpy scalars, which are buffers too), so
    # Stream(b"abc") would fail on the first int, or worse, Stream(np_array) would make one
    # chunk per element. Say what was meant instead.
    if type(chunks) in (list, tuple, deque):
        return
    try:
        memoryview(chunks)  # type: ignore[arg-type]
    except TypeError:
        return
    raise TypeError(
        f"expected an iterable of buffers, got a single {type(chunks).__name__}; use "
        f"Stream.frombytes(data) or writechunk(data)"
    )


_NO_CHUNKS: tuple[()] = ()


class Stream:
    """A FIFO of ``memoryview`` chunks: a zero-copy, non-blocking pipe of bytes.

    ``Stream(chunks)`` starts with a view of each buffer in ``chunks``. Chunks accept any
    C-contiguous buffer (``bytes``, ``bytearray``, ``memoryview``, ``array.array``, numpy
    arrays...) and are stored as flat unsigned-byte views; nothing is copied on write or read.
    Zero-length buffers are ignored. ``len(stream)`` is the number of bytes; iterating yields
    the chunks without consuming them. As a context manager the stream is cleared on exit,
    dropping its references to the underlying buffers (views already handed out stay valid).
    """

    __slots__ = ("_chunks", "_nbytes")

    _chunks: deque[memoryview]
    _nbytes: int

    def __init__(self, chunks: Iterable[Buffer] = _NO_CHUNKS) -> None:
        self._chunks = deque()
        self._nbytes = 0
        if chunks is not _NO_CHUNKS:
            self.writechunks(chunks)

    @classmethod
    def from_flat_views(cls, views: Iterable[memoryview], nbytes: int) -> Stream:
        """A stream of ``views`` as they are, for a serializer that made them itself.

        The caller vouches for what :meth:`writechunks` would check: every view is flat,
        C-contiguous, of format ``"B"`` and not empty, and ``nbytes`` is their total size.
        """
        stream = cls.__new__(cls)
        stream._chunks = deque(views)
        stream._nbytes = nbytes
        return stream

    @classmethod
    def frombytes(cls, data: Buffer) -> Stream:
        """A stream of one chunk viewing ``data`` (no copy; empty ``data``: an empty stream)."""
        stream = cls()
        stream.writechunk(data)
        return stream

    # -- size -----------------------------------------------------------------------------

    @property
    def nchunks(self) -> int:
        """Number of chunks."""
        return len(self._chunks)

    @property
    def nbytes(self) -> int:
        """Total number of bytes over all chunks."""
        return self._nbytes

    def empty(self) -> bool:
        """True when the stream holds no chunks (and so no bytes)."""
        return not self._chunks

    def __len__(self) -> int:
        return self._nbytes

    # -- writing --------------------------------------------------------------------------

    def writechunk(self, buffer: Buffer) -> int:
        """Append a view of ``buffer`` as the last chunk (ignored when it is empty); returns
        the number of bytes written."""
        view = as_view(buffer)
        nbytes = view.nbytes
        if nbytes:
            self._chunks.append(view)
            self._nbytes += nbytes
        return nbytes

    def writechunks(self, buffers: Iterable[Buffer]) -> int:
        """Append a view of every buffer in ``buffers``, in order; returns the number of bytes
        written."""
        if isinstance(buffers, Stream):
            return self.update(buffers)
        _reject_single_buffer(buffers)
        append = self._chunks.append
        total = 0
        for buffer in buffers:
            view = as_view(buffer)
            nbytes = view.nbytes
            if nbytes:
                append(view)
                total += nbytes
        self._nbytes += total
        return total

    def unwritechunk(self) -> memoryview:
        """Remove and return the last chunk."""
        if not self._chunks:
            raise IndexError("unwritechunk() from an empty Stream")
        view = self._chunks.pop()
        self._nbytes -= view.nbytes
        return view

    def update(self, other: Stream | Iterable[Buffer]) -> int:
        """Append every chunk of ``other``; a Stream ``other`` is left unchanged. Returns the
        number of bytes written.

        The views are shared with ``other``, not copied.
        """
        if isinstance(other, Stream):
            nbytes = other._nbytes  # read first: other may be self
            # deque.extend copes with other being self (it snapshots its argument first).
            self._chunks.extend(other._chunks)
            self._nbytes += nbytes
            return nbytes
        return self.writechunks(other)

    # -- reading --------------------------------------------------------------------------

    def readchunk(self) -> memoryview:
        """Remove and return the first chunk."""
        if not self._chunks:
            raise IndexError("readchunk() from an empty Stream")
        view = self._chunks.popleft()
        self._nbytes -= view.nbytes
        return view

    def unreadchunk(self, buffer: Buffer) -> int:
        """Push a view of ``buffer`` back as the first chunk (ignored when it is empty);
        returns the number of bytes pushed back."""
        view = as_view(buffer)
        nbytes = view.nbytes
        if nbytes:
            self._chunks.appendleft(view)
            self._nbytes += nbytes
        return nbytes

    def peekchunk(self) -> memoryview:
        """The first chunk, left in place."""
        if not self._chunks:
            raise IndexError("peekchunk() on an empty Stream")
        return self._chunks[0]

    def readchunks(self) -> list[memoryview]:
        """Remove and return all chunks."""
        chunks = list(self._chunks)
        self._chunks.clear()
        self._nbytes = 0
        return chunks

    def clear(self) -> None:
        """Drop every chunk."""
        self._chunks.clear()
        self._nbytes = 0

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self._chunks)

    # -- copies ---------------------------------------------------------------------------

    def copy(self) -> Stream:
        """A new stream sharing this one's views (a shallow copy: no bytes are copied)."""
        cls = type(self)
        new = cls.__new__(cls)
        new._chunks = self._chunks.copy()
        new._nbytes = self._nbytes
        return new

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> Stream:
        # memoryviews cannot be deep-copied generically; copy each chunk's bytes, keeping the
        # chunk boundaries and each chunk's writability.
        cls = type(self)
        new = cls.__new__(cls)
        new._chunks = deque(
            memoryview(bytes(view) if view.readonly else bytearray(view)) for view in self._chunks
        )
        new._nbytes = self._nbytes
        return new

    def tobytes(self) -> bytes:
        """All bytes joined into one ``bytes`` object.

        This copies, except when the stream is a single chunk covering a whole ``bytes``
        object: that object is returned as is (it is immutable, so sharing it is safe).
        """
        chunks = self._chunks
        if len(chunks) == 1:
            view = chunks[0]
            obj = view.obj
            if type(obj) is bytes and len(obj) == view.nbytes:
                return obj
        return b"".join(chunks)

    __bytes__ = tobytes

    # -- protocol -------------------------------------------------------------------------

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nchunks={len(self._chunks)}, nbytes={self._nbytes})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Stream):
            return self._nbytes == other._nbytes and self.tobytes() == other.tobytes()
        try:
            view = memoryview(other)  # type: ignore[arg-type]
        except TypeError:
            return NotImplemented
        return self._nbytes == view.nbytes and self.tobytes() == view.tobytes()

    # Mutable and compared by content.
    __hash__ = None  # type: ignore[assignment]
