"""``DeliveryFuture``: the future ``put()`` returns, cheap enough for one per message.

A stock :class:`concurrent.futures.Future` builds a ``threading.Condition`` (and its RLock) in
``__init__``: ~0.8 us, most of a 64-byte put's budget, for a lock that nobody waits on when the
caller never calls ``result()``. This subclass creates the condition on first use, so the I/O
thread resolves a future nobody waits for with a few attribute writes. It stays a real
``concurrent.futures.Future``: ``asyncio.wrap_future``, ``concurrent.futures.wait`` and
``as_completed`` accept it, because every path that needs the condition goes through the lazy
``_condition`` property.

State changes out of PENDING (started, cancelled, resolved) are made under one module lock,
held for a few attribute writes and never while calling out: a broadcast message is started by
several threads at once (the I/O thread and a caller writing directly to an idle socket), and
each of them must see at once whether it was cancelled. Waiting is lock-free for the resolver:
it writes ``_state`` before it looks for a condition, and a waiter creates the condition (under
the same lock) before it reads ``_state`` under that condition, so either the resolver sees the
condition (and notifies under it) or the waiter sees the new state.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures._base import (  # the states Future's own methods compare against
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
    RUNNING,
)

__all__ = ("DeliveryFuture",)

LOGGER = logging.getLogger("netq")
# Guards every future's state changes and condition creation. Held for a few attribute writes,
# never while calling out (callbacks, waiters, session locks), so it cannot deadlock.
_LOCK = threading.Lock()


class DeliveryFuture(Future):
    """Resolves when every addressed peer has acknowledged the message.

    ``remaining`` counts the peers still to acknowledge (a broadcast is one future). The I/O
    thread calls :meth:`_delivered` once per peer and :meth:`_fail` on loss; the first failure
    wins and later outcomes are ignored, so the future resolves exactly once (``_claimed``).

    A failure does not stop the message: a broadcast whose future failed because one peer
    left still goes to every other peer it was queued for. Only ``cancel()`` withdraws it, and
    only before any peer's copy went on the wire; after a successful ``cancel()`` the message
    leaves the queues of ``_sessions`` (the peers ``put`` addressed) at once, so a cancelled
    put holds no memory and no room in the send window.
    """

    _sessions = ()  # class default: put() sets the addressed PeerSessions, adapters never do

    def __init__(self, remaining: int = 1) -> None:  # no super(): no Condition up front
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []
        self._cond = None
        self._claimed = False  # someone took the one right to resolve or cancel
        self.remaining = remaining

    @property
    def _condition(self) -> threading.Condition:
        cond = self._cond
        if cond is None:
            with _LOCK:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    def _finish(self, state: str, exception: BaseException | None) -> bool:
        """Resolve (FINISHED) or complete a cancel; False if someone else resolved it first."""
        with _LOCK:
            if self._claimed and state is FINISHED:
                return False
            self._claimed = True
            cond = self._cond
            if cond is None:
                # No condition (checked under the lock that creates it): nobody is waiting or
                # installing a waiter, so the state is published here.
                self._exception = exception
                self._state = state
        if cond is not None:
            # With a condition, the state changes under it, so concurrent.futures.wait()
            # never counts this future both as already done and through its waiter.
            with cond:
                with _LOCK:
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
        callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # the stdlib logs and carries on; so do we
                LOGGER.exception("exception calling callback for %r", self)
        return True

    def add_done_callback(self, fn) -> None:
        with self._condition:
            if self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    # -- the I/O thread's side ----------------------------------------------------------

    def _start(self) -> bool:
        """A copy goes on the wire; False only if the caller cancelled the put first."""
        state = self._state
        if state is RUNNING:
            return True
        with _LOCK:
            state = self._state
            if state is PENDING:
                if self._claimed:
                    return True  # failing elsewhere right now: this peer still gets it
                self._state = RUNNING
                return True
        return state is not CANCELLED and state is not CANCELLED_AND_NOTIFIED

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
        with _LOCK:
            state = self._state
            if state is CANCELLED or state is CANCELLED_AND_NOTIFIED:
                return True
            if state is not PENDING or self._claimed:
                return False
            self._claimed = True
            self._state = CANCELLED  # from here on, _start() refuses it
        # Out of the queues first, so done-callbacks already see it gone from statistics().
        try:
            for session in self._sessions:
                session.withdraw(self)
        finally:
            self._finish(CANCELLED_AND_NOTIFIED, None)
        return True

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
