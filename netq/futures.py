"""``DeliveryFuture``: the future ``put()`` returns, cheap enough for one per message.

A stock :class:`concurrent.futures.Future` builds a ``threading.Condition`` (and its RLock) and
two lists in ``__init__``, for a lock that nobody waits on when the caller never calls
``result()``. This subclass creates the condition and the waiter list on first use, keeps the
done-callbacks in a class-level empty tuple until one is added, and holds no other container
the cyclic garbage collector would track. That matters as much as the allocations: every
message in flight has a future, and each tracked object that outlives a young collection is
traversed again by the older ones, so a window of thousands of small messages made the
collector a large share of a put's CPU. It stays a real ``concurrent.futures.Future``:
``asyncio.wrap_future``, ``concurrent.futures.wait`` and ``as_completed`` accept it, because
every path that needs the condition or the waiters goes through the lazy ``_condition`` and
``_waiters`` properties.

What those helpers and the inherited ``done()``, ``result()``, ``exception()`` read is the
stdlib's own protocol between a future and its waiters: ``_condition``, ``_waiters``,
``_state``, ``_result``, ``_exception``. Its state values are plain strings, compared by
equality; this module spells them itself (:data:`PENDING` ... :data:`FINISHED`) rather than
importing them from the private ``concurrent.futures._base``, and tests/test_futures.py checks
them against the states a stock ``Future`` takes. Only this class writes ``_state``, so its own
comparisons use ``is``.

A future knows the queues its message waits in (``SendQueue``: a
:class:`~netq.session.PeerSession` is one, and this module does not know it), to tell them
"withdraw me" when the put is cancelled; what a queue holds and how it drops a message is the
queue's.

Start and cancel race lock-free for the right to decide a message's fate: each of them
appends its kind to the future's ``start_gate`` (if it is empty) and reads the first entry
back (``bytearray.append`` is atomic under the GIL), so every thread agrees on who came first,
whether another start (send it too) or a cancel (skip it). A broadcast is started by several
threads at once (the I/O thread and a caller writing directly to an idle socket), so "someone
else was first" must never be taken for "cancelled". The gate and :data:`STARTED` are public
for the engine's pump, which starts every message it sends and does so inline (a call per
message fewer); :meth:`DeliveryFuture._start` is the same rule as a method.

Resolving takes no lock either. Two ``dict.setdefault`` calls on the instance's ``__dict__``
(each one atomic: string keys, no Python code runs inside) decide it:

1. ``_outcome``: the first resolver's ``(state, exception)`` goes in; a later one finds
   another claim there and gives up, so a future resolves once and only its resolver ever
   writes ``_state``.
2. ``_cond``: the resolver puts :data:`_UNWATCHED` there unless a condition is there first.
   With a condition, it publishes the state under it and tells the waiters
   (``concurrent.futures.wait()`` and ``result()``). Without one, nobody can be waiting, and
   whoever makes a condition later (:attr:`_condition`) finds the marker and publishes the
   state from ``_outcome`` before anyone can wait on it.

So a waiter either sees the new state or is told through the condition, never both (which
would count the future twice in ``wait()``) and never neither.

A future nobody can watch is not resolved at all: when the peer acknowledges a message that
nothing outside its queue refers to, whose future only that message refers to (the caller
dropped what ``put()`` returned) and has no done-callback and no weak reference, nothing could
ever see the future's state, and the session drops the message without resolving it
(:meth:`netq.session.PeerSession.acknowledge`). ``add_done_callback()``,
``asyncio.wrap_future``, ``concurrent.futures.wait`` and ``result()`` all hold the future or
register a callback first, so every future anyone waits on resolves as before.

``result()`` does not use the condition: a caller waiting for its put's acknowledgement
appends a locked lock of its own to ``_gates`` and then looks at ``_outcome`` again; the
resolver claims ``_outcome`` first and then releases every lock in ``_gates``. So the waiter
either finds the claim or is in the list the resolver walks, and waits on a lock (one C call)
instead of a condition's Python methods on both threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any, Protocol

from .exceptions import BroadcastIncomplete, ResourceGone

__all__ = ("DeliveryFuture", "SendQueue", "STARTED")

# The states of concurrent.futures.Future (its _state), which its inherited methods and
# wait()/as_completed() compare against by value. RUNNING is never written here: running() is
# answered from the gate.
PENDING = "PENDING"
CANCELLED = "CANCELLED"
CANCELLED_AND_NOTIFIED = "CANCELLED_AND_NOTIFIED"
FINISHED = "FINISHED"

LOGGER = logging.getLogger("netq")
_CREATE = threading.Lock()  # taken by whoever makes a future's condition (waiters only)
_new_lock = threading.Lock  # a result() waiter's own lock (see the module docstring)
_UNWATCHED = object()  # in _cond: resolved while no condition existed (see the module docstring)
STARTED = 1  # start_gate entries: a sender's (see the module docstring)
_CANCELLED = 2


class SendQueue(Protocol):
    """A queue a put's message waits in (:class:`netq.session.PeerSession`, one per addressed
    peer): told to drop it at once when the put is cancelled before it reached the wire."""

    def withdraw(self, future: DeliveryFuture) -> None:
        """Drop the message of ``future`` if it is still queued here (any thread)."""

    def waiting_for(self, future: DeliveryFuture) -> str | None:
        """Why the peer has not acknowledged the message of ``future`` (a clause), or None
        when this queue holds no copy of it any more (any thread)."""


class DeliveryFuture(Future):
    """Resolves when every addressed peer has acknowledged the message.

    ``remaining`` counts the peers still to answer (a broadcast is one future). The I/O
    thread calls :meth:`_delivered` once per peer that acknowledged it and :meth:`_fail_peer`
    once per peer that never will. A future for one peer resolves at its answer; a broadcast's
    once every addressed peer has answered: with no error when all acknowledged, else with a
    :class:`~netq.exceptions.BroadcastIncomplete` that says how many did and why each other
    one did not. :meth:`_fail` fails the whole future at once (put() refused the message).

    A failure does not stop the message: a broadcast still goes to every peer it was queued
    for whose session lasts. Only ``cancel()`` withdraws it, and
    only before any peer's copy went on the wire; after a successful ``cancel()`` the message
    leaves its ``queues`` (``SendQueue``: the sessions of the peers ``put`` addressed) at
    once, so a cancelled put holds no memory and no room in the send window.

    ``_state`` stays PENDING until the future resolves (``running()`` is answered from the
    gate instead). Only the resolver writes it, and whoever makes the condition after an
    unwatched resolution (with the resolver's outcome).
    """

    # Class defaults: what most futures never change costs no per-instance object;
    # add_done_callback() makes a list.
    _done_callbacks: Sequence[Callable[[Future[Any]], object]] = ()
    _result = None
    _exception = None
    _cond: Any = None  # a threading.Condition once someone waits, or _UNWATCHED
    _waiter_list: list[Any] | None = None
    _addressed = 1  # a broadcast sets the number of peers it was put to
    _failures: list[tuple[Any, Exception]] | None = None  # a broadcast's peers that failed

    def __init__(self, remaining: int = 1,
                 queues: Sequence[SendQueue] = ()) -> None:  # no super(): no Condition yet
        self._state = PENDING
        # STARTED / _CANCELLED, in the order they came: the first one decides. A bytearray,
        # not a list: its append is as atomic, and it holds no references, so the cyclic GC
        # never tracks it (a put makes one future per message; see the module docstring).
        self.start_gate = bytearray()
        self.remaining = remaining
        # Where the message waits: the queues of the peers put() addressed (adapters address
        # none), told to withdraw it on cancel(). Set here, always, so that every future sets
        # its attributes in one order: CPython then keeps sharing one key table among them,
        # where a future that got an attribute out of that order carries a dict of its own
        # (about 270 bytes more per queued message).
        self._queues = queues
        if remaining > 1:  # after the shared attributes: a broadcast's dict is its own anyway
            self._addressed = remaining

    @property  # Future declares a plain attribute, created in the __init__ we skip
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        """concurrent.futures.wait()/as_completed() install their waiters here (with the
        condition held): made on first use, like the condition."""
        waiters = self._waiter_list
        if waiters is None:
            waiters = self._waiter_list = []
        return waiters

    @property  # Future declares a plain attribute, created in the __init__ we skip
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None or cond is _UNWATCHED:
            with _CREATE:
                slots = self.__dict__
                cond = slots.get("_cond")
                if cond is None:
                    made = threading.Condition()
                    cond = slots.setdefault("_cond", made)  # a resolver may mark it first
                if cond is _UNWATCHED:
                    # Resolved before anyone waited: publish the outcome before anyone can.
                    state, exception = slots["_outcome"]
                    self._exception = exception
                    self._state = state
                    cond = slots["_cond"] = threading.Condition()
        return cond

    def _finish(self, state: str, exception: BaseException | None) -> bool:
        """Resolve (FINISHED or CANCELLED_AND_NOTIFIED); False if it was resolved already."""
        claim = (state, exception)
        slots = self.__dict__
        if slots.setdefault("_outcome", claim) is not claim:
            return False
        self._settle(slots.setdefault("_cond", _UNWATCHED), state, exception)
        return True

    def _settle(self, cond: Any, state: str, exception: BaseException | None) -> None:
        """The claimed outcome: publish it (under ``cond`` if a waiter made one: notify it),
        then run the callbacks."""
        if cond is _UNWATCHED:
            if exception is not None:  # None is the class default
                self._exception = exception
            self._state = state
        else:
            with cond:
                self._exception = exception
                self._state = state
                for waiter in self._waiters:
                    if state is not FINISHED:
                        waiter.add_cancelled(self)
                    elif exception is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                cond.notify_all()
        gates = self.__dict__.get("_gates")
        if gates:
            for gate in list(gates):  # result() waiters (see the module docstring)
                gate.release()
        if self._queues:
            self._queues = ()  # a finished future does not keep the peers' queues alive
        callbacks = self._done_callbacks
        if callbacks:
            self._done_callbacks = ()
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # the stdlib logs and carries on; so do we
                LOGGER.exception("exception calling callback for %r", self)

    def add_done_callback(self, fn) -> None:
        with self._condition:
            if self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                self._done_callbacks = [*self._done_callbacks, fn]
                return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    def running(self) -> bool:
        gate = self.start_gate
        return bool(gate) and gate[0] == STARTED and self._state is PENDING

    # -- the I/O thread's side ----------------------------------------------------------

    def _start(self) -> bool:
        """A copy goes on the wire; False only if the caller cancelled the put first."""
        gate = self.start_gate
        if not gate:
            gate.append(STARTED)
        return gate[0] == STARTED

    def _delivered(self) -> None:
        """One addressed peer acknowledged the message."""
        remaining = self.remaining = self.remaining - 1
        if remaining > 0:
            return
        if self._failures:
            self._broadcast_answered()
            return
        # _finish(FINISHED, None), its claims inline: one call per acknowledged message.
        claim = (FINISHED, None)
        slots = self.__dict__
        if slots.setdefault("_outcome", claim) is not claim:
            return
        cond = slots.setdefault("_cond", _UNWATCHED)
        if cond is _UNWATCHED:
            # Nobody waits, and no callback can be registered: add_done_callback() makes the
            # condition first, and one made from now on publishes FINISHED to it.
            self._state = FINISHED
            if self._queues:
                self._queues = ()
            gates = slots.get("_gates")
            if gates:
                for gate in list(gates):  # result() waiters (see the module docstring)
                    gate.release()
        else:
            self._settle(cond, FINISHED, None)

    def _fail(self, exception: BaseException) -> None:
        """Fail the whole future now (every addressed peer: put() refused the message)."""
        self._finish(FINISHED, exception)

    def _fail_peer(self, exception: Exception, peer: Any) -> None:
        """Addressed peer ``peer`` (its id) will never acknowledge the message."""
        if self._addressed == 1 or (isinstance(exception, ResourceGone) and exception.peer is None):
            # One peer; or this communicator itself closed or broke: nobody else gets it.
            self._finish(FINISHED, exception)
            return
        failures = self._failures
        if failures is None:
            failures = self._failures = []
        failures.append((peer, exception))
        remaining = self.remaining = self.remaining - 1
        if remaining <= 0:
            self._broadcast_answered()

    def _broadcast_answered(self) -> None:
        failures = self._failures or []
        self._finish(FINISHED, BroadcastIncomplete(
            self._addressed - len(failures), self._addressed, failures))

    # -- the caller's side ----------------------------------------------------------------

    def result(self, timeout: float | None = None) -> None:
        """None once every addressed peer acknowledged the message; raises what failed it
        (``CancelledError`` after ``cancel()``), or ``TimeoutError`` after ``timeout`` seconds.

        Waits on a lock of its own that the resolver releases (see the module docstring).
        """
        slots = self.__dict__
        outcome = slots.get("_outcome")
        if outcome is None:
            gate = _new_lock()
            gate.acquire()
            gates = slots.get("_gates")
            if gates is None:
                gates = slots.setdefault("_gates", [])
            gates.append(gate)
            outcome = slots.get("_outcome")  # claimed before our gate was in the list?
            if outcome is None:
                if gate.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
                    outcome = slots["_outcome"]  # claimed before the gates were released
                else:
                    try:
                        gates.remove(gate)
                    except ValueError:
                        pass  # the resolver's copy of the list had it: it releases it
                    outcome = slots.get("_outcome")
                    if outcome is None:
                        raise TimeoutError(self._not_acknowledged(max(timeout or 0.0, 0.0)))
        state, exception = outcome
        if state is not FINISHED:
            raise CancelledError()
        if exception is not None:
            try:
                raise exception
            finally:
                exception = None  # no cycle through this frame's traceback
        return None

    def _not_acknowledged(self, timeout: float) -> str:
        """What result(timeout=) ran out waiting for, peer by peer."""
        waits = [(queue, why) for queue in self._queues
                 if (why := queue.waiting_for(self)) is not None]
        text = f"put()'s message was not acknowledged within {timeout:g} s"
        if self._addressed > 1:
            text += f" by {self.remaining} of the {self._addressed} peers it went to"
        if not waits:
            return text
        if self._addressed == 1:
            return f"{text}: {waits[0][1]}"
        return f"{text}: " + "; ".join(f"peer {getattr(queue, 'id', queue)}: {why}"
                                        for queue, why in waits)

    def cancel(self) -> bool:
        """Withdraw a put that no peer's copy of is on the wire yet; False once one is."""
        gate = self.start_gate
        if not gate:
            gate.append(_CANCELLED)
        if gate[0] != _CANCELLED:
            return False  # started first: it is on the wire
        # From here on no peer sends it. Out of the queues first, so done-callbacks already
        # see it gone from statistics(). A failure that resolved it first keeps its word (and
        # _finish has emptied _queues: a second cancel() withdraws nothing).
        try:
            for queue in self._queues:
                queue.withdraw(self)
        finally:
            self._finish(CANCELLED_AND_NOTIFIED, None)
        return self._state is CANCELLED_AND_NOTIFIED

    def set_running_or_notify_cancel(self) -> bool:
        return self._start()

    def set_result(self, result) -> None:
        """Adapters only: resolve as delivered."""
        if self._start():
            self._finish(FINISHED, None)

    def set_exception(self, exception) -> None:
        self._fail(exception)

    def __repr__(self) -> str:
        return f"<DeliveryFuture state={self._state} remaining={self.remaining}>"
