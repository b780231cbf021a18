"""The engine/loop contract: what the engine and the loop that drives its links know of each
other.

This module sits below both :mod:`netq.engine` and :mod:`netq.loop`: each imports it, and it
imports neither. The loop talks to its carrier (sockets, MQTT, gRPC) through another contract,
:mod:`netq.carrier`; the engine never sees a carrier. This one holds

* :class:`EngineAPI`: everything the loop may call on the engine (four methods and the
  :class:`LoopSignals`: what the loop reads, and the notices it leaves the engine, as data);
* :class:`LoopAPI`: everything the engine may call on its loop (a
  :class:`netq.loop.IOLoop`, or the in-memory stand-in of the engine tests);
* :class:`Inbox`: what the engine hands received messages to (the queue API's receive side);
* :class:`Link`: one connection to one peer, in two parts with one owner each:
  :class:`LinkIO` (the loop's: the sans-I/O Connection, the carrier's ``channel``, write and
  close state) and the fields :class:`Link` adds (the engine's: session, peer id, liveness and
  credit accounting);
* :data:`Address`: the forms :attr:`LoopAPI.address` takes (:data:`netq.carrier.Address`:
  the loop hands on its carrier's).

A link's ``channel`` is the carrier's handle of it (a socket channel, an MQTT topic pair, a
gRPC stream), typed ``object`` (nothing in the contract is ``Any``): the loop keeps it with
the link and hands it back to the carrier without looking inside.

Layers, top to bottom::

    Communicator (netq.communicator)     queue API, inboxes, fair receive, close
        |
    SessionEngine (netq.engine)          event dispatch, pumping, timers
        |  uses: peers, credit, diagnostics, flow, protocol (resume numbering)
        |
    -- netq.contract ------------------  EngineAPI / LoopAPI / Inbox / Link
        |
    IOLoop (netq.loop)                   the I/O thread: links, reads, writes, reconnects
        |
    -- netq.carrier -------------------  Carrier / CarrierInfo / events
        |
    carriers (netq.transports.*)         sockets, MQTT, gRPC
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ._shm import ShmCounters
from .carrier import Address
from .options import CommunicatorOptions, Purpose
from .protocol import Connection, Event, MessageReceived

if TYPE_CHECKING:
    from .protocol.sending import Buffer
    from .session import PeerSession

__all__ = ("CONNECT_FAILED", "CONNECT_STARTED", "LINK_CLOSED", "LINK_SERVED", "Address",
           "EngineAPI", "Inbox", "Link", "LinkIO", "LoopSignals", "Notice", "LoopAPI",
           "LoopFactory")

_serials = itertools.count()  # Link.serial (next() on a count is atomic: any thread may)


class Inbox(Protocol):
    """What the engine hands received messages to (the queue API's receive side). What the
    loop reads of the receive side is in :class:`LoopSignals`, never this."""

    def deliver(self, session: PeerSession, messages: list[MessageReceived]) -> None:
        """Append complete messages to the session's inbox and wake getters (I/O thread)."""

    def wake_all(self) -> None:
        """Wake every waiting get(): something changed that may end their wait."""

    @property
    def getters(self) -> int:
        """get() calls waiting now (asleep or leading the loop)."""

    @property
    def waiting_since(self) -> float | None:
        """time.monotonic() when get() began waiting with nothing taken since, or None."""


class LinkIO:
    """The loop's part of a link: its protocol state and its write/close state.

    ``channel`` is the carrier's handle of the link (a socket, a topic pair, a stream:
    :mod:`netq.carrier`), opaque to the loop, which hands it back to the carrier. ``conn`` is
    the sans-I/O :class:`netq.protocol.Connection`, written under :attr:`Link.lock`. Only the
    loop writes these fields; the engine reads ``conn``, ``error``, ``closing`` and
    ``write_blocked``, and sets ``error``/``replaced`` when a frame tells why a link ends.
    """

    __slots__ = ("conn", "channel", "reader", "writer", "own_lock", "error", "closing",
                 "close_deadline", "write_blocked", "replaced", "dropped", "address",
                 "ack_hold_until", "ack_hold_misses", "ack_hold_skip")

    def __init__(self, conn: Connection, address: object, channel: object = None) -> None:
        self.conn = conn
        self.channel = channel  # the carrier's handle (netq.carrier), opaque to the loop
        # The channel's own read_into(buffer) (netq.carrier.Opened.read_into) where the link
        # takes no descriptors; None: the carrier's read_into(channel, buffer[, fds]).
        self.reader: Callable[[memoryview], int] | None = None
        # write(buffers): the channel's own (netq.carrier.Opened.write) or the carrier's
        # write bound to the channel; set when the loop opens the link.
        self.writer: Callable[[list[Buffer]], int] | None = None
        self.own_lock = threading.RLock()
        self.error: BaseException | None = None  # why the link ended (or is ending)
        self.closing = False  # flushing its last frames (LinkDriver.close_link)
        self.close_deadline = 0.0  # monotonic time by which a closing link is dropped
        self.write_blocked = False  # the carrier took less than all the output
        self.replaced = False  # a newer link of the same peer took over (no reconnect)
        self.dropped = False  # gone: released and reported to the engine
        self.address = address  # the peer's address, in the transport's terms
        # Until when queued ACK frames may wait for a reply to carry them (0.0: not held).
        self.ack_hold_until = 0.0
        # Holds in a row that no reply carried (the consumer went on with other work), and how
        # many chances to hold are skipped because of them (netq.link_driver: back-off).
        self.ack_hold_misses = 0
        self.ack_hold_skip = 0


class Link(LinkIO):
    """One connection to one peer: the transport's part (:class:`LinkIO`) and the engine's.

    The engine's part: ``session`` (the :class:`netq.session.PeerSession` it is attached to
    once the handshake is done), ``peer_id`` (from the peer's HELLO), liveness
    (``last_received_at``, which the transport stamps on every read, ``ping_sent_at``,
    ``rtt``), ``direct_ok`` and ``credit_counted``.

    The session points back at its link (``PeerSession.link``) typed as
    :class:`netq.session.AttachedLink`, what the session's readers need of it, so that the
    session module does not import this one: the contract sits above the session.
    """

    __slots__ = ("session", "peer_id", "opened_at", "last_received_at", "ping_sent_at", "rtt",
                 "direct_ok", "credit_counted", "serial")

    def __init__(self, conn: Connection, address: object, channel: object = None) -> None:
        super().__init__(conn, address, channel)
        self.session: PeerSession | None = None
        self.peer_id: uuid.UUID | None = None
        # The order links were made in (a server: the order it accepted them), so that of two
        # links of one peer the newer one keeps the session, whichever handshake ends first.
        self.serial = next(_serials)
        now = time.monotonic()
        self.opened_at = now
        self.last_received_at = now  # monotonic time of the last bytes read (transport)
        self.ping_sent_at = now
        self.rtt = 0.0  # seconds, from the last heartbeat PING's PONG
        # User threads may write on this link only once the I/O thread has left the critical
        # section in which it attached the link to a session (before that, the I/O thread
        # holds the link's own lock, not the session's).
        self.direct_ok = False
        # The receive credit of this link the engine counts against its budget (the HELLO
        # grant from the start: the engine counted it when it built the Connection).
        self.credit_counted = max(conn.recv_allowance_bytes, 0)

    @property
    def lock(self) -> threading.RLock:
        """The lock guarding ``conn``: the session's send lock once attached."""
        session = self.session
        return session.send_lock if session is not None else self.own_lock

    @property
    def peer_name(self) -> str:
        return str(self.peer_id) if self.peer_id is not None else str(self.address)


# What the loop tells its engine, as data (:attr:`LoopSignals.notices`): each a
# ``(kind, link, text)`` the engine drains at the start of its next service(), never a call.
LINK_CLOSED = 1  # the link's channel is gone (link; text unused)
# A link's read left its session with messages queued and unscheduled, or a newly attached
# link was served: the engine lets user threads write on it (direct_ok) and pumps it (link).
LINK_SERVED = 2
CONNECT_STARTED = 3  # client: an attempt to reach the server began (no link)
CONNECT_FAILED = 4  # client: an attempt failed, the loop retries (no link; text: why)
Notice = tuple[int, "Link | None", str]


class LoopSignals:
    """What the layers above the loop tell it, and what it tells them, as plain data.

    The engine and the receive side write the flags; the loop reads them on every turn and
    calls nothing on them. The loop appends to ``notices`` what the engine must hear (a link
    closed or was served, a connection attempt began or failed); the engine drains them once
    per turn, in the service() the loop runs whenever they are not empty (and before a
    handshake frame, so that a peer's old link is heard of as closed first). One object, made
    by the communicator and handed to its inboxes and its engine (which hands it to the loop).
    """

    __slots__ = ("attention", "service_due", "closing", "stopping", "said_goodbye",
                 "wants_connection", "notices", "consumer_waiting", "sleepers", "ready",
                 "held_acks", "release_acks")

    def __init__(self, wants_connection: bool = False) -> None:
        # Sessions user threads queued work for (engine.schedule): non-empty means the loop's
        # turn must not wait.
        self.attention: collections.deque[PeerSession] = collections.deque()
        # Monotonic time before which a turn with nothing in attention and notices before
        # close() need not call service() (0.0: call it now).
        self.service_due = 0.0
        self.closing = False  # close() began: refuse newcomers, flush, then stop
        self.stopping = False  # the goodbyes are under way; the loop ends after them
        self.said_goodbye = False  # stopping: nothing is left to wait for but the links
        # Client: should the loop (re)connect now? Kept current by the engine whenever what
        # it depends on may have changed (a link closed, a control frame, closing).
        self.wants_connection = wants_connection
        self.notices: collections.deque[Notice] = collections.deque()
        # The receive side's (netq.inbox): a get() is blocked (a reply is likely to follow
        # what arrives); get() calls asleep on a gate (they do not lead the loop); the peers
        # with messages to take. Asleep with nothing to take: the loop must not be left to
        # callers.
        self.consumer_waiting = False
        self.sleepers = 0
        self.ready: collections.deque[PeerSession] = collections.deque()
        # The loop's (netq.link_driver): the links whose ACKs wait for the reply a waiting
        # get() may be about to send. A get() that goes back to sleep without a put() sends no
        # such reply: it sets release_acks (and wakes the loop), and the loop's next turn
        # writes them rather than letting them wait out their hold.
        self.held_acks: set[Link] = set()
        self.release_acks = False


class EngineAPI(Protocol):
    """What the loop may call on its engine (and nothing else): what it reads is data
    (:attr:`signals`), what it tells the engine is data too (:attr:`LoopSignals.notices`)."""

    signals: LoopSignals

    def new_connection(self, passes_fds: bool = False) -> Connection:
        """The protocol state for a new link (its HELLO is queued); ``passes_fds``: its
        carrier passes descriptors (the link may take parts in shared memory)."""

    def handle_events(self, link: Link, events: list[Event]) -> None:
        """What the link's Connection produced from received bytes (link lock held)."""

    def service(self, now: float) -> float:
        """Drain the notices, pump, grant credit, run the timers and, stopping, the goodbyes
        (:attr:`LoopSignals.said_goodbye`); returns seconds until it wants to run again."""

    def ended(self, error: BaseException | None) -> None:
        """The I/O thread has ended (``error``: what it died of), its links dropped."""


class LoopAPI(Protocol):
    """What the engine may call on its loop (and nothing else): :class:`netq.loop.IOLoop`, or
    the in-memory stand-in of the engine tests."""

    direct_writes: bool  # a user thread may write on an idle link itself
    caller_leads: bool  # a blocked get() may run the loop itself (lead())
    # Client: a connected link's handshake is waited for however long the server takes; the
    # carrier fails the link once the server's host stops answering (CarrierInfo).
    watches_peer_host: bool
    # When the loop's latest look for I/O began (monotonic): every byte that had arrived by
    # then has been read. A link's silence is measured up to it, so that a stall of this
    # process (no CPU for a while: a storm of other threads, a suspended laptop) is not taken
    # for its peers' silence before the loop has looked again.
    looked_at: float

    @property
    def shm(self) -> ShmCounters:
        """Shared-memory totals of the links (for statistics; netq._shm)."""

    @property
    def address(self) -> Address:
        """Where a server listens (the forms: :data:`Address`)."""

    def start(self) -> None:
        """Start the I/O thread (never blocks on the network)."""

    def wake(self) -> None:
        """Any thread: make the I/O loop call ``engine.service`` soon."""

    def unpark(self) -> None:
        """Any thread: a parked I/O thread takes the loop back (a get() went to sleep)."""

    def lead(self, timeout: float | None, ready: Callable[[], object]) -> bool:
        """A blocked get() runs the loop on its own thread, if this transport allows it."""

    def write_now(self, link: Link) -> None:
        """Write the link's queued output as far as possible (link lock held)."""

    def close_link(self, link: Link, flush: bool) -> None:
        """Drop a link, after flushing its output when ``flush`` is true."""

    def links(self) -> Sequence[Link]:
        """The live links (I/O thread; a transport may keep its own subclass of Link)."""

    def authorize(self, link: Link, peer_id: uuid.UUID) -> bool:
        """May ``peer_id`` (from the peer's HELLO) use this link? (I/O thread)"""

    def connect_target(self) -> str:
        """Client: where connection attempts go, in this transport's terms."""

    def connect_state(self) -> str | None:
        """Client: what stands between us and the server now, if the transport knows more."""

    def abort(self) -> None:
        """Stop at once."""

    def join(self) -> None:
        """Wait for the I/O thread to end."""


LoopFactory = Callable[[EngineAPI, CommunicatorOptions, Purpose], LoopAPI]
"""What builds an engine's loop, called with the engine and its options and purpose
(:func:`netq.loop.carrier_loop` makes one from a carrier class)."""
