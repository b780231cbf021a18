"""The session engine: event dispatch, pumping queued messages, and timers.

The engine sits between its loop (:class:`netq.loop.IOLoop`, which drives the transport's
carrier) and the queue API (:class:`netq.Communicator`):

* the loop calls it through :class:`netq.contract.EngineAPI` (a ``typing.Protocol``): a new
  link's :class:`~netq.protocol.Connection`, the events a link produced, the periodic
  :meth:`SessionEngine.service` and the end of the I/O thread; what else the engine must hear
  (a link served or closed, a client's attempt begun or failed) the loop leaves as data, in
  :attr:`netq.contract.LoopSignals.notices`, which :meth:`SessionEngine.service` drains first,
  and what the loop reads of the engine is data in the same ``LoopSignals``; the engine
  calls the loop through :class:`netq.contract.LoopAPI` (write a link now, close
  it, wake the loop);
* the queue API calls :meth:`SessionEngine.submit` (queue a serialized message for some peers,
  waiting for send budget) and the closing and reporting methods; its receive side
  (:mod:`netq.inbox`) counts what ``get()`` consumed in the engine's
  :class:`~netq.credit.ReceiveBudget` and leads the loop itself;
* received messages go to the queue API through the :class:`netq.contract.Inbox` it passes in.

The engine dispatches and pumps; each decision it needs lives in one module (see
docs/architecture.md): which peer an id names (:mod:`netq.peers`), how much credit to grant
(:mod:`netq.credit`, policy in :mod:`netq.flow`), what a handshake, a goodbye or an error frame
means for a session (:mod:`netq.handshake`), where numbering resumes
(:mod:`netq.protocol.resume`), what a wait says (:mod:`netq.diagnostics`), and which message
goes on the wire under which sequence number (:meth:`netq.session.PeerSession.pump`). Here:
what a link's events mean, when a session is pumped, when a silent link is dead.

Threads: the I/O thread runs every ``handle_*``/``service`` method. User threads run
``submit`` (appending under the session's ``put_lock``; writing an idle link themselves when
the carrier allows: ``direct_writes``) and the close/report methods.
See :mod:`netq.session` for which thread writes which field.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Sequence

from . import flow, protocol as proto
from .contract import (
    CONNECT_FAILED,
    CONNECT_STARTED,
    LINK_CLOSED,
    LINK_SERVED,
    EngineAPI,
    Inbox,
    Link,
    LoopAPI,
    LoopFactory,
    LoopSignals,
)
from .credit import ReceiveBudget
from .diagnostics import (
    WAITING_CLIENTS,
    Diagnostics,
    Reachability,
    explain_no_handshake,
)
from .exceptions import (
    AuthenticationError,
    ConnectionLost,
    Full,
    NetqError,
)
from .handshake import Handshake, new_connection
from .options import CommunicatorOptions, Purpose
from .peers import PeerDirectory
from .protocol.frames import UNLIMITED_MESSAGES
from .session import QUEUED_MESSAGE_COST, Outgoing, PeerSession, PeerState
from .stall import StallWarning

__all__ = ("EngineAPI", "Inbox", "SessionEngine")

LOGGER = logging.getLogger("netq")

_GOODBYE_GRACE = 1.0  # seconds close(timeout) still allows for goodbyes after the timeout
_STOPPING_POLL = 0.01  # seconds between looks at the goodbyes while links are open
_GOODBYE_RETRY_POLL = 0.25  # at most this between looks while waiting to reconnect
_CORK_BYTES = 64 * 1024  # unsent bytes that wake the I/O thread even while an ACK is due
# Seconds at least between looks at the timers (heartbeats, session timeouts, stall warnings),
# which run when due: a busy link turns the loop once per message, and a look scans every link
# and session, so a server with thousands of links must not look on every turn (a connection
# storm turns the loop thousands of times a second).
_TIMER_TICK = 0.01
# The share of a heartbeat by which a PING may be late (see SessionEngine._timers).
_HEARTBEAT_SLACK = 0.1
_QUIET = 50e-6  # seconds since the previous put after which a put counts as a lone request
_clock = time.perf_counter


class SessionEngine:
    """The I/O side of one communicator. Create through :class:`netq.Communicator`."""

    def __init__(self, options: CommunicatorOptions, purpose: Purpose, inbox: Inbox,
                 signals: LoopSignals, loop_factory: LoopFactory) -> None:
        self.options = options
        self.purpose = purpose
        self.id = options.id
        self._inbox = inbox
        self._server = purpose is Purpose.SERVER
        queue_size = options.serialization.queue_size
        self._recv_messages = UNLIMITED_MESSAGES if queue_size < 0 else max(1, queue_size)
        connection = options.connection
        # ConnectionOptions fills these in (None means "derive from the others").
        assert connection.window_min is not None and connection.window_max is not None
        self.limits = flow.FlowLimits(connection.recv_budget, connection.window_min,
                                      connection.window_max)
        self._send_budget = connection.send_budget
        self._send_messages = connection.send_messages
        self._stall_warning = connection.stall_warning

        # Every session, a client's one session included (netq.peers); a client's one
        # session (with the server) is fixed for its life (None on a server).
        self.peers = PeerDirectory(server=self._server, window=self.limits.window_min)
        self.server_session: PeerSession | None = self.peers.server_session
        self.all_sessions = self.peers.all

        # The receive budget and the credit our peers have (netq.credit).
        self.budget = ReceiveBudget(self.limits, recv_messages=self._recv_messages,
                                    stall_warning=self._stall_warning,
                                    peer_count=self.peers.__len__, schedule=self.schedule,
                                    clock=time.monotonic, look_within=self._timers_changed,
                                    consumers=inbox)

        # What the loop reads on every turn and the notices it leaves us (netq.contract):
        # attention (the sessions the I/O thread must service, pump and grant credit, on its
        # next turn), service_due, closing and stopping are written here.
        self.signals = signals
        self.attention: collections.deque[PeerSession] = signals.attention
        self._notices = signals.notices
        self._timers_ran = self._timers_due = 0.0  # when _timers last ran, when next due
        self._stopping_since = 0.0
        self._close_progress = threading.Condition()  # close() waits here (wait_flushed)
        self.closed = threading.Event()  # the I/O thread has ended
        self.failure: BaseException | None = None  # why the I/O thread died, if it did
        self.fatal: NetqError | None = None  # a client that cannot go on (wrong authkey)
        self._ping_tokens = itertools.count(1)
        self.created = time.monotonic()

        # Client connection trouble, for warnings and statistics().
        self.reach = None if self._server else Reachability(self._stall_warning, self.created,
                                                            str(options.netloc))

        self.loop: LoopAPI = loop_factory(self, options, purpose)
        self._pump = PeerSession.pump  # an attribute: a test hooks into the I/O thread's pumping
        self.start = self.loop.start
        self.handshake = Handshake(server=self._server, peers=self.peers, budget=self.budget,
                                   loop=self.loop, reachability=self.reach,
                                   schedule=self.schedule, changed=self._session_came,
                                   options=options, recv_messages=self._recv_messages)
        self.diagnostics = Diagnostics(server=self._server, options=options, peers=self.peers,
                                       budget=self.budget, loop=self.loop,
                                       reachability=self.reach, getters=inbox)

    def raise_if_broken(self) -> None:
        """Raise what stops put() and get() for good: the I/O thread died, or a key was refused."""
        if self.failure is not None:
            raise ConnectionLost(None, f"I/O thread failed: {self.failure!r}")
        if self.fatal is not None:
            raise self.fatal

    # ================================================================== user threads: send

    def submit(self, targets: Sequence[PeerSession], message: Outgoing, block: bool,
               timeout: float | None) -> None:
        """Queue ``message`` for every target, waiting for send budget as allowed."""
        loop = self.loop
        send_budget = self._send_budget
        send_messages = self._send_messages
        for session in targets:
            with session.put_lock:
                outbox = session.outbox
                # session.has_room(), inline: one call fewer on every put.
                if (session.queued_bytes - session.dequeued_bytes
                        + len(outbox) * QUEUED_MESSAGE_COST >= send_budget
                        or len(outbox) + len(session.inflight) >= send_messages):
                    self._wait_for_space(session, block, timeout)
                session.queued_bytes += message.size
                outbox.append(message)
            now = _clock()
            quiet = now - session.last_put >= _QUIET
            session.last_put = now
            if session.inflight:
                if session.queued_bytes - session.dequeued_bytes < _CORK_BYTES:
                    # Autocork: an ACK is coming (messages are on the wire) and the I/O thread
                    # pumps the outbox when it arrives (it checks the outbox after popping
                    # acknowledged messages, we checked inflight after appending: nothing is
                    # stranded). Meanwhile puts pile up into one batch, one sendmsg.
                    continue
            elif quiet and loop.direct_writes and session.send_lock.acquire(False):
                # Request/response: nothing in flight and no put just before this one.
                # Writing from this thread saves waking the I/O thread on the way out.
                try:
                    link: Link | None = session.link  # type: ignore[assignment]  # AttachedLink
                    if link is not None and link.direct_ok and not link.write_blocked:
                        self._pump(session, link)
                        conn = link.conn
                        if conn.bytes_queued:
                            loop.write_now(link)
                            if not session.outbox and not conn.bytes_queued:
                                continue
                        elif not session.outbox:
                            continue
                finally:
                    session.send_lock.release()
            if not session.scheduled:
                self.schedule(session)
                loop.wake()

    def schedule(self, session: PeerSession) -> None:
        """Ask the I/O thread to service ``session`` (pump, grant credit) on its next turn."""
        session.scheduled = True
        self.attention.append(session)

    def _wait_for_space(self, session: PeerSession, block: bool, timeout: float | None) -> None:
        """Called with put_lock held: wait until the peer's unsent bytes drop under budget."""
        explain = self.diagnostics.explain_send_wait
        if not block:
            raise Full(f"put() would wait: {explain(session)}")
        self.schedule(session)
        self.loop.wake()
        session.wait_for_space(self._send_budget, self._send_messages, timeout, StallWarning(
            self._stall_warning, time.monotonic()), lambda: self.signals.closing,
            lambda: explain(session), self.purpose.value)

    # ================================================================== I/O thread: links

    def new_connection(self, passes_fds: bool = False) -> proto.Connection:
        if self.reach is not None:
            self.reach.reached_server()
        # Not through self.handshake: a carrier's thread may get here before __init__ ends.
        return new_connection(self.options, server=self._server, passes_fds=passes_fds,
                              recv_messages=self._recv_messages, grant=self.budget.hello_grant(),
                              pool=self.budget.receive_pool)

    def handle_events(self, link: Link, events: list[proto.Event]) -> None:
        arrived: list[proto.MessageReceived] | None = None
        session = link.session
        for event in events:
            kind = type(event)
            # type(event) is the class: the annotated names below tell the type checker so
            # (typing.cast would be a Python call per event).
            if kind is proto.MessageReceived:
                assert session is not None
                received: proto.MessageReceived = event  # type: ignore[assignment]
                session.last_received = received.seq
                if arrived is None:
                    arrived = []
                arrived.append(received)  # the event itself waits in the inbox: no new object
            elif kind is proto.AckReceived:
                assert session is not None
                ack: proto.AckReceived = event  # type: ignore[assignment]
                session.acknowledge(ack.seq)
                if session.outbox and not session.scheduled:
                    self.schedule(session)
            elif kind is proto.CreditReceived:
                assert session is not None
                # Its pump sends what waited for credit (and says whether credit is still
                # short); with nothing queued there is nothing to pump.
                if (session.outbox or session.credit_exhausted_since is not None) \
                        and not session.scheduled:
                    self.schedule(session)
            elif kind is proto.PeerAuthenticated:
                assert isinstance(event, proto.PeerAuthenticated)
                if self._notices:  # a link of this peer that closed is heard of first
                    self._drain_notices()
                if not self.handshake.authenticated(link, event.hello):
                    return  # refused: nothing after the HELLO is looked at
            elif kind is proto.SessionOpened:
                assert isinstance(event, proto.SessionOpened)
                if self._notices:  # a link of this peer that closed is heard of first
                    self._drain_notices()
                if not self.handshake.session_opened(link, event):
                    return  # refused (a stale attempt): nothing after it is looked at
                session = link.session
            elif kind is proto.ByeReceived:
                self.handshake.bye(link)
                self._wants_connection()
            elif kind is proto.ErrorReceived:
                assert isinstance(event, proto.ErrorReceived)
                self.handshake.error_frame(link, event)
                self._wants_connection()
            elif kind is proto.ConnectionFailed:
                assert isinstance(event, proto.ConnectionFailed)
                link.error = event.error
                # A client's failed handshake is reported by link_closed (connect_failed).
                if (link.session is not None or self._server) \
                        and not isinstance(event.error, AuthenticationError):
                    LOGGER.info("netq %s: link to %s failed: %s", self.purpose.value,
                                link.peer_name, event.error)
            elif kind is proto.PongReceived:
                assert isinstance(event, proto.PongReceived)
                if session is not None and event.token == session.bdp_token:
                    self.budget.probe_answered(session)
                else:
                    link.rtt = time.monotonic() - link.ping_sent_at
        if arrived:
            assert session is not None
            self.budget.arrived(session, link, arrived)  # counts them: one call per read
            self._inbox.deliver(session, arrived)

    def _drain_notices(self) -> None:
        """What the loop left us since the last turn (netq.contract.LoopSignals.notices), in
        the order it happened."""
        notices = self._notices
        while notices:
            kind, link, text = notices.popleft()
            if kind == LINK_SERVED:
                assert link is not None
                session = link.session
                if session is not None:
                    # User threads may write on the link from now on (see Link.direct_ok).
                    link.direct_ok = True
                    if session.outbox and not session.scheduled:
                        self.schedule(session)
            elif kind == LINK_CLOSED:
                assert link is not None
                with link.lock:
                    self._link_closed(link)
                self._wants_connection()  # the session may have ended with it
            elif kind == CONNECT_STARTED:
                self._timers_changed()
                if self.reach is not None:
                    self.reach.started(time.monotonic())
            elif kind == CONNECT_FAILED:
                self._connect_failed(text)

    def _link_closed(self, link: Link) -> None:
        """The link's channel is gone (link lock held): its credit, its session, and for a
        client whose attempt ended before its handshake, a failed attempt."""
        # Nothing of a closed link is due before its session expires or a client warns.
        connection = self.options.connection
        self._timers_changed(min(connection.session_timeout, connection.stall_warning))
        self.budget.link_closed(link)
        if isinstance(link.error, AuthenticationError):
            LOGGER.warning("netq %s: %s", self.purpose.value, link.error)
            if not self._server:
                # Retrying cannot help (wrong key, untrusted certificate): fail all, saying why.
                self.fatal = link.error
                server = self.peers.server_session
                assert server is not None
                self.handshake.end_session(server, link.error)
                self._inbox.wake_all()
                return
        failed_attempt = self.handshake.link_closed(link, time.monotonic())
        if failed_attempt is not None:
            self._connect_failed(failed_attempt)

    def _connect_failed(self, reason: str) -> None:
        """Client: an attempt to reach the server failed; the loop retries."""
        self._timers_changed()
        if self.reach is not None:
            self.reach.failed(time.monotonic(), reason)
        LOGGER.debug("netq client: connecting to %s failed: %s", self.options.netloc, reason)

    def _wants_connection(self) -> None:
        """Client: should the loop (re)connect now? Said in LoopSignals.wants_connection,
        looked at again whenever its answer may have changed: a link closed, a BYE or ERROR
        frame, and every turn once close() began."""
        signals = self.signals
        session = self.peers.server_session
        if signals.stopping:
            # Only to finish a goodbye a broken link interrupted, while close() allows it.
            wants = self.handshake.goodbye_retry(time.monotonic())
        elif session is None or session.state is PeerState.CLOSED:
            wants = False
        elif signals.closing:
            wants = bool(session.outbox or session.inflight)
        else:
            wants = True
        signals.wants_connection = wants

    # ================================================================== I/O thread: periodic

    def service(self, now: float) -> float:
        if self._notices:
            self._drain_notices()
        wait = self._service(now)
        signals = self.signals
        if signals.stopping:
            signals.said_goodbye = self._goodbyes(now)
            wait = min(wait, self._goodbye_wait(now, bool(self.loop.links())))
        if signals.closing:
            self._wants_connection()
        return wait

    def _service(self, now: float) -> float:
        """Pump and grant credit to the sessions in attention; the timers when due."""
        attention = self.attention
        loop = self.loop
        # One pass over what is queued now: a session rescheduled meanwhile waits for the next
        # pass (it is in the deque again), so user threads cannot keep this loop spinning.
        for _ in range(len(attention)):
            session = attention.popleft()
            session.scheduled = False  # before pumping: later puts must schedule again
            link: Link | None = session.link  # type: ignore[assignment]  # AttachedLink
            if link is None or link.closing:
                continue
            with session.send_lock:
                if link.conn.state is proto.ConnectionState.OPEN:
                    self.budget.grant(session, link)
                self._pump(session, link)
                if link.conn.has_output:
                    loop.write_now(link)
        if self.signals.closing:
            self._closing_progress()  # close() looks at flushed() again
        due = self._timers_due
        # Due (0: a look now), and for a due time reached, a tick after the last look.
        if now < due or (due and now - self._timers_ran < _TIMER_TICK):
            return max(due - now, self._timers_ran + _TIMER_TICK - now)
        wait = self._timers(now)
        self._timers_ran, self._timers_due = now, now + wait
        self.signals.service_due = now + max(wait, _TIMER_TICK)
        return wait

    def _timers_changed(self, within: float = 0.0) -> None:
        """Something the timers watch changed: look at them within ``within`` seconds (the
        loop's next turn by default), and not later than they were due anyway."""
        due = time.monotonic() + within if within else 0.0
        if due < self._timers_due:
            self._timers_due = due
            self.signals.service_due = max(due, self._timers_ran + _TIMER_TICK) if due else 0.0

    def _session_came(self) -> None:
        # No look now (one per handshake scans every link in a storm): one within the slack.
        self._timers_changed(self.options.connection.heartbeat * _HEARTBEAT_SLACK)

    def _timers(self, now: float) -> float:
        connection = self.options.connection
        heartbeat = connection.heartbeat
        wait = min(heartbeat, self.handshake.expire_sessions(now))
        seen = self.loop.looked_at  # silence as of our last look: not our own stall
        for link in self.loop.links():
            silent = seen - link.last_received_at
            if silent >= heartbeat:
                link.conn.release_buffers()  # nothing arrives: free the buffers kept for reuse
            if silent >= 3 * heartbeat:
                if link.session is not None or self._server:
                    link.error = ConnectionLost(link.peer_id, f"silent for {silent:.1f} s")
                elif self.loop.watches_peer_host and silent < connection.session_timeout:
                    continue  # its server's host answers: keep the place in its queue a while
                else:
                    link.error = ConnectionLost(None, explain_no_handshake(
                        silent, heard_hello=link.conn.peer is not None))
                self.loop.close_link(link, flush=False)
            elif silent >= heartbeat and now - link.ping_sent_at >= heartbeat:
                link.ping_sent_at = now
                with link.lock:
                    link.conn.send_ping(next(self._ping_tokens))
                    self.loop.write_now(link)
            else:
                # The next PING is due a heartbeat after the later of the last bytes received
                # and the last PING sent. Looking at most every slack keeps a server with
                # thousands of idle links (spread-out due times) from scanning them all every
                # millisecond, at the price of a PING that much late.
                due = heartbeat - min(silent, now - link.ping_sent_at)
                wait = min(wait, max(due, heartbeat * _HEARTBEAT_SLACK))
        return max(min(wait, self.diagnostics.watch(now, self.signals.stopping)), 0.001)

    # ================================================================== closing

    def begin_close(self) -> None:
        self._timers_changed()
        self.signals.closing = True

    def stop(self, goodbye_by: float | None = None) -> None:
        """Say goodbye and end the loop. ``goodbye_by``: see Handshake.stopping."""
        self._timers_changed()
        now = time.monotonic()
        self._stopping_since = now
        self.handshake.stopping(now, goodbye_by)
        self.signals.stopping = True
        self.loop.wake()

    def flushed(self) -> bool:
        """Everything put has been acknowledged (or failed), and for a server: peers left."""
        return self.failure is not None or self.handshake.flushed(time.monotonic())

    def wait_flushed(self, timeout: float | None) -> bool:
        """close(): wait until flushed() or the I/O thread ended, at most ``timeout`` seconds.
        The engine notifies after every turn of its loop while closing (no polling here)."""
        with self._close_progress:
            return self._close_progress.wait_for(
                lambda: self.closed.is_set() or self.flushed(), timeout)

    def _closing_progress(self) -> None:
        with self._close_progress:
            self._close_progress.notify_all()

    def _goodbye_wait(self, now: float, linked: bool) -> float:
        """Stopping: seconds the loop may sleep before it looks at the goodbyes again. While
        links are open, or in the first moment, every 10 ms: a goodbye under way ends soon.
        A client with no link that waits to reconnect to finish its goodbye sleeps until its
        deadline, at most a quarter second (its reconnect timer and its sockets wake it)."""
        if linked or now - self._stopping_since < _GOODBYE_GRACE:
            return _STOPPING_POLL
        deadline = self.handshake.goodbye_deadline()
        if deadline is None:
            return _STOPPING_POLL
        return min(max(deadline - now, _STOPPING_POLL), _GOODBYE_RETRY_POLL)

    def explain_close_wait(self) -> str:
        """What close() waits for, in words (its stall WARNINGs)."""
        now = time.monotonic()
        deadline = self.handshake.goodbye_deadline() if self.signals.stopping else None
        return self.diagnostics.explain_close_wait(now, goodbye_deadline=deadline)

    def _goodbyes(self, now: float) -> bool:
        """Closing: say goodbye on every link; True when nothing is left to wait for."""
        retrying = self.handshake.goodbye_retry(now)
        done = self.handshake.goodbyes(
            in_grace=retrying or now - self._stopping_since < _GOODBYE_GRACE)
        return done and not retrying

    def ended(self, error: BaseException | None) -> None:
        if error is not None:
            self.failure = error
            lost = ConnectionLost(None, f"I/O thread failed: {error!r}")
            for session in self.all_sessions():
                session.fail_outbound(lost)
            self._inbox.wake_all()
        try:
            self._drain_notices()  # the links the loop dropped as it ended
        finally:
            self._finished()

    def _finished(self) -> None:
        if self.reach is not None:
            WAITING_CLIENTS.remove(self.reach)
        self.closed.set()
        self._closing_progress()

