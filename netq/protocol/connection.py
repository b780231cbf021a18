"""The sans-I/O netq connection: bytes in, events out; calls in, bytes out.

One :class:`Connection` is one link (a TCP/TLS/Unix stream, or the frame sequence of one MQTT
topic pair or gRPC stream pair). It owns the handshake, the framing, the chunking of outgoing
messages, the reassembly of incoming ones, their acknowledgement (one ACK frame per read that
completed any, or fewer where the sender says more follows) and the per-link credit balance.
It has no sockets, threads or clocks, so every case is tested by feeding bytes, whole and
byte by byte. This module holds the link's state and the receive path (parsing, limits,
control frames); its base classes the rest: :class:`netq.protocol.sending.SendSide` queues
frames, :class:`netq.protocol.segments.SharedMemorySide` handles parts in shared memory (Unix
sockets: memfd segments whose descriptors travel with the bytes),
:class:`netq.protocol.acknowledgement.DeferredAcks` says when an ACK may wait for the next
message. What it reports are the events of :mod:`netq.protocol.events`; a message's parts are
allocated and filled by :mod:`netq.protocol.reassembly`.

Receiving is zero-copy for large bodies: the I/O layer asks :meth:`Connection.receive_buffer`
where to write next and reports with :meth:`Connection.receive_done`. Small frames land in a
staging buffer and are parsed many per call; once a message body is large, the buffer returned
is the final part's own memory, so ``recv_into`` writes straight into the ``bytearray`` (or,
for a large read-only part, the buffer behind the read-only ``memoryview``) the user will get
(:mod:`netq._buffers`).

The staging buffer is sized to what the link carries: it starts at :data:`STAGING_MIN` bytes,
doubles (up to :data:`STAGING_SIZE`) whenever a read filled it, and
:meth:`Connection.release_buffers` frees it when the link is idle, so an idle link holds a few
KiB and a busy one keeps its full-size buffer. :attr:`Connection.buffered_bytes` says what
the core holds at any time.

Errors never escape as exceptions from the receive path: a violation becomes a final
:class:`ConnectionFailed` event after every event parsed before it, and an ERROR frame is queued
for the peer. Nothing received before the bad bytes is lost.
"""

from __future__ import annotations

import collections
import hmac
import struct

from .. import _buffers
from ..exceptions import (
    AuthenticationError,
    LocalProtocolError,
    NetqError,
    RemoteProtocolError,
)
from . import frames
from .acknowledgement import DeferredAcks
from .events import (
    AckReceived,
    ByeReceived,
    ConnectionFailed,
    ConnectionState,
    CreditReceived,
    ErrorReceived,
    Event,
    MessageReceived,
    PeerAuthenticated,
    PongReceived,
    SessionOpened,
)
from .frames import (
    DESCRIPTOR,
    HEADER,
    HEADER_SIZE,
    ONE_PART,
    ONE_PART_DESCRIPTOR,
    READONLY_BIT,
    SEGMENT_BIT,
    DataFlags,
    ErrorCode,
    FrameType,
    Hello,
    make_hello,
)
from .reassembly import Incoming, cut_whole
from .resume import resume_numbering
from .segments import SharedMemorySide
from .sending import Buffer, SendSide

__all__ = [
    "Connection",
    "STAGING_SIZE",
    "STAGING_MIN",
    "DIRECT_THRESHOLD",
    "make_hello",
]


STAGING_SIZE = 256 * 1024  # a busy link's receive staging buffer: many small frames per recv
STAGING_MIN = 4 * 1024  # a fresh or idle link's staging buffer (doubles while reads fill it)
DIRECT_THRESHOLD = 128 * 1024  # body bytes still to come above which we recv_into the part
_EMPTY = bytearray()  # the staging buffer of an idle link (allocated again on the next read)
# Bound here, apart from the parts' allocate_* calls (which tests and the fuzzer count).
_allocate_staging = _buffers.allocate_writable
# Messages this large go into parts from the ReceivePool (reused buffers), never into
# parts sliced out of the staging buffer (fresh allocations).
_POOL_MIN = _buffers.POOL_MIN
_SIZE_MASK = frames.PART_SIZE_MASK
_FIRST = DataFlags.FIRST.value
_LAST = DataFlags.LAST.value
_BATCH = DataFlags.BATCH.value
_FOLLOWS = DataFlags.FOLLOWS.value
_DATA = FrameType.DATA.value
_HEADER_PACK = HEADER.pack
_HEADER_UNPACK_FROM = HEADER.unpack_from
_DESCRIPTOR_SIZE = DESCRIPTOR.size
_DESCRIPTOR_UNPACK_FROM = DESCRIPTOR.unpack_from
_KNOWN_TYPES = frozenset(int(t) for t in FrameType)
_ACK = FrameType.ACK.value
_SESSION = FrameType.SESSION.value
# The payload limit of each frame type but DATA (whose limit is the receiver's max_frame).
_CONTROL_LIMITS = {int(t): frames.max_payload(t, 0) for t in FrameType if t is not FrameType.DATA}
_FIRST_LAST = _FIRST | _LAST
_ONE_PART_DESCRIPTOR = ONE_PART_DESCRIPTOR
_ONE_PART_UNPACK_FROM = ONE_PART.unpack_from
_ONE_PART_SIZE = ONE_PART.size  # a header and a one-part descriptor
_CLOSED = ConnectionState.CLOSED
_OPEN = ConnectionState.OPEN
_new_tuple = tuple.__new__  # the per-message events, made without a Python call (events.py)


# ------------------------------------------------------------------------- connection


class Connection(DeferredAcks, SendSide, SharedMemorySide):
    """One netq link's protocol state. Not thread-safe: one I/O thread drives it.

    ``local`` is our HELLO; the peer must have the opposite role. ``authkey`` enables the
    challenge-response: both sides must hold the same key, or the link fails with
    :class:`AuthenticationError` before any data frame is accepted.
    """

    def __init__(
        self,
        local: Hello,
        authkey: bytes | None = None,
        *,
        max_size: int = 4 * 1024 * 1024,
        merge_size: int = 4 * 1024 * 1024,
        efficient_size: int = 64 * 1024,
        pool: _buffers.ReceivePool | None = None,
    ) -> None:
        if local.auth != (authkey is not None):
            raise LocalProtocolError("Hello.auth must say whether an authkey is used")
        self.local = local
        self.peer: Hello | None = None
        # Read on every received buffer and every message sent: a plain attribute, written
        # only by _set_state (which keeps _open_for_data in step with it).
        self.state = ConnectionState.HELLO
        self._open_for_data = False  # OPEN and no BYE from the peer: DATA is acceptable
        self._authkey = authkey
        self.max_size = max_size
        self.merge_size = merge_size
        self.efficient_size = efficient_size
        self._chunk = max_size  # lowered to the peer's max_frame by its HELLO

        # Flow control on this link. What we let the peer send (checked on every FIRST
        # chunk, before allocating) and what the peer lets us send.
        self.recv_allowance_bytes = local.recv_window
        self.recv_allowance_messages = local.recv_messages
        self.send_credit_bytes = 0
        self.send_credit_messages = 0
        self.expected_seq = 1  # next DATA sequence number from the peer
        self._asked: tuple[bytes, int] | None = None  # client: the SESSION we sent
        self._max_message = local.max_message
        self._count_messages = local.recv_messages != frames.UNLIMITED_MESSAGES
        self.peer_said_bye = False
        self.sent_bye = False

        # Output: sealed buffers in order, plus the bytearray small frames are merged into.
        self._pending: collections.deque[Buffer] = collections.deque()
        self._merge = bytearray()
        self.bytes_queued = 0  # not yet sent; > 0 exactly when has_output (no empty buffers)
        # Stream offsets (counted over every byte ever queued) of the last run of ACK frames
        # and of the last run of ACK/CREDIT frames, for output_is_only_acks(): bytes written
        # so far; where the run of ACK frames last queued starts and ends.
        self.sent_total = 0
        self.acks_start = self.acks_end = -1
        self._replies_start = self._replies_end = -1

        # Input. The staging buffer is allocated by the first receive_buffer().
        self._buffer = _EMPTY
        self._view = memoryview(_EMPTY)
        self._grow = False  # the last read filled the staging buffer: double it
        self._start = 0
        self._end = 0
        self._body_left = 0  # bytes of the current DATA chunk's body still to come
        self._last_chunk = False  # the current chunk carries the LAST flag
        self._incoming: Incoming | None = None
        self._direct = False  # receive_buffer() points into the incoming message
        self._after_large = False  # the last message took the direct path
        # Where to read next while the staging buffer is simply empty (everything parsed, no
        # bookkeeping due): the I/O layer reads into it without asking receive_buffer(); None
        # when receive_buffer() must decide (and when anything here changes the staging).
        self.read_buffer: memoryview | None = None
        # Large part buffers, reused once the caller is done: the communicator's, shared by
        # its links (``pool``), or this link's own.
        self._own_pool = pool is None
        self._pool = _buffers.ReceivePool() if pool is None else pool

        self.start_descriptors()
        self._emit(frames.encode_hello(local))

    # ------------------------------------------------------------------ properties

    def _set_state(self, value: ConnectionState) -> None:
        self.state = value
        self._open_for_data = value is ConnectionState.OPEN and not self.peer_said_bye

    @property
    def chunk_size(self) -> int:
        """Largest body per DATA frame: ours and the peer's limit, whichever is smaller."""
        return self._chunk

    @property
    def can_send_data(self) -> bool:
        """True when the next message may start: link open and both credits positive."""
        return (
            self.state is _OPEN
            and self.send_credit_bytes > 0
            and self.send_credit_messages > 0
            and not self.sent_bye
        )

    @property
    def receiving_message(self) -> bool:
        return self._incoming is not None

    def _release_core_buffers(self) -> None:
        """release_buffers: the large buffers kept for reuse (of a shared pool, those no link
        used lately), and the staging buffer when nothing is waiting in it (the next read
        allocates a small one)."""
        if self._incoming is None:
            if self._own_pool:
                self._pool.clear()
            else:
                self._pool.release_idle()
            if self._start == self._end and not self._direct:
                self.read_buffer = None
                self._buffer = _EMPTY
                self._view = memoryview(_EMPTY)
                self._start = self._end = 0
                self._grow = False

    @property
    def _core_buffered_bytes(self) -> int:
        """buffered_bytes: the staging buffer, output merged and not yet sent, and the
        link's own receive pool's buffers (an upper bound: a pooled buffer may be a message
        the user still holds; a pool shared by a communicator's links is not this link's)."""
        return len(self._buffer) + len(self._merge) + (
            self._pool.capacity if self._own_pool else 0)

    @property
    def incoming_bytes(self) -> int:
        """Size of the message being received: its credit is spent, it is not complete yet."""
        incoming = self._incoming
        return incoming.size if incoming is not None else 0


    # ------------------------------------------------------------------ receiving

    def receive_buffer(self) -> memoryview:
        """Where the I/O layer should ``recv_into`` next (never empty).

        :attr:`read_buffer`, where it is set, is the same answer without the call.
        """
        if self._direct:
            assert self._incoming is not None  # _direct is only set while a message is due
            return self._incoming.target(self._body_left)
        size = len(self._buffer)
        if self._grow or not size:
            # The last read filled the buffer (the link is busy: read more per call), or an
            # idle link's buffer was freed. Allocate, keeping the unparsed tail.
            self._grow = False
            self._restage(min(max(2 * size, STAGING_MIN), STAGING_SIZE))
        elif self._start == self._end:
            self._start = self._end = 0
        elif size - self._end < size >> 2:
            # Move the unparsed tail (always < one header + descriptor + control payload,
            # or the start of a body) to the front.
            tail = self._end - self._start
            self._buffer[:tail] = self._view[self._start : self._end]
            self._start, self._end = 0, tail
        if self._start == self._end and self._after_large:
            # The previous message was large; the next one probably is too. Read just
            # enough for its header and descriptor, so its body goes straight into the
            # part buffer instead of through the staging buffer (a copy saved).
            return self._view[: HEADER_SIZE + frames.MAX_DESCRIPTOR]
        return self._view[self._end :]

    def _restage(self, size: int) -> None:
        """A new staging buffer of ``size`` bytes, the unparsed tail moved to its front."""
        tail = self._end - self._start
        buffer = _allocate_staging(max(size, tail))
        if tail:
            buffer[:tail] = self._view[self._start : self._end]
        self._buffer = buffer
        self._view = memoryview(buffer)
        self._start, self._end = 0, tail

    def receive_done(self, count: int) -> list[Event]:
        """``count`` bytes were written into the last :meth:`receive_buffer` (or
        :attr:`read_buffer`).

        Messages it completes are acknowledged here: one ACK frame, for the last of them, is
        queued once per call (the peer's netq has them; see docs/protocol.md).
        """
        if self.state is ConnectionState.CLOSED:
            return []
        if self._direct:
            events: list[Event] = []
            incoming = self._incoming
            assert incoming is not None
            incoming.advance(count)
            self._body_left -= count
            if incoming.remaining == 0:
                self._direct = False
                self._after_large = True
                self._complete(events)
                if self.state is not _CLOSED and not (self.defers_acks and self._defer_ack()):
                    self.send_ack(self.expected_seq - 1)
            elif self._body_left < DIRECT_THRESHOLD:
                self._direct = False
            return events
        self.read_buffer = None
        first_expected = self.expected_seq
        self._end += count
        if self._end == len(self._buffer) and len(self._buffer) < STAGING_SIZE:
            self._grow = True
        # Parse what is staged (inline: one call per read that carries small messages).
        events = []
        view = self._view
        start = self._start
        end = self._end
        data_limit = self.local.max_frame + frames.MAX_DESCRIPTOR
        while self.state is not _CLOSED:
            if self._body_left:
                available = end - start
                if not available:
                    self._direct = self._body_left >= DIRECT_THRESHOLD  # the header alone
                    break
                take = min(available, self._body_left)
                incoming = self._incoming
                assert incoming is not None  # _body_left counts the body of this message
                incoming.fill(view[start : start + take])
                start += take
                self._body_left -= take
                if incoming.remaining == 0:
                    self._complete(events)
                elif self._body_left >= DIRECT_THRESHOLD:
                    self._direct = True
                    break
                continue
            available = end - start
            if available >= _ONE_PART_SIZE:
                # The header and, if this is a one-part DATA frame, its descriptor, in one
                # unpack (of another frame, the descriptor's fields are the next bytes, unused).
                (frame_type, flags, reserved, length, value, total, nparts, reserved2,
                 raw) = _ONE_PART_UNPACK_FROM(view, start)
                # A busy link's frames first: a whole one-part message (its length says
                # the descriptor is its own: total >= 0), an ACK. Then the rest.
                if (frame_type == _DATA and flags & _FIRST_LAST == _FIRST_LAST
                        and length == _ONE_PART_DESCRIPTOR + total and nparts == 1
                        and not reserved and not reserved2 and length <= data_limit
                        and available >= HEADER_SIZE + length and raw & _SIZE_MASK == total
                        and value == self.expected_seq and total < _POOL_MIN
                        and total <= self._max_message and self._open_for_data
                        and self._incoming is None and self.recv_allowance_bytes > 0
                        and self.recv_allowance_messages > 0):
                    self.recv_allowance_bytes -= total
                    if self._count_messages:
                        self.recv_allowance_messages -= 1
                    position = start + HEADER_SIZE + _ONE_PART_DESCRIPTOR
                    start = position + total
                    part = (bytes(view[position:start]) if raw & READONLY_BIT
                            else self._buffer[position:start])
                    self.expected_seq = value + 1
                    self._after_large = False
                    events.append(_new_tuple(MessageReceived,
                                             (value, bool(flags & _BATCH), [part], total)))
                    continue
            elif available >= HEADER_SIZE:
                frame_type, flags, reserved, length, value = _HEADER_UNPACK_FROM(view, start)
            else:
                break
            if frame_type == _ACK and not length and not reserved and self.state is _OPEN:
                start += HEADER_SIZE
                events.append(_new_tuple(AckReceived, (value,)))
                continue
            if self.state is ConnectionState.HELLO and (frame_type not in _KNOWN_TYPES
                                                         or reserved):
                # Not even a netq frame header: say what the other end is not.
                self._fail(events, RemoteProtocolError(
                    f"the other end is not a netq peer: its first bytes "
                    f"{bytes(view[start:start + 8])!r} are not a netq HELLO"), ErrorCode.PROTOCOL)
                break
            if frame_type not in _KNOWN_TYPES:
                self._fail(events, RemoteProtocolError(f"unknown frame type {frame_type}"),
                           ErrorCode.PROTOCOL)
                break
            if reserved:
                self._fail(events, RemoteProtocolError("reserved header bits set"),
                           ErrorCode.PROTOCOL)
                break
            if length > (data_limit if frame_type == _DATA else _CONTROL_LIMITS[frame_type]):
                self._fail(events, RemoteProtocolError(
                    f"{FrameType(frame_type).name} frame of {length} bytes over the limit"),
                    ErrorCode.LIMIT)
                break
            if frame_type == _DATA:
                consumed = self._data_header(events, view, start, end, flags, length, value)
                if consumed < 0:
                    break
                start = consumed
                continue
            if end - start < HEADER_SIZE + length:
                break
            payload = bytes(view[start + HEADER_SIZE : start + HEADER_SIZE + length])
            start += HEADER_SIZE + length
            if frame_type == _SESSION:
                first_expected = -1  # a resumed session renumbers: only messages count
            self._control(events, frame_type, flags, value, payload)
        if start == end and not self._grow and not self._after_large and not self._direct:
            self._start = self._end = 0
            self.read_buffer = view  # all parsed: the next read fills the buffer from its start
        else:
            self._start = start
        if self.expected_seq != first_expected and self.state is not _CLOSED:
            if first_expected < 0:
                if events and any(type(event) is MessageReceived for event in events):
                    self.send_ack(self.expected_seq - 1)
            elif self.defers_acks and self._defer_ack():
                pass  # owed: ack_owed says so until an ACK covers it
            else:
                # send_ack(), inline: once per read that carried messages.
                seq = self.expected_seq - 1
                position = self.sent_total + self.bytes_queued
                if position != self.acks_end:
                    self.acks_start = position
                if position != self._replies_end:
                    self._replies_start = position
                merge = self._merge
                merge += _HEADER_PACK(_ACK, 0, 0, 0, seq)
                self.bytes_queued += HEADER_SIZE
                self.acks_end = self._replies_end = position + HEADER_SIZE
                if len(merge) >= self.merge_size:
                    self._seal()
        return events

    def receive_data(self, data: Buffer) -> list[Event]:
        """Feed bytes that were read elsewhere (tests, message-oriented transports). A large
        read-only part that ends ``data`` whole stays in it (a view, not a copy) where ``data``
        is (a view of) ``bytes``, which nobody can change: a carrier's packet."""
        events: list[Event] = []
        view = memoryview(data).cast("B")
        keep = type(data) is bytes or type(data) is memoryview and type(data.obj) is bytes
        while view and self.state is not ConnectionState.CLOSED:
            if keep and self._direct and self._incoming.adopt(view):  # type: ignore[union-attr]
                events.extend(self.receive_done(len(view)))  # _direct: a message is due
                break
            target = self.receive_buffer()
            count = min(len(target), len(view))
            if keep and len(view) >= _POOL_MIN and not self._direct \
                    and self._start == self._end and not self._body_left:
                # A packet that is one DATA frame: its head alone, then its body whole above.
                count = min(count, frames.sole_data_frame_head(view) or count)
            target[:count] = view[:count]
            view = view[count:]
            events.extend(self.receive_done(count))
        return events

    def _receive_eof(self) -> list[Event]:
        """receive_eof: a goodbye before the end makes this a clean end."""
        if self.state is ConnectionState.CLOSED:
            return []
        self._set_state(ConnectionState.CLOSED)
        if self._incoming is not None or self._end > self._start:
            return [ConnectionFailed(RemoteProtocolError("connection closed mid-frame"))]
        return []

    def _fail(self, events: list[Event], error: NetqError, code: ErrorCode) -> None:
        self.send_error(code, str(error))
        self._set_state(ConnectionState.CLOSED)
        self._direct = False
        events.append(ConnectionFailed(error))

    def _complete(self, events: list[Event]) -> None:
        incoming = self._incoming
        assert incoming is not None
        self._incoming = None
        self.expected_seq += 1
        if self._incoming_follows:
            self._incoming_follows = 0
            self.follows(incoming.seq, incoming.size)
        events.append(incoming.finish())

    def _data_header(self, events: list[Event], view: memoryview, start: int, end: int,
                     flags: int, length: int, seq: int) -> int:
        """Handle a DATA header at ``start``; returns the new parse position, -1 to stop."""
        if self.state is not ConnectionState.OPEN:
            self._fail(events, RemoteProtocolError(f"DATA in state {self.state.value}"),
                       ErrorCode.PROTOCOL)
            return -1
        if self.peer_said_bye:
            self._fail(events, RemoteProtocolError("DATA after BYE"), ErrorCode.PROTOCOL)
            return -1
        if not flags & _FIRST:
            incoming = self._incoming
            if incoming is None or seq != incoming.seq:
                self._fail(events, RemoteProtocolError("continuation without a first chunk"),
                           ErrorCode.PROTOCOL)
                return -1
            last = bool(flags & _LAST)
            if length > incoming.remaining or last != (length == incoming.remaining) or not length:
                self._fail(events, RemoteProtocolError("chunk sizes disagree with the message"),
                           ErrorCode.PROTOCOL)
                return -1
            self._body_left = length
            return start + HEADER_SIZE
        if end - start < HEADER_SIZE + _DESCRIPTOR_SIZE:
            return -1
        total: int
        nparts: int
        total, nparts, reserved = _DESCRIPTOR_UNPACK_FROM(view, start + HEADER_SIZE)
        descriptor_size = _DESCRIPTOR_SIZE + 8 * nparts
        if reserved or nparts > frames.MAX_PARTS or length < descriptor_size:
            self._fail(events, RemoteProtocolError("malformed message descriptor"),
                       ErrorCode.PROTOCOL)
            return -1
        if end - start < HEADER_SIZE + descriptor_size:
            return -1
        if self._incoming is not None:
            self._fail(events, RemoteProtocolError("new message before the last one ended"),
                       ErrorCode.PROTOCOL)
            return -1
        if seq != self.expected_seq:
            self._fail(events, RemoteProtocolError(
                f"message {seq} out of order (expected {self.expected_seq})"), ErrorCode.PROTOCOL)
            return -1
        if total > self.local.max_message:
            self._fail(events, RemoteProtocolError(
                f"message of {total} bytes over max_message={self.local.max_message}"),
                ErrorCode.LIMIT)
            return -1
        if self.recv_allowance_bytes <= 0 or self.recv_allowance_messages <= 0:
            self._fail(events, RemoteProtocolError("message sent without credit"),
                       ErrorCode.LIMIT)
            return -1
        sizes = struct.unpack_from(f"<{nparts}Q", view, start + HEADER_SIZE + _DESCRIPTOR_SIZE)
        body = length - descriptor_size
        if self.received_fds is not None:
            for raw in sizes:  # a loop, not any(): no generator per message
                if raw & SEGMENT_BIT:
                    return self._segment_header(events, view, start, end, flags, seq, total,
                                                sizes, body)
        last = bool(flags & _LAST)
        described = 0
        for raw in sizes:
            described += raw & _SIZE_MASK
        if described != total or body > total or last != (body == total):
            self._fail(events, RemoteProtocolError("descriptor sizes disagree with the frame"),
                       ErrorCode.PROTOCOL)
            return -1
        if body == 0 and total:
            self._fail(events, RemoteProtocolError("empty first chunk"), ErrorCode.PROTOCOL)
            return -1
        self.recv_allowance_bytes -= total
        if self.local.recv_messages != frames.UNLIMITED_MESSAGES:
            self.recv_allowance_messages -= 1
        position = start + HEADER_SIZE + descriptor_size
        batch = bool(flags & _BATCH)
        follows = flags & _FOLLOWS
        if last and end - position >= total:
            parts = cut_whole(view, self._buffer, position, sizes, self._pool)
            self.expected_seq += 1
            if follows:
                self.follows(seq, total)
            events.append(_new_tuple(MessageReceived, (seq, batch, parts, total)))
            return position + total
        self._incoming = Incoming(seq, batch, list(sizes), total, self._pool)
        self._incoming_follows = follows
        self._body_left = body
        return position

    def _control(self, events: list[Event], frame_type: int, flags: int, value: int,
                 payload: bytes) -> None:
        state = self.state
        if frame_type in frames.EXACT_LENGTH and len(payload) != _CONTROL_LIMITS[frame_type]:
            error = RemoteProtocolError(
                f"{FrameType(frame_type).name} payload of {len(payload)} bytes")
            self._fail(events, error, ErrorCode.PROTOCOL)
            return
        if frame_type == FrameType.HELLO:
            if state is not ConnectionState.HELLO:
                self._fail(events, RemoteProtocolError("second HELLO"), ErrorCode.PROTOCOL)
                return
            self._hello(events, payload)
        elif frame_type == FrameType.AUTH:
            if state is not ConnectionState.AUTH:
                self._fail(events, RemoteProtocolError(f"AUTH in state {state.value}"),
                           ErrorCode.PROTOCOL)
                return
            peer = self.peer
            assert peer is not None and self._authkey is not None  # state AUTH: both are set
            expected = frames.auth_digest(self._authkey, peer.role, peer.id, self.local.nonce,
                                          peer.nonce)
            if not hmac.compare_digest(expected, payload):
                self._fail(events, AuthenticationError(f"peer {peer.id} failed the authkey check"),
                           ErrorCode.AUTHENTICATION)
                return
            self._set_state(ConnectionState.SESSION)
            events.append(PeerAuthenticated(peer))
        elif frame_type == FrameType.SESSION:
            if state is not ConnectionState.SESSION:
                self._fail(events, RemoteProtocolError(f"SESSION in state {state.value}"),
                           ErrorCode.PROTOCOL)
                return
            token, last_received, resumed, held_bytes, held_messages = \
                frames.decode_session(payload)
            self._set_state(ConnectionState.OPEN)
            self.send_credit_bytes -= held_bytes
            assert self.peer is not None  # state SESSION: its HELLO came first
            if self.peer.recv_messages != frames.UNLIMITED_MESSAGES:
                self.send_credit_messages -= held_messages
            if self._asked is not None:
                # The server's DATA may follow its SESSION in the same bytes, before the session
                # layer has seen this event: decide here where its numbering continues. It
                # resumes our session (same token: after what we said we have) or starts a new
                # one (from 1): netq.protocol.resume decides, for the session layer too.
                asked_token, asked_last = self._asked
                self.expected_seq = resume_numbering(
                    same_session=token == asked_token, peer_received=last_received,
                    we_received=asked_last).expected
            events.append(SessionOpened(token, last_received, resumed, held_bytes,
                                        held_messages))
        elif frame_type == FrameType.ERROR:
            # The peer is closing this link and says why; the session layer maps the code.
            self._set_state(ConnectionState.CLOSED)
            events.append(ErrorReceived(value, payload.decode(errors="replace")))
        elif frame_type == FrameType.PING:
            self._emit(_HEADER_PACK(FrameType.PONG, 0, 0, 0, value))
        elif frame_type == FrameType.PONG:
            events.append(PongReceived(value))
        elif state is not ConnectionState.OPEN:
            self._fail(events, RemoteProtocolError(
                f"{FrameType(frame_type).name} in state {state.value}"), ErrorCode.PROTOCOL)
        elif frame_type == FrameType.CREDIT:
            messages: int = frames.CREDIT_PAYLOAD.unpack(payload)[0]
            self.send_credit_bytes += value
            assert self.peer is not None  # state OPEN
            if self.peer.recv_messages != frames.UNLIMITED_MESSAGES:
                self.send_credit_messages += messages
            events.append(CreditReceived(value, messages))
        elif frame_type == FrameType.ACK:
            events.append(_new_tuple(AckReceived, (value,)))
        elif frame_type == FrameType.BYE:
            self.peer_said_bye = True
            self._open_for_data = False
            events.append(ByeReceived(payload.decode(errors="replace")))

    def _hello(self, events: list[Event], payload: bytes) -> None:
        try:
            hello = frames.decode_hello(payload)
        except ValueError as error:
            self._fail(events, RemoteProtocolError(
                f"the other end is not a netq peer (malformed HELLO: {error})"),
                ErrorCode.PROTOCOL)
            return
        if hello.version != frames.VERSION:
            self._fail(events, RemoteProtocolError(
                f"peer speaks netq protocol {hello.version}, we speak {frames.VERSION}"),
                ErrorCode.VERSION)
            return
        if hello.role == self.local.role:
            self._fail(events, RemoteProtocolError(f"both ends are {hello.role.name}"),
                       ErrorCode.PROTOCOL)
            return
        if hello.auth != (self._authkey is not None):
            who = "the peer has an authkey and we have none" if hello.auth else \
                "we require an authkey and the peer has none"
            self._fail(events, AuthenticationError(who), ErrorCode.AUTHENTICATION)
            return
        self.peer = hello
        self._chunk = max(1, min(self.max_size, hello.max_frame))
        self.send_credit_bytes = hello.recv_window
        self.send_credit_messages = hello.recv_messages
        if self._authkey is not None:
            digest = frames.auth_digest(self._authkey, self.local.role, self.local.id,
                                        hello.nonce, self.local.nonce)
            self._emit(frames.encode_header(FrameType.AUTH, 0, len(digest), 0) + digest)
            self._set_state(ConnectionState.AUTH)
            return
        self._set_state(ConnectionState.SESSION)
        events.append(PeerAuthenticated(hello))

