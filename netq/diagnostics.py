"""What a wait is waiting for: every sentence netq says about a stall, decided here.

A silent wait is a bug (docs/guarantees.md): a ``put()`` waiting for send budget, a
``close()`` waiting for acknowledgements, a client that cannot reach its server, a full
receive budget all say, within ``stall_warning`` seconds, what they wait for and what would
change it: as a WARNING on the ``netq`` logger (repeated every
:data:`netq.stall.REPEAT_WARNING` seconds while the wait lasts: when is the stall timer's,
:class:`netq.stall.StallWarning`; what, this module's) and in ``statistics()``
(:meth:`Diagnostics.peer_blocked`). A ``get()`` that has waited that long says so in
``statistics()`` (:meth:`Diagnostics.get_wait`), and on a server with no client connected
(nobody who could send) also in one WARNING per wait: waiting for a peer that is there is a
program's normal idle state, and a log line every half minute would bury the real ones.

* :class:`Reachability`: a client's connection attempts since it last had a connection
  (counts, the attempt under way and how far it got, the last failure's reason), and its
  session clock (the time counted against ``session_timeout``);
* :class:`Diagnostics`: the sentences, from the engine's state (read only);
* :func:`format_bytes`: sizes in those sentences, in statistics tables and widgets.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref
from typing import Protocol

from .live import live_communicators, name_of
from .options import CommunicatorOptions
from .peers import PeerDirectory
from .session import QUEUED_MESSAGE_COST, PeerSession, PeerState
from .stall import StallWarning

LOGGER = logging.getLogger("netq")

__all__ = ("SUMMARY_EVERY", "BudgetView", "ConnectView", "Diagnostics", "GetterView",
           "Reachability", "WAITING_CLIENTS", "WaitingClients", "explain_empty",
           "explain_no_handshake", "format_bytes")

# Seconds between the summary WARNINGs of a process whose clients wait for their server
# together (a connection storm): one line for them all, not one per client.
SUMMARY_EVERY = 5.0


def format_bytes(value: float) -> str:
    """Bytes as B / KiB / MiB / GiB, three significant digits: ``0 B``, ``512 B``,
    ``64.0 KiB``, ``4.00 MiB`` (``-`` for NaN, a missing sample)."""
    value = float(value)
    if value != value:
        return "-"
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            number = value / scale
            return f"{number:.2f} {suffix}" if abs(number) < 10 else f"{number:.1f} {suffix}"
    return f"{value:.0f} B"


def explain_no_handshake(silent: float, *, heard_hello: bool) -> str:
    """Why a client gives up an attempt that connected and heard nothing for 3 heartbeats
    (``heard_hello``: the server's HELLO came, the rest of the handshake did not)."""
    if heard_hello:
        return (f"connected, and the server's HELLO came, but not the rest of the netq "
                f"handshake in {silent:.0f} s: the server is overloaded (a connection storm) "
                f"or stuck")
    return (f"connected, but no netq handshake in {silent:.0f} s: the server has not taken the "
            f"connection from its queue (overloaded, or stuck), or the other end is not a netq "
            f"server")


def explain_empty(timeout: float, *, server: bool, connected: int, named: int = 0,
                  unreachable: str = "") -> str:
    """The text of the ``Empty`` a ``get(timeout=)`` raises when ``timeout`` seconds passed
    with no message: whom it could have come from (``connected``: clients of a server, 1 or 0
    for a client's server; ``named``: how many peers the get() named, 0 for any;
    ``unreachable``: what stands between a client and its server, "" if nothing is known)."""
    waited = f"get(timeout={timeout:g}) found no message in {timeout:g} s"
    if named:
        waited += " from the peer it named" if named == 1 else f" from the {named} peers it named"
    if not server:
        if connected:
            return f"{waited}; the server is connected, and nothing came from it in that time"
        if unreachable:
            return f"{waited}; the server is not connected ({unreachable}; netq keeps trying)"
        return f"{waited}; the server is not connected yet (netq keeps trying to reach it)"
    if not connected:
        return f"{waited}; no client is connected"
    if connected == 1:
        return f"{waited}; 1 client is connected, and nothing came from it in that time"
    return f"{waited}; {connected} clients are connected, and nothing came from them in that time"


def _peer_in_this_process(peer: uuid.UUID) -> str:
    """Said of a peer that holds our messages unread when it is a communicator of this very
    process (a notebook kernel that runs a server and its clients): the get() that would free
    it may be meant to run on the thread that now waits for it."""
    for communicator in live_communicators():
        if communicator.id == peer:
            return (". That peer is a communicator of this process: if the code that calls its "
                    "get() runs on this thread after this call (the next notebook cell, the "
                    "end of a with block), it never runs; take its messages on another thread, "
                    "or put less before they are taken")
    return ""


class Reachability:
    """A client's attempts to reach its server since its last connection (I/O thread).

    It also keeps the client's session clock (docs/guarantees.md, "session_timeout"): it runs
    only while no attempt is under way (between a failed attempt and the next one), so a
    client whose attempts are slow because the server is busy (a storm) fails nothing.
    Transports that do not report when an attempt starts leave it running from the start or
    the disconnection.
    """

    def __init__(self, stall_warning: float, now: float, server: str = "") -> None:
        self.server = server  # where the server is, in words: clients of one share a warning
        self._absent_total = 0.0  # seconds counted so far since the last connection
        # When the stretch being counted now began (None: an attempt is under way).
        self._absent_since: float | None = now
        self.connect_error = ""  # what the last failed attempt ran into ("" once connected)
        # The current stretch without a connection (None while connected).
        self.unreachable: StallWarning | None = StallWarning(stall_warning, now)
        self._stall_warning = stall_warning
        self.attempts = 0  # attempts started since the last connection
        self.failures = 0  # of which ended in failure
        self.attempt_started_at: float | None = None  # the attempt under way, if any
        self.attempt_reached_server = False  # the attempt under way reached a listener
        WAITING_CLIENTS.add(self)

    @property
    def unreachable_since(self) -> float | None:
        return self.unreachable.since if self.unreachable is not None else None

    def absent_for(self, now: float) -> float:
        """Seconds counted against ``session_timeout`` since the last connection: the time
        spent with no connection attempt under way."""
        total = self._absent_total
        if self._absent_since is not None:
            total += now - self._absent_since
        return total

    @property
    def absence_counting(self) -> bool:
        """The session clock runs now (no attempt under way)."""
        return self._absent_since is not None

    def restart_absence(self, now: float) -> None:
        """session_timeout ran out (what was queued failed): a fresh period for later puts."""
        self._absent_total = 0.0
        if self._absent_since is not None:
            self._absent_since = now

    def started(self, now: float) -> None:
        if self._absent_since is not None:  # an attempt under way stops the session clock
            self._absent_total += now - self._absent_since
            self._absent_since = None
        self.attempts += 1
        self.attempt_started_at = now
        self.attempt_reached_server = False

    def reached_server(self) -> None:
        """The attempt under way has a link to a listener (its handshake begins)."""
        if self.attempt_started_at is not None:
            self.attempt_reached_server = True

    def failed(self, now: float, error: str) -> None:
        if self.attempt_started_at is None:  # a transport that does not report its starts
            self.attempts += 1
        self.failures += 1
        if self._absent_since is None:
            self._absent_since = now
        self.attempt_started_at = None
        self.attempt_reached_server = False
        self.connect_error = error
        self.lost(now)

    def lost(self, now: float) -> None:
        """No connection from ``now`` on (unless we already knew)."""
        if self.unreachable is None:
            self.unreachable = StallWarning(self._stall_warning, now)
            WAITING_CLIENTS.lost(self)

    def disconnected(self, now: float) -> None:
        """The connection broke: the session clock starts from zero, until the next attempt."""
        self.lost(now)
        self._absent_total = 0.0
        self._absent_since = now

    def connected(self) -> StallWarning | None:
        """A connection: the counts start again. Returns the stretch without one that just
        ended (None if there was none)."""
        ended, self.unreachable = self.unreachable, None
        if ended is not None:
            self.connect_error = ""
            WAITING_CLIENTS.connected(self)
        self._absent_total, self._absent_since = 0.0, None
        self.attempts = self.failures = 0
        self.attempt_started_at = None
        self.attempt_reached_server = False
        return ended


class WaitingClients:
    """The clients of this process that cannot reach their server, for one WARNING line.

    A connection storm (a fleet reconnecting, a class starting the same notebook) makes every
    client of a process wait at once; a WARNING from each would be thousands of lines saying
    the same. A client whose warning is due reports here instead: alone, it logs its own line
    (what it waits for, in full); while others of this process wait for the same server too,
    one of them logs a summary for all of those (how many of how many wait, the oldest wait,
    how far their attempts got, and the reporter's own sentence as an example) at most every
    :data:`SUMMARY_EVERY` seconds, and the others' warnings come due again for the next one.
    Clients of different servers never share a line: each may wait for a reason of its own.

    Process-wide and thread-safe (every client's I/O thread reports here); it holds the
    clients weakly, so a client that is dropped without closing leaves no trace.
    """

    def __init__(self, every: float = SUMMARY_EVERY) -> None:
        self.every = every
        self._forget()

    def _forget(self) -> None:
        """Start empty. Also a forked child's first step (see _after_fork_in_child)."""
        self._lock = threading.Lock()
        self._clients: weakref.WeakSet[Reachability] = weakref.WeakSet()
        # The clients not connected, by server (Reachability.server).
        self._waiting: dict[str, weakref.WeakSet[Reachability]] = {}
        self._summary_at: dict[str, float] = {}  # by server: when its last line was logged

    def _waiting_for(self, server: str) -> weakref.WeakSet[Reachability]:
        group = self._waiting.get(server)
        if group is None:
            group = self._waiting[server] = weakref.WeakSet()
        return group

    def add(self, client: Reachability) -> None:
        """A new client: it counts, and waits until it connects."""
        with self._lock:
            self._clients.add(client)
            self._waiting_for(client.server).add(client)

    def lost(self, client: Reachability) -> None:
        with self._lock:
            self._waiting_for(client.server).add(client)

    def connected(self, client: Reachability) -> None:
        with self._lock:
            self._waiting_for(client.server).discard(client)

    def remove(self, client: Reachability) -> None:
        """The client closed: it neither waits nor counts any longer."""
        with self._lock:
            self._waiting_for(client.server).discard(client)
            self._clients.discard(client)

    def waiting(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._waiting.values())

    def warn(self, client: Reachability, warning: StallWarning, now: float,
             sentence: str) -> None:
        """``client``'s warning is due now (``sentence``: what it waits for): log it, or a
        summary of every waiting client, or nothing (a line was logged a moment ago, and this
        client's warning comes due again for the next one)."""
        server = client.server
        with self._lock:
            group = self._waiting_for(server)
            count = len(group)
            last = self._summary_at.get(server)
            if count > 1 and last is not None and now - last < self.every:
                warning.summarized = True
                warning.defer(now, last + self.every - now)
                return
            # An own line counts too: one line per interval for each server's clients.
            self._summary_at[server] = now
            line = None  # alone: its own line
            if count > 1:
                waiting = list(group)
                count = len(waiting)
                oldest = now - min(other.unreachable_since or now for other in waiting)
                reached = sum(1 for other in waiting if other.attempt_reached_server)
                line = (f"{count} of {len(self._clients)} clients in this process are not "
                        f"connected to their server, the oldest for {oldest:.0f} s ({reached} "
                        f"connected and waiting for the netq handshake, {count - reached} "
                        f"not connected yet); one line for all every {self.every:g} s; "
                        f"for example: {sentence}")
        if line is None:
            warning.summarized = False
            LOGGER.warning("netq client: %s; put(), get() and the futures of puts wait for it",
                           sentence)
        else:
            warning.summarized = True
            LOGGER.warning("netq clients: %s", line)


WAITING_CLIENTS = WaitingClients()
"""This process's clients that cannot reach their server (see :class:`WaitingClients`)."""


def _after_fork_in_child() -> None:
    # The parent's clients do not run in the child (they raise UsedInForkedChild), and another
    # thread of the parent may have held the lock at the fork: a fresh, empty one.
    WAITING_CLIENTS._forget()


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


class BudgetView(Protocol):
    """What the sentences read of the receive budget (netq.credit.ReceiveBudget)."""

    @property
    def held_bytes(self) -> int:
        """Received from all peers and not yet consumed: queued, or handed out by the last
        get() (:attr:`taken_bytes`)."""

    def taken_bytes(self) -> int:
        """Of :attr:`held_bytes`, what the last get() handed out: counted until the next
        get() call, as its caller may still hold it."""

    @property
    def budget_bytes(self) -> int:
        """recv_budget."""

    @property
    def outstanding_bytes(self) -> int:
        """Credit granted to peers and not yet used by them (what may still arrive)."""

    @property
    def waiting_peers(self) -> int:
        """Peers whose credit the budget capped (they wait for get())."""

    def share(self) -> int:
        """Each peer's share of recv_budget, in bytes."""

    def starved_sessions(self) -> list[PeerSession]:
        """The peers the budget holds back with no credit left."""

    @property
    def full_since(self) -> float | None:
        """Monotonic time since which the budget has been too full to grant credit."""

    def watch(self, now: float) -> tuple[StallWarning | None, float]:
        """The budget's stall (None when not full) and seconds until a warning could be due."""


class ConnectView(Protocol):
    """What the sentences read of the transport (netq.contract.LoopAPI)."""

    def connect_target(self) -> str:
        """Client: where connection attempts go."""

    def connect_state(self) -> str | None:
        """Client: what stands between us and the server, if the transport knows more."""

    @property
    def watches_peer_host(self) -> bool:
        """Client: a slow handshake on a connected link is waited for (its carrier notices
        a server host that stops answering)."""


class GetterView(Protocol):
    """What the sentences read of the get() side (netq.contract.Inbox)."""

    @property
    def getters(self) -> int:
        """get() calls waiting now."""

    @property
    def waiting_since(self) -> float | None:
        """Monotonic time since which get() has waited with nothing taken, or None."""


class Diagnostics:
    """The sentences: why a wait lasts and what would end it (reads engine state only)."""

    def __init__(self, *, server: bool, options: CommunicatorOptions, peers: PeerDirectory,
                 budget: BudgetView, loop: ConnectView,
                 reachability: Reachability | None, getters: GetterView) -> None:
        self._server = server
        self._options = options
        self._peers = peers
        self._budget = budget
        self._loop = loop
        self._reach = reachability
        self._getters = getters
        self._stall_warning = options.connection.stall_warning
        self._get_warned_for: float | None = None  # the get() wait already warned about

    def watch(self, now: float, stopping: bool) -> float:
        """Say what waits for too long (a client with no server, a full receive budget) in a
        WARNING; returns seconds until the next look (I/O thread, with the timers)."""
        next_check = self._stall_warning
        unreachable = self._reach.unreachable if self._reach is not None else None
        if unreachable is not None and not stopping:
            wait = unreachable.until_due(now)
            if wait > 0:
                next_check = wait
            elif unreachable.due(now):
                assert self._reach is not None
                WAITING_CLIENTS.warn(self._reach, unreachable, now, self.explain_unreachable(now))
        full, wait = self._budget.watch(now)
        if full is not None and wait <= 0 and full.due(now):
            LOGGER.warning("netq %s: %s", "server" if self._server else "client",
                           self.explain_budget(now - full.since))
        elif wait > 0:
            next_check = min(next_check, wait)
        since = self._getters.waiting_since
        if self._server and since is not None and self._getters.getters \
                and since != self._get_warned_for:
            due = since + self._stall_warning - now
            if due > 0:
                next_check = min(next_check, due)
            elif not stopping and not self._any_client_connected():
                self._get_warned_for = since
                LOGGER.warning("netq server: %s", self.get_wait(now))
        return max(next_check, 0.05)

    def _any_client_connected(self) -> bool:
        # Looked at on every look at the timers while a get() waits: it stops at the first
        # connected session instead of counting thousands of them.
        return any(session.state is PeerState.CONNECTED for session in self._peers.all())

    def _connected_clients(self) -> int:
        return sum(1 for session in self._peers.all() if session.state is PeerState.CONNECTED)

    def empty_after(self, timeout: float, named: int) -> str:
        """:func:`explain_empty` for this communicator now."""
        reach = self._reach
        unreachable = ""
        if reach is not None:
            unreachable = self._loop.connect_state() or ""
            if not unreachable and reach.failures:
                error = reach.connect_error or "no reason given"
                unreachable = f"the last attempt failed with: {error}"
        return explain_empty(timeout, server=self._server, connected=self._connected_clients(),
                             named=named, unreachable=unreachable)

    def get_wait(self, now: float) -> str:
        """For statistics() and the server's WARNING: what a get() that has waited
        ``stall_warning`` seconds or more waits for ("" when none has)."""
        since = self._getters.waiting_since
        if since is None or not self._getters.getters or now - since < self._stall_warning:
            return ""
        # Since the last message taken, with get() waiting now: a wait that timed out and a
        # later one count as one (a loop of get(timeout=) that finds nothing is one wait).
        waited = f"get() waits and has returned no message for {now - since:.0f} s"
        connected = self._connected_clients()
        if not self._server:
            if not connected:
                return (f"{waited}; the server is not connected: it returns once the client "
                        f"reconnects and the server puts one")
            return (f"{waited}; the server is connected: it returns when the server puts "
                    f"one (get(timeout=) gives up after that many seconds)")
        if not connected:
            return (f"{waited}; no client is connected: it returns when a client connects and "
                    f"puts one (get(timeout=) gives up after that many seconds)")
        return (f"{waited}; {connected} client{'s are' if connected > 1 else ' is'} "
                f"connected: it returns when one of them puts one")

    def explain_send_wait(self, session: PeerSession) -> str:
        """Why messages to ``session`` are not moving, and what would change it."""
        now = time.monotonic()
        count = len(session.outbox)
        # One figure for the unsent bytes: the payload, as statistics() shows it (queue_out_bytes).
        unsent = (f"{count} message{'s' if count != 1 else ''} of "
                  f"{format_bytes(session.unsent_bytes)}")
        connection = self._options.connection
        inflight = len(session.inflight)
        budget = (f"send_budget={format_bytes(connection.send_budget)}, which counts "
                  f"{QUEUED_MESSAGE_COST} B more per queued message; "
                  f"{count + inflight} of send_messages={connection.send_messages} held, "
                  f"{inflight} of them sent and not yet acknowledged")
        link = session.link
        if session.state is PeerState.CLOSED:
            return f"peer {name_of(session.id)} is gone"
        if link is None or session.state is not PeerState.CONNECTED:
            if not self._server:
                return (f"{unsent} unsent ({budget}): "
                        f"{self.explain_unreachable(now)}")
            since = session.disconnected_at or now
            return (f"{unsent} unsent to peer {name_of(session.id)} ({budget}), whose link "
                    f"broke {now - since:.0f} s ago; its session waits session_timeout="
                    f"{self._options.connection.session_timeout:g} s for it to reconnect")
        conn = link.conn
        if not conn.can_send_data:
            since = session.credit_exhausted_since or now
            return (f"peer {name_of(session.id)} has granted no credit for {now - since:.0f} s: it "
                    f"holds what we sent unread, because its code is not calling get() (or "
                    f"takes messages slower than we send them: while it takes them it grants "
                    f"a window ahead, not its whole recv_budget; or its recv_budget is full "
                    f"of other peers' messages); {unsent} wait here "
                    f"({budget}). It changes when the peer calls get(); "
                    f"put(timeout=) or put(block=False) raise Full instead of waiting"
                    f"{_peer_in_this_process(session.id)}")
        return (f"{unsent} unsent to peer {name_of(session.id)} ({budget}): the link "
                f"takes them slower than put() queues them")

    def explain_unreachable(self, now: float) -> str:
        """Client: what connecting to the server has run into so far (counts that are true:
        attempts started, the one under way and how far it got, the last failure's reason),
        in the transport's own terms where it has them (an MQTT broker without a live server)."""
        reach = self._reach
        assert reach is not None, "a server has no server to reach"
        where = self._loop.connect_target()
        since = reach.unreachable_since or now
        attempts, failures = reach.attempts, reach.failures
        started = reach.attempt_started_at
        error = reach.connect_error
        state = self._loop.connect_state()
        if state is not None:
            progress = state
            if failures:
                progress += (f"; {failures} attempt{'s' if failures > 1 else ''} failed, the "
                             f"last with: {error or 'no reason given'}")
        elif started is not None:
            stage = ("connected, the netq handshake is not finished yet"
                     if reach.attempt_reached_server else "TCP connect not completed yet")
            if reach.attempt_reached_server and self._loop.watches_peer_host:
                stage += (": the server's host answers, its netq has not yet (busy with a "
                          "storm of others, stuck, or not a netq server); the client keeps "
                          "its place in the server's queue for up to session_timeout")
            progress = f"attempt {attempts} in progress for {now - started:.0f} s: {stage}"
            if failures:
                progress += f"; {failures} failed before it, the last with: {error}"
        elif attempts:
            progress = (f"{attempts} attempt{'s' if attempts > 1 else ''}; last failed with: "
                        f"{error or 'no reason given'}")
        else:
            progress = "no attempt has ended yet"
        return (f"not connected to the server at {where} for {now - since:.0f} s "
                f"({progress}); netq keeps retrying every "
                f"{self._options.connection.reconnect_max:g} s at most")

    def explain_close_wait(self, now: float, goodbye_deadline: float | None = None) -> str:
        """What close() is still waiting for. ``goodbye_deadline``: a client's goodbye is
        unfinished, and it tries to finish it until then (monotonic seconds)."""
        if goodbye_deadline is not None:
            return self._explain_goodbye(now, goodbye_deadline)
        sessions = self._peers.all()
        waiting = [s for s in sessions
                   if s.state is not PeerState.CLOSED and (s.outbox or s.inflight)]
        if waiting:
            unacked = sum(s.unsent_bytes + s.inflight_bytes() for s in waiting)
            first = waiting[0]
            reason = (self.explain_send_wait(first) if first.outbox
                      else f"peer {name_of(first.id)} has not acknowledged what is on the wire")
            return (f"waiting for {len(waiting)} peer(s) to acknowledge "
                    f"{format_bytes(unacked)}; {reason}. close(timeout=) gives up after "
                    f"that many seconds")
        if self._server:
            live = [s for s in sessions if s.state is not PeerState.CLOSED]
            if live:
                return (f"waiting for {len(live)} client(s) to close (a client that "
                        f"vanished is given up after session_timeout="
                        f"{self._options.connection.session_timeout:g} s); close(timeout=) "
                        f"ends them sooner")
        return "saying goodbye"

    def _explain_goodbye(self, now: float, deadline: float) -> str:
        session = self._peers.server_session
        if session is None or session.state is PeerState.CONNECTED \
                or session.disconnected_at is None:
            return "saying goodbye: waiting for the server's BYE"
        left = (f"; it stops trying in {max(deadline - now, 0.0):.0f} s"
                if deadline != float("inf") else "")
        return (f"finishing its goodbye: the link broke before the server's BYE came back, so "
                f"the server may not know what this client received (it would keep the "
                f"session for session_timeout and send that again to the next client with "
                f"this id); {self.explain_unreachable(now)}{left}. close(timeout=) gives up "
                f"after that many seconds")

    def explain_budget(self, full_for: float) -> str:
        """The receive budget has had no room for ``full_for`` seconds: what fills it (held
        messages, or credit promised to other peers), and which peers wait, each against its
        share."""
        budget = self._budget
        held, promised = budget.held_bytes, max(budget.outstanding_bytes, 0)
        taken = min(budget.taken_bytes(), held)
        waiting = sorted(budget.starved_sessions(), key=lambda s: s.held_bytes, reverse=True)
        shown = "; ".join(f"{name_of(s.id)}: {self._against_share(s)}" for s in waiting[:3])
        more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
        peers = len(waiting)
        # The bytes the last get() handed out are named apart: no get() has to take them,
        # the next get() call frees them.
        handed_out = (f", {format_bytes(taken)} was handed out by the last get() (it counts "
                      f"until the next get() call, as its caller may still hold it)"
                      if taken else "")
        return (f"the receive budget has had no room for {full_for:.0f} s: of recv_budget="
                f"{format_bytes(budget.budget_bytes)}, {format_bytes(held - taken)} is received "
                f"and not taken by get(){handed_out} and {format_bytes(promised)} is credit "
                f"granted to peers that have not used it yet. {peers} "
                f"peer{'s have' if peers != 1 else ' has'} no credit left ({shown}{more}): "
                f"what {'they send' if peers != 1 else 'it sends'} next waits until get() is "
                f"called again, or with a larger ConnectionOptions.recv_budget")

    def _against_share(self, session: PeerSession) -> str:
        """``session``'s received bytes against its share of the budget, in one figure (the
        ``memory`` statistics() shows for that peer)."""
        share = self._budget.share()
        held = session.held_bytes
        if held >= share:
            return (f"its share is full, {format_bytes(held)} held of "
                    f"{format_bytes(share)} (a message may start on the last of its credit, "
                    f"so a share holds up to one message more)")
        return (f"{format_bytes(held)} held of its {format_bytes(share)} share; the rest "
                f"of the budget is promised to other peers")

    def peer_blocked(self, session: PeerSession, now: float) -> tuple[str, float]:
        """For statistics(): ("" or why traffic with this peer waits, for how many seconds)."""
        if session.blocked_since is not None:
            return self.explain_send_wait(session), now - session.blocked_since
        exhausted = session.credit_exhausted_since
        if exhausted is not None and session.outbox and now - exhausted >= self._stall_warning:
            return self.explain_send_wait(session), now - exhausted
        full_since = self._budget.full_since
        if session.credit_waiting and full_since is not None:
            return (f"waits for credit from recv_budget: {self._against_share(session)}",
                    now - full_since)
        reach = self._reach
        if reach is not None and session.state is not PeerState.CONNECTED:
            since = reach.unreachable_since
            if since is not None and now - since >= self._stall_warning:
                return self.explain_unreachable(now), now - since
        return "", 0.0
