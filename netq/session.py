"""Per-peer session state: what survives a reconnect.

A :class:`PeerSession` holds one peer's queues in both directions, sequence numbers, the
messages sent but not yet acknowledged, and counters. A link (a
:class:`~netq.protocol.Connection` plus a transport handle) attaches to a session after the
handshake and detaches when it breaks; the session waits ``session_timeout`` for the next one.

Threads and ownership (one writer per field, so the hot path needs no lock):

* user threads append to ``outbox`` (``deque.append`` is atomic) and count ``queued_bytes``
  under ``put_lock``; they pop ``inbox`` under the communicator's receive lock and count
  ``consumed_*`` there.
* whoever holds ``send_lock`` (the I/O thread, or a user thread writing on an idle link) moves
  messages from ``outbox`` to the link, numbers them and appends them to ``inflight``
  (:meth:`PeerSession.pump`).
* the I/O thread alone appends to ``inbox``, pops ``inflight`` on ACK, and attaches links.

And one module per field: each field is written by one module (this one, netq.handshake for
the link and the state, netq.credit for the receive counts, netq.engine and netq.inbox for the
few they own; ``tests/test_layers.py`` checks it and names the one exception left).
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .exceptions import ConnectionLost, Full, MessageTooLarge, ResourceClosed
from .futures import STARTED, DeliveryFuture
from .protocol.events import ConnectionState
from .protocol.resume import Resume

if TYPE_CHECKING:
    from .chunk_stream import Buffer
    from .protocol.connection import Connection
    from .stall import StallWarning

_OPEN = ConnectionState.OPEN
getrefcount = sys.getrefcount

__all__ = ("NO_TOKEN", "AttachedLink", "Outgoing", "PeerSession", "PeerState")

NO_TOKEN = bytes(16)  # a client's session token before the server has answered
LOGGER = logging.getLogger("netq")
_SPACE_POLL = 0.1  # seconds between checks while put() waits for send budget
# Bytes of memory a queued message holds beyond its serialized payload (its future, its
# Outgoing, the part list and the objects' headers), counted against send_budget so that the
# budget bounds memory for small messages too (tests/engine/test_engine.py measures it).
QUEUED_MESSAGE_COST = 512


class PeerState(enum.StrEnum):
    CONNECTING = "connecting"  # client: no link yet / handshake in progress
    CONNECTED = "connected"  # a link is attached and open
    DISCONNECTED = "disconnected"  # the link broke; waiting for a reconnect
    CLOSING = "closing"  # a goodbye was sent or received
    CLOSED = "closed"  # gone: nothing more will be sent or received


class Outgoing(NamedTuple):
    """One serialized message, shared by every peer it is addressed to.

    A named tuple: ``put()`` builds one per message with ``tuple.__new__`` (no Python-level
    constructor runs), and its fields read through C descriptors."""

    parts: Sequence[Buffer]
    size: int
    batch: bool
    future: DeliveryFuture


def _counts_when_unheld() -> tuple[int, int]:
    """What ``sys.getrefcount`` says in :meth:`PeerSession.acknowledge` of a message only its
    local variable refers to, and of that message's future when only the message refers to
    it; (-1, -1), so that every future resolves, if this interpreter does not tell those from
    a message or a future held elsewhere. Measured here, with the expressions ``acknowledge``
    uses: an interpreter may pass a local variable to a call without counting a reference for
    it (CPython 3.14 does where it can prove the variable outlives the call)."""
    message = Outgoing((), 0, False, DeliveryFuture())
    unheld = getrefcount(message), getrefcount(message.future)
    held, future = message, message.future
    if (getrefcount(message), getrefcount(message.future)) != (unheld[0] + 1, unheld[1] + 1):
        return -1, -1
    del held, future
    return unheld


_MESSAGE_UNHELD, _FUTURE_UNHELD = _counts_when_unheld()


class AttachedLink(Protocol):
    """What the session knows of the link attached to it: a :class:`netq.contract.Link`,
    which points back at its session (``Link.session``). The contract sits above the session
    and names it; the session names only this, so the two modules import one way. Where the
    engine hands a session's link to the loop it tells the type checker that it is a Link by
    annotating (``link: Link | None = session.link``), not with ``typing.cast``: that would be
    a Python call per put."""

    @property
    def conn(self) -> Connection:
        """The link's sans-I/O protocol state (its credit, its output)."""

    @property
    def serial(self) -> int:
        """The order links were made in: of two links of one peer, the newer keeps it."""


class PeerSession:
    """One peer, as seen from this communicator."""

    def __init__(self, peer_id: uuid.UUID, token: bytes | None = None,
                 window: int = 256 * 1024) -> None:
        self.id = peer_id
        self.token = token or os.urandom(16)
        self.state = PeerState.CONNECTING
        self.link: AttachedLink | None = None  # the attached transport link
        self.disconnected_at: float | None = None
        self.connected_at: float | None = None
        self.reconnects = 0

        # Outbound.
        self.outbox: collections.deque[Outgoing] = collections.deque()
        # On the wire, unacknowledged, in order. Their numbers are consecutive and end at
        # next_seq - 1, so they are not stored (no tuple per message).
        self.inflight: collections.deque[Outgoing] = collections.deque()
        self.next_seq = 1
        self.put_lock = threading.Lock()
        # RLock: the I/O thread holds it while handling a link's events and may re-enter.
        self.send_lock = threading.RLock()
        self.space = threading.Condition(self.put_lock)  # put() waits here for the window
        self.space_waiters = 0
        # The limits the waiting put()s wait under (send_budget, send_messages): what tells a
        # moved or acknowledged message that frees too little from one that lets them go on.
        self.space_limits = (0, 0)
        self.queued_bytes = 0  # put() side, under put_lock
        self.dequeued_bytes = 0  # send side: bytes moved from outbox to the link
        self.sent_messages = 0
        self.acked_messages = 0
        self.acked_bytes = 0
        self.last_put = 0.0  # perf_counter() of the latest put, to tell streams from requests
        self.scheduled = False  # queued in the I/O thread's attention list
        self.goodbye_sent = False
        self.goodbye_received = False
        # Why put() may be waiting (statistics() and warnings): monotonic times or None.
        self.blocked_since: float | None = None  # a put() waits for send budget
        self.credit_exhausted_since: float | None = None  # messages queued, no credit left

        # Inbound: MessageReceived events (deserialized lazily by get(), on the user thread),
        # and the remaining elements of an opened put_many batch.
        self.inbox: collections.deque[Any] = collections.deque()
        self.in_ready = False
        self.last_received = 0  # highest sequence number received in this session
        self.received_messages = 0
        self.received_bytes = 0
        self.consumed_messages = 0  # get() side, under the receive lock
        self.consumed_bytes = 0
        self.credited_messages = 0  # I/O side: message consumption returned as CREDIT
        self.credit_requested = False  # get() asked the I/O thread to return message credit
        self.window = window  # receive credit we aim to keep outstanding (netq.flow)
        # The bandwidth-delay probe under way (netq.credit.ReceiveBudget.probe): its PING
        # token (0: none), the link it went out on, and the bytes received since.
        self.bdp_token = 0
        self.bdp_link: AttachedLink | None = None
        self.bdp_bytes = 0
        self.bdp_backoff = 0.0  # seconds until the next probe after one that did not grow
        self.bdp_next_at = 0.0  # monotonic time before which no probe starts
        self.credit_waiting = False  # the receive budget capped this peer's last grant

    # --------------------------------------------------------------- accounting

    @property
    def unsent_bytes(self) -> int:
        """Payload bytes queued and not yet on the wire."""
        return self.queued_bytes - self.dequeued_bytes

    @property
    def unsent_charge(self) -> int:
        """What the unsent messages count against ``send_budget``: their payload bytes plus
        :data:`QUEUED_MESSAGE_COST` each (see ``ConnectionOptions.send_budget``); the sum
        :meth:`has_room` compares (spelled out there because every put() asks it) and
        :meth:`_room_came` wakes waiting put()s by."""
        return self.queued_bytes - self.dequeued_bytes + len(self.outbox) * QUEUED_MESSAGE_COST

    @property
    def held_bytes(self) -> int:
        """Received and not yet consumed."""
        return self.received_bytes - self.consumed_bytes

    @property
    def held_messages(self) -> int:
        return self.received_messages - self.consumed_messages

    def inflight_bytes(self) -> int:
        """Bytes on the wire to the peer and not yet acknowledged."""
        total = 0
        for message in list(self.inflight):
            total += message.size
        return total

    @property
    def connected(self) -> bool:
        return self.state is PeerState.CONNECTED

    def pump(self, link: AttachedLink) -> None:
        """Move queued messages onto ``link`` while credit lasts, numbering them (send_lock
        held): what goes on the wire under which sequence number. The engine's pump, from its
        I/O thread's service and a user's direct write."""
        conn = link.conn
        outbox = self.outbox
        inflight = self.inflight
        moved = 0
        if self.credit_exhausted_since is not None and conn.can_send_data:
            self.credit_exhausted_since = None  # CREDIT came
        # conn.can_send_data, inline: the link is open, both credits positive, no BYE sent.
        while outbox and conn.state is _OPEN and conn.send_credit_bytes > 0 \
                and conn.send_credit_messages > 0 and not conn.sent_bye:
            message = outbox.popleft()
            moved += message.size
            gate = message.future.start_gate  # DeliveryFuture._start, inline (netq.futures)
            if not gate:
                gate.append(STARTED)
            if gate[0] != STARTED:
                continue  # cancelled before it reached the wire
            peer = conn.peer
            assert peer is not None
            if message.size > (limit := peer.max_message):
                # Over the peer's limit, learnt after the put() (which raises for a known one).
                message.future._fail_peer(MessageTooLarge(message.size, limit, peer.id),
                                          peer.id)
                continue
            seq = self.next_seq
            self.next_seq = seq + 1
            conn.queue_message(seq, message.parts, message.size, message.batch, outbox)
            inflight.append(message)
            self.sent_messages += 1
        if outbox and self.credit_exhausted_since is None \
                and conn.state is _OPEN and not conn.can_send_data:
            self.credit_exhausted_since = time.monotonic()
        if moved:
            self.dequeued_bytes += moved
            if self.space_waiters:
                self._room_came()

    def acknowledge(self, seq: int) -> None:
        """The peer has every message up to ``seq``: resolve their futures (I/O thread)."""
        inflight = self.inflight
        # inflight holds the numbers next_seq - len(inflight) .. next_seq - 1
        count = min(seq - (self.next_seq - len(inflight)) + 1, len(inflight))
        if count <= 0:
            return
        acked_bytes = 0
        for _ in range(count):
            message = inflight.popleft()
            acked_bytes += message.size
            # A future nothing can watch is dropped with its message, unresolved (netq.futures).
            if getrefcount(message) != _MESSAGE_UNHELD \
                    or getrefcount(message.future) != _FUTURE_UNHELD \
                    or message.future._done_callbacks \
                    or message.future.__weakref__ is not None:  # type: ignore[attr-defined]
                message.future._delivered()
        self.acked_messages += count
        self.acked_bytes += acked_bytes
        if self.space_waiters:
            self._room_came()  # a put() may wait for send_messages

    def resume(self, numbering: Resume) -> None:
        """A link (re)opened this session: continue numbering where ``numbering`` says.

        Only the send-lock holder may call this. Messages the peer has resolve; the others go
        back in front of the queue, in order, to be sent again under fresh numbers (the ones
        the peer now expects).
        """
        self.acknowledge(numbering.acknowledged)
        inflight = self.inflight
        again = list(inflight)
        inflight.clear()
        self.outbox.extendleft(reversed(again))
        self.dequeued_bytes -= sum(message.size for message in again)
        self.next_seq = numbering.next_send
        self.last_received = numbering.last_received

    def has_room(self, send_budget: int, send_messages: int) -> bool:
        """May put() queue another message: :attr:`unsent_charge` under ``send_budget``, and
        fewer than ``send_messages`` messages queued or unacknowledged?"""
        outbox = self.outbox
        return (self.queued_bytes - self.dequeued_bytes + len(outbox) * QUEUED_MESSAGE_COST
                < send_budget and len(outbox) + len(self.inflight) < send_messages)

    def wait_for_space(self, send_budget: int, send_messages: int, timeout: float | None,
                       stall: StallWarning, closing: Callable[[], bool],
                       explain: Callable[[], str], who: str) -> None:
        """put(), with ``put_lock`` held: wait until :meth:`has_room`, warning (``stall``,
        ``explain()``: why) while nothing moves.

        Raises :class:`Full` after ``timeout`` seconds, :class:`ResourceClosed` when the
        communicator closes meanwhile (``closing()``), :class:`ConnectionLost` when the peer
        leaves.
        """
        start = stall.since
        deadline = None if timeout is None else start + timeout
        self.space_limits = (send_budget, send_messages)
        self.space_waiters += 1
        if self.blocked_since is None:
            self.blocked_since = start
        progress = (self.dequeued_bytes, self.acked_messages)
        try:
            while not self.has_room(send_budget, send_messages):
                if closing() or self.state is PeerState.CLOSED:
                    raise ResourceClosed(None, "close() was called") if closing() \
                        else ConnectionLost(self.id, "the peer left")
                now = time.monotonic()
                if (self.dequeued_bytes, self.acked_messages) != progress:
                    progress = (self.dequeued_bytes, self.acked_messages)
                    stall.progress(now)
                elif stall.due(now):
                    LOGGER.warning("netq %s: put() has waited %.0f s: %s", who, now - start,
                                   explain())
                remaining = None if deadline is None else deadline - now
                if remaining is not None and remaining <= 0:
                    raise Full(f"put() waited {timeout:g} s: {explain()}")
                self.space.wait(_SPACE_POLL if remaining is None
                                else min(remaining, _SPACE_POLL))
        finally:
            self.space_waiters -= 1
            if not self.space_waiters:
                self.blocked_since = None

    def withdraw(self, future: DeliveryFuture) -> None:
        """The caller cancelled a put before it reached the wire: drop it from the outbox now.

        Without this the message (its payload, its share of ``send_budget``) would stay queued
        until credit let the pump reach it and skip it: behind a stalled receiver, forever.
        Runs on the cancelling thread, under ``send_lock`` (the pump's lock) and ``put_lock``
        (put() appends under it; a deque must not change while we look through it). Lock
        order send_lock -> put_lock, as in the pump.
        """
        with self.send_lock:
            with self.put_lock:
                for message in self.outbox:
                    if message.future is future:
                        self.outbox.remove(message)
                        self.dequeued_bytes += message.size
                        break
                else:
                    return  # not queued here any more: on the wire, or failed
            self.wake_putters()

    def waiting_for(self, future: DeliveryFuture) -> str | None:
        """Why this peer has not acknowledged the message of ``future`` yet (a clause for the
        future's ``TimeoutError``), and what would change it; None once it holds no copy of
        it (acknowledged, failed or withdrawn). Any thread: it reads copies of the queues."""
        sent = list(self.inflight)
        queued = list(self.outbox)
        connected = self.state is PeerState.CONNECTED
        for position, message in enumerate(sent):
            if message.future is future:
                if connected:
                    return (f"sent, and its acknowledgement has not come back"
                            f"{_ahead(position, 'sent before it and not acknowledged either')}"
                            f": the peer's netq acknowledges what it receives before its "
                            f"get() takes it, so the link or the peer's process is slow or "
                            f"stuck")
                return (f"sent, and the link broke before its acknowledgement came: it is "
                        f"sent again when the session resumes ({self._not_connected()})")
        for position, message in enumerate(queued):
            if message.future is future:
                ahead = _ahead(position + len(sent), "ahead of it")
                if not connected:
                    return f"not sent yet{ahead}: {self._not_connected()}"
                if self.credit_exhausted_since is not None:
                    return (f"not sent yet{ahead}: the peer's receive window is full, because "
                            f"its code has not called get() for what it holds; it is sent "
                            f"when the peer takes messages")
                return f"not sent yet{ahead}: the link takes them slower than put() queues them"
        return None

    def _not_connected(self) -> str:
        if self.state is PeerState.CLOSED:
            return "the session ended: the peer is gone"
        return ("not connected to it now; netq reconnects, and the WARNING it logs and "
                "statistics() say what it runs into")

    def fail_outbound(self, error: Exception) -> int:
        """Fail every queued and unacknowledged message (peer or communicator gone)."""
        failed = 0
        while self.inflight:
            message = self.inflight.popleft()
            message.future._fail_peer(error, self.id)
            failed += 1
        return failed + self.fail_queued(error)

    def fail_queued(self, error: Exception) -> int:
        """Fail the messages not yet on the wire (what is on it may still be acknowledged)."""
        failed = 0
        while self.outbox:
            message = self.outbox.popleft()
            self.dequeued_bytes += message.size
            message.future._fail_peer(error, self.id)
            failed += 1
        self.wake_putters()
        return failed

    def wake_putters(self) -> None:
        if self.space_waiters:
            with self.space:
                self.space.notify_all()

    def _room_came(self) -> None:
        """Messages moved onto the wire or were acknowledged: wake the waiting put()s once a
        quarter of the send budget is free, or a message may go by the count limit's measure.

        Waking them for every message that frees a little would cost a wake-up of the caller's
        thread (and the interpreter lock's hand-over) per message where large messages wait
        for a full budget; woken with a quarter free, a put() thread queues several.
        """
        budget, messages = self.space_limits
        if self.unsent_charge < budget - (budget >> 2) \
                and len(self.outbox) + len(self.inflight) < messages:
            with self.space:
                self.space.notify_all()


def _ahead(count: int, what: str) -> str:
    return f" ({count} message{'s' if count != 1 else ''} {what})" if count else ""
