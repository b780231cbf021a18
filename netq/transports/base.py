"""What every transport shares: the link record and the I/O loop around the session engine.

A transport owns one I/O thread per communicator. The loop is the same for all of them:

    run the engine's periodic work (``engine.service``: pump queued messages, grant credit,
    heartbeats) -> wait for the transport's own events (``_wait``) -> reconnect when due ->
    drop closing links that are flushed or out of time

What differs is how a transport waits and moves bytes: a readiness loop over sockets
(:mod:`netq.transports.sockets`), or an inbox fed by a carrier library's threads
(:mod:`netq.transports.packets`, for MQTT and gRPC). Subclasses implement the hooks marked
"subclass" below. A transport calls its engine only through
:class:`netq.contract.EngineAPI`; the engine calls only what
:class:`netq.contract.TransportAPI` lists (``start, wake, unpark, lead, write_now,
close_link, links, authorize, connect_target, connect_state, abort, join, address,
direct_writes, caller_leads``).

Leader/followers: where ``caller_leads`` is set (the socket transports), a ``get()`` that
would block may run the loop on its own thread (:meth:`Transport.lead`) while the I/O thread
is parked, so that a round trip wakes one thread per side, not two. Whoever holds ``_lead``
runs the loop; "on the I/O thread" means "leading it".
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable

from .._interrupts import LoopTurns
from ..contract import Address, EngineAPI, Link
from ..exceptions import RemoteProtocolError
from ..options import Purpose
from ..protocol import ConnectionState, Event

__all__ = ("Link", "Transport", "CLOSE_FLUSH_LIMIT")

CLOSE_FLUSH_LIMIT = 1.0  # seconds a closing link may take to flush its last frames
PARK_LIMIT = 0.001  # seconds the parked I/O thread leaves the loop to callers between checks
PARK_MAX = 0.004  # ... growing to this while every look finds callers leading and nothing due
LEAD_SLICE = 0.05  # seconds of a caller-led wait for I/O between looks at its own state


class Transport:
    """The I/O thread and the link bookkeeping shared by all transports."""

    family_name = "transport"
    direct_writes = False  # True when a user thread may write on an idle link itself
    caller_leads = False  # True when a blocked get() may run the loop itself (lead())

    def __init__(self, engine: EngineAPI) -> None:
        self.engine = engine
        self._options = engine.options
        self._server = engine.purpose is Purpose.SERVER
        self._links: set[Link] = set()
        self._closing_links: set[Link] = set()  # links flushing their last frames (close_link)
        self._aborted = False
        self._idle = False  # the I/O thread is (about to be) waiting: wake() must signal it
        self._reconnect_at: float | None = None
        self._backoff = self._options.connection.reconnect_min
        self.address: Address = None
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

    # ----------------------------------------------------------------- diagnostics

    def connect_target(self) -> str:
        """Client: where connection attempts go, in this transport's terms (for messages)."""
        return str(self._options.netloc)

    def connect_state(self) -> str | None:
        """Client: what stands between us and the server right now, when the transport knows
        more than the last failed attempt says (a broker between us, say); None otherwise."""
        return None

    # ----------------------------------------------------------------- subclass hooks

    def _wait(self, timeout: float) -> None:
        """Subclass: wait up to ``timeout`` seconds for I/O and handle what happened."""
        raise NotImplementedError

    def _connect(self) -> None:
        """Subclass, client: start one connection attempt (never blocks for long)."""
        raise NotImplementedError

    def _abandon_connect(self) -> None:
        """Subclass, client: give up an attempt still in progress (closing)."""

    def _connect_pending(self) -> bool:
        """Subclass, client: is a connection attempt under way?"""
        return False

    def _connect_timeout(self) -> float:
        """Seconds a connection attempt may take before it is given up and retried."""
        return 3 * self._options.connection.heartbeat

    def _stop_listening(self) -> None:
        """Subclass, server: refuse newcomers from now on. Idempotent."""

    def _release(self, link: Link) -> None:
        """Subclass: free the link's socket or channel (I/O thread; idempotent)."""

    def _close_resources(self) -> None:
        """Subclass: free everything else, once, as the I/O thread ends."""

    def _authorize(self, link: Link, peer_id: uuid.UUID) -> bool:
        """Subclass: may ``peer_id`` (from the peer's HELLO) use this link? (I/O thread)"""
        return True

    def write_now(self, link: Link) -> None:
        """Subclass: write the link's queued output as far as possible (link lock held)."""
        raise NotImplementedError

    def wake(self) -> None:
        """Subclass: any thread; make the I/O loop run ``engine.service`` soon."""
        raise NotImplementedError

    # ----------------------------------------------------------------- thread API

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        if self._thread.ident is not None and threading.get_ident() != self._thread.ident:
            self._thread.join()

    def abort(self) -> None:
        self._aborted = True
        self._idle = True
        self.wake()

    def links(self) -> list[Link]:
        return [link for link in self._links if not link.dropped]

    def authorize(self, link: Link, peer_id: uuid.UUID) -> bool:
        return self._authorize(link, peer_id)

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
        if engine.closing:
            self._stop_listening()  # close() refuses newcomers from its first moment
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
        self._check_connect(now)
        if self._closing_links:
            for link in list(self._closing_links):
                if not link.conn.has_output or now >= link.close_deadline:
                    self._drop(link)
        return False

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
        """Is something due that no caller's turn has done: a timer, or held output?"""
        return now >= self._due_at or self._holds_due(now)

    def _holds_due(self, now: float) -> bool:
        """Subclass: is output held back (delayed ACKs) due to go by ``now``?"""
        return False

    def unpark(self) -> None:
        """Any thread: a parked I/O thread takes the loop back now (a get() went to sleep)."""
        if self._parked:
            with self._park:
                self._park.notify()

    def lead(self, timeout: float | None, ready: Callable[[], object]) -> bool:
        """A blocked ``get()`` runs the loop on its own thread until ``ready()`` or timeout.

        False (nothing done) when this transport does not allow it, or the I/O thread leads
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

    def _stop_step(self) -> bool:
        """One step of closing; True when the loop may end."""
        self._stop_listening()
        if not self._server and self._wants_connection():
            # A client finishing a goodbye a broken link interrupted: (re)connect as usual.
            if not self.links() and self._reconnect_at is None and not self._connect_pending():
                self._schedule_reconnect()
        else:
            self._abandon_connect()
            self._reconnect_at = None
        done = self.engine.goodbyes()
        return done and not self.links()

    def _shutdown(self) -> None:
        for link in list(self._links):
            self._drop(link)
        self._stop_listening()
        self._abandon_connect()
        self._close_resources()

    # ----------------------------------------------------------------- links

    def _after_io(self, link: Link) -> None:
        """After reading or writing a link: let the engine move more of its session's queue."""
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

    def _end_of_stream(self, link: Link) -> None:
        """The peer's end of the stream: what it completes goes to the engine, then the link
        is dropped (link lock held)."""
        events = link.conn.receive_eof()
        if events:
            self.engine.handle_events(link, events)
        self._drop(link)

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
                self.write_now(link)
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
        self._links.discard(link)
        self._closing_links.discard(link)
        self._release(link)
        with link.lock:
            self.engine.link_closed(link)
        if not self._server and not link.replaced:
            if link.session is not None:
                self._backoff = self._options.connection.reconnect_min
            self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        if self._server or self._aborted or not self.engine.wants_connection():
            return
        # Jittered (half to all of the backoff): clients that lost their server together do
        # not come back in lockstep, each retry wave spread over half a backoff.
        self._reconnect_at = time.monotonic() + self._backoff * random.uniform(0.5, 1.0)
        self._due_at = 0.0
        self._backoff = min(self._backoff * 2, self._options.connection.reconnect_max)

    def _wants_connection(self) -> bool:
        """Client: connect now? Not once stopping, nor while closing with nothing to send."""
        return self.engine.wants_connection()

    def _check_connect(self, now: float) -> None:
        """Subclass, client: give up an attempt that has taken too long (I/O thread)."""
