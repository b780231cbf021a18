"""The asyncio loop of ``grpc.aio``, driven by the transport's own I/O thread.

No thread of our own beyond the base's I/O thread: while the engine has nothing to do, the I/O
thread runs the loop (:meth:`LoopDrivenTransport._sleep`) until the carrier posts something
(a read completed, a stream ended), a user thread wakes it (:meth:`~LoopDrivenTransport.wake`
stops the loop from any thread), or the engine's timeout expires. Packets therefore go from the
engine to ``call.write`` and from ``call.read`` to the engine without a thread hand-off; a
packet read while the I/O thread runs the loop there is fed to the engine in the read's own
callback (:meth:`~LoopDrivenTransport._feed`), without stopping the loop.

Outside the I/O thread the loop runs twice: on the constructor's thread (a server binds) and on
a closing thread (shutdown), each time through :meth:`~LoopDrivenTransport._run_until` and,
when that thread is itself inside an event loop (Jupyter, ``netq.aio``),
:func:`outside_running_loop`. :meth:`~LoopDrivenTransport._close_loop` cancels what is left and
closes the loop, once.
"""

from __future__ import annotations

import asyncio
import threading

from ..._native_heap import NativeHeap
from ..._threads import call_on_thread
from ..packets import _PACKET, PacketTransport
from .streams import Stream

__all__ = ("LoopDrivenTransport", "outside_running_loop", "STOP_TIMEOUT")

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


class LoopDrivenTransport(PacketTransport[Stream]):
    """A packet transport whose carrier lives on an asyncio loop that the I/O thread runs."""

    def __init__(self, engine) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop_waiting = False  # the I/O thread is inside loop.run_forever() in _wait
        self._wake_pending = False  # a stop of the loop is on its way from another thread
        self._loop_closed = False
        self._feeding = False  # the I/O thread runs the loop in _sleep: packets go in at once
        self._feed_error: BaseException | None = None  # raised by _feed, re-raised by _sleep
        # gRPC's native buffers: freed memory goes back to the OS (see netq._native_heap)
        self.native_heap = NativeHeap()
        super().__init__(engine)

    def call_soon(self, callback) -> None:
        """Any thread: run ``callback()`` on the carrier's loop soon (nothing once it closed)."""
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:
            pass  # the loop is closed: whatever it was for is gone

    def packet_received(self, link, payload) -> None:
        self.native_heap.moved(len(payload))
        if self._feeding and not self._inbox:
            self._feed(link, payload)
        else:
            super().packet_received(link, payload)

    def _feed(self, link, payload) -> None:
        """A packet of an open link, fed to its Connection from the carrier's callback.

        The carrier's callbacks run on the I/O thread while it runs the loop in ``_sleep``, so
        the packet can go to the engine right there, as ``_drain_inbox`` would take it after the
        loop stopped: no stop and restart of the loop, no pass of the engine loop per packet,
        and the consumer waiting in ``get()`` is woken one loop turn earlier. The loop still
        stops (the engine loop takes over) whenever the engine has more to do than this link's
        reply: work it queued for ``service``, a link that closes, or a handshake still going on.
        """
        self._inbox.append((_PACKET, link, payload))
        try:
            self._drain_inbox()
        except BaseException as error:  # noqa: BLE001 - the engine loop's to report
            # Not the carrier's failure: _sleep raises it on the I/O thread, as if the engine
            # loop had met it (the communicator fails), rather than ending one stream.
            self._feed_error = error
            self._feeding = False  # what arrives until the loop stops waits in the inbox
            self._loop.stop()
            return
        if (self.engine.has_work or link.session is None or link.closing or link.dropped
                or self.engine.closing):
            self._loop.stop()

    def wake(self) -> None:
        if self._loop_waiting and threading.get_ident() == self._io_ident:
            self._loop.stop()  # a carrier callback: return to the engine after this turn
        elif self._idle and not self._wake_pending and not self._loop_closed:
            # Sticky: if the I/O thread has not entered the loop yet, the stop runs first thing.
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:
                pass  # the loop is closed: the I/O thread is gone

    def _sleep(self, timeout: float) -> None:
        loop = self._loop
        self._feeding = True
        try:
            if self._inbox or timeout <= 0:
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
        finally:
            self._feeding = False
        self._wake_pending = False
        self.native_heap.trim_if_due(loop.time())
        error, self._feed_error = self._feed_error, None
        if error is not None:
            raise error

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
