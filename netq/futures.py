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

Start and cancel race lock-free for the right to decide a message's fate: each of them
appends its kind to the future's ``_gate`` and reads the first entry back (``bytearray.append``
is atomic under the GIL), so every thread agrees on who came first, whether another start (send
it too) or a cancel (skip it). A broadcast is started by several threads at once (the I/O
thread and a caller writing directly to an idle socket), so "someone else was first" must
never be taken for "cancelled". Resolving is claimed once, by popping the one-byte ``_ticket``,
and only the claimant writes ``_state``; nothing else ever writes it, so a late start cannot
reopen a resolved future.

Ordering argument for waiting: the resolver writes ``_state`` before it looks for a
condition; a waiter creates the condition before it reads ``_state`` under that condition.
Either the resolver sees the condition (and notifies under it) or the waiter sees the new
state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures._base import (  # the states Future's own methods compare against
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .session import PeerSession

__all__ = ("DeliveryFuture",)

LOGGER = logging.getLogger("netq")
_CREATE = threading.Lock()  # only taken the first time a future's condition is needed
_STARTED = 1  # _gate entries
_CANCELLED = 2


class DeliveryFuture(Future):
    """Resolves when every addressed peer has acknowledged the message.

    ``remaining`` counts the peers still to acknowledge (a broadcast is one future). The I/O
    thread calls :meth:`_delivered` once per peer and :meth:`_fail` on loss; the first failure
    wins and later outcomes are ignored, so the future resolves exactly once.

    A failure does not stop the message: a broadcast whose future failed because one peer
    left still goes to every other peer it was queued for. Only ``cancel()`` withdraws it, and
    only before any peer's copy went on the wire; after a successful ``cancel()`` the message
    leaves the queues of ``_sessions`` (the peers ``put`` addressed) at once, so a cancelled
    put holds no memory and no room in the send window.

    ``_state`` stays PENDING until the future resolves (``running()`` is answered from the
    gate instead): the resolver is then the only writer of ``_state``.
    """

    # Class defaults: what most futures never change costs no per-instance object. put()
    # sets the addressed PeerSessions (adapters never do); add_done_callback() makes a list.
    _sessions: Sequence[PeerSession] = ()
    _done_callbacks: Sequence[Callable[[Future[Any]], object]] = ()
    _result = None
    _exception = None
    _cond: threading.Condition | None = None
    _waiter_list: list[Any] | None = None

    def __init__(self, remaining: int = 1) -> None:  # no super(): no Condition up front
        self._state = PENDING
        # _STARTED / _CANCELLED, in the order they came: the first one decides. Bytearrays,
        # not lists: their append and pop are as atomic, and they hold no references, so the
        # cyclic GC never tracks them (a put makes one future per message; see the module
        # docstring).
        self._gate = bytearray()
        self._ticket = bytearray(1)  # popped by whoever resolves the future
        self.remaining = remaining

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
        if cond is None:
            with _CREATE:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    def _finish(self, state: str, exception: BaseException | None) -> bool:
        """Resolve (FINISHED or CANCELLED_AND_NOTIFIED); False if it was resolved already."""
        try:
            self._ticket.pop()
        except IndexError:
            return False
        # Publish the state atomically with respect to condition creation: with no condition
        # (checked under the creation lock) nobody can be waiting or installing a waiter;
        # with one, the state changes under it, so concurrent.futures.wait() never counts
        # this future both as already done and through its waiter.
        cond = self._cond
        if cond is None:
            with _CREATE:
                cond = self._cond
                if cond is None:
                    self._exception = exception
                    self._state = state
        if cond is not None:
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
        self._sessions = ()  # a finished future does not keep the peers' sessions alive
        callbacks = self._done_callbacks
        if callbacks:
            self._done_callbacks = ()
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # the stdlib logs and carries on; so do we
                LOGGER.exception("exception calling callback for %r", self)
        return True

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
        gate = self._gate
        return bool(gate) and gate[0] == _STARTED and self._state is PENDING

    # -- the I/O thread's side ----------------------------------------------------------

    def _start(self) -> bool:
        """A copy goes on the wire; False only if the caller cancelled the put first."""
        gate = self._gate
        if not gate:
            gate.append(_STARTED)
        return gate[0] == _STARTED

    def _delivered(self) -> None:
        """One addressed peer acknowledged the message."""
        self.remaining -= 1
        if self.remaining <= 0:
            self._finish(FINISHED, None)

    def _fail(self, exception: BaseException) -> None:
        self._finish(FINISHED, exception)

    # -- the caller's side ----------------------------------------------------------------

    def cancel(self) -> bool:
        """Withdraw a put that no peer's copy of is on the wire yet; False once one is."""
        gate = self._gate
        if not gate:
            gate.append(_CANCELLED)
        if gate[0] != _CANCELLED:
            return False  # started first: it is on the wire
        # From here on no peer sends it. Out of the queues first, so done-callbacks already
        # see it gone from statistics(). A failure that resolved it first keeps its word (and
        # _finish has emptied _sessions: a second cancel() withdraws nothing).
        try:
            for session in self._sessions:
                session.withdraw(self)
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
