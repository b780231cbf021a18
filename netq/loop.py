"""The one loop: readiness, reading and writing links, reconnects, closing. Engine side.

Each communicator has one :class:`IOLoop`. It owns the I/O thread, the links and every
decision about them; its carrier (:mod:`netq.carrier`: sockets, MQTT, gRPC) only moves bytes
and reports what happened. Each turn::

    engine.service()        pump queued messages, grant credit, heartbeats, timers
    carrier.wait(timeout)   until something happens, a wake-up, or the next timer
    for each event          read (read_into -> Connection.receive_done -> engine.handle_events
                            -> inbox), write (Connection.outgoing -> carrier.write), open or
                            drop a link, count a failed attempt
    reconnect when due, give up an attempt that takes too long, drop flushed closing links

The engine calls the loop through :class:`netq.contract.TransportAPI` (``write_now``,
``close_link``, ``lead``, ``wake``...); the loop calls the engine through
:class:`netq.contract.EngineAPI` and the carrier through :class:`netq.carrier.Carrier`.

Leader/followers: where the carrier lets any thread wait (``info.any_thread_waits``: the socket
carriers), a ``get()`` that would block may run the loop on its own thread (:meth:`lead`)
while the I/O thread is parked, so that a round trip wakes one thread per side, not two.
Whoever holds ``_lead`` runs the loop; "on the I/O thread" means "leading it".
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable

from ._interrupts import LoopTurns
from .carrier import (
    CLOSED,
    DATA,
    FAILED,
    OPENED,
    READABLE,
    WRITABLE,
    Address,
    Carrier,
    CarrierFactory,
    Opened,
)
from .contract import EngineAPI, Link, TransportAPI
from .exceptions import AuthenticationError, ConnectionLost, NetqError, RemoteProtocolError
from .options import Purpose
from .protocol import ConnectionState, Event

__all__ = ("IOLoop", "CLOSE_FLUSH_LIMIT", "carrier_loop")

CLOSE_FLUSH_LIMIT = 1.0  # seconds a closing link may take to flush its last frames
PARK_LIMIT = 0.001  # seconds the parked I/O thread leaves the loop to callers between checks
PARK_MAX = 0.004  # ... growing to this while every look finds callers leading and nothing due
LEAD_SLICE = 0.05  # seconds of a caller-led wait for I/O between looks at its own state
READS_PER_EVENT = 32  # read_into calls per readable event before serving other links
LEAD_BELOW = 256 * 1024  # bytes handed to a waiting get() below which callers may lead the loop


def carrier_loop(carrier_class: CarrierFactory) -> Callable[[EngineAPI], TransportAPI]:
    """What the engine builds its loop with: an :class:`IOLoop` over ``carrier_class``."""

    def build(engine: EngineAPI) -> TransportAPI:
        return IOLoop(engine, carrier_class)

    return build


class IOLoop:
    """The I/O thread of one communicator, its links, and the carrier it drives."""

    def __init__(self, engine: EngineAPI, carrier_class: CarrierFactory) -> None:
        self.engine = engine
        self._options = engine.options
        self._server = engine.purpose is Purpose.SERVER
        # A server's carrier binds here: a taken port raises from netq.new().
        self.carrier: Carrier[object] = carrier_class(engine.options, engine.purpose)
        info = self.carrier.info
        self.info = info
        self.direct_writes = info.user_threads_write
        self.caller_leads = info.any_thread_waits
        self._links: dict[object, Link] = {}  # channel -> its link
        self._bound: dict[Link, str] = {}  # links whose channel is bound to one peer id
        self._closing_links: set[Link] = set()  # links flushing their last frames (close_link)
        self._held: set[Link] = set()  # links whose ACK frames wait for a reply (ack_hold)
        self._aborted = False
        self._idle = False  # the loop is (about to be) waiting: wake() must reach the carrier
        self._reconnect_at: float | None = None
        self._backoff = self._options.connection.reconnect_min
        self._attempt_since: float | None = None  # client: an attempt is under way since then
        self._io_ident: int | None = None
        # Leader/followers (caller_leads): whoever holds _lead runs the loop; the I/O thread
        # parks on _park while callers' get() lead it (see lead()).
        self._lead = threading.Lock()
        self._park = threading.Condition(threading.Lock())
        self._parked = False
        self._handed_off = False  # this turn read data while a get() was waiting for it
        self._caller_rounds = 0  # times a caller led the loop
        # When the loop must next turn even without I/O (timers, reconnect, closing links),
        # as the latest turn computed it: a parked I/O thread looks at it, not at the loop.
        self._due_at = 0.0
        self._leader_ident: int | None = None
        self._turns = LoopTurns()  # a caller's turns on the main thread defer Ctrl-C (see lead)
        self._thread = threading.Thread(
            target=self._run,
            name=f"netq-io-{engine.purpose.value}-{str(engine.id)[:8]}", daemon=True)

    # ----------------------------------------------------------------- what the engine calls

    @property
    def address(self) -> Address:
        return self.info.address

    def connect_target(self) -> str:
        return self.info.target

    def connect_state(self) -> str | None:
        return self.carrier.explain()

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        if self._thread.ident is not None and threading.get_ident() != self._thread.ident:
            self._thread.join()

    def abort(self) -> None:
        self._aborted = True
        self._idle = True
        self.wake()

    def wake(self) -> None:
        if self._parked:
            self.unpark()
        if self._idle:
            self.carrier.wake()

    def unpark(self) -> None:
        """Any thread: a parked I/O thread takes the loop back now (a get() went to sleep)."""
        if self._parked:
            with self._park:
                self._park.notify()

    def links(self) -> list[Link]:
        return [link for link in self._links.values() if not link.dropped]

    def authorize(self, link: Link, peer_id: uuid.UUID) -> bool:
        bound = self._bound.get(link)
        return bound is None or bound == str(peer_id)

    @property
    def caller_led_turns(self) -> int:
        """How many times a blocked get() ran the loop on its own thread (leader/followers)."""
        return self._caller_rounds

    @property
    def on_io_thread(self) -> bool:
        """True on the thread that leads the loop now (the I/O thread, or a caller's get())."""
        return threading.get_ident() == self._leader_ident

    # ----------------------------------------------------------------- the loop

    def _run(self) -> None:
        engine = self.engine
        self._io_ident = self._leader_ident = threading.get_ident()
        try:
            if not self._server:
                self._connect()
            while not self._aborted:
                with self._lead:
                    self._leader_ident = self._io_ident
                    self._handed_off = False
                    if self._step(None):
                        break
                    park = self._handed_off and self.caller_leads
                if park:
                    self._park_for_callers()
        except BaseException as error:  # noqa: BLE001 - must reach futures and get()
            engine.failed(error)
        finally:
            with self._lead:  # a caller leading the loop ends its turn first (it sees _aborted)
                self._shutdown()
            engine.finished()

    def _step(self, cap: float | None) -> bool:
        """One turn of the loop (whoever leads it); True when a closing loop may end.

        ``cap``: wait at most this long for I/O (a caller leading the loop, see :meth:`lead`).
        """
        engine = self.engine
        now = time.monotonic()
        if engine.closing and self._server:
            self.carrier.admit(False)  # close() refuses newcomers from its first moment
        timeout = engine.service(now)
        if engine.stopping:
            if self._stop_step():
                return True
            timeout = min(timeout, engine.goodbye_wait(now, bool(self._links)))
        if self._reconnect_at is not None:
            timeout = min(timeout, max(0.0, self._reconnect_at - now))
        if self._closing_links:
            for link in list(self._closing_links):
                timeout = min(timeout, max(0.0, link.close_deadline - now))
        if self._attempt_since is not None and self.info.attempt_limit is not None:
            timeout = min(timeout, max(0.0, self._attempt_since + self.info.attempt_limit - now))
        self._due_at = now + timeout
        if cap is not None:
            timeout = min(timeout, cap)
        # Set before looking at the engine's queue: a user thread that queues work after the
        # look sees _idle and signals the wait (no lost wake-up).
        self._idle = True
        if engine.has_work:
            timeout = 0
        self._wait(timeout)
        self._idle = False
        now = time.monotonic()
        if self._reconnect_at is not None and now >= self._reconnect_at:
            self._reconnect_at = None
            self._connect()
        self._check_attempt(now)
        if self._closing_links:
            for link in list(self._closing_links):
                if not link.conn.has_output or now >= link.close_deadline:
                    self._drop(link)
        return False

    def _wait(self, timeout: float) -> None:
        """Wait for the carrier's events (at most ``timeout`` s) and act on each."""
        if self._held:
            timeout = min(timeout, self._release_holds())
        turns = self._turns
        if turns.active:  # the main thread leads: a Ctrl-C may interrupt the wait at once
            turns.waiting()
            try:
                events = self.carrier.wait(timeout)
            finally:
                turns.working()
        else:
            events = self.carrier.wait(timeout)
        links = self._links
        for kind, channel, value in events:
            if kind <= 3:  # READABLE and/or WRITABLE
                link = links.get(channel)
                if link is not None:
                    self._service(link, kind)
            elif kind is DATA:
                link = links.get(channel)
                if link is not None and not link.dropped:
                    self._data(link, value)
            elif kind is OPENED:
                assert isinstance(value, Opened)
                self._open(channel, value)
            elif kind is CLOSED:
                link = links.get(channel)
                if link is not None and not link.dropped:
                    if isinstance(value, BaseException) and link.error is None:
                        link.error = self._blamed(link, value)
                    self._end_of_stream(link)
            elif kind is FAILED:
                self._attempt_failed(str(value) if value is not None else "the attempt failed")

    # ----------------------------------------------------------------- callers lead the loop

    def _park_for_callers(self) -> None:
        """Leave the loop to the next blocked get() (leader/followers), checking back often.

        The I/O thread just handed a message to a get() that was waiting for it. That caller
        will likely wait again soon; if the loop is free then, it runs the loop itself
        (:meth:`lead`) and wakes up once, on its own socket, instead of the I/O thread waking
        and then waking it. The I/O thread stays parked while callers keep leading; it takes
        the loop back as soon as there is work (``wake()``) or when a look finds that no
        caller led since the last one. Looks come every ``PARK_LIMIT``; while each finds
        callers leading and nothing due, the gap doubles up to ``PARK_MAX`` (a steady stream
        of round trips then costs the I/O thread a wake-up every few milliseconds, not every
        one). Timers, heartbeats and held ACKs that no caller's turn took care of are never
        later than that gap.
        """
        engine = self.engine
        park = self._park
        gap = PARK_LIMIT
        while not self._aborted:
            rounds = self._caller_rounds
            with park:
                self._parked = True
                try:
                    # A get() asleep on its condition does not lead: someone must poll.
                    if engine.has_work or engine.closing or engine.consumer_sleeping:
                        return
                    park.wait(gap)
                finally:
                    self._parked = False
            if engine.has_work or engine.closing or engine.consumer_sleeping \
                    or self._caller_rounds == rounds:
                return  # work to do, a get() asleep, or no caller led meanwhile: lead again
            if not self._overdue(time.monotonic()):
                # Callers lead and nothing is late: a turn of ours now would only contend
                # with theirs for the loop (their get() would then wait for a hand-over).
                gap = min(2 * gap, PARK_MAX)
                continue
            gap = PARK_LIMIT
            if self._lead.acquire(False):
                # Callers lead between their messages: keep the timers and holds on time.
                try:
                    self._leader_ident = self._io_ident
                    self._step(0.0)
                finally:
                    self._lead.release()

    def _overdue(self, now: float) -> bool:
        """Is something due that no caller's turn has done: a timer, or a held ACK?"""
        if now >= self._due_at:
            return True
        for link in list(self._held):
            if link.ack_hold_until <= now:
                return True
        return False

    def lead(self, timeout: float | None, ready: Callable[[], object]) -> bool:
        """A blocked ``get()`` runs the loop on its own thread until ``ready()`` or timeout.

        False (nothing done) when this carrier does not allow it, or the I/O thread leads
        (it is waiting for I/O itself: the caller waits for its hand-over as before).
        """
        if not self._parked or not self._lead.acquire(False):  # positional: no keyword parsing
            return False
        engine = self.engine
        turns = self._turns
        try:
            # Not if the I/O thread took the loop back meanwhile, nor on the main thread under
            # a SIGINT handler of the program's own (netq._interrupts). From here on, Ctrl-C on
            # the main thread waits for the end of a turn.
            if not self._parked or not turns.begin():
                return False
            self._leader_ident = threading.get_ident()
            self._caller_rounds += 1
            deadline = None if timeout is None else time.monotonic() + timeout
            while not ready() and not self._aborted and not engine.closing:
                cap = LEAD_SLICE
                if deadline is not None:
                    cap = min(cap, deadline - time.monotonic())
                    if cap <= 0:
                        break
                self._step(cap)
                if turns.active and turns.pending:  # attribute reads: no call per turn
                    turns.end_of_turn()
        finally:
            if turns.active:
                turns.end()
            self._leader_ident = self._io_ident
            self._lead.release()
        return True

    # ----------------------------------------------------------------- closing

    def _stop_step(self) -> bool:
        """One step of closing; True when the loop may end."""
        if self._server:
            self.carrier.admit(False)
        elif self.engine.wants_connection():
            # A client finishing a goodbye a broken link interrupted: (re)connect as usual.
            if not self.links() and self._reconnect_at is None and self._attempt_since is None:
                self._schedule_reconnect()
        else:
            self._abandon_attempt()
            self._reconnect_at = None
        done = self.engine.goodbyes()
        return done and not self.links()

    def _shutdown(self) -> None:
        for link in list(self._links.values()):
            self._drop(link)
        if self._server:
            self.carrier.admit(False)
        else:
            self._abandon_attempt()
        self.carrier.close(None)

    # ----------------------------------------------------------------- client attempts

    def _connect(self) -> None:
        if self._attempt_since is not None or not self.engine.wants_connection():
            return
        if self.info.attempt_limit is not None:
            # An attempt the loop bounds stops the session clock while it lasts. A carrier
            # that bounds its own (a broker waiting for a server to announce itself) may wait
            # for ever: its time counts against session_timeout.
            self.engine.connect_started()
        self._attempt_since = time.monotonic()
        self.carrier.admit(True)

    def _abandon_attempt(self) -> None:
        if self._attempt_since is not None:
            self._attempt_since = None
            self.carrier.admit(False)

    def _attempt_failed(self, reason: str) -> None:
        self._attempt_since = None
        self.engine.connect_failed(str(self._options.netloc), reason)
        self._schedule_reconnect()

    def _check_attempt(self, now: float) -> None:
        limit = self.info.attempt_limit
        since = self._attempt_since
        if since is not None and limit is not None and now - since > limit:
            self._abandon_attempt()
            self._attempt_failed(f"timed out after {limit:.0f} s "
                                 f"(no answer: a firewall or an unreachable host?)")

    def _schedule_reconnect(self) -> None:
        if self._server or self._aborted or not self.engine.wants_connection():
            return
        # Jittered (half to all of the backoff): clients that lost their server together do
        # not come back in lockstep, each retry wave spread over half a backoff.
        self._reconnect_at = time.monotonic() + self._backoff * random.uniform(0.5, 1.0)
        self._due_at = 0.0
        self._backoff = min(self._backoff * 2, self._options.connection.reconnect_max)

    # ----------------------------------------------------------------- links

    def _open(self, channel: object, opened: Opened) -> None:
        engine = self.engine
        if not self._server:
            self._attempt_since = None
        refuse = engine.stopping or (self._server and engine.closing) or self._aborted
        if not refuse and not self._server:
            refuse = not engine.wants_connection()
        if refuse:
            self.carrier.close(channel)
            return
        link = Link(engine.new_connection(), opened.address, channel)
        self._links[channel] = link
        if opened.bound_to is not None:
            self._bound[link] = opened.bound_to
        with link.lock:
            self.write_now(link)  # the HELLO

    def _service(self, link: Link, mask: int) -> None:
        """A link's channel is readable and/or writable: read, then write or hold."""
        if link.dropped:
            return
        engine = self.engine
        # Looked at before reading: the message read now is what a blocked get() waited for.
        consumer_waiting = engine.consumer_waiting
        with link.lock:
            if mask & WRITABLE:
                self._write(link)
            if mask & READABLE and not link.dropped:
                session = link.session
                if consumer_waiting and session is not None:
                    messages, size = session.received_messages, session.received_bytes
                    self._read(link)
                    if session.received_messages > messages \
                            and session.received_bytes - size < LEAD_BELOW:
                        # Small messages handed to a waiting get(): it may lead the loop from
                        # now on. Large ones keep the I/O thread reading the next while the
                        # caller takes this one (reading and consuming overlap).
                        self._handed_off = True
                else:
                    self._read(link)
            if not link.dropped and link.conn.bytes_queued:
                self._write_or_hold(link, consumer_waiting)
        engine.after_io(link)

    def _read(self, link: Link) -> None:
        """Read a link until drained, or until its share of this turn is read."""
        conn = link.conn
        read_into = self.carrier.read_into
        channel = link.channel
        for _ in range(READS_PER_EVENT):
            buffer = conn.receive_buffer()
            try:
                count = read_into(channel, buffer)
            except (BlockingIOError, InterruptedError):
                return
            except (OSError, NetqError) as error:
                if link.error is None:
                    link.error = self._blamed(link, error) if isinstance(error, NetqError) \
                        else ConnectionLost(link.peer_id, f"receive failed: {error}")
                self._drop(link)
                return
            if count == 0:
                self._end_of_stream(link)
                return
            link.last_received_at = time.monotonic()
            if not self._received(link, conn.receive_done(count)):
                return
            if count < len(buffer):
                # Drained. (A large direct read keeps going: more of the body is usually on
                # its way, and another read is cheaper than a round through wait().)
                return

    def _data(self, link: Link, data: object) -> None:
        """A packet of the link's byte stream (packet carriers)."""
        link.last_received_at = time.monotonic()
        consumer_waiting = self.engine.consumer_waiting
        with link.lock:
            conn = link.conn
            if not self._received(link, conn.receive_data(data)):  # type: ignore[arg-type]
                return
            if conn.bytes_queued:
                self._write_or_hold(link, consumer_waiting)
        self.engine.after_io(link)

    def _received(self, link: Link, events: list[Event]) -> bool:
        """Hand the events of bytes just received to the engine (link lock held).

        False when the link ended meanwhile: dropped, or closed by the peer (then its last
        output is flushed and it is closed).
        """
        if events:
            self.engine.handle_events(link, events)
        if link.dropped:
            return False
        if link.conn.state is ConnectionState.CLOSED:
            if link.error is None:
                link.error = RemoteProtocolError("the peer ended the link")
            self.close_link(link, flush=True)
            return False
        return True

    @staticmethod
    def _blamed(link: Link, error: BaseException) -> BaseException:
        """A carrier's error about a link, naming the link's peer (carriers know channels,
        not the peers the handshake named)."""
        if isinstance(error, ConnectionLost) and error.peer is None and link.peer_id is not None:
            return ConnectionLost(link.peer_id, error.reason)
        return error

    def _end_of_stream(self, link: Link) -> None:
        """The peer's end of the stream: what it completes goes to the engine, then the link
        is dropped."""
        with link.lock:
            events = link.conn.receive_eof()
            if events:
                self.engine.handle_events(link, events)
        self._drop(link)

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
            self._hold(link)
        else:
            self.write_now(link)

    def _hold(self, link: Link) -> None:
        if not link.ack_hold_until:
            link.ack_hold_until = time.monotonic() + self.info.ack_hold
            self._held.add(link)

    def _release_holds(self) -> float:
        """Write the held ACKs that are due (I/O thread); seconds until the next is due."""
        now = time.monotonic()
        wait = self.info.ack_hold
        credit = self.info.ack_hold_always
        for link in list(self._held):
            due = link.ack_hold_until - now
            if due > 0 and not link.dropped and link.conn.output_is_only_acks(credit=credit):
                wait = min(wait, due)
                continue
            self._held.discard(link)
            link.ack_hold_until = 0.0
            if not link.dropped and link.conn.has_output:
                with link.lock:
                    self._write(link)
        return wait

    def write_now(self, link: Link) -> None:
        """Write the link's queued output as far as the carrier takes it (link lock held).

        Where each write is a broker round of its own (``info.ack_hold_always``), output of
        nothing but ACK/CREDIT frames first waits up to ``info.ack_hold`` for company.
        """
        if self.info.ack_hold_always and not link.closing \
                and link.conn.output_is_only_acks(credit=True):
            if not link.ack_hold_until:
                self._hold(link)
                if not self.on_io_thread:
                    self.wake()  # the loop's wait must end by the new deadline
                return
            if time.monotonic() < link.ack_hold_until:
                return
        self._write(link)

    def _write(self, link: Link) -> None:
        if link.dropped:
            return
        conn = link.conn
        channel = link.channel
        write = self.carrier.write
        blocked = conn.bytes_queued > 0
        while blocked:
            try:
                sent = write(channel, conn.outgoing())
            except (BlockingIOError, InterruptedError):
                break
            except (OSError, NetqError) as error:
                if link.error is None:
                    link.error = error if isinstance(error, AuthenticationError) else \
                        ConnectionLost(link.peer_id, f"send failed: {error}")
                link.write_blocked = True
                if self.on_io_thread:
                    self._drop(link)
                return
            if not sent:
                break
            blocked = conn.sent(sent)
        if link.ack_hold_until and not blocked:
            link.ack_hold_until = 0.0  # the held ACKs left with this write
            self._held.discard(link)
        link.write_blocked = blocked

    # ----------------------------------------------------------------- ending links

    def close_link(self, link: Link, flush: bool) -> None:
        if link.dropped:
            return
        if flush and link.conn.has_output:
            if not link.closing:
                link.closing = True
                link.close_deadline = time.monotonic() + CLOSE_FLUSH_LIMIT
                self._closing_links.add(link)
                self._due_at = 0.0
            with link.lock:
                self._write(link)
            if not link.conn.has_output and self.on_io_thread:
                self._drop(link)
            return
        if self.on_io_thread:
            self._drop(link)
        else:
            link.closing = True
            link.close_deadline = 0.0
            self._closing_links.add(link)
            self._due_at = 0.0
            self.wake()

    def _drop(self, link: Link) -> None:
        if link.dropped:
            return
        link.dropped = True
        self._due_at = 0.0  # the engine's timers change: the next look runs a turn
        self._links.pop(link.channel, None)
        self._bound.pop(link, None)
        self._closing_links.discard(link)
        self._held.discard(link)
        self.carrier.close(link.channel)
        with link.lock:
            self.engine.link_closed(link)
        if not self._server and not link.replaced:
            if link.session is not None:
                self._backoff = self._options.connection.reconnect_min
            self._schedule_reconnect()
