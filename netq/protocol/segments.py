"""The shared-memory side of a netq connection: parts in memfd segments (Unix sockets).

:class:`SharedMemorySide` is a base class of :class:`netq.protocol.connection.Connection`: the
part of the sans-I/O core that exists only between two peers whose HELLOs both said ``SHM``
(docs/protocol.md, "Parts in shared memory"). Kept apart so that the core reads as it did
without it; it touches the core's state only where a message's parts are framed and parsed.

Sending: a message's writable parts of ``shm_threshold`` bytes or more are copied into a
segment of the link's pool (or, for a buffer netq handed out, sent as they are); their sizes
get ``SEGMENT_BIT`` and their descriptors a *mark* at the stream offset of the DATA frame
about to be queued. The I/O layer writes with :meth:`outgoing_fds`: the descriptors of every
frame the write reaches go with it (a descriptor may arrive before its frame, never after).

Receiving: the carrier appends the descriptors that came with the bytes to
:attr:`received_fds` (in order); the first frame of a message with ``SEGMENT`` parts claims
one per such part, after every limit and credit check, and maps it
(:func:`netq._shm.map_segment`); anything wrong fails the link with a
:class:`~netq.exceptions.RemoteProtocolError` and closes the descriptors.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import _shm
from ..exceptions import LocalProtocolError, NetqError, RemoteProtocolError
from .events import ConnectionFailed, MessageReceived
from .frames import (
    DESCRIPTOR,
    HEADER_SIZE,
    PART_SIZE_MASK,
    READONLY_BIT,
    SEGMENT_BIT,
    UNLIMITED_MESSAGES,
    DataFlags,
    ErrorCode,
)
from .reassembly import Incoming, cut_whole

if TYPE_CHECKING:
    from .. import _buffers
    from .._buffers import Part
    from .events import Event
    from .frames import Hello
    from .sending import Buffer

__all__ = ("SharedMemorySide",)

_SIZE_MASK = PART_SIZE_MASK
_PART_MASK = PART_SIZE_MASK & ~SEGMENT_BIT  # a part's size, without any of its flag bits
# (frame offset, fds, what to close once they are sent: one-shot segments, the probe)
_Mark = tuple[int, list[int], list[_shm.Segment | _shm.Probe]]
_SHARED_COUNTERS = _shm.ShmCounters()  # for connections nobody gave counters (tests)
_LAST = DataFlags.LAST.value  # ints: an enum flag in `&` costs Python calls per message
_BATCH = DataFlags.BATCH.value


class SharedMemorySide:
    """Connection's parts in shared memory. ``shm_threshold`` and ``shm_counters`` are set
    by whoever makes the connection (netq.handshake, the link driver)."""

    shm_threshold: int = 1 << 20  # smallest part sent in a segment
    shm_counters: _shm.ShmCounters = _SHARED_COUNTERS
    # Received descriptors not yet claimed by a DATA frame, in arrival order (the carrier
    # appends to it); None where we take no segments (our HELLO said no SHM). Set by the
    # connection's constructor (start_descriptors); plain attributes, read on every read and
    # write of the link.
    received_fds: collections.deque[int] | None = None
    # Descriptors wait to be sent with the output (outgoing_fds): segments', or the probe
    # that goes with our HELLO where we take segments.
    has_fds = False
    _send_pool: _shm.SendPool | None = None
    _fd_marks: collections.deque[_Mark] | None = None  # descriptors to send, in order
    _marks_in_write = 0
    _probe_sent = False  # our HELLO's write carried the probe descriptor
    _peer_probe: bool | None = None  # the peer's HELLO came with its probe (None: not known)

    if TYPE_CHECKING:  # the Connection's state this side reads and writes
        local: Hello
        peer: Hello | None
        _buffer: bytearray
        _pool: _buffers.ReceivePool
        _incoming: Incoming | None
        _body_left: int
        expected_seq: int
        recv_allowance_bytes: int
        recv_allowance_messages: int
        bytes_queued: int
        sent_total: int

        def _fail(self, events: list[Event], error: NetqError, code: ErrorCode) -> None: ...
        def _seal(self) -> None: ...
        def outgoing(self) -> list[Buffer]: ...
        def _release_core_buffers(self) -> None: ...
        def _receive_eof(self) -> list[Event]: ...
        @property
        def _core_buffered_bytes(self) -> int: ...

    # ------------------------------------------------------------------ the core's calls

    def start_descriptors(self) -> None:
        """Set up the descriptors' state for our HELLO (the constructor, before the HELLO is
        queued): where it says SHM, descriptors may arrive, and our probe goes with it."""
        shm = self.local.shm
        self.received_fds = collections.deque() if shm else None
        self.has_fds = shm

    @property
    def shm_out(self) -> bool:
        """Both HELLOs said SHM and the peer's came with its probe descriptor: our large parts
        may go in segments."""
        peer = self.peer
        return peer is not None and peer.shm and self.local.shm and self._peer_passes_fds()

    def _peer_passes_fds(self) -> bool:
        """Did the peer's HELLO come with a descriptor (its probe, the first it sends)? A
        path that forwards bytes only (a proxy reading with recv) drops descriptors both
        ways: then neither side sends segments, though both HELLOs said SHM. Once the
        peer's HELLO was parsed (its probe, if any, came with its first byte)."""
        got = self._peer_probe
        if got is None:
            fds = self.received_fds
            got = self._peer_probe = bool(fds)
            if fds:
                os.close(fds.popleft())
        return got

    def release_buffers(self) -> None:
        """Free what an idle link need not hold: the large buffers kept for reuse, the
        staging buffer when nothing is waiting in it (the next read allocates a small one),
        and the send pool's segments the receiver does not hold."""
        if self._send_pool is not None:
            self._send_pool.trim()
        self._release_core_buffers()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of memory the core holds for this link, beyond the messages it hands out:
        the staging buffer, output merged and not yet sent, the receive pool's buffers (an
        upper bound: a pooled buffer may be a message the user still holds) and the send
        pool's segments."""
        pool = self._send_pool
        return self._core_buffered_bytes + (pool.capacity if pool is not None else 0)

    def receive_eof(self) -> list[Event]:
        """The peer closed its side. A goodbye before it makes this a clean end; a
        descriptor no frame claimed makes it the peer's failure."""
        events = self._receive_eof()
        if self.peer is not None and self.local.shm:
            self._peer_passes_fds()  # its probe is no stray descriptor
        fds = self.received_fds
        if fds and not events:
            events.append(ConnectionFailed(RemoteProtocolError(
                f"shared memory: {len(fds)} descriptor(s) without a DATA frame when the peer "
                f"ended the link")))
        return events

    # ------------------------------------------------------------------ sending

    def _to_segments(self, parts: Sequence[bytes | memoryview],
                     sizes: list[int]) -> tuple[list[bytes | memoryview], int]:
        """Move the message's large parts into segments: their sizes get SEGMENT_BIT,
        their descriptors a mark at the DATA frame about to be queued. The parts that stay
        in the frames, and their bytes. Read-only parts (``bytes``, read-only arrays and
        maps) go too, copied like writable ones: the receiver maps them read-only and gets
        the read-only view a large read-only part is on the socket path
        (:func:`netq._shm.map_segment`). The segment is a copy either way, so the sender may
        refill its buffer as soon as ``put()``'s future resolves."""
        threshold = self.shm_threshold
        counters = self.shm_counters
        wire: list[bytes | memoryview] = []
        body = 0
        fds: list[int] = []
        one_shot: list[_shm.Segment | _shm.Probe] = []
        moved = 0
        for index, part in enumerate(parts):
            raw = sizes[index]
            size = raw & _SIZE_MASK
            if size < threshold or len(fds) >= _shm.MAX_FDS_PER_WRITE:
                wire.append(part)
                body += size
                continue
            handout = _shm.handout_of(part)
            if handout is not None:
                fd, capacity = handout
                _shm.flag_handout(fd, capacity)
                counters.handed += 1
            else:
                if self._send_pool is None:
                    self._send_pool = _shm.SendPool(counters)
                pool = self._send_pool
                segment, pooled = pool.acquire(size)
                segment.fill(part, pool.copy)
                fd = segment.fd
                if not pooled:
                    one_shot.append(segment)
                counters.copied += 1
            fds.append(fd)
            sizes[index] = raw | SEGMENT_BIT
            moved += size
        if fds:
            if self._fd_marks is None:
                self._fd_marks = collections.deque()
            self._seal()
            self._fd_marks.append((self.sent_total + self.bytes_queued, fds, one_shot))
            self.has_fds = True
            counters.bytes_out += moved
            counters.messages_out += 1
        return wire, body

    def outgoing_fds(self) -> tuple[list[Buffer], list[int]]:
        """``outgoing()``, and the descriptors that must go with that write: those of the
        DATA frames it reaches. The buffers stop before a frame whose descriptors do not fit
        in the same write (at most ``MAX_FDS_PER_WRITE``)."""
        if not self._probe_sent and self.local.shm:
            # The probe: an empty memfd with our first write (the HELLO, at offset 0).
            self._probe_sent = True
            probe = _shm.Probe()
            if self._fd_marks is None:
                self._fd_marks = collections.deque()
            self._fd_marks.appendleft((self.sent_total, [probe.fd], [probe]))
        buffers = self.outgoing()
        self._marks_in_write = 0
        sent = self.sent_total
        end = sent + sum(map(len, buffers))
        fds: list[int] = []
        for offset, mark_fds, _ in self._fd_marks or ():
            if offset >= end:
                break
            if len(fds) + len(mark_fds) > _shm.MAX_FDS_PER_WRITE:
                buffers = _cut(buffers, offset - sent)
                break
            fds.extend(mark_fds)
            self._marks_in_write += 1
        return buffers, fds

    def fds_written(self) -> None:
        """The write with :meth:`outgoing_fds`'s descriptors took bytes: they are sent (the
        peer has its own copies; one-shot segments are closed on our side)."""
        marks = self._fd_marks
        for _ in range(self._marks_in_write):
            assert marks is not None  # outgoing_fds counted marks in it
            _, _, one_shot = marks.popleft()
            for segment in one_shot:
                segment.close()
        self._marks_in_write = 0
        self.has_fds = bool(marks) or (not self._probe_sent and self.local.shm)

    def close_descriptors(self) -> None:
        """The link is gone: close every descriptor it holds (received and unclaimed, ours
        not sent, the send pool's)."""
        fds = self.received_fds
        while fds:
            os.close(fds.popleft())
        marks = self._fd_marks
        while marks:
            _, _, one_shot = marks.popleft()
            for segment in one_shot:
                segment.close()
        self.has_fds = False
        if self._send_pool is not None:
            self._send_pool.close()
            self._send_pool = None

    @property
    def shm_held(self) -> int:
        """Segments of our pool the peer holds (sent, not released)."""
        pool = self._send_pool
        return pool.held() if pool is not None else 0

    # ------------------------------------------------------------------ receiving

    def _segment_header(self, events: list[Event], view: memoryview, start: int, end: int,
                        flags: int, seq: int, total: int, sizes: tuple[int, ...],
                        body: int) -> int:
        """The first frame (at ``start``) of a message with parts in segments, its limits
        and credit checked: claim and map their descriptors, then take the rest as usual.
        The new parse position, -1 to stop."""
        self._peer_passes_fds()  # its probe first: it came before anything else
        position = start + HEADER_SIZE + DESCRIPTOR.size + 8 * len(sizes)
        last = bool(flags & _LAST)
        wire = []  # the parts that cross the socket, and their bytes
        wire_total = 0
        in_segments = 0  # bytes of the parts in segments
        for raw in sizes:
            if raw & SEGMENT_BIT:
                in_segments += raw & _PART_MASK
            else:
                wire.append(raw)
                wire_total += raw & _PART_MASK
        if (wire_total + in_segments != total or body > wire_total
                or last != (body == wire_total) or (body == 0 and wire_total)):
            self._fail(events, RemoteProtocolError("descriptor sizes disagree with the frame"),
                       ErrorCode.PROTOCOL)
            return -1
        fds = self.received_fds
        assert fds is not None  # the caller found it so
        count = len(sizes) - len(wire)
        if len(fds) < count:
            self._fail(events, RemoteProtocolError(
                f"shared memory: a DATA frame names {count} segment(s), {len(fds)} "
                f"descriptor(s) came with it"), ErrorCode.PROTOCOL)
            return -1
        claimed = [fds.popleft() for _ in range(count)]
        segments: list[tuple[int, Part]] = []
        moved = 0
        for index, raw in enumerate(sizes):
            if not raw & SEGMENT_BIT:
                continue
            fd = claimed.pop(0)
            try:
                part = _shm.map_segment(fd, raw & _PART_MASK, bool(raw & READONLY_BIT))
            except (_shm.SegmentError, OSError) as error:
                for other in claimed:
                    os.close(other)
                failure: NetqError
                if isinstance(error, _shm.SegmentError):
                    failure = RemoteProtocolError(f"shared memory: the peer sent {error}")
                else:
                    failure = LocalProtocolError(f"shared memory: cannot map a segment: {error}")
                self._fail(events, failure, ErrorCode.PROTOCOL)
                return -1
            segments.append((index, part))
            moved += raw & _PART_MASK
        counters = self.shm_counters
        counters.bytes_in += moved
        counters.messages_in += 1
        self.recv_allowance_bytes -= total
        if self.local.recv_messages != UNLIMITED_MESSAGES:
            self.recv_allowance_messages -= 1
        batch = bool(flags & _BATCH)
        if last and end - position >= wire_total:
            parts = cut_whole(view, self._buffer, position, tuple(wire), self._pool)
            for index, part in segments:
                parts.insert(index, part)
            self.expected_seq += 1
            events.append(MessageReceived(seq, batch, parts, total))
            return position + wire_total
        incoming = Incoming(seq, batch, wire, wire_total, self._pool)
        incoming.size = total
        incoming.segments = segments
        self._incoming = incoming
        self._body_left = body
        return position


def _cut(buffers: list[Buffer], limit: int) -> list[Buffer]:
    """The front of ``buffers`` up to ``limit`` bytes, without copying."""
    parts: list[Buffer] = []
    size = 0
    for buffer in buffers:
        length = len(buffer)
        if size + length >= limit:
            if limit > size:
                parts.append(memoryview(buffer)[: limit - size])
            break
        parts.append(buffer)
        size += length
    return parts
