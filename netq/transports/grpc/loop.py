"""The asyncio loop of ``grpc.aio``, driven by whichever thread runs the netq loop.

No thread of our own beyond the I/O thread: while the netq loop waits (``Carrier.wait``), the
thread that leads it (the I/O thread, or a ``get()`` that would block: ``any_thread_waits``)
runs the asyncio loop (:meth:`LoopDrivenCarrier._sleep`) until the carrier posts something (a
read completed, a stream ended: the loop stops after that turn), another thread wakes it
(:meth:`~LoopDrivenCarrier.wake` stops the loop from any thread), or the timeout expires.
Packets therefore go from the netq loop to ``call.write`` and from ``call.read`` to the netq
loop without a thread hand-off. asyncio runs a loop on one thread at a time, whichever it is:
``_run_lock`` is held by the thread that runs it. A packet queued while the stream's writer
sleeps wakes it through :meth:`~LoopDrivenCarrier.kick`: a thread that finds the loop free (a
caller writing its put while the I/O thread is parked) runs one pass of it itself, in which the
writer hands the packet to gRPC; otherwise one callback asks the thread that runs it.

Two things keep the waits cheap: one asyncio timer serves consecutive waits for the same
deadline (:meth:`~LoopDrivenCarrier._timer_for`), and a wait as short as a held ACK's ends
with the reply a caller's thread writes, which carries that ACK
(:meth:`~LoopDrivenCarrier.caller_wrote`), instead of in a wake-up of its own.

Outside the netq loop the asyncio loop runs twice: on the constructor's thread (a server binds)
and on a closing thread (shutdown), each time through :meth:`~LoopDrivenCarrier._run_until`
and, when that thread is itself inside an event loop (Jupyter, ``netq.aio``),
:func:`outside_running_loop`. A ``get()`` or a write on such a thread runs the loop in its
place (:meth:`~LoopDrivenCarrier._run_forever`: the outer loop is blocked in that call).
:meth:`~LoopDrivenCarrier._close_loop` cancels what is left and closes the loop, once.
"""

from __future__ import annotations

import asyncio
import collections
import threading

from ..._interrupts import LoopTurns
from ..._native_heap import NativeHeap, expect_blocks
from ..._threads import call_on_thread
from ...carrier import DATA
from ...options import CommunicatorOptions, Purpose
from ..packets import PacketCarrier
from .streams import CallStream

__all__ = ("LoopDrivenCarrier", "outside_running_loop", "STOP_TIMEOUT")

STOP_TIMEOUT = 10.0  # seconds the final shutdown of the carrier may take at most
# A wait may reuse the timer of an earlier wait that ends it at most this fraction of its
# timeout early (an early end costs the netq loop one turn; a new timer per wait costs a
# timer handle, a heap push and a cancelled entry per wait).
EARLY_FRACTION = 0.1
# ... or at most this late (s): below the selector's own granularity (epoll waits in whole
# milliseconds), so no wait ends later than it would with a timer of its own.
LATE_ALLOWANCE = 0.0005
# Native blocks up to this size are reused by the C allocator once the carrier starts
# (netq._native_heap.expect_blocks): the 1 MiB packets' bytes, and gRPC's read buffers, which
# grow past a packet or two in a stream of large messages. Eight packets' worth.
NATIVE_BLOCKS = 8 * 1024 * 1024


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


class LoopDrivenCarrier(PacketCarrier[CallStream]):
    """A packet carrier whose library lives on an asyncio loop that the netq loop's thread
    runs while it waits."""

    def __init__(self, options: CommunicatorOptions, purpose: Purpose) -> None:
        self._loop = asyncio.new_event_loop()
        # Held by the thread that runs the asyncio loop (one at a time: the I/O thread, a
        # get() that leads the netq loop, a caller's thread starting its own write).
        self._run_lock = threading.Lock()
        self._loop_waiting = False  # a thread is inside loop.run_forever() in _sleep
        self._wake_pending = False  # a stop of the loop is on its way from another thread
        self._loop_closed = False
        self._waiter: int | None = None  # the thread that runs the loop in _sleep
        # Streams whose sleeping writer has packets to write: woken by the next thread that
        # runs the loop (see kick)
        self._kicks: collections.deque[CallStream] = collections.deque()
        self._kick_posted = False  # a _serve_kicks callback is on its way to the loop
        self._pass_turns = LoopTurns()  # a pass on the main thread defers Ctrl-C (_run_pass)
        # The wait under way is no longer than a held ACK's (ack_hold): see caller_wrote()
        self._waiting_for_hold = False
        self._waits = 0  # waits begun (_sleep): tells one wait from the next
        # The timer that ends waits, kept across them while the netq loop's next deadline
        # stays where it was (see _timer_for): None once it fired
        self._deadline_timer: asyncio.TimerHandle | None = None
        # gRPC's native buffers: freed memory goes back to the OS, and blocks up to a few
        # packets are reused rather than mapped afresh (see netq._native_heap)
        self.native_heap = NativeHeap()
        expect_blocks(NATIVE_BLOCKS)
        super().__init__(options, purpose)

    def call_soon(self, callback) -> None:
        """Any thread: run ``callback()`` on the carrier's loop soon (nothing once it closed)."""
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:
            pass  # the loop is closed: whatever it was for is gone

    def kick(self, stream: CallStream) -> None:
        """Any thread outside the loop: ``stream``'s sleeping writer has packets to write.

        If no thread runs the loop now, this one runs a single pass of it, in which the
        writer hands the packet to gRPC (its C core sends it; the completion waits for the
        next thread that runs the loop). Otherwise the thread that runs it is asked to wake
        the writer: one callback, which also ends a wait as short as a held ACK's (see
        :meth:`caller_wrote`).
        """
        if self._loop_closed:
            return
        self._kicks.append(stream)
        if not self._run_lock.acquire(False) or not self._run_pass():
            if not self._kick_posted:
                self._kick_posted = True
                self.call_soon(self._serve_kicks)

    def _serve_kicks(self) -> None:
        """On the loop: wake the writers :meth:`kick` asked for."""
        self._kick_posted = False
        kicks = self._kicks
        woke = False
        while kicks:
            stream = kicks.popleft()
            if stream.waiting:
                stream.waiting = False
                wakeup = stream.wakeup
                stream.wakeup = None
                if wakeup is not None and not wakeup.done():
                    wakeup.set_result(None)
                woke = True
        if woke:
            self.caller_wrote()

    def _run_pass(self) -> bool:
        """One pass of the loop on this thread, which just took ``_run_lock`` (released here,
        and taken again while kicks arrived meanwhile); False (nothing run) on the main thread
        under a SIGINT handler of the program's own.

        On the main thread a Ctrl-C waits for the end of the pass (netq's handler, see
        :mod:`netq._interrupts`; already so inside a turn of the netq loop) and is raised
        then: raised inside it, it would end the writer's task half-way.
        """
        loop = self._loop
        turns = None
        if not LoopTurns.deferring and threading.get_ident() == threading.main_thread().ident:
            turns = self._pass_turns
            if not turns.begin():
                self._run_lock.release()
                return False
        try:
            while True:
                try:
                    if not self._loop_closed:
                        self._serve_kicks()
                        loop.call_soon(loop.stop)
                        self._run_forever()
                finally:
                    self._run_lock.release()
                # A kick that found the lock taken just before the release: nobody else may
                # run the loop soon, so its writer is woken here.
                if not self._kicks or self._loop_closed or not self._run_lock.acquire(False):
                    break
        finally:
            if turns is not None:
                turns.end()
        if turns is not None and LoopTurns.pending:
            LoopTurns.pending = False
            raise KeyboardInterrupt
        return True

    def _run_forever(self) -> None:
        """``loop.run_forever()`` on this thread, even when it is inside a running event loop
        of its own (a Jupyter cell, a coroutine that called get()): that loop is blocked in
        this call meanwhile, so ours may run here; its marker is put back afterwards."""
        outer = asyncio._get_running_loop()
        if outer is None:
            self._loop.run_forever()
            return
        asyncio._set_running_loop(None)
        try:
            self._loop.run_forever()
        finally:
            asyncio._set_running_loop(outer)

    def packet_received(self, channel: CallStream, payload) -> None:
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

    def caller_wrote(self) -> None:
        """On the loop: a packet a caller's thread queued woke its stream's writer.

        A caller writes while the netq loop holds an ACK back for the reply to carry
        (``ack_hold``): this write is most likely that reply, which took the ACK along, and
        the loop's short wait would end in a timer with nothing left to do, one more wake-up
        of the I/O thread per round trip. Instead the wait ends now, in the wake-up this
        write costs anyway, once the writer has started the write: its step was scheduled
        before the stop, so it runs first. Ending a wait early is always allowed
        (``Carrier.wait``); the loop then waits again for what is left.
        """
        if self._waiting_for_hold:
            self._waiting_for_hold = False
            self._loop.call_soon(self._end_wait, self._waits)

    def _end_wait(self, wait: int) -> None:
        """Stop the loop if wait number ``wait`` is still under way (a stop meant for a wait
        that ended meanwhile would cut the next one short)."""
        if self._waits == wait and self._loop_waiting:
            self._loop.stop()

    def _sleep(self, timeout: float) -> None:
        loop = self._loop
        me = threading.get_ident()
        self._run_lock.acquire()
        # Ctrl-C on the main thread (a get() leading the netq loop there) waits for the end
        # of the netq loop's turn: a wait here runs gRPC's callbacks and the writer's task,
        # which an exception must not cut in half.
        on_main = me == threading.main_thread().ident
        deferring = LoopTurns.deferring
        try:
            self._waiter = me
            self._waits += 1
            if on_main:
                LoopTurns.deferring = True
            if self._kicks:
                self._serve_kicks()
            if self._events or timeout <= 0:
                # Still give gRPC a turn: queued writes go out, completed reads come in.
                loop.call_soon(loop.stop)
                self._run_forever()
            else:
                shorter = self._timer_for(timeout)
                self._loop_waiting = True
                self._waiting_for_hold = timeout <= self.ack_hold
                try:
                    self._run_forever()
                finally:
                    self._loop_waiting = False
                    self._waiting_for_hold = False
                    if shorter is not None:
                        shorter.cancel()
            self._wake_pending = False
            self.native_heap.trim_if_due(loop.time())
        finally:
            if on_main:
                LoopTurns.deferring = deferring
            self._run_lock.release()
        if self._kicks and self._run_lock.acquire(False) and not self._run_pass():
            self.call_soon(self._serve_kicks)

    def _timer_for(self, timeout: float) -> asyncio.TimerHandle | None:
        """Make sure a timer ends the coming wait within ``timeout`` s; the one to cancel
        after the wait, if it is a wait's own.

        Most waits end with a packet long before their timeout, and the next one waits for
        about the same deadline (the netq loop's next timer, or a leading get()'s slice): the
        deadline timer stays and serves it. A wait as short as a held ACK's gets a timer of
        its own and leaves the deadline timer for the waits after it; any other deadline
        earlier or far later than the timer's replaces it (a caller that leads the loop waits
        in slices: its waits then share one timer until the I/O thread waits again).
        """
        loop = self._loop
        deadline = loop.time() + timeout
        timer = self._deadline_timer
        if timer is not None and not timer.cancelled():
            when = timer.when()
            slack = timeout * EARLY_FRACTION
            if deadline - slack <= when <= deadline + min(slack, LATE_ALLOWANCE):
                return None
            if when > deadline and timeout <= self.ack_hold:
                return loop.call_at(deadline, loop.stop)
            timer.cancel()
        self._deadline_timer = loop.call_at(deadline, self._deadline_passed)
        return None

    def _deadline_passed(self) -> None:
        self._deadline_timer = None
        self._loop.stop()

    def _run_until(self, coroutine, timeout: float):
        """Run ``coroutine`` to completion on the loop (thread not in the loop); its result."""
        loop = self._loop
        with self._run_lock:
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
        with self._run_lock:
            self._loop_closed = True
            self._close_loop_now()
        self._kicks.clear()

    def _close_loop_now(self) -> None:
        loop = self._loop
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
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
