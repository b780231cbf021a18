"""The asyncio loop of ``grpc.aio``, driven by the netq loop's own I/O thread.

No thread of our own beyond the I/O thread: while the netq loop waits (``Carrier.wait``), the
I/O thread runs the asyncio loop (:meth:`LoopDrivenCarrier._sleep`) until the carrier posts
something (a read completed, a stream ended: the loop stops after that turn), a user thread
wakes it (:meth:`~LoopDrivenCarrier.wake` stops the loop from any thread), or the timeout
expires. Packets therefore go from the netq loop to ``call.write`` and from ``call.read`` to
the netq loop without a thread hand-off.

Outside the I/O thread the loop runs twice: on the constructor's thread (a server binds) and on
a closing thread (shutdown), each time through :meth:`~LoopDrivenCarrier._run_until` and,
when that thread is itself inside an event loop (Jupyter, ``netq.aio``),
:func:`outside_running_loop`. :meth:`~LoopDrivenCarrier._close_loop` cancels what is left and
closes the loop, once.
"""

from __future__ import annotations

import asyncio
import threading

from ..._native_heap import NativeHeap
from ..._threads import call_on_thread
from ...carrier import DATA
from ...options import CommunicatorOptions, Purpose
from ..packets import PacketCarrier
from .streams import Stream

__all__ = ("LoopDrivenCarrier", "outside_running_loop", "STOP_TIMEOUT")

STOP_TIMEOUT = 10.0  # seconds the final shutdown of the carrier may take at most


def outside_running_loop(function):
    """``function()``, on a helper thread when the calling thread is inside an event loop.

    The transport's own loop runs on the constructor's thread once (the server binds) and on
    a closing thread once (shutdown). asyncio lets only one loop run per thread, and a Jupyter
    kernel runs every cell inside its loop (so does a coroutine calling ``netq.aio.new``):
    there our loop runs on a short-lived thread that the caller waits for.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return function()
    return call_on_thread(function, "netq-grpc-setup")


class LoopDrivenCarrier(PacketCarrier[Stream]):
    """A packet carrier whose library lives on an asyncio loop that the I/O thread runs."""

    def __init__(self, options: CommunicatorOptions, purpose: Purpose) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop_waiting = False  # the I/O thread is inside loop.run_forever() in _sleep
        self._wake_pending = False  # a stop of the loop is on its way from another thread
        self._loop_closed = False
        self._waiter: int | None = None  # the thread that runs the loop in _sleep (I/O thread)
        # gRPC's native buffers: freed memory goes back to the OS (see netq._native_heap)
        self.native_heap = NativeHeap()
        super().__init__(options, purpose)

    @property
    def on_loop_thread(self) -> bool:
        """True on the thread that runs the asyncio loop while it waits (the I/O thread)."""
        return threading.get_ident() == self._waiter

    def call_soon(self, callback) -> None:
        """Any thread: run ``callback()`` on the carrier's loop soon (nothing once it closed)."""
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:
            pass  # the loop is closed: whatever it was for is gone

    def packet_received(self, channel: Stream, payload) -> None:
        self.native_heap.moved(len(payload))
        self._events.append((DATA, channel, payload))
        # A read's callback on the I/O thread, running the loop in _sleep: back to the netq
        # loop after this turn, so the packet reaches its get() without waiting for a timer.
        self.wake()

    def wake(self) -> None:
        if self._loop_waiting and threading.get_ident() == self._waiter:
            self._loop.stop()  # a carrier callback: return to the netq loop after this turn
        elif not self._wake_pending and not self._loop_closed:
            # Sticky: if the I/O thread has not entered the loop yet, the stop runs first thing.
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:
                pass  # the loop is closed: the I/O thread is gone

    def _sleep(self, timeout: float) -> None:
        loop = self._loop
        self._waiter = threading.get_ident()
        if self._events or timeout <= 0:
            # Still give gRPC a turn: queued writes go out, completed reads come in.
            loop.call_soon(loop.stop)
            loop.run_forever()
        else:
            timer = loop.call_later(timeout, loop.stop)
            self._loop_waiting = True
            try:
                loop.run_forever()
            finally:
                self._loop_waiting = False
                timer.cancel()
        self._wake_pending = False
        self.native_heap.trim_if_due(loop.time())

    def _run_until(self, coroutine, timeout: float):
        """Run ``coroutine`` to completion on the loop (thread not in the loop); its result."""
        loop = self._loop
        task = loop.create_task(coroutine)
        task.add_done_callback(lambda _: loop.stop())
        timer = loop.call_later(timeout, loop.stop)
        deadline = loop.time() + timeout
        try:
            while not task.done() and loop.time() < deadline:
                loop.run_forever()  # a stray stop (a late wake-up) only costs a turn
        finally:
            timer.cancel()
        if not task.done():
            task.cancel()
            raise TimeoutError(f"gRPC did not finish within {timeout} s")
        return task.result()

    def _close_loop(self) -> None:
        """Cancel every task left, close the loop (once, from a thread not inside it)."""
        loop = self._loop
        self._loop_closed = True
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            gathered = asyncio.gather(*pending, return_exceptions=True)
            gathered.add_done_callback(lambda _: loop.stop())
            timer = loop.call_later(STOP_TIMEOUT, loop.stop)
            while not gathered.done() and not timer.cancelled():
                loop.run_forever()
                if loop.time() >= timer.when():
                    break
            timer.cancel()
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        except RuntimeError:
            pass  # a stray stop: the generators are gone with the loop anyway
        loop.close()
