"""The inboxes get() takes from: one per peer, served round-robin, filled by the engine.

:class:`Inboxes` is the queue API's receive side. The engine hands complete messages to it
on the I/O thread (the :class:`netq.contract.Inbox` methods: ``deliver``, ``wake_all``);
what the loop reads of it (``consumer_waiting``, ``sleepers``, ``ready``) it keeps in the
:class:`netq.contract.LoopSignals` it shares with the engine and the loop. A ``get()``
takes the next one, fairly across peers, and while it waits it may run the I/O loop itself
(leader/followers, ``IOLoop.lead``), spin briefly, or sleep on a condition the engine
notifies. A message taken is lent by the receive budget until the next ``get()``
(netq.credit.ReceiveBudget.lend); one given back after a failed ``get()`` counts as held
again. The communicator opens (deserializes) what it takes, on the caller's thread.

A ``get()`` that finds a message takes one lock round trip and one call into the budget
(:meth:`netq.credit.ReceiveBudget.settle_lent`); one that waits leads the loop through the
transport's ``lead`` directly (:class:`netq.contract.LoopAPI`). What it reads of the
engine's state on the way are plain attributes, looked at only when nothing was found.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .contract import LoopAPI, LoopSignals
from .credit import ReceiveBudget
from .engine import SessionEngine
from .exceptions import ConnectionLost, Empty, ResourceClosed
from .protocol.events import MessageReceived
from .session import PeerSession, PeerState

__all__ = ("Inboxes",)

_clock = time.perf_counter
_new_lock = threading.Lock
_sleep = time.sleep


class Inboxes:
    """Every peer's inbox, the peers that have something (in the round-robin order get()
    serves them), and the get() calls waiting. Thread-safe: one lock for all of it."""

    def __init__(self, spin: float, signals: LoopSignals) -> None:
        self._spin = spin  # seconds a get() busy-polls before it leads the loop or sleeps
        self._lock = threading.Lock()
        # The locks of the get() calls asleep, oldest first: each sleeps on its own locked lock
        # and whoever hands it a message pops and releases it (a condition variable's
        # protocol, without its Python methods on both threads of every hand-over).
        self._gates: collections.deque[Any] = collections.deque()
        self._getters = 0  # get() calls waiting for a message (sleeping or leading the loop)
        # What the loop reads of us on every read and turn (plain data, never a call):
        # consumer_waiting (_getters > 0); sleepers, the get() calls asleep on a gate (_gates:
        # a hand-over wakes them), with ready: a get() asleep with nothing to take does not
        # lead the loop, so a parked I/O thread must run it (one handed a message wakes and
        # takes it).
        self._signals = signals
        # time.monotonic() when get() began waiting with nothing taken since (None when a
        # message was taken and no get() waits): the diagnostics say what such a wait is for.
        self.waiting_since: float | None = None
        self._adapter_getters = 0  # adapters' get() calls waiting (adapter_waits)
        # The peers with messages to take, in the order get() serves them (read only outside).
        self.ready: collections.deque[PeerSession] = signals.ready
        self._listeners: list[Callable[[], None]] = []
        self._engine: SessionEngine | None = None

    def attach(self, engine: SessionEngine) -> None:
        """The engine that fills these inboxes (made after them: it takes them as its Inbox)."""
        self._engine = engine
        self._budget: ReceiveBudget = engine.budget
        loop: LoopAPI = engine.loop
        # A blocked get() may run the I/O loop itself (leader/followers; IOLoop.lead).
        self._caller_leads: bool = loop.caller_leads
        self._lead = loop.lead
        self._wake_io = loop.wake  # settling what get() lent scheduled credit to send
        # A get() went to sleep: a loop parked for callers must run again (IOLoop.lead).
        self._unpark_io = loop.unpark
        # A client's one session (the server), fixed for its life; None on a server.
        self._server_session: PeerSession | None = engine.peers.server_session

    @property
    def getters(self) -> int:
        """get() calls waiting now (asleep or leading the loop, or in an adapter: netq.aio)."""
        return self._getters + self._adapter_getters

    def adapter_waits(self, waiting: bool) -> None:
        """An adapter's get() (netq.aio) began (``True``) or ended a wait outside take():
        it counts for the diagnostics, not for the I/O loop (nothing here can wake it)."""
        with self._lock:
            if waiting:
                self._adapter_getters += 1
                if self.waiting_since is None:
                    self.waiting_since = time.monotonic()
            else:
                self._adapter_getters -= 1

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.remove(listener)

    def push_front(self, session: PeerSession, items: list[Any]) -> None:
        """``items`` (values of an opened batch) go back to the front of ``session``'s inbox,
        and every listener hears of them."""
        with self._lock:
            self._push_front(session, items)
        # Other getters may have looked while this batch was being opened: tell them.
        for listener in list(self._listeners):
            listener()

    def _push_front(self, session: PeerSession, items: list[Any]) -> None:
        """``items`` go to the front of ``session``'s inbox, in order (receive lock held)."""
        session.inbox.extendleft(reversed(items))
        if not session.in_ready:
            session.in_ready = True
            self.ready.appendleft(session)
        if self._signals.sleepers:
            self._wake(len(items))

    def give_back(self, taken: list[tuple[PeerSession, Any]]) -> None:
        """Put messages taken by a get that then failed back at the front of their inboxes.

        ``taken`` in the order they were taken: unopened messages (as _take returned them) and
        values of opened ones. An unopened message's bytes count as held again
        (netq.credit.ReceiveBudget.give_back).
        """
        if not taken:
            return
        budget = self._budget
        with self._lock:
            for session, item in reversed(taken):
                if type(item) is MessageReceived:
                    budget.give_back(session, item.size)
                self._push_front(session, [item])
        for listener in list(self._listeners):
            listener()

    def take(self, peers: tuple[uuid.UUID, ...], block: bool,
              timeout: float | None) -> tuple[PeerSession, Any]:
        """Pop the next raw item, fairly: round-robin over peers with queued messages."""
        engine = self._engine
        assert engine is not None  # attached before the communicator is handed out
        budget = self._budget
        lent = budget.lent
        deadline = None
        spin_until = None
        looked_again = False  # the loop was offered to this get and not taken: sleep next
        with self._lock:
            # What the previous get() handed out is consumed now (netq.credit).
            if lent and budget.settle_lent():
                self._wake_io()
            while True:
                if peers:
                    found = self._take_from(peers)
                    if found is not None:
                        if not self._getters:
                            self.waiting_since = None
                        return found
                else:
                    # The next message of the first peer that has one (inline: the hot path).
                    ready = self.ready
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
                        elif ready[-1] is not session:  # another peer waits too
                            ready.rotate(-1)  # fairness: the next get serves the next peer
                        if type(item) is MessageReceived:  # a batch element: counted with its batch
                            lent.append((session, item.size))  # budget.lend, inline
                        if self.waiting_since is not None and not self._getters:
                            self.waiting_since = None  # the wait ended with a message
                        return session, item
                # The loop ends only after close() began or the I/O thread failed: until one of
                # them, engine.closed cannot be set, and nothing here costs a call.
                if engine.failure is not None:
                    # The I/O thread died ("it broke"), whether or not it has ended yet: the same
                    # ConnectionLost to a get() it wakes as to every later one.
                    engine.raise_if_broken()
                if self._signals.closing and (not block or engine.closed.is_set()):
                    raise ResourceClosed(None, "closed and every received message was taken")
                if engine.fatal is not None:
                    engine.raise_if_broken()
                server = self._server_session
                if server is not None and server.state is PeerState.CLOSED and not server.inbox:
                    if self._signals.closing:  # its BYE answered ours: we closed it
                        raise ResourceClosed(None, "closed and every received message was taken")
                    raise ConnectionLost(server.id, "the server closed the session")
                if not block:
                    raise Empty()
                if timeout is not None:
                    now = time.monotonic()
                    if deadline is None:
                        deadline = now + timeout
                    remaining: float | None = deadline - now
                    assert remaining is not None
                    if remaining <= 0:
                        raise Empty(engine.diagnostics.empty_after(timeout, len(peers)))
                else:
                    remaining = None
                if self._spin:
                    if spin_until is None:
                        spin_until = _clock() + self._spin
                    if _clock() < spin_until:
                        # Busy-poll briefly, letting the I/O thread have the GIL: a message
                        # that arrives within the spin is taken without a thread wake-up.
                        self._lock.release()
                        try:
                            _sleep(0)
                        finally:
                            self._lock.acquire()
                        continue
                # A client with no server: the engine's WARNING says so (put() and get() wait
                # for it), once for everything that waits on the connection. Any other long
                # wait is explained from waiting_since (netq.diagnostics.Diagnostics.get_wait).
                if self.waiting_since is None:
                    self.waiting_since = time.monotonic()
                self._getters += 1
                self._signals.consumer_waiting = True
                try:
                    if self._caller_leads and not looked_again and (
                            not peers or server is not None):
                        # Run the I/O loop here if the I/O thread has left it to callers: the
                        # message is then read on this thread, with no hand-over wake-up.
                        self._lock.release()
                        try:
                            led = self._lead(remaining, self.ready.__len__)
                        finally:
                            self._lock.acquire()
                        # Look again either way: while the lock was released, a message
                        # the I/O thread delivered, or close(), notified nobody (no sleepers).
                        looked_again = not led
                        continue
                    signals = self._signals
                    signals.sleepers += 1
                    if signals.held_acks and not signals.release_acks:
                        # Back without a put(): the ACKs held for a reply need not wait out
                        # their hold (a wait for I/O rounds it up to a millisecond). The wake
                        # unparks a parked I/O thread too.
                        signals.release_acks = True
                        self._wake_io()
                    elif self._caller_leads:
                        self._unpark_io()  # nobody may be polling: the I/O thread must
                    gate = _new_lock()
                    gate.acquire()
                    self._gates.append(gate)
                    woken = False
                    self._lock.release()
                    try:
                        woken = gate.acquire(True, -1 if remaining is None else remaining)
                    finally:
                        self._lock.acquire()
                        self._signals.sleepers -= 1
                        if not woken:
                            try:
                                self._gates.remove(gate)
                            except ValueError:
                                pass  # popped by a hand-over as the wait ended: woken anyway
                    looked_again = False  # woken: this get may lead the loop again
                finally:
                    self._getters -= 1
                    self._signals.consumer_waiting = self._getters > 0

    def _wake(self, count: int) -> None:
        """Wake up to ``count`` sleeping get() calls, oldest first (receive lock held)."""
        gates = self._gates
        for _ in range(min(count, len(gates))):
            gates.popleft().release()

    def _take_from(self, peers: tuple[uuid.UUID, ...]) -> tuple[PeerSession, Any] | None:
        assert self._engine is not None
        for session in self._engine.peers.resolve(peers, sending=False):
            if session.inbox:
                item = session.inbox.popleft()
                if type(item) is MessageReceived:
                    self._budget.lend(session, item.size)
                return session, item
        return None

    # ------------------------------------------------------------------ the engine's side

    def deliver(self, session: PeerSession, messages: list[MessageReceived]) -> None:
        """The engine's hand-over of complete messages (I/O thread)."""
        with self._lock:
            session.inbox.extend(messages)
            if not session.in_ready:
                session.in_ready = True
                self.ready.append(session)
            if self._signals.sleepers:
                gates = self._gates  # _wake(len(messages)), inline: once per read
                for _ in range(min(len(messages), len(gates))):
                    gates.popleft().release()
        for listener in self._listeners:
            listener()

    def wake_all(self) -> None:
        with self._lock:
            self._wake(len(self._gates))
        for listener in list(self._listeners):
            listener()

