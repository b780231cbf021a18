"""One link's way between its carrier and the engine: read, write, hold, end. Engine side.

:class:`LinkDriver` holds the links of one :class:`netq.loop.IOLoop` (by channel) and does to
each what the loop's events call for::

    READABLE    carrier.read_into(channel, Connection.read_buffer or receive_buffer()) (or
                the channel's own reader, a plain socket's recv_into)
                -> Connection.receive_done (which queues the ACK) -> engine.handle_events
                (-> the inbox)
    DATA        Connection.receive_data(packet) -> engine.handle_events
    WRITABLE    Connection.write_to(link.writer)  (outgoing() and sent() in one; the writer is
                the channel's own where it has one, else carrier.write bound to the channel)
    CLOSED      Connection.receive_eof -> engine.handle_events, then the link is dropped

and the same writes for the engine (``write_now``: its pumping, a user's direct write), the
delayed ACKs (a lone ACK waits briefly for the reply that will carry it), and closing links
(``close_link``: flush, then drop). When it runs and on which thread is the loop's business:
the loop tells it whether the current thread leads the loop (``leading``), how to wake the
loop (``wake``), and hears of every dropped link (``dropped``).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from functools import partial

from ._shm import ShmCounters
from .carrier import READABLE, WRITABLE, Carrier, CarrierInfo, Opened
from .contract import LINK_CLOSED, LINK_SERVED, EngineAPI, Link
from .exceptions import AuthenticationError, ConnectionLost, NetqError, RemoteProtocolError
from .options import Purpose
from .protocol import ConnectionState, Event

__all__ = ("LinkDriver", "CLOSE_FLUSH_LIMIT", "READS_PER_EVENT", "LEAD_BELOW")

LOGGER = logging.getLogger("netq")

CLOSE_FLUSH_LIMIT = 1.0  # seconds a closing link may take to flush its last frames
READS_PER_EVENT = 32  # read_into calls per readable event before serving other links
LEAD_BELOW = 256 * 1024  # bytes handed to a waiting get() below which callers may lead the loop
# After n holds in a row that no reply carried, the next min(2 ** n, this) chances to hold an
# ACK on that link are skipped (its ACKs go at once): a consumer that goes on with other work
# after get() does not make every sender wait out a hold, and then the GIL, for each ACK.
HOLD_SKIP_LIMIT = 64
_CLOSED = ConnectionState.CLOSED


class LinkDriver:
    """The links of one loop, and what happens to each of them."""

    def __init__(self, engine: EngineAPI, purpose: Purpose, carrier: Carrier[object], *,
                 leading: Callable[[], bool], wake: Callable[[], None],
                 dropped: Callable[[Link], None]) -> None:
        self.engine = engine
        self._purpose = purpose.value
        # Read only: consumer_waiting; and what the engine must hear goes to notices.
        self._signals = engine.signals
        self._notices = engine.signals.notices
        self.carrier = carrier
        self.info: CarrierInfo = carrier.info
        self._leading = leading
        self._wake = wake
        self._dropped = dropped
        self.by_channel: dict[object, Link] = {}  # channel -> its link
        self._bound: dict[Link, str] = {}  # links whose channel is bound to one peer id
        self.closing: set[Link] = set()  # links flushing their last frames (close_link)
        # Links whose ACK frames wait for a reply (ack_hold); the receive side reads it.
        self.held: set[Link] = self._signals.held_acks
        # No held ACK is due before this (time.monotonic()); it may be earlier than the first
        # one due now (a held link written since): the loop compares it on every turn, and
        # calls release_holds() only once it is reached.
        self.hold_due = 0.0
        # Links owing a deferred ACK (info.ack_defer), when each is due (time.monotonic()),
        # and the first of those times (infinity: none owed).
        self.owing: dict[Link, float] = {}
        self.owed_due = math.inf
        self.handed_off = False  # a read handed small messages to a get() waiting for them
        self.changed = False  # links closed or began closing: the loop's due times change
        self.refused = 0  # links refused: their HELLO named another peer than they are bound to
        self.shm = ShmCounters()  # shared-memory totals of every link (netq._shm)
        # Write a link's queued output now (link lock held); where each write is a broker
        # round of its own, output of nothing but ACK/CREDIT frames may wait for company.
        self.write_now: Callable[[Link], None] = \
            self._write_after_hold if self.info.ack_hold_always else self._write

    def links(self) -> list[Link]:
        return [link for link in self.by_channel.values() if not link.dropped]

    def authorize(self, link: Link, peer_id: uuid.UUID) -> bool:
        """May ``peer_id`` (from the peer's HELLO) use this link? Not where the carrier bound
        the channel to another peer (MQTT: the client id of the topics it came on)."""
        bound = self._bound.get(link)
        if bound is None or bound == str(peer_id):
            return True
        self.refused += 1
        LOGGER.warning("netq %s: refused a link bound to peer %s whose HELLO claims id %s",
                       self._purpose, bound, peer_id)
        return False

    def open(self, channel: object, opened: Opened) -> None:
        """A new channel the loop accepted: its link, and its HELLO on the way."""
        link = Link(self.engine.new_connection(self.info.passes_fds), opened.address, channel)
        link.conn.shm_counters = self.shm
        link.conn.defers_acks = self.info.ack_defer > 0
        if not link.conn.local.shm:  # descriptors come through the carrier's read_into only
            link.reader = opened.read_into
        link.writer = opened.write or partial(self.carrier.write, channel)
        self.by_channel[channel] = link
        if opened.bound_to is not None:
            self._bound[link] = opened.bound_to
        with link.lock:
            self.write_now(link)

    def serve_io(self, link: Link, mask: int) -> None:
        """A link's channel is readable and/or writable: read until drained (or its share of
        this turn is read), then write or hold what the reads queued.

        One method on purpose: every small message a link reads passes through here, and
        each helper split out of it would be a Python call per read.
        """
        if link.dropped:
            return
        engine = self.engine
        # Looked at before reading: the message read now is what a blocked get() waited for.
        consumer_waiting = self._signals.consumer_waiting
        session = link.session
        conn = link.conn
        with session.send_lock if session is not None else link.own_lock:  # link.lock
            if mask & WRITABLE:
                self._write(link)
            if mask & READABLE and not link.dropped:
                counted = session if consumer_waiting else None
                if counted is not None:
                    messages, size = counted.received_messages, counted.received_bytes
                read_into = self.carrier.read_into
                reader = link.reader
                channel = link.channel
                # None unless the link takes parts in shared memory (our HELLO said so).
                fds = conn.received_fds
                read_at = 0.0
                for _ in range(READS_PER_EVENT):
                    buffer = conn.read_buffer or conn.receive_buffer()
                    try:
                        if reader is not None:
                            count = reader(buffer)
                        elif fds is None:
                            count = read_into(channel, buffer)
                        else:
                            count = read_into(channel, buffer, fds)
                    except (BlockingIOError, InterruptedError):
                        break
                    except (OSError, NetqError) as error:
                        self._read_failed(link, error)
                        break
                    if count == 0:
                        self.end_of_stream(link)
                        break
                    link.last_received_at = read_at = time.monotonic()
                    events = conn.receive_done(count)
                    if events:
                        engine.handle_events(link, events)
                    if link.dropped:
                        break
                    if conn.state is _CLOSED:
                        self._peer_ended(link)
                        break
                    if count < len(buffer):
                        # Drained. (A large direct read keeps going: more of the body is
                        # usually on its way, and another read is cheaper than a round
                        # through wait().)
                        break
                if counted is not None and counted.received_messages > messages:
                    if counted.received_bytes - size < LEAD_BELOW:
                        # Small messages handed to a waiting get(): it may lead the loop from
                        # now on. Large ones keep the I/O thread reading the next while the
                        # caller takes this one (reading and consuming overlap).
                        self.handed_off = True
                    else:
                        # Nor do their ACKs wait for a reply: one more small write is
                        # nothing beside a large message, and a sender waiting for its
                        # future should not wait for the consumer too.
                        consumer_waiting = False
            if not link.dropped and conn.bytes_queued:
                # _write_or_hold and _hold, inline (see there); conn.output_is_only_acks()
                # too: the queued bytes end with a run of ACK frames that covers all of them.
                if consumer_waiting and link.direct_ok and self.info.ack_hold \
                        and conn.acks_end == conn.sent_total + conn.bytes_queued \
                        and conn.sent_total >= conn.acks_start:
                    if link.ack_hold_skip:
                        link.ack_hold_skip -= 1  # recent holds carried no reply: not this one
                        self.write_now(link)
                    elif not link.ack_hold_until:
                        until = link.ack_hold_until = (
                            read_at or time.monotonic()) + self.info.ack_hold
                        if not self.held or until < self.hold_due:
                            self.hold_due = until
                        self.held.add(link)
                else:
                    self.write_now(link)
        session = link.session
        if not link.direct_ok and session is not None or (
                session is not None and session.outbox and not session.scheduled):
            self._notices.append((LINK_SERVED, link, ""))  # the engine may pump it

    def _read_failed(self, link: Link, error: OSError | NetqError) -> None:
        """Reading the link's channel failed: the link ends, saying why."""
        if isinstance(error, RemoteProtocolError):  # the peer's bytes (descriptors)
            LOGGER.info("netq %s: link to %s failed: %s", self._purpose,
                        link.peer_name, error)
        if link.error is None:
            link.error = self.blamed(link, error) if isinstance(error, NetqError) \
                else ConnectionLost(link.peer_id, f"receive failed: {error}")
        self.drop(link)

    def _peer_ended(self, link: Link) -> None:
        """The peer closed the link (its ERROR frame, or ours after its bad bytes): flush our
        last output, then close it."""
        if link.error is None:
            link.error = RemoteProtocolError("the peer ended the link")
        self.close_link(link, flush=True)

    def data(self, link: Link, data: object) -> None:
        """A packet of the link's byte stream (packet carriers)."""
        link.last_received_at = time.monotonic()
        consumer_waiting = self._signals.consumer_waiting
        counted = link.session if consumer_waiting else None
        if counted is not None:
            messages, size = counted.received_messages, counted.received_bytes
        with link.lock:
            conn = link.conn
            if not self._received(link, conn.receive_data(data)):  # type: ignore[arg-type]
                return
            if conn.defers_acks and link not in self.owing and conn.ack_owed:
                due = self.owing[link] = time.monotonic() + self.info.ack_defer
                self.owed_due = min(self.owed_due, due)
            if counted is not None and counted.received_messages > messages \
                    and counted.received_bytes - size < LEAD_BELOW:
                self.handed_off = True  # as in serve_io(): a waiting get() may lead from now on
            if conn.bytes_queued:
                self._write_or_hold(link, consumer_waiting)
        session = link.session
        if not link.direct_ok and session is not None or (
                session is not None and session.outbox and not session.scheduled):
            self._notices.append((LINK_SERVED, link, ""))  # the engine may pump it

    def _received(self, link: Link, events: list[Event]) -> bool:
        """Hand the events of bytes just received to the engine (link lock held).

        False when the link ended meanwhile: dropped, or closed by the peer (then its last
        output is flushed and it is closed).
        """
        if events:
            self.engine.handle_events(link, events)
        if link.dropped:
            return False
        if link.conn.state is _CLOSED:
            self._peer_ended(link)
            return False
        return True

    @staticmethod
    def blamed(link: Link, error: BaseException) -> BaseException:
        """A carrier's error about a link, naming the link's peer (carriers know channels,
        not the peers the handshake named)."""
        if isinstance(error, ConnectionLost) and error.peer is None and link.peer_id is not None:
            return ConnectionLost(link.peer_id, error.reason)
        return error

    def end_of_stream(self, link: Link) -> None:
        """The peer's end of the stream: what it completes goes to the engine, then the link
        is dropped."""
        with link.lock:
            events = link.conn.receive_eof()
            if events:
                self.engine.handle_events(link, events)
        self.drop(link)

    # ----------------------------------------------------------------- writing

    def _write_or_hold(self, link: Link, consumer_waiting: bool) -> None:
        """After a read queued output: write it, unless it is only ACK frames that a reply
        is about to carry (link lock held).

        Delayed acknowledgement: someone was blocked in get() for the message they
        acknowledge and usually replies at once; the reply's write then carries them (one
        write and one read fewer each way, and the peer's next read finds the reply instead
        of a lone ACK). Never longer than ``info.ack_hold``, and only while nothing but ACK
        frames is queued: a CREDIT frame may be what a sender waits for, so it goes at once.
        """
        if consumer_waiting and link.direct_ok and self.info.ack_hold \
                and link.conn.output_is_only_acks():
            if link.ack_hold_skip:
                link.ack_hold_skip -= 1  # recent holds carried no reply (release_holds)
                self.write_now(link)
            else:
                self._hold(link)
        else:
            self.write_now(link)

    def _hold(self, link: Link) -> None:
        if not link.ack_hold_until:
            until = link.ack_hold_until = time.monotonic() + self.info.ack_hold
            if not self.held or until < self.hold_due:
                self.hold_due = until
            self.held.add(link)

    def release_holds(self, every: bool = False) -> float:
        """Write the held ACKs that are due (``every``: all of them; I/O thread); seconds
        until the next is due (:attr:`hold_due` then says when)."""
        now = time.monotonic()
        wait = self.info.ack_hold
        credit = self.info.ack_hold_always
        if every:
            self._signals.release_acks = False  # asked for or not, none is held after this
        for link in list(self.held):
            due = link.ack_hold_until - now
            only_acks = not link.dropped and link.conn.output_is_only_acks(credit=credit)
            if due > 0 and not every and only_acks:
                wait = min(wait, due)
                continue
            self.held.discard(link)
            link.ack_hold_until = 0.0
            if not link.dropped and link.conn.bytes_queued:
                if only_acks and not credit:
                    # No reply came to carry them: back off (HOLD_SKIP_LIMIT). The hold's own
                    # time is the least of it: by now the consumer's thread may hold the GIL,
                    # and this write waits for it (up to sys.getswitchinterval()).
                    misses = link.ack_hold_misses = link.ack_hold_misses + 1
                    link.ack_hold_skip = min(1 << min(misses, 16), HOLD_SKIP_LIMIT)
                session = link.session
                with session.send_lock if session is not None else link.own_lock:  # link.lock
                    self._write(link)
        self.hold_due = now + wait
        return wait

    def flush_owed(self) -> None:
        """Write the deferred ACKs that are due (the message they waited for did not come in
        time), and forget those an ACK queued since covers."""
        now = time.monotonic()
        for link, due in list(self.owing.items()):
            owed = not link.dropped and link.conn.ack_owed
            if owed and due > now:
                continue
            del self.owing[link]
            if owed:
                session = link.session
                with session.send_lock if session is not None else link.own_lock:  # link.lock
                    link.conn.flush_owed_ack()
                    self._write(link)
        self.owed_due = min(self.owing.values(), default=math.inf)

    def _write_after_hold(self, link: Link) -> None:
        """``write_now`` where ``info.ack_hold_always``: write the link's queued output as far
        as the carrier takes it (link lock held).

        Where each write is a broker round of its own (``info.ack_hold_always``), output of
        nothing but ACK/CREDIT frames first waits up to ``info.ack_hold`` for company.
        """
        if self.info.ack_hold_always and not link.closing \
                and link.conn.output_is_only_acks(credit=True):
            if not link.ack_hold_until:
                self._hold(link)
                if not self._leading():
                    self._wake()  # the loop's wait must end by the new deadline
                return
            if time.monotonic() < link.ack_hold_until:
                return
        self._write(link)

    def _write(self, link: Link) -> None:
        if link.dropped:
            return
        conn = link.conn
        if not conn.bytes_queued:
            blocked = False
        elif conn.has_fds:  # descriptors to send (our HELLO said SHM)
            written = self._write_with_fds(link)
            if written is None:
                return
            blocked = written
        else:
            try:
                blocked = conn.write_to(link.writer)  # type: ignore[arg-type]  # set by open()
            except (BlockingIOError, InterruptedError):
                # The channel's own writer found no room (write_to leaves what was not
                # written queued): once more through the carrier's write, which arranges
                # the WRITABLE event that says when there is.
                written = self._write_via_carrier(link)
                if written is None:
                    return
                blocked = written
            except (OSError, NetqError) as error:
                self._write_failed(link, error)
                return
        if link.ack_hold_until and not blocked:
            link.ack_hold_until = 0.0  # the held ACKs left with this write: the hold paid
            link.ack_hold_misses = 0
            self.held.discard(link)
        link.write_blocked = blocked

    def _write_with_fds(self, link: Link) -> bool | None:
        """_write where descriptors go with the output; True while output remains, None when
        the write failed (the link ends). Only descriptors queued before it began can be
        due during it (the link lock is held)."""
        conn = link.conn
        channel = link.channel
        write = self.carrier.write
        blocked = True
        while blocked:
            try:
                if conn.has_fds:
                    buffers, fds = conn.outgoing_fds()
                    sent = write(channel, buffers, fds)
                    if sent:
                        conn.fds_written()
                else:
                    sent = write(channel, conn.outgoing())
            except (BlockingIOError, InterruptedError):
                break
            except (OSError, NetqError) as error:
                self._write_failed(link, error)
                return None
            if not sent:
                break
            blocked = conn.sent(sent)
        return blocked

    def _write_via_carrier(self, link: Link) -> bool | None:
        """Write the link's output with the carrier's write: True while output remains,
        None when the link failed (it is dropped)."""
        try:
            return link.conn.write_to(partial(self.carrier.write, link.channel))
        except (BlockingIOError, InterruptedError):
            return True
        except (OSError, NetqError) as error:
            self._write_failed(link, error)
            return None

    def _write_failed(self, link: Link, error: OSError | NetqError) -> None:
        if link.error is None:
            link.error = error if isinstance(error, AuthenticationError) else \
                ConnectionLost(link.peer_id, f"send failed: {error}")
        link.write_blocked = True
        if self._leading():
            self.drop(link)

    # ----------------------------------------------------------------- ending links

    def close_link(self, link: Link, flush: bool) -> None:
        if link.dropped:
            return
        if flush and link.conn.has_output:
            if not link.closing:
                link.closing = True
                link.close_deadline = time.monotonic() + CLOSE_FLUSH_LIMIT
                self.closing.add(link)
                self.changed = True
            with link.lock:
                self._write(link)
            if not link.conn.has_output and self._leading():
                self.drop(link)
            return
        if self._leading():
            self.drop(link)
        else:
            link.closing = True
            link.close_deadline = 0.0
            self.closing.add(link)
            self.changed = True
            self._wake()

    def drop(self, link: Link) -> None:
        if link.dropped:
            return
        link.dropped = True
        if LOGGER.isEnabledFor(logging.DEBUG):
            LOGGER.debug("netq: link to %s dropped: %r", link.address, link.error)
        self.changed = True  # the engine's timers change: the next look runs a turn
        self.by_channel.pop(link.channel, None)
        self._bound.pop(link, None)
        self.closing.discard(link)
        self.held.discard(link)
        self.carrier.close(link.channel)
        with link.lock:
            link.conn.close_descriptors()
        self._notices.append((LINK_CLOSED, link, ""))  # the engine drains it on its next turn
        self._dropped(link)
