"""The sending side of the sans-I/O netq connection: frames queued as buffers to write.

:class:`SendSide` is a base class of :class:`netq.protocol.connection.Connection`.
:meth:`SendSide.send_message` and the control-frame methods append to an output queue of
buffers; small frames are coalesced into one bytearray (``efficient_size``, ``merge_size``),
large parts are queued as views of the caller's memory, and ``bytes`` parts from
:data:`BY_REFERENCE_MIN` as the objects they are. The I/O layer takes
:meth:`SendSide.outgoing` (an iovec list for ``sendmsg``) and reports :meth:`SendSide.sent`,
or hands its write to :meth:`SendSide.write_to`, which does both.
The state it reads and writes (credit, the output queue, stream offsets) is the connection's,
set up by its constructor.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence, Sized
from itertools import islice
from typing import TYPE_CHECKING

from ..exceptions import LocalProtocolError
from . import frames
from .events import ConnectionState
from .frames import (
    ARRAY_BIT,
    DESCRIPTOR,
    HEADER,
    HEADER_SIZE,
    ONE_PART,
    ONE_PART_DESCRIPTOR,
    READONLY_BIT,
    WHOLE_MESSAGE,
    DataFlags,
    FrameType,
    Role,
    whole_message_layout,
)

if TYPE_CHECKING:
    from .frames import Hello

__all__ = ("SendSide", "Buffer", "IOV_MAX", "BY_REFERENCE_MIN")

IOV_MAX = 1024  # buffers per sendmsg (Linux UIO_MAXIOV)
# A ``bytes`` part of at least this many bytes is queued as the object it is, behind its frame
# header, instead of being copied into the merge buffer: a stream of such copies keeps growing
# merge buffers into fresh pages (a page fault per 4 KiB page), which costs more than one more
# iovec per write. A ``bytes`` object cannot change while it waits; a writable buffer could,
# so below ``efficient_size`` those are still copied.
BY_REFERENCE_MIN = 4096
Buffer = bytes | bytearray | memoryview  # what is queued for sending

_FIRST = DataFlags.FIRST.value
_LAST = DataFlags.LAST.value
_BATCH = DataFlags.BATCH.value
_FOLLOWS = DataFlags.FOLLOWS.value
# Messages at least this large say when another is queued behind them (FOLLOWS): their
# receiver may then acknowledge several with one ACK. Smaller ones share ACKs anyway (one per
# read that carries them).
FOLLOWS_MIN = 64 * 1024
_DATA = FrameType.DATA.value
_ACK = FrameType.ACK.value
_HEADER_PACK = HEADER.pack
_DESCRIPTOR_SIZE = DESCRIPTOR.size
_ONE_PART = ONE_PART
_ONE_PART_DESCRIPTOR = ONE_PART_DESCRIPTOR
_WHOLE_MESSAGE = WHOLE_MESSAGE
_whole_message_layout = whole_message_layout
_OPEN = ConnectionState.OPEN


class SendSide:
    """Connection's output: the frames it queues and the bookkeeping of what was written."""

    if TYPE_CHECKING:  # the Connection's state, set by its constructor
        local: Hello
        peer: Hello | None
        state: ConnectionState
        merge_size: int
        efficient_size: int
        _chunk: int
        send_credit_bytes: int
        send_credit_messages: int
        recv_allowance_bytes: int
        recv_allowance_messages: int
        _count_messages: bool
        _asked: tuple[bytes, int] | None
        sent_bye: bool
        _pending: collections.deque[Buffer]
        _merge: bytearray
        bytes_queued: int
        sent_total: int
        acks_start: int
        acks_end: int
        _replies_start: int
        _replies_end: int
        shm_threshold: int

        @property
        def shm_out(self) -> bool: ...
        def _to_segments(self, parts: Sequence[bytes | memoryview],
                         sizes: list[int]) -> tuple[list[bytes | memoryview], int]: ...

    def _emit(self, data: Buffer) -> None:
        merge = self._merge
        merge += data
        self.bytes_queued += len(data)
        if len(merge) >= self.merge_size:
            self._seal()

    def _emit_view(self, view: bytes | memoryview) -> None:
        self._seal()
        self._pending.append(view)
        self.bytes_queued += len(view)

    def _seal(self) -> None:
        if self._merge:
            self._pending.append(self._merge)
            self._merge = bytearray()

    def send_session(self, token: bytes, last_received: int, resumed: bool,
                     held_bytes: int = 0, held_messages: int = 0) -> None:
        """Our SESSION frame: client first (asking), server second (answering).

        ``held_bytes``/``held_messages``: what we still hold of the peer's messages from
        earlier links of the session. The window our HELLO granted shrinks by that much on
        both sides, so a peer reconnecting to a stalled receiver cannot add a window per link.
        """
        if self.state not in (ConnectionState.SESSION, ConnectionState.OPEN):
            raise LocalProtocolError(f"SESSION cannot be sent in state {self.state.value}")
        if held_bytes < 0 or held_messages < 0:
            raise LocalProtocolError("held amounts are never negative")
        if self.local.role is Role.CLIENT:
            self._asked = (token, last_received)
        self.recv_allowance_bytes -= held_bytes
        if self._count_messages:
            self.recv_allowance_messages -= held_messages
        self._emit(frames.encode_session(token, last_received, resumed, held_bytes,
                                         held_messages))

    def send_message(self, seq: int, parts: Sequence[bytes | memoryview], total: int,
                     batch: bool) -> None:
        """Queue one message as DATA frames, after checking what :meth:`queue_message`
        leaves to its caller: :attr:`can_send_data`, the peer's ``max_message`` and the
        part count (:class:`LocalProtocolError` if one fails).

        ``parts`` are flat byte views (or ``bytes``: delivered read-only, like read-only
        views); views of ``efficient_size`` bytes or more are queued as they are (zero copy),
        smaller ones are merged.
        """
        if not (self.state is _OPEN and self.send_credit_bytes > 0
                and self.send_credit_messages > 0 and not self.sent_bye):  # can_send_data
            raise LocalProtocolError("no send credit, or the link is not open")
        peer = self.peer
        assert peer is not None  # set by its HELLO, before the link opened
        if total > peer.max_message:
            raise LocalProtocolError(f"message of {total} bytes over the peer's limit")
        if len(parts) > frames.MAX_PARTS:
            raise LocalProtocolError(f"{len(parts)} parts: at most {frames.MAX_PARTS}")
        self.queue_message(seq, parts, total, batch)

    def queue_message(self, seq: int, parts: Sequence[bytes | memoryview], total: int,
                      batch: bool, queued_behind: Sized = ()) -> None:
        """:meth:`send_message` for a caller that checked its rules once already (the
        engine's pump: ``put()`` checked the part count and the peer limit it knew, the pump
        the credit, the open link and the limit learnt since): the frames only.

        ``queued_behind``: the messages the caller queues next, if credit lasts (only whether
        it is empty is read). A large message then says another follows (FOLLOWS), and its
        receiver may acknowledge both with one ACK."""
        peer = self.peer
        assert peer is not None  # set by its HELLO, before the link opened
        self.send_credit_bytes -= total
        if peer.recv_messages != frames.UNLIMITED_MESSAGES:
            self.send_credit_messages -= 1
        if len(parts) == 1 and total < self.efficient_size and total <= self._chunk:
            part = parts[0]
            size = total | READONLY_BIT if type(part) is not memoryview or part.readonly else total
            merge = self._merge
            merge += _ONE_PART.pack(_DATA, (_FIRST | _LAST | _BATCH) if batch else (_FIRST | _LAST),
                                    0, _ONE_PART_DESCRIPTOR + total, seq, total, 1, 0, size)
            self.bytes_queued += HEADER_SIZE + _ONE_PART_DESCRIPTOR + total
            if total >= BY_REFERENCE_MIN and type(part) is bytes:
                pending = self._pending  # _seal and _emit_view, inline
                pending.append(merge)
                pending.append(part)
                self._merge = bytearray()
                return
            merge += part
            if len(merge) >= self.merge_size:
                self._seal()
            return
        # A writable part that is no bytearray may come back as a map, if the peer reads the bit.
        array = ARRAY_BIT if peer.array_parts else 0
        sizes = [len(p) | READONLY_BIT if type(p) is not memoryview or p.readonly
                 else len(p) if type(p.obj) is bytearray else len(p) | array for p in parts]
        parts, body = self._to_segments(parts, sizes) if self.shm_out \
            and total >= self.shm_threshold else (parts, total)  # body: bytes in the frames
        first = _FIRST | _BATCH if batch else _FIRST
        if queued_behind and total >= FOLLOWS_MIN and self.send_credit_bytes > 0 \
                and self.send_credit_messages > 0:
            first |= _FOLLOWS  # the caller goes on to the next message: credit lasts
        chunk = self._chunk
        if body <= chunk:
            nparts = len(sizes)
            layout = _WHOLE_MESSAGE.get(nparts) or _whole_message_layout(nparts)
            self._emit(layout.pack(_DATA, first | _LAST, 0, _DESCRIPTOR_SIZE + 8 * nparts + body,
                                   seq, total, nparts, 0, *sizes))
            efficient = self.efficient_size
            for part in parts:
                length = len(part)
                if length < efficient and (length < BY_REFERENCE_MIN or type(part) is not bytes):
                    self._emit(part)  # merged: a copy, cheaper than an iovec when small
                else:
                    self._emit_view(part)
            return
        # Several chunks: walk the parts, cutting the concatenated body every `chunk` bytes.
        descriptor = frames.encode_descriptor(total, sizes)
        # Cut through views: a slice of a bytes part would be a copy of it.
        parts = [part if type(part) is memoryview else memoryview(part) for part in parts]
        position = 0
        part_index = 0
        part_offset = 0
        flags = first
        while position < body:
            size = min(chunk, body - position)
            if position + size == body:
                flags |= _LAST
            extra = descriptor if flags & _FIRST else b""
            self._emit(_HEADER_PACK(_DATA, flags, 0, len(extra) + size, seq) + extra)
            need = size
            while need:
                part = parts[part_index]
                count = min(len(part) - part_offset, need)
                if count:
                    piece = part[part_offset : part_offset + count]
                    if count < self.efficient_size:
                        self._emit(piece)
                    else:
                        self._emit_view(piece)
                need -= count
                part_offset += count
                if part_offset == len(part):
                    part_index += 1
                    part_offset = 0
            position += size
            flags &= ~(_FIRST | _BATCH | _FOLLOWS)  # these mark the first chunk only

    def send_credit(self, nbytes: int, messages: int) -> None:
        """Grant the peer ``nbytes`` more bytes and ``messages`` more messages."""
        if nbytes < 0 or messages < 0:
            raise LocalProtocolError("credit grants are positive")
        if self.local.recv_messages == frames.UNLIMITED_MESSAGES:
            messages = 0
        self.recv_allowance_bytes += nbytes
        self.recv_allowance_messages += messages
        start = self.sent_total + self.bytes_queued
        if start != self._replies_end:
            self._replies_start = start
        self._emit(_HEADER_PACK(FrameType.CREDIT, 0, 0, 4, nbytes)
                   + frames.CREDIT_PAYLOAD.pack(messages))
        self._replies_end = start + HEADER_SIZE + frames.CREDIT_PAYLOAD.size

    def send_ack(self, seq: int) -> None:
        start = self.sent_total + self.bytes_queued
        if start != self.acks_end:
            self.acks_start = start
        if start != self._replies_end:
            self._replies_start = start
        merge = self._merge  # _emit, inline: one ACK per read that carried messages
        merge += _HEADER_PACK(_ACK, 0, 0, 0, seq)
        self.bytes_queued += HEADER_SIZE
        self.acks_end = self._replies_end = start + HEADER_SIZE
        if len(merge) >= self.merge_size:
            self._seal()

    def send_ping(self, token: int) -> None:
        self._emit(_HEADER_PACK(FrameType.PING, 0, 0, 0, token))

    def send_bye(self, reason: str = "") -> None:
        if self.sent_bye:
            return
        self.sent_bye = True
        text = reason.encode()[: frames.MAX_TEXT]
        self._emit(_HEADER_PACK(FrameType.BYE, 0, 0, len(text), 0) + text)

    def send_error(self, code: int, text: str) -> None:
        data = text.encode()[: frames.MAX_TEXT]
        self._emit(_HEADER_PACK(FrameType.ERROR, 0, 0, len(data), code) + data)

    def outgoing(self) -> list[Buffer]:
        """Buffers to write next, in order (at most IOV_MAX); empty when all is sent."""
        pending = self._pending
        if self._merge:  # _seal, inline: called on every write
            pending.append(self._merge)
            self._merge = bytearray()
        if len(pending) <= IOV_MAX:
            return list(pending)
        return list(islice(pending, IOV_MAX))

    def write_to(self, write: Callable[[list[Buffer]], int]) -> bool:
        """Write the output with ``write(buffers)`` (bytes taken, 0 for none: a carrier's
        write bound to its channel, or a socket's ``sendmsg``) until all of it is written or a
        write takes nothing; True while output remains (:attr:`has_output`). :meth:`outgoing`
        and :meth:`sent` in one call, for the link driver's every write. What ``write``
        raises propagates; the bytes it did not take stay queued."""
        pending = self._pending
        while self.bytes_queued:
            if self._merge:  # _seal, inline
                pending.append(self._merge)
                self._merge = bytearray()
            count = write(list(pending) if len(pending) <= IOV_MAX
                          else list(islice(pending, IOV_MAX)))
            if not count:
                return True
            # sent(count), inline
            queued = self.bytes_queued
            self.bytes_queued = queued - count
            self.sent_total += count
            if count == queued:
                # All of it was written, so every queued buffer was in this write: no walk
                # over them (a stream of parts sent by reference queues two per message).
                pending.clear()
                return False
            while count:
                head = pending[0]
                size = len(head)
                if count >= size:
                    pending.popleft()
                    count -= size
                else:
                    pending[0] = memoryview(head)[count:]
                    break
        return False

    def data_to_send(self) -> bytes:
        """Everything queued, joined (for transports that write whole messages, and tests)."""
        data = b"".join(self.outgoing_all())
        self.sent(len(data))
        return data

    def outgoing_all(self) -> list[Buffer]:
        self._seal()
        return list(self._pending)

    def sent(self, count: int) -> bool:
        """``count`` bytes of :meth:`outgoing` were written; True while output remains
        (:attr:`has_output`). The bookkeeping of :meth:`write_to`, after a write made
        elsewhere (the shared-memory side's, which passes descriptors with its bytes)."""
        written = [count]

        def already_written(buffers: list[Buffer]) -> int:
            taken, written[0] = written[0], 0
            return taken

        return self.write_to(already_written)

    @property
    def has_output(self) -> bool:
        return self.bytes_queued > 0

    def output_is_only_acks(self, *, credit: bool = False) -> bool:
        """True when there is output and every unsent byte belongs to ACK frames (with
        ``credit``: ACK or CREDIT frames); a partly written one counts.

        For transports that delay acknowledgements: a write carrying nothing but ACKs may
        wait a moment for the reply the application is about to send, so that one write
        carries both. Anything else queued (DATA, PING, PONG, BYE, ...) must go at once.
        Constant time: it compares stream offsets recorded by :meth:`send_ack`,
        :meth:`send_credit` and :meth:`sent`, never scans the output. Those of ACK frames are
        public (:attr:`acks_start`, :attr:`acks_end`, :attr:`sent_total`) for a caller that
        asks after every read and compares them itself (the link driver).
        """
        if credit:
            start, end = self._replies_start, self._replies_end
        else:
            start, end = self.acks_start, self.acks_end
        sent = self.sent_total
        queued = self.bytes_queued
        return queued > 0 and end == sent + queued and sent >= start
