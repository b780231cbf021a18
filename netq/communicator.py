"""The communicator: the queue API on user threads, the session engine on the I/O thread.

User threads call :meth:`Communicator.put` / :meth:`Communicator.get`; they serialize and
deserialize, so user code never runs on the I/O thread. The transport's I/O thread feeds
connection events into the engine methods (``_io_*``), which attach links to sessions, move
queued messages onto links as credit allows, acknowledge, and resolve futures.

A put to an idle plain socket is written by the calling thread itself (no thread hand-off,
~35 us per wake-up on this VM): the caller takes the session's ``send_lock`` without blocking,
and falls back to waking the I/O thread when the lock is taken or the socket is busy.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

from . import protocol as proto
from .exceptions import (
    AuthenticationError,
    ConnectionLost,
    DeserializationError,
    Empty,
    Full,
    LocalProtocolError,
    MessageTooLarge,
    NetqError,
    RemoteProtocolError,
    ResourceClosed,
    UnknownPeer,
)
from .futures import DeliveryFuture
from .options import CommunicatorOptions, Protocol, Purpose
from .protocol.frames import MAX_PARTS, UNLIMITED_MESSAGES, ErrorCode, Role
from .protocol.connection import MessageReceived as Incoming  # what waits in an inbox
from .session import Outgoing, PeerSession, PeerState
from .statistics import CommunicatorStatistics, PeerStatistics, RateMeter
from .stream import Stream

__all__ = ("Communicator", "Message")

LOGGER = logging.getLogger("netq")
_NO_TOKEN = bytes(16)
_CLOSE_POLL = 0.002
_GOODBYE_GRACE = 1.0
_DEPARTED_MEMORY = 65536  # departed peer ids remembered  # seconds close(timeout) still allows for goodbyes after the timeout
_CORK_BYTES = 64 * 1024  # unsent bytes that wake the I/O thread even while an ACK is due
_QUIET = 50e-6  # seconds since the previous put after which a put counts as a lone request
_clock = time.perf_counter
_sleep = time.sleep  # seconds between checks while close() waits for acknowledgements


class Message(NamedTuple):
    """A received message: who sent it, and the object (``peer, data = queue.get()`` works).

    A named tuple rather than a frozen dataclass: it is built once per get(), and a frozen
    dataclass's __init__ costs several times more.
    """

    peer: uuid.UUID
    data: Any


def _part_codecs(serialization):
    """dump/load as part lists: the serializer's own fast forms when it has them."""
    dump, load = serialization.dump, serialization.load
    owner = getattr(dump, "__self__", None)
    if owner is not None and getattr(owner, "dump", None) == dump and hasattr(owner, "dump_parts"):
        dump_parts = owner.dump_parts
    else:
        def dump_parts(obj):
            return [memoryview(chunk).cast("B") for chunk in dump(obj).readchunks()]
    owner = getattr(load, "__self__", None)
    if owner is not None and getattr(owner, "load", None) == load and hasattr(owner, "load_parts"):
        load_parts = owner.load_parts
    else:
        def load_parts(parts):
            return load(Stream(parts))
    return dump_parts, load_parts


class Communicator:
    """A server or client endpoint. Thread-safe; use as a context manager.

    Create with :func:`netq.new`. The constructor never blocks: a client connects (and
    reconnects) on the I/O thread, and ``put`` queues until the link is up.
    """

    def __init__(self, protocol: Protocol, purpose: Purpose, options: CommunicatorOptions,
                 transport_class: type) -> None:
        self.options = options
        self.protocol = Protocol(protocol)
        self.purpose = Purpose(purpose)
        self.id: uuid.UUID = options.id
        self._role = Role.SERVER if self.purpose is Purpose.SERVER else Role.CLIENT
        self._dump_parts, self._load_parts = _part_codecs(options.serialization)
        self._message_limit = options.serialization.message_limit
        queue_size = options.serialization.queue_size
        self._recv_messages = UNLIMITED_MESSAGES if queue_size < 0 else max(1, queue_size)
        connection = options.connection
        self._recv_window = connection.recv_window
        self._send_window = connection.send_window
        self._credit_threshold = max(1, connection.recv_window // 4)
        self._spin = connection.spin
        self._credit_message_threshold = max(1, self._recv_messages // 4)
        security = options.security
        self._authkey = security.authkey if security is not None else None

        self._sessions: dict[uuid.UUID, PeerSession] = {}
        # Ids of peers that left (oldest first, bounded): ResourceClosed, not UnknownPeer.
        self._departed: dict[uuid.UUID, None] = {}
        self._server_session: PeerSession | None = None  # client: the one session
        if self.purpose is Purpose.CLIENT:
            # The server's id is unknown until the handshake; the session exists up front so
            # put() can queue before the first connection.
            self._server_session = PeerSession(uuid.UUID(int=0), token=_NO_TOKEN)

        self._recv_lock = threading.Lock()
        self._recv_ready = threading.Condition(self._recv_lock)
        self._getters = 0
        self._ready: collections.deque[PeerSession] = collections.deque()
        self._lent: list = []  # (session, size) handed out by get(), credit not yet returned

        self._attention: collections.deque[PeerSession] = collections.deque()
        self._arrival_listeners: list = []  # called on the I/O thread when messages arrive
        self._closing = False  # close() called: no new puts
        self._stopping = False  # the I/O loop should finish once goodbyes are done
        self._stopping_since = 0.0  # monotonic time close() set _stopping
        self._closed = threading.Event()  # the I/O thread has ended
        self._failure: BaseException | None = None  # why the I/O thread died, if it did
        self._fatal: NetqError | None = None  # a client that cannot go on (wrong authkey)
        self._close_lock = threading.Lock()
        self._ping_tokens = itertools.count(1)
        self._created = time.monotonic()
        self._meter = RateMeter()
        self._totals_closed = [0, 0, 0, 0]  # messages/bytes in/out of sessions now gone

        self._transport = transport_class(self)
        self._transport.start()

    # ================================================================== user API

    def __repr__(self) -> str:
        return (f"<netq {self.purpose.value} {self.protocol.value} {self.options.netloc} "
                f"id={self.id} peers={len(self.peers)}>")

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def peers(self) -> tuple[uuid.UUID, ...]:
        """Ids of the peers with a live or resumable session."""
        if self._server_session is not None:
            session = self._server_session
            return (session.id,) if session.state is PeerState.CONNECTED else ()
        return tuple(peer for peer, s in list(self._sessions.items())
                     if s.state not in (PeerState.CLOSED, PeerState.CLOSING))

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def address(self):
        """Where a server listens (the bound address, useful with port 0)."""
        return self._transport.address

    def _targets(self, peers: tuple) -> list[PeerSession]:
        if self._closing:
            raise ResourceClosed(None, "put after close()")
        if self._failure is not None:
            raise ConnectionLost(None, f"I/O thread failed: {self._failure!r}")
        if self._fatal is not None:
            raise self._fatal
        if self._server_session is not None:
            session = self._server_session
            if peers and any(p != session.id for p in peers):
                unknown = next(p for p in peers if p != session.id)
                raise UnknownPeer(unknown)
            if session.state is PeerState.CLOSED:
                raise ResourceClosed(session.id, "the server closed the session")
            return [session]
        sessions = self._sessions
        if not peers:
            return [s for s in list(sessions.values())
                    if s.state not in (PeerState.CLOSED, PeerState.CLOSING)]
        targets = []
        for peer in peers:
            session = sessions.get(peer)
            if session is None:
                if peer in self._departed:
                    raise ResourceClosed(peer, "the peer left")
                raise UnknownPeer(peer)
            if session.state in (PeerState.CLOSED, PeerState.CLOSING):
                raise ResourceClosed(peer, "the peer left")
            targets.append(session)
        return targets

    def put(self, data: Any, *peers: uuid.UUID, block: bool = True,
            timeout: float | None = None) -> DeliveryFuture:
        """Send ``data`` to ``peers`` (client: the server; server: everyone if none named).

        The object is serialized once for all peers and must not be mutated until the returned
        future resolves; the future resolves when every peer has received the message and
        fails with :class:`ResourceClosed` if a peer or this communicator goes away first.
        Blocks while a peer's unsent bytes exceed ``send_window`` (``block=False``: raise
        :class:`Full`; ``timeout``: raise :class:`Full` after that many seconds).
        """
        return self._put(self._dump_parts(data), False, peers, block, timeout)

    def put_many(self, items: Iterable[Any], *peers: uuid.UUID, block: bool = True,
                 timeout: float | None = None) -> DeliveryFuture:
        """Send many (small) objects as one wire message; ``get`` returns them one by one."""
        items = list(items)
        if not items:
            raise ValueError("put_many() needs at least one item")
        return self._put(self._dump_parts(items), True, peers, block, timeout)

    def _put(self, parts: list, batch: bool, peers: tuple, block: bool,
             timeout: float | None) -> DeliveryFuture:
        if len(parts) == 1:
            size = len(parts[0])
        else:
            size = 0
            for part in parts:
                size += len(part)
        targets = self._targets(peers)
        future = DeliveryFuture(len(targets))
        if size > self._message_limit:
            future._fail(MessageTooLarge(size, self._message_limit))
            return future
        if len(parts) > MAX_PARTS:
            # A custom dump() made more parts than a message can carry. Caught here, on the
            # caller's thread: in the pump it would end the link or the I/O thread.
            future._fail(LocalProtocolError(
                f"dump() made {len(parts)} parts; a message carries at most {MAX_PARTS}"))
            return future
        if not targets:
            future._start()
            future._delivered()
            return future
        message = Outgoing(parts, size, batch, future)
        future._sessions = targets  # where cancel() withdraws it from (PeerSession.withdraw)
        for session in targets:
            self._enqueue(session, message, block, timeout)
        return future

    def _enqueue(self, session: PeerSession, message: Outgoing, block: bool,
                 timeout: float | None) -> None:
        with session.put_lock:
            if session.queued_bytes - session.dequeued_bytes >= self._send_window:
                self._wait_for_space(session, block, timeout)
            session.queued_bytes += message.size
            session.outbox.append(message)
        now = _clock()
        quiet = now - session.last_put >= _QUIET
        session.last_put = now
        if session.inflight:
            if session.queued_bytes - session.dequeued_bytes < _CORK_BYTES:
                # Autocork: messages are on the wire unacknowledged, so an ACK is coming and
                # the I/O thread pumps the outbox when it arrives (it checks the outbox after
                # popping acknowledged messages, and we checked inflight after appending: no
                # message is stranded). Meanwhile puts pile up into one batch, one sendmsg.
                return
        elif quiet and self._transport.direct_writes and session.send_lock.acquire(False):
            # Request/response: nothing in flight and no put just before this one. Writing
            # from this thread saves the I/O thread's wake-up (~35 us here) on the way out.
            try:
                link = session.link
                if link is not None and link.direct_ok and not link.write_blocked:
                    self._pump(session, link)
                    if link.conn.has_output:
                        self._transport.write_now(link)
                    if not session.outbox and not link.conn.has_output:
                        return
            finally:
                session.send_lock.release()
        if not session.scheduled:
            self._schedule(session)
            self._transport.wake()

    def _schedule(self, session: PeerSession) -> None:
        """Ask the I/O thread to service ``session`` (pump, return credit) on its next turn."""
        session.scheduled = True
        self._attention.append(session)

    def _wait_for_space(self, session: PeerSession, block: bool, timeout: float | None) -> None:
        """Called with put_lock held: wait until the peer's unsent bytes drop under the window."""
        if not block:
            raise Full(f"{session.unsent_bytes} bytes unsent to {session.id}")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._schedule(session)
        self._transport.wake()
        session.space_waiters += 1
        try:
            while session.queued_bytes - session.dequeued_bytes >= self._send_window:
                if self._closing or session.state is PeerState.CLOSED:
                    raise ResourceClosed(None if self._closing else session.id)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Full(f"{session.unsent_bytes} bytes unsent to {session.id}")
                session.space.wait(0.1 if remaining is None else min(remaining, 0.1))
        finally:
            session.space_waiters -= 1

    # ------------------------------------------------------------------ receive

    def get(self, *peers: uuid.UUID, timeout: float | None = None,
            block: bool = True) -> Message:
        """The next message (from ``peers`` only, if named), fairly across peers.

        Blocks until one arrives (``timeout``: raise :class:`Empty` after that many seconds).
        After ``close()`` it keeps returning what was received, then raises
        :class:`ResourceClosed`.
        """
        session, item = self._take(peers, block, timeout)
        return self._open(session, item)

    def get_nowait(self, *peers: uuid.UUID) -> Message:
        return self.get(*peers, block=False)

    def get_many(self, *peers: uuid.UUID, max_messages: int = 1024,
                 timeout: float | None = None, block: bool = True) -> list[Message]:
        """At least one message (blocking like ``get``) and at most ``max_messages``."""
        messages = [self.get(*peers, timeout=timeout, block=block)]
        while len(messages) < max_messages:
            try:
                session, item = self._take(peers, False, None)
            except (Empty, ResourceClosed):
                break
            if type(item) is Incoming and item.batch:
                messages.extend(self._open_batch(session, item, max_messages - len(messages)))
            else:
                messages.append(self._open(session, item))
        return messages

    def _open(self, session: PeerSession, item) -> Message:
        if type(item) is not Incoming:
            return Message(session.id, item)  # an element of an opened batch
        if item.batch:
            return self._open_batch(session, item, 1)[0]
        try:
            return Message(session.id, self._load_parts(item.parts))
        except Exception as error:
            raise DeserializationError(session.id, error) from error

    def _open_batch(self, session: PeerSession, item: Incoming, take: int) -> list[Message]:
        try:
            values = self._load_parts(item.parts)
        except Exception as error:
            raise DeserializationError(session.id, error) from error
        peer = session.id
        taken = [Message(peer, value) for value in values[:take]]
        rest = values[take:]
        if rest:
            with self._recv_lock:
                session.inbox.extendleft(reversed(rest))
                if not session.in_ready:
                    session.in_ready = True
                    self._ready.appendleft(session)
                if self._getters:
                    self._recv_ready.notify(len(rest))
            # Other getters may have looked while this batch was being opened: tell them.
            for listener in list(self._arrival_listeners):
                listener()
        return taken

    def _take(self, peers: tuple, block: bool, timeout: float | None):
        """Pop the next raw item, fairly: round-robin over peers with queued messages."""
        deadline = None
        spin_until = None
        with self._recv_lock:
            if self._lent:
                self._release_lent()
            while True:
                if peers:
                    found = self._take_from(peers)
                else:
                    found = self._take_any()
                if found is not None:
                    return found
                if self._closed.is_set() or (self._closing and not block):
                    raise ResourceClosed(None, "closed and every received message was taken")
                if self._failure is not None:
                    raise ConnectionLost(None, f"I/O thread failed: {self._failure!r}")
                if self._fatal is not None:
                    raise self._fatal
                server = self._server_session
                if server is not None and server.state is PeerState.CLOSED and not server.inbox:
                    raise ResourceClosed(server.id, "the server closed the session")
                if not block:
                    raise Empty()
                if timeout is not None:
                    if deadline is None:
                        deadline = time.monotonic() + timeout
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise Empty()
                else:
                    remaining = None
                if spin_until is None:
                    spin_until = _clock() + self._spin
                if _clock() < spin_until:
                    # Busy-poll briefly, letting the I/O thread have the GIL: a message that
                    # arrives within the spin is taken without a futex wake-up (~35-50 us
                    # here, per hop).
                    self._recv_lock.release()
                    try:
                        _sleep(0)
                    finally:
                        self._recv_lock.acquire()
                    continue
                self._getters += 1
                try:
                    self._recv_ready.wait(remaining)
                finally:
                    self._getters -= 1

    def _take_any(self):
        ready = self._ready
        while ready:
            session = ready[0]
            inbox = session.inbox
            if not inbox:
                ready.popleft()
                session.in_ready = False
                continue
            item = inbox.popleft()
            if not inbox:
                ready.popleft()
                session.in_ready = False
            elif len(ready) > 1:
                ready.rotate(-1)  # fairness: the next get serves the next peer
            self._consumed(session, item)
            return session, item
        return None

    def _take_from(self, peers: tuple):
        sessions = self._sessions
        for peer in peers:
            session = self._server_session if self._server_session is not None else sessions.get(peer)
            if session is None and peer in self._departed:
                raise ResourceClosed(peer, "the peer left and everything it sent was taken")
            if session is None or (self._server_session is not None and peer != session.id):
                raise UnknownPeer(peer)
            if session.inbox:
                item = session.inbox.popleft()
                self._consumed(session, item)
                return session, item
        return None

    def _consumed(self, session: PeerSession, item) -> None:
        """A message was handed out (receive lock held); its credit returns on the next get().

        The caller holds the message until it comes back for another one: granting its
        credit at that point, not now, keeps a peer from sending the next large message
        while the previous one is still in the caller's hands (receiver memory stays near one
        message instead of two).
        """
        if type(item) is Incoming:  # a batch element was counted when the batch was opened
            self._lent.append((session, item.size))

    def _release_lent(self) -> None:
        """Count the messages handed out earlier as consumed; return credit past a threshold."""
        for session, size in self._lent:
            session.consumed_messages += 1
            session.consumed_bytes += size
            if session.credit_requested:
                continue
            if (session.consumed_bytes - session.credited_bytes >= self._credit_threshold
                    or session.consumed_messages - session.credited_messages
                    >= self._credit_message_threshold):
                session.credit_requested = True
                self._schedule(session)
                self._transport.wake()
        self._lent.clear()

    # ------------------------------------------------------------------ close

    def close(self, timeout: float | None = None) -> None:
        """Flush, say goodbye and stop. Idempotent.

        A client waits until the server acknowledged everything it put, then says goodbye. A
        server waits for its queues to drain and its clients to leave (a killed client's
        session expires after ``session_timeout``). With ``timeout`` (seconds), whatever is
        still pending then fails with :class:`ResourceClosed` and the links are closed.
        """
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closing = True
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed.is_set() and not self._flushed():
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(_CLOSE_POLL)
        self._stopping_since = time.monotonic()
        self._stopping = True
        self._transport.wake()
        # Even when the timeout has run out, give the I/O thread a moment to tell peers that
        # we are leaving (ERROR SHUTDOWN / BYE) before the links are cut.
        remaining = None if deadline is None else max(_GOODBYE_GRACE, deadline - time.monotonic())
        if not self._closed.wait(remaining):
            self._transport.abort()
            self._closed.wait()
        self._transport.join()
        error = ResourceClosed(None, "the communicator closed")
        for session in self._all_sessions():
            with session.send_lock:
                session.fail_outbound(error)
        with self._recv_lock:
            self._recv_ready.notify_all()
        for listener in list(self._arrival_listeners):
            listener()

    def _all_sessions(self) -> list[PeerSession]:
        sessions = list(self._sessions.values())
        if self._server_session is not None:
            sessions.append(self._server_session)
        return sessions

    def _flushed(self) -> bool:
        """Everything put has been acknowledged (or failed), and for a server: peers left."""
        if self._failure is not None:
            return True
        for session in self._all_sessions():
            if session.state is PeerState.CLOSED:
                continue
            if session.outbox or session.inflight:
                if self.purpose is Purpose.CLIENT and session.state is not PeerState.CONNECTED \
                        and session.token == _NO_TOKEN and session.reconnects == 0 \
                        and time.monotonic() - self._created > self.options.connection.session_timeout:
                    continue  # never connected within session_timeout: give up
                return False
            if self.purpose is Purpose.SERVER:
                return False  # still there: the server waits for its clients to leave
        return True

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> CommunicatorStatistics:
        """A frozen snapshot: totals and one row per peer (see :mod:`netq.statistics`)."""
        now = time.monotonic()
        rows = []
        for session in self._all_sessions():
            link = session.link
            conn = link.conn if link is not None else None
            inflight_bytes = 0
            for _, message in list(session.inflight):
                inflight_bytes += message.size
            # The message get() returned last is the caller's now; its credit is still out.
            queued_in = session.held_bytes - sum(
                size for owner, size in list(self._lent) if owner is session)
            rows.append(PeerStatistics(
                peer=session.id,
                state=session.state.value,
                queue_in=len(session.inbox),
                queue_in_bytes=queued_in,
                queue_out=len(session.outbox),
                queue_out_bytes=session.unsent_bytes,
                inflight=len(session.inflight),
                inflight_bytes=inflight_bytes,
                messages_in=session.received_messages,
                bytes_in=session.received_bytes,
                messages_out=session.acked_messages,
                bytes_out=session.acked_bytes,
                credit_out=conn.send_credit_bytes if conn is not None else 0,
                credit_in=conn.recv_allowance_bytes if conn is not None else 0,
                memory=queued_in + session.unsent_bytes + inflight_bytes,
                reconnects=session.reconnects,
                connected_for=(now - session.connected_at)
                if session.connected_at is not None and session.connected else 0.0,
                messages_in_per_s=0.0, bytes_in_per_s=0.0,
                messages_out_per_s=0.0, bytes_out_per_s=0.0,
            ))
        return self._meter.snapshot(
            now=now,
            id=self.id,
            purpose=self.purpose.value,
            protocol=self.protocol.value,
            address=str(self._transport.address),
            state="closed" if self._closed.is_set() else "closing" if self._closing else "open",
            uptime=now - self._created,
            peers=rows,
            closed_totals=tuple(self._totals_closed),
        )

    # ------------------------------------------------------------------ display

    def monitor(self, interval: float = 0.5, **options):
        """A live Jupyter view of :meth:`statistics` (per-peer table and plots at 1/interval Hz).

        Needs the ``netq[widgets]`` extra (the ``netq.widgets`` package, imported only here);
        without it, a static text/HTML summary (and a warning). Options: see
        ``netq.widgets.Monitor``.
        """
        from .display import monitor

        return monitor(self, interval=interval, **options)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """Jupyter display: a live monitor in a kernel with ``netq[widgets]``, else static."""
        from .display import communicator_bundle

        return communicator_bundle(self, include, exclude)

    # ================================================================== I/O engine
    # Everything below runs on the transport's I/O thread.

    def _io_new_connection(self) -> proto.Connection:
        connection = self.options.connection
        hello = proto.make_hello(
            self._role, self.id,
            auth=self._authkey is not None,
            max_message=self._message_limit,
            max_frame=connection.max_size,
            recv_window=self._recv_window,
            recv_messages=self._recv_messages,
        )
        return proto.Connection(hello, self._authkey, max_size=connection.max_size,
                                merge_size=connection.merge_size,
                                efficient_size=connection.efficient_size)

    def _io_events(self, link, events: list) -> None:
        """Handle what a link's Connection produced; may queue output on the link."""
        arrived = None
        session = link.session
        for event in events:
            kind = type(event)
            if kind is proto.MessageReceived:
                session.last_received = event.seq
                session.received_messages += 1
                session.received_bytes += event.size
                if arrived is None:
                    arrived = []
                arrived.append(event)  # the event itself waits in the inbox: no new object
            elif kind is proto.AckReceived:
                self._io_ack(session, event.seq)
            elif kind is proto.CreditReceived:
                self._schedule(session)
            elif kind is proto.PeerAuthenticated:
                if not self._io_authenticated(link, event.hello):
                    return  # refused: nothing after the HELLO is looked at
            elif kind is proto.SessionOpened:
                self._io_session_opened(link, event)
                session = link.session
            elif kind is proto.ByeReceived:
                self._io_bye(link)
            elif kind is proto.ErrorReceived:
                self._io_error_frame(link, event)
            elif kind is proto.ConnectionFailed:
                link.error = event.error
                if not isinstance(event.error, AuthenticationError):
                    LOGGER.info("netq %s: link to %s failed: %s", self.purpose.value,
                                link.peer_name, event.error)
            elif kind is proto.PongReceived:
                link.rtt = time.monotonic() - link.ping_sent_at
        if arrived:
            link.conn.send_ack(session.last_received)
            with self._recv_lock:
                session.inbox.extend(arrived)
                if not session.in_ready:
                    session.in_ready = True
                    self._ready.append(session)
                if self._getters:
                    self._recv_ready.notify(len(arrived))
            for listener in self._arrival_listeners:
                listener()

    def _io_ack(self, session: PeerSession, seq: int) -> None:
        session.acknowledge(seq)
        if session.outbox and not session.scheduled:
            self._schedule(session)

    def _io_authenticated(self, link, hello) -> bool:
        """The peer proved who it is (or needs no proof). False if the transport refuses it."""
        if not self._transport.authorize(link, hello.id):
            link.error = AuthenticationError(f"{hello.id} may not use this link")
            link.conn.send_error(ErrorCode.AUTHENTICATION, "peer id not allowed on this link")
            self._transport.close_link(link, flush=True)
            return False
        link.peer_id = hello.id
        if self._role is Role.CLIENT:
            session = self._server_session
            token = session.token
            last = session.last_received if token != _NO_TOKEN else 0
            self._send_session(session, link, token, last, False)
        return True

    def _io_session_opened(self, link, event: proto.SessionOpened) -> None:
        now = time.monotonic()
        if self._role is Role.SERVER:
            session = self._sessions.get(link.peer_id)
            resumed = session is not None and session.state is not PeerState.CLOSED
            if not resumed:
                session = PeerSession(link.peer_id)
                self._sessions[link.peer_id] = session
            old = session.link
            if old is not None and old is not link:
                old.conn.send_error(ErrorCode.REPLACED, "a newer connection took over")
                self._transport.close_link(old, flush=True)
            with session.send_lock:
                if resumed and event.token == session.token:
                    session.requeue_inflight(event.last_received)
                else:
                    # A new client process reusing the id: its queues survive, numbering
                    # restarts on both sides.
                    session.requeue_inflight(0)
                    session.last_received = 0
                if session.state is not PeerState.CONNECTING:
                    session.reconnects += 1
                link.conn.expected_seq = session.last_received + 1
                self._send_session(session, link, session.token, session.last_received,
                                   resumed)
                self._attach(session, link, now)
        else:
            session = self._server_session
            with session.send_lock:
                if event.token == session.token:
                    session.requeue_inflight(event.last_received)
                else:
                    if session.token != _NO_TOKEN:
                        # The server lost our session (restart or expiry): send everything
                        # unacknowledged again, numbering from 1 both ways.
                        session.requeue_inflight(0)
                        session.last_received = 0
                    session.token = event.token
                if session.id.int == 0 or session.id != link.peer_id:
                    session.id = link.peer_id
                if session.connected_at is not None:
                    session.reconnects += 1
                # No expected_seq here: the protocol core set it when it read the SESSION
                # frame (the same answer as above), and the server's messages that followed it
                # in the same read have advanced it since; resetting it made the next message
                # "out of order" and cost the new link.
                self._attach(session, link, now)

    def _send_session(self, session: PeerSession, link, token: bytes, last_received: int,
                      resumed: bool) -> None:
        """Our SESSION frame, with what we still hold of the peer's messages.

        The new link's HELLO granted a whole window; the SESSION takes back what earlier links'
        messages still occupy, so window = credit on this link + held, however often the peer
        reconnects. From this moment, every consumed message returns its credit on this link.
        """
        link.conn.send_session(token, last_received, resumed, session.held_bytes,
                               session.held_messages)
        session.credited_bytes = session.consumed_bytes
        session.credited_messages = session.consumed_messages
        session.credit_requested = False

    def _attach(self, session: PeerSession, link, now: float) -> None:
        session.link = link
        link.session = session
        session.state = PeerState.CONNECTED
        session.connected_at = now
        session.disconnected_at = None
        self._schedule(session)

    def _io_bye(self, link) -> None:
        session = link.session
        if session is None:
            return
        session.goodbye_received = True
        if self._role is Role.SERVER:
            # The client leaves: nothing more goes to it. Messages already on the wire still
            # get acknowledged (it reads until our BYE); queued ones fail now.
            with session.send_lock:
                error = ResourceClosed(session.id, "the peer closed")
                while session.outbox:
                    message = session.outbox.popleft()
                    session.dequeued_bytes += message.size
                    message.future._fail(error)
                session.wake_putters()
                session.state = PeerState.CLOSING
                link.conn.send_bye("goodbye")
                session.goodbye_sent = True
            self._transport.close_link(link, flush=True)
        else:
            session.state = PeerState.CLOSED
            if not session.goodbye_sent:  # the server shut us out
                link.conn.send_bye("goodbye")
                session.goodbye_sent = True
            with session.send_lock:
                session.fail_outbound(ResourceClosed(session.id, "the server closed"))
            self._transport.close_link(link, flush=True)

    def _io_error_frame(self, link, event: proto.ErrorReceived) -> None:
        code = event.code
        if code == ErrorCode.REPLACED:
            link.error = ConnectionLost(link.peer_id, "replaced by a newer connection")
            link.replaced = True
        elif code == ErrorCode.SHUTDOWN:
            link.error = ResourceClosed(link.peer_id, "the peer shut down")
            session = link.session
            if session is not None:
                session.state = PeerState.CLOSED
        elif code == ErrorCode.AUTHENTICATION:
            link.error = AuthenticationError(f"peer rejected us: {event.text}")
        else:
            link.error = RemoteProtocolError(f"peer reported error {code}: {event.text}")

    def _io_link_closed(self, link) -> None:
        """A link's socket is gone; detach it from its session."""
        session = link.session
        now = time.monotonic()
        if isinstance(link.error, AuthenticationError):
            LOGGER.warning("netq %s: %s", self.purpose.value, link.error)
            if self._role is Role.CLIENT:
                # Retrying cannot help (wrong key, untrusted server certificate): fail
                # everything with the reason.
                self._fatal = link.error
                server = self._server_session
                server.state = PeerState.CLOSED
                with server.send_lock:
                    server.fail_outbound(link.error)
                with self._recv_lock:
                    self._recv_ready.notify_all()
                return
        if session is None or session.link is not link:
            return
        if session.goodbye_received or session.state is PeerState.CLOSED:
            session.link = None
            self._end_session(session, ResourceClosed(session.id, "the peer closed"))
            return
        session.mark_disconnected(now)

    def _end_session(self, session: PeerSession, error: BaseException) -> None:
        session.state = PeerState.CLOSED
        with session.send_lock:
            session.fail_outbound(error)
        if self._role is Role.SERVER and not session.inbox:
            self._forget(session)

    def _forget(self, session: PeerSession) -> None:
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
            self._departed[session.id] = None
            while len(self._departed) > _DEPARTED_MEMORY:
                del self._departed[next(iter(self._departed))]
            totals = self._totals_closed
            totals[0] += session.received_messages
            totals[1] += session.received_bytes
            totals[2] += session.acked_messages
            totals[3] += session.acked_bytes

    def _pump(self, session: PeerSession, link) -> None:
        """Move queued messages onto the link while credit lasts (send_lock held)."""
        conn = link.conn
        outbox = session.outbox
        inflight = session.inflight
        moved = 0
        while outbox and conn.can_send_data:
            message = outbox.popleft()
            moved += message.size
            if not message.future._start():
                continue  # cancelled before it reached the wire
            if message.size > conn.peer.max_message:
                # Within our limit, over the peer's: only this message fails.
                message.future._fail(MessageTooLarge(message.size, conn.peer.max_message))
                continue
            seq = session.next_seq
            session.next_seq = seq + 1
            conn.send_message(seq, message.parts, message.size, message.batch)
            inflight.append((seq, message))
            session.sent_messages += 1
        if moved:
            session.dequeued_bytes += moved
            if session.space_waiters:
                session.wake_putters()

    def _io_service(self, now: float) -> float:
        """Periodic and requested work; returns seconds until it wants to run again."""
        attention = self._attention
        # One pass over what is queued now: a session rescheduled meanwhile waits for the next
        # pass (it is in the deque again), so user threads cannot keep this loop spinning.
        for _ in range(len(attention)):
            session = attention.popleft()
            session.scheduled = False  # before pumping: later puts must schedule again
            link = session.link
            if link is None or link.closing:
                continue
            with session.send_lock:
                if session.credit_requested or session.consumed_bytes != session.credited_bytes:
                    self._io_return_credit(session, link)
                self._pump(session, link)
                if link.conn.has_output:
                    self._transport.write_now(link)
        return self._io_timers(now)

    def _io_return_credit(self, session: PeerSession, link) -> None:
        session.credit_requested = False
        nbytes = session.consumed_bytes - session.credited_bytes
        messages = session.consumed_messages - session.credited_messages
        if nbytes <= 0 and messages <= 0:
            return
        session.credited_bytes += max(nbytes, 0)
        session.credited_messages += max(messages, 0)
        link.conn.send_credit(max(nbytes, 0), max(messages, 0))

    def _io_timers(self, now: float) -> float:
        connection = self.options.connection
        heartbeat = connection.heartbeat
        wait = heartbeat
        for session in self._all_sessions():
            state = session.state
            if state is PeerState.DISCONNECTED:
                waited = now - session.disconnected_at
                if waited >= connection.session_timeout:
                    session.disconnected_at = now  # client: a fresh period for later puts
                    error = ConnectionLost(session.id, "no reconnect within session_timeout")
                    if self._role is Role.SERVER:
                        self._end_session(session, error)
                    else:
                        with session.send_lock:
                            session.fail_outbound(error)
                else:
                    wait = min(wait, connection.session_timeout - waited)
            elif state is PeerState.CLOSED and self._role is Role.SERVER and not session.inbox \
                    and session.link is None:
                self._forget(session)
        for link in self._transport.links():
            silent = now - link.last_received_at
            if silent >= 3 * heartbeat:
                link.error = ConnectionLost(link.peer_id, f"silent for {silent:.1f} s")
                self._transport.close_link(link, flush=False)
            elif silent >= heartbeat and now - link.ping_sent_at >= heartbeat:
                link.ping_sent_at = now
                with link.lock:
                    link.conn.send_ping(next(self._ping_tokens))
                    self._transport.write_now(link)
            else:
                wait = min(wait, heartbeat - max(silent, now - link.ping_sent_at))
        return max(wait, 0.001)

    def _io_goodbyes(self) -> bool:
        """Closing: say goodbye on every link; True when nothing is left to wait for."""
        done = True
        for link in self._transport.links():
            session = link.session
            if session is None:
                if (self._role is Role.CLIENT and not link.closing
                        and time.monotonic() - self._stopping_since < _GOODBYE_GRACE):
                    # Mid-handshake: the server may have opened our session already (it
                    # does on our SESSION frame). Let the handshake finish so that we can
                    # say goodbye; cut now, the server would keep that session for
                    # session_timeout, and its close() would wait for it.
                    done = False
                    continue
                self._transport.close_link(link, flush=False)
                continue
            with link.lock:
                if self._role is Role.CLIENT:
                    if not session.goodbye_sent:
                        session.goodbye_sent = True
                        session.state = PeerState.CLOSING
                        link.conn.send_bye("goodbye")
                        self._transport.write_now(link)
                    done = False  # wait for the server's BYE (or EOF)
                else:
                    # Server stopping with clients still attached (close timeout ran out).
                    link.conn.send_error(ErrorCode.SHUTDOWN, "server closing")
                    self._transport.close_link(link, flush=True)
        return done

    def _io_failed(self, error: BaseException) -> None:
        """The I/O thread is dying: make the failure visible to futures and get()."""
        self._failure = error
        lost = ConnectionLost(None, f"I/O thread failed: {error!r}")
        for session in self._all_sessions():
            session.fail_outbound(lost)
        with self._recv_lock:
            self._recv_ready.notify_all()
