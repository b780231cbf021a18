"""The one loop: when the links are read and written, reconnects, closing. Engine side.

Each communicator has one :class:`IOLoop`. It owns the I/O thread, and the links through its
:class:`netq.link_driver.LinkDriver` (what happens to one link: read, write, hold an ACK,
end); its carrier (:mod:`netq.carrier`: sockets, MQTT, gRPC) only moves bytes and reports what
happened. Each turn::

    engine.service()        pump queued messages, grant credit, heartbeats, timers
    carrier.wait(timeout)   until something happens, a wake-up, or the next timer
    for each event          the driver reads (read_into -> Connection.receive_done ->
                            engine.handle_events -> inbox) or writes (Connection.write_to
                            -> the link's writer); a link opens or ends; an attempt failed
    reconnect when due, give up an attempt that takes too long, drop flushed closing links

The engine calls the loop through :class:`netq.contract.LoopAPI` (``write_now``,
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
from collections.abc import Callable

from ._interrupts import SIGINT_NUMBER, LoopTurns, on_sigint, sigint_disposition
from ._shm import ShmCounters
from .carrier import (
    CLOSED,
    DATA,
    FAILED,
    OPENED,
    Address,
    Carrier,
    CarrierFactory,
    Opened,
)
from .contract import (
    CONNECT_FAILED,
    CONNECT_STARTED,
    EngineAPI,
    Link,
    LoopAPI,
    LoopSignals,
)
from .link_driver import LinkDriver
from .options import CommunicatorOptions, Purpose
from .shared_io import client_thread, own_thread_ended

__all__ = ("IOLoop", "carrier_loop")

PARK_LIMIT = 0.001  # seconds the parked I/O thread leaves the loop to callers between checks
PARK_MAX = 0.004  # ... growing to this while every look finds callers leading and nothing due
LEAD_SLICE = 0.05  # seconds of a caller-led wait for I/O between looks at its own state


def carrier_loop(carrier_class: CarrierFactory) -> Callable[
        [EngineAPI, CommunicatorOptions, Purpose], LoopAPI]:
    """What the engine builds its loop with: an :class:`IOLoop` over ``carrier_class``."""

    def build(engine: EngineAPI, options: CommunicatorOptions, purpose: Purpose) -> LoopAPI:
        return IOLoop(engine, options, purpose, carrier_class)

    return build


class ParkingSpot:
    """Where an I/O thread waits while callers lead its loop: a lock held locked, released by
    :meth:`unpark` once per park. ``parked`` stays set until the parked thread is back (a
    caller may take the loop until then, as it finds it free). The parking thread sets it
    under ``mutex`` before it looks for work, so work queued after the look finds it parked
    and unparks it."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.parked = False
        self._released = False  # unpark() released the gate during this park
        self._gate = threading.Lock()
        self._gate.acquire()

    def unpark(self) -> None:
        """Any thread: the parked thread goes on now (nothing if it is not parked)."""
        with self.mutex:
            if self.parked and not self._released:
                self._released = True
                self._gate.release()

    def wait(self, gap: float) -> bool:
        """The parked thread: wait at most ``gap`` seconds; True when unparked."""
        gate = self._gate
        woken = gate.acquire(True, gap)
        with self.mutex:
            self.parked = False
            if not self._released:
                return False  # the gap ended
            self._released = False
        if not woken:
            gate.acquire()  # unparked as the gap ended: take the released gate back (no wait)
        return True


class ClientAttempts:
    """A client's attempts to reach its server: one at a time, each given up after the
    carrier's ``attempt_limit`` (where the loop bounds them), the next one after a backoff
    that doubles from ``reconnect_min`` to ``reconnect_max`` (and starts again from
    ``reconnect_min`` once a link had a session)."""

    def __init__(self, carrier: Carrier[object], signals: LoopSignals,
                 options: CommunicatorOptions) -> None:
        self._carrier = carrier
        self._signals = signals
        self._limit = carrier.info.attempt_limit
        self._min = self.backoff = options.connection.reconnect_min
        self._max = options.connection.reconnect_max
        self.since: float | None = None  # an attempt is under way since then
        self.retry_at: float | None = None  # the next attempt is due then

    def start(self) -> None:
        """Begin an attempt, unless one is under way or the engine wants no connection."""
        if self.since is not None or not self._signals.wants_connection:
            return
        if self._limit is not None:
            # An attempt the loop bounds stops the session clock while it lasts. A carrier
            # that bounds its own (a broker waiting for a server to announce itself) may wait
            # for ever: its time counts against session_timeout.
            self._signals.notices.append((CONNECT_STARTED, None, ""))
        self.since = time.monotonic()
        self._carrier.admit(True)

    def abandon(self) -> None:
        """Give up the attempt under way (if any) and forget the one scheduled."""
        self.retry_at = None
        if self.since is not None:
            self.since = None
            self._carrier.admit(False)

    def succeeded(self) -> None:
        self.since = None

    def failed(self, reason: str) -> None:
        self.since = None
        self._signals.notices.append((CONNECT_FAILED, None, reason))
        self.schedule()

    def schedule(self) -> None:
        """The next attempt after the backoff, if the engine wants a connection."""
        if not self._signals.wants_connection:
            return
        # Jittered (half to all of the backoff): clients that lost their server together do
        # not come back in lockstep, each retry wave spread over half a backoff.
        self.retry_at = time.monotonic() + self.backoff * random.uniform(0.5, 1.0)
        self.backoff = min(self.backoff * 2, self._max)

    def link_lost(self, had_session: bool) -> None:
        if had_session:
            self.backoff = self._min
        self.schedule()

    def due_in(self, now: float, timeout: float) -> float:
        """``timeout``, shortened to when the next attempt or the limit of this one is due."""
        if self.retry_at is not None:
            timeout = min(timeout, max(0.0, self.retry_at - now))
        if self.since is not None and self._limit is not None:
            timeout = min(timeout, max(0.0, self.since + self._limit - now))
        return timeout

    def tick(self, now: float) -> None:
        """Start the attempt that is due; give up the one that took too long."""
        if self.retry_at is not None and now >= self.retry_at:
            self.retry_at = None
            self.start()
        limit = self._limit
        if self.since is not None and limit is not None and now - self.since > limit:
            self.abandon()
            self.failed(f"timed out after {limit:.0f} s (no answer: a server too busy to "
                        f"take new connections, a firewall, or an unreachable host?)")


class IOLoop:
    """The I/O thread of one communicator, its links, and the carrier it drives."""

    def __init__(self, engine: EngineAPI, options: CommunicatorOptions, purpose: Purpose,
                 carrier_class: CarrierFactory) -> None:
        self.engine = engine
        # Plain data (netq.contract.LoopSignals) the loop reads, and appends notices to.
        signals = self._signals = engine.signals
        self._notices = signals.notices
        self._options = options
        self._server = purpose is Purpose.SERVER
        # A server's carrier binds here: a taken port raises from netq.new().
        self.carrier: Carrier[object] = carrier_class(options, purpose)
        info = self.carrier.info
        self.info = info
        self.connect_state = self.carrier.explain  # what stands between a client and its server
        self.direct_writes = info.user_threads_write
        # A client may run on the process's shared I/O thread (netq.shared_io), where no
        # caller leads it (the shared thread serves the others meanwhile).
        client = not self._server and info.any_thread_waits
        self._shared = client_thread(options.connection.io_thread, info.poll_fd) \
            if client else None
        self._owns_client_thread = client and self._shared is None  # counted per process
        self.poll_fd = info.poll_fd if self._shared is not None and info.poll_fd is not None \
            else -1
        self._ended = threading.Event()  # a shared loop has ended (what join() waits for)
        self._woken = False  # wake() since the start of a shared loop's turn
        self._handled = 0  # events the latest turn acted on
        self._next_turn_in = 0.0  # seconds until the latest turn wants the next
        self.caller_leads = info.any_thread_waits and self._shared is None
        self.watches_peer_host = info.watches_peer_host
        self.looked_at = time.monotonic()
        # The links and what happens to each (netq.link_driver): the engine's calls go to it.
        driver = self._driver = LinkDriver(engine, purpose, self.carrier, leading=self._leading,
                                           wake=self.wake, dropped=self._link_dropped)
        self.write_now = driver.write_now
        self.close_link = driver.close_link
        self.links = driver.links
        self.authorize = driver.authorize
        self._attention = signals.attention  # non-empty: the turn must not wait
        self._aborted = False
        self._idle = False  # the loop is (about to be) waiting: wake() must reach the carrier
        self._attempts = ClientAttempts(self.carrier, signals, options)  # a client's
        self._io_ident: int | None = None
        # Leader/followers (caller_leads): whoever holds _lead runs the loop; the I/O thread
        # parks in _spot while callers' get() lead it (see lead()).
        self._lead = threading.Lock()
        self._spot = ParkingSpot()
        self._caller_rounds = 0  # times a caller led the loop
        # When the loop must next turn even without I/O (timers, reconnect, closing links),
        # as the latest turn computed it: a parked I/O thread looks at it, not at the loop.
        self._due_at = 0.0
        self._leader_ident: int | None = None
        self._turns = LoopTurns()  # a caller's turns on the main thread defer Ctrl-C (see lead)
        self._thread = None if self._shared is not None else threading.Thread(
            target=self._run,
            name=f"netq-io-{purpose.value}-{str(options.id)[:8]}", daemon=True)

    # ----------------------------------------------------------------- what the engine calls

    @property
    def address(self) -> Address:
        return self.info.address

    def connect_target(self) -> str:
        return self.info.target

    def start(self) -> None:
        if self._thread is None:
            assert self._shared is not None
            self._shared.add(self)
        else:
            self._thread.start()

    def join(self) -> None:
        thread = self._thread
        if thread is None:
            if threading.get_ident() != self._io_ident:
                self._ended.wait()
        elif thread.ident is not None and threading.get_ident() != thread.ident:
            thread.join()

    def abort(self) -> None:
        self._aborted = True
        self._idle = True
        self.wake()

    def wake(self) -> None:
        self._woken = True
        if self._spot.parked:
            self._spot.unpark()
        if self._idle:
            self.carrier.wake()

    def unpark(self) -> None:
        """Any thread: a parked I/O thread takes the loop back now (a get() went to sleep)."""
        self._spot.unpark()  # nothing if it is not parked

    @property
    def shm(self) -> ShmCounters:
        """Shared-memory totals of this loop's links (netq._shm)."""
        return self._driver.shm

    @property
    def refused_links(self) -> int:
        """Links refused because their HELLO named another peer than their channel is bound
        to (MQTT: someone else's topics)."""
        return self._driver.refused

    @property
    def caller_led_turns(self) -> int:
        """How many times a blocked get() ran the loop on its own thread (leader/followers)."""
        return self._caller_rounds

    def _leading(self) -> bool:
        """True on the thread that leads the loop now (the I/O thread, or a caller's get())."""
        return threading.get_ident() == self._leader_ident

    # ----------------------------------------------------------------- the loop

    def _run(self) -> None:
        """The loop on a thread of its own."""
        error: BaseException | None = None
        try:
            self.begin()
            while not self._aborted:
                with self._lead:
                    self._leader_ident = self._io_ident
                    self._driver.handed_off = False
                    if self._step(None):
                        break
                    park = self._driver.handed_off and self.caller_leads
                if park:
                    self._park_for_callers()
        except BaseException as failure:  # noqa: BLE001 - must reach futures and get()
            error = failure
        finally:
            self.end(error)

    # The shared I/O thread calls begin(), then turn() until it returns None, then end().

    def begin(self) -> None:
        """The first thing the loop does on its thread: a client starts to connect."""
        self._io_ident = self._leader_ident = threading.get_ident()
        if not self._server:
            self._attempts.start()

    def turn(self) -> float | None:
        """One turn on the shared I/O thread, with a wait of 0: seconds until the loop wants
        the next (0: at once), or None when it may end."""
        if self._aborted:
            return None
        self._woken = False
        with self._lead:
            self._leader_ident = self._io_ident
            try:
                if self._step(0.0):
                    return None
            finally:
                self._leader_ident = None  # another member's callback is not this loop's
        if self._aborted:
            return None
        if self._woken or self._handled or self._due_at == 0.0 or self._driver.changed \
                or self._notices:
            # Woken, or what it did (events, reconnects, closing links, notices) wants a turn now.
            return 0.0
        return self._next_turn_in

    def end(self, error: BaseException | None) -> None:
        """The loop ends (``error``: why it failed): links closed, the engine told."""
        try:
            with self._lead:  # a caller leading the loop ends its turn first (it sees _aborted)
                self._shutdown()
        finally:
            if self._owns_client_thread:
                self._owns_client_thread = False
                own_thread_ended()
            try:
                self.engine.ended(error)
            finally:
                self._ended.set()

    def _step(self, cap: float | None) -> bool:
        """One turn of the loop (whoever leads it); True when a closing loop may end.

        ``cap``: wait at most this long for I/O (a caller leading the loop, see :meth:`lead`).
        """
        signals = self._signals
        now = time.monotonic()
        if signals.closing and self._server:
            self.carrier.admit(False)  # close() refuses newcomers from its first moment
        # The stamp of this turn's look: whatever had arrived by then, the wait reports (and
        # what it reports is read before the timers look again). Taken before the wait, and
        # again after the engine's service, which may take a while: stamped after the wait, a
        # stall between the poll and the stamp (waiting for the GIL) would hide bytes that
        # came meanwhile.
        looked_at = now
        if self._attention or self._notices or signals.closing or now >= signals.service_due:
            timeout = self.engine.service(now)
            looked_at = -1.0  # stamped again below: the service may have taken a while
        else:
            timeout = signals.service_due - now  # nothing to service, no timer due before
        if signals.stopping and self._stop_step():
            return True
        attempts = self._attempts
        if attempts.since is not None or attempts.retry_at is not None:  # no call per turn
            timeout = attempts.due_in(now, timeout)
        driver = self._driver
        if driver.closing:
            for closing in list(driver.closing):
                timeout = min(timeout, max(0.0, closing.close_deadline - now))
        if driver.owing:  # deferred ACKs (packet carriers): a turn is due when one is
            timeout = min(timeout, max(0.0, driver.owed_due - now))
        driver.changed = False
        self._due_at = now + timeout
        # Set before looking at the engine's queue: a user thread that queues work after the
        # look sees _idle and signals the wait (no lost wake-up). A shared loop is idle
        # between its turns too: it stays set.
        self._idle = True
        if self._attention:
            timeout = 0
        if driver.held:  # release_holds() once the first is due (all: a get() went to sleep)
            every = self._signals.release_acks
            due_in = 0.0 if every else driver.hold_due - time.monotonic()
            timeout = min(timeout, due_in if due_in > 0 else driver.release_holds(every))
        self._next_turn_in = timeout
        if cap is not None:
            timeout = min(timeout, cap)
        turns = self._turns
        if looked_at < 0:
            looked_at = time.monotonic()
        if turns.active:  # the main thread leads: a Ctrl-C may interrupt the wait at once
            LoopTurns.deferring = False  # turns.waiting(), inline (plain class attributes)
            if LoopTurns.pending:
                LoopTurns.pending = False
                raise KeyboardInterrupt
            try:
                events = self.carrier.wait(timeout)
            finally:
                LoopTurns.deferring = True  # turns.working()
        else:
            events = self.carrier.wait(timeout)
        self.looked_at = looked_at
        self._handled = len(events)
        links = driver.by_channel
        for kind, channel, value in events:
            if kind <= 3:  # READABLE and/or WRITABLE
                link = links.get(channel)
                if link is not None:
                    driver.serve_io(link, kind)
            elif kind is DATA:
                link = links.get(channel)
                if link is not None and not link.dropped:
                    driver.data(link, value)
            elif kind is OPENED:
                assert isinstance(value, Opened)
                self._open(channel, value)
            elif kind is CLOSED:
                link = links.get(channel)
                if link is not None and not link.dropped:
                    if isinstance(value, BaseException) and link.error is None:
                        link.error = driver.blamed(link, value)
                    driver.end_of_stream(link)
            elif kind is FAILED:
                self._attempts.failed(str(value) if value is not None else "the attempt failed")
        self._idle = self._shared is not None
        if driver.owing:
            # After this turn's packets: the message a deferred ACK waits for may be among them.
            driver.flush_owed()
        if attempts.since is not None or attempts.retry_at is not None:
            attempts.tick(time.monotonic())
        if driver.closing:
            now = time.monotonic()
            for closing in list(driver.closing):
                if not closing.conn.has_output or now >= closing.close_deadline:
                    driver.drop(closing)
        return False

    # ----------------------------------------------------------------- callers lead the loop

    def _park_for_callers(self) -> None:
        """Leave the loop to the next blocked get() (leader/followers), checking back often.

        The I/O thread just handed a message to a get() that was waiting for it, which will
        likely wait again soon and then run the loop itself (:meth:`lead`), waking once on its
        own socket. The I/O thread takes the loop back as soon as there is work (``wake()``)
        or when a look finds that no caller led since the last one, nor leads now. Looks come
        every ``PARK_LIMIT``; while each finds callers leading and nothing due, the gap doubles up
        to ``PARK_MAX`` (a steady stream of round trips then costs the I/O thread a wake-up
        every few milliseconds, not every one). Timers, heartbeats, held and deferred ACKs that
        no caller's turn took care of are never later than that gap.
        """
        signals = self._signals
        attention = self._attention
        notices = self._notices
        spot = self._spot
        driver = self._driver
        gap = PARK_LIMIT
        while not self._aborted:
            rounds = self._caller_rounds
            with spot.mutex:
                spot.parked = True  # before the look: work queued after it unparks us
                # A get() asleep on its gate does not lead: someone must poll.
                if attention or notices or signals.closing \
                        or signals.sleepers and not signals.ready:
                    spot.parked = False
                    return
            if spot.wait(gap):
                return  # unparked: work to do, or a get() went to sleep
            if attention or notices or signals.closing or self._caller_rounds == rounds \
                    and not self._lead.locked():
                return  # work to do, or no caller led meanwhile nor leads now: lead again
            now = time.monotonic()
            if now < self._due_at and not driver.changed and now < driver.owed_due \
                    and not (driver.held and now >= driver.hold_due):
                # Callers lead and nothing is late (a timer, an ACK): a turn of ours now
                # would only contend with theirs (their get() would wait for a hand-over).
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

    def lead(self, timeout: float | None, ready: Callable[[], object]) -> bool:
        """A blocked ``get()`` runs the loop on its own thread until ``ready()`` or timeout.

        False (nothing done) when this carrier does not allow it, or the I/O thread leads
        (it is waiting for I/O itself: the caller waits for its hand-over as before).
        """
        if not self._spot.parked or not self._lead.acquire(False):  # positional: no keyword parsing
            return False
        signals = self._signals
        turns = self._turns
        try:
            # Not if the I/O thread took the loop back meanwhile, nor on the main thread under
            # a SIGINT handler of the program's own (netq._interrupts). From here on, Ctrl-C on
            # the main thread waits for the end of a turn.
            if not self._spot.parked:
                return False
            ident = threading.get_ident()
            if ident == LoopTurns.main_ident:
                if sigint_disposition(SIGINT_NUMBER) is on_sigint:
                    # turns.begin(), inline where netq's handler is in place already (every
                    # lead on the main thread but the first): a Python call per lead saved.
                    turns.active = True
                    LoopTurns.deferring = True
                elif not turns.begin():
                    return False
            self._leader_ident = ident
            self._caller_rounds += 1
            if self._driver.held:  # a get() back without a put(): no reply carries held ACKs
                self._driver.release_holds(True)  # so they go now (a turn saved)
            deadline = None if timeout is None else time.monotonic() + timeout
            while not ready() and not self._aborted and not signals.closing:
                cap = LEAD_SLICE
                if deadline is not None:
                    cap = min(cap, deadline - time.monotonic())
                    if cap <= 0:
                        break
                self._step(cap)
                if turns.active and turns.pending:  # attribute reads: no call per turn
                    turns.end_of_turn()
        finally:
            if turns.active:  # turns.end(), inline (plain attributes: see netq._interrupts)
                LoopTurns.deferring = False
                turns.active = False
            self._leader_ident = self._io_ident
            self._lead.release()
        return True

    # ----------------------------------------------------------------- closing

    def _stop_step(self) -> bool:
        """One step of closing (service() said the goodbyes); True when the loop may end."""
        if self._server:
            self.carrier.admit(False)
        elif self._signals.wants_connection:
            # A client finishing a goodbye a broken link interrupted: (re)connect as usual.
            attempts = self._attempts
            if not self.links() and attempts.retry_at is None and attempts.since is None:
                attempts.schedule()
        else:
            self._attempts.abandon()
        return self._signals.said_goodbye and not self.links()

    def _shutdown(self) -> None:
        for link in list(self._driver.by_channel.values()):
            self._driver.drop(link)
        if self._server:
            self.carrier.admit(False)
        else:
            self._attempts.abandon()
        self.carrier.close(None)

    # ----------------------------------------------------------------- links come and go

    def _open(self, channel: object, opened: Opened) -> None:
        if self._server:
            refuse = self._signals.closing or self._aborted  # close() refuses newcomers at once
        else:
            self._attempts.succeeded()
            # A closing client still takes a link that finishes a goodbye a broken link
            # interrupted (wants_connection says whether one is under way).
            refuse = self._aborted or not self._signals.wants_connection
        if refuse:
            self.carrier.close(channel)
        else:
            self._driver.open(channel, opened)

    def _link_dropped(self, link: Link) -> None:
        """A client whose link ended reconnects (after a backoff), unless a newer link of the
        same peer replaced it."""
        self._due_at = 0.0
        if not self._server and not link.replaced and not self._aborted:
            self._attempts.link_lost(link.session is not None)
