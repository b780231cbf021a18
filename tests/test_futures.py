"""DeliveryFuture: a real concurrent.futures.Future that resolves exactly once."""

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import pickle
import sys
import threading
import time
import uuid
import weakref

import pytest

from netq import futures
from netq.exceptions import BroadcastIncomplete, ConnectionLost, MessageTooLarge, ResourceClosed
from netq.futures import DeliveryFuture


def race(first, second):
    """Run ``first()`` on a new thread and ``second()`` on this one, released together by a
    barrier; returns their results in that order."""
    barrier = threading.Barrier(2)
    results = {}

    def run(name, fn):
        barrier.wait()
        results[name] = fn()

    thread = threading.Thread(target=run, args=("first", first))
    thread.start()
    run("second", second)
    thread.join()
    return results["first"], results["second"]


@contextlib.contextmanager
def fast_thread_switching():
    """Switch threads as often as CPython allows (1 us), so that races show up."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def test_is_a_stdlib_future_without_an_eager_condition():
    future = DeliveryFuture()
    assert isinstance(future, cf.Future)
    assert future._cond is None  # nothing allocated until someone waits


def test_its_states_are_the_ones_a_stock_future_takes():
    # netq.futures spells Future's states itself (not from concurrent.futures._base): they
    # must be the values the inherited methods and wait()/as_completed() compare against.
    stock = cf.Future()
    assert stock._state == futures.PENDING
    stock.cancel()
    assert stock._state == futures.CANCELLED
    stock.set_running_or_notify_cancel()
    assert stock._state == futures.CANCELLED_AND_NOTIFIED
    finished = cf.Future()
    finished.set_result(None)
    assert finished._state == futures.FINISHED
    assert DeliveryFuture()._state == futures.PENDING


def test_cancel_withdraws_from_its_queues_and_a_finished_future_lets_them_go():
    class Queue:
        def __init__(self):
            self.withdrawn = []

        def withdraw(self, future):
            self.withdrawn.append(future)

    first, second = Queue(), Queue()
    cancelled = DeliveryFuture(2, (first, second))
    assert cancelled.cancel() and cancelled.cancelled()
    assert first.withdrawn == second.withdrawn == [cancelled]
    assert cancelled._queues == ()  # resolved: it holds its queues no longer
    assert cancelled.cancel() and first.withdrawn == [cancelled]  # still cancelled; withdrawn once
    delivered = DeliveryFuture(1, (first,))
    assert delivered._start()
    delivered._delivered()
    assert delivered._queues == () and first.withdrawn == [cancelled]


def test_resolves_after_every_peer_acknowledged():
    future = DeliveryFuture(remaining=3)
    assert future._start()
    future._delivered()
    future._delivered()
    assert not future.done()
    future._delivered()
    assert future.done() and future.result() is None


def test_first_failure_wins_and_later_acks_are_ignored():
    future = DeliveryFuture(remaining=2)
    future._start()
    future._fail(ValueError("peer gone"))
    future._delivered()
    future._delivered()
    with pytest.raises(ValueError, match="peer gone"):
        future.result()


def test_result_wakes_a_waiting_thread():
    future = DeliveryFuture()
    future._start()
    timer = threading.Timer(0.05, future._delivered)
    timer.start()
    assert future.result(timeout=5) is None
    timer.join()


def test_cancel_before_the_wire_wins_and_the_sender_skips_it():
    future = DeliveryFuture()
    assert future.cancel()
    assert future.cancelled()
    assert not future._start()  # the I/O thread must not send it
    with pytest.raises(cf.CancelledError):
        future.result(timeout=1)


def test_cancel_after_the_wire_is_refused():
    future = DeliveryFuture()
    assert not future.running()
    assert future._start()
    assert future.running()
    assert not future.cancel()
    future._delivered()
    assert future.result() is None
    assert not future.running() and future.done()


def test_cancel_and_start_race_has_exactly_one_winner():
    for _ in range(2000):
        future = DeliveryFuture()
        cancelled, started = race(future.cancel, future._start)
        assert started != cancelled


def test_callbacks_run_once_and_wait_helpers_work():
    future = DeliveryFuture()
    calls = []
    future.add_done_callback(calls.append)
    future._start()
    waiter = threading.Thread(target=lambda: cf.wait([future], timeout=5))
    waiter.start()
    future._delivered()
    waiter.join()
    assert calls == [future]
    assert list(cf.as_completed([future], timeout=1)) == [future]
    late = []
    future.add_done_callback(late.append)  # already done: runs at once
    assert late == [future]


def test_asyncio_can_await_it():
    async def main():
        future = DeliveryFuture()
        future._start()
        asyncio.get_running_loop().call_later(0.01, future._delivered)
        return await asyncio.wrap_future(future)

    assert asyncio.run(main()) is None


def test_a_failed_broadcast_still_goes_to_the_other_peers():
    """One peer's failure does not resolve a broadcast: the copies queued for the other peers
    still go, and the future waits for their answers."""
    future = DeliveryFuture(remaining=3)
    lost = uuid.uuid4()
    future._fail_peer(ConnectionLost(lost, "no reconnect within session_timeout"), lost)
    assert future._start() and future._start()
    assert not future.cancel()
    future._delivered()
    assert not future.done()
    future._delivered()
    with pytest.raises(BroadcastIncomplete) as raised:
        future.result(timeout=1)
    error = raised.value
    assert (error.delivered, error.addressed) == (2, 3)
    assert list(error.failed) == [lost] and isinstance(error.failed[lost], ConnectionLost)
    assert str(error).startswith("delivered to 2 of 3 peers; 1 failed (peer ")
    assert "no reconnect within session_timeout" in str(error)


def test_a_broadcast_failure_names_every_peer_and_splits_by_type():
    """Each failed peer is reported with its own error; ``except*`` handles them by type and
    keeps the counts."""
    future = DeliveryFuture(remaining=4)
    future._start()
    left, small = uuid.uuid4(), uuid.uuid4()
    future._delivered()
    future._fail_peer(MessageTooLarge(10, 5), small)
    future._delivered()
    assert not future.done()
    future._fail_peer(ConnectionLost(left, "killed"), left)
    try:
        future.result(timeout=1)
    except* ConnectionLost as lost:
        assert isinstance(lost, BroadcastIncomplete)
        assert list(lost.failed) == [left] and (lost.delivered, lost.addressed) == (2, 4)
    except* MessageTooLarge as large:
        assert list(large.failed) == [small]
    else:
        raise AssertionError("the broadcast should have failed")
    error = future.exception(0)
    copy = pickle.loads(pickle.dumps(error))  # it crosses processes (multiprocessing, dask)
    assert isinstance(copy, BroadcastIncomplete) and str(copy) == str(error)
    assert (copy.delivered, copy.addressed, list(copy.failed)) == (2, 4, [small, left])


def test_a_single_peer_future_fails_at_once_and_a_closed_communicator_fails_a_broadcast():
    single = DeliveryFuture()
    single._start()
    peer = uuid.uuid4()
    single._fail_peer(ConnectionLost(peer, "killed"), peer)
    with pytest.raises(ConnectionLost):
        single.result(timeout=0)
    broadcast = DeliveryFuture(remaining=3)
    broadcast._start()
    broadcast._fail_peer(ResourceClosed(None, "closed"), peer)  # this communicator closed
    with pytest.raises(ResourceClosed) as raised:
        broadcast.result(timeout=0)
    assert not isinstance(raised.value, BroadcastIncomplete)


def test_concurrent_starts_all_send():
    """A broadcast started by the I/O thread and a directly writing caller at once: both
    copies go out (neither may mistake the other's start for a cancel)."""
    with fast_thread_switching():
        for _ in range(10_000):  # the old code lost a copy here in about 1 run of 3
            future = DeliveryFuture(remaining=2)
            assert race(future._start, future._start) == (True, True)


def test_a_start_right_after_another_start_claimed_the_gate_sends_too():
    """The interleaving the race above hunts for, forced: a second start runs between the
    first start's claim and its answer (the old code's window: ticket popped, RUNNING not yet
    written)."""
    future = DeliveryFuture(remaining=2)
    second = []

    class SecondStartArrives(list):
        def append(self, item):
            super().append(item)
            if not second:
                second.append(future._start())

    future.start_gate = SecondStartArrives()
    assert future._start()
    assert second == [True]


def test_concurrent_fail_and_start_never_reopen_a_resolved_future():
    with fast_thread_switching():
        for _ in range(3000):
            future = DeliveryFuture(remaining=2)
            fail = functools.partial(future._fail, ConnectionError("peer left"))
            _, started = race(fail, future._start)
            assert started
            assert future.done(), future
            with pytest.raises(ConnectionError):
                future.result(timeout=1)


def test_resolving_while_someone_starts_waiting_tells_each_waiter_exactly_once():
    # The resolver takes no lock: it either finds the waiter's condition (and notifies under
    # it) or marks the future resolved-unwatched (and the condition made after it publishes
    # the state). A future counted both ways would let wait(ALL_COMPLETED) return early; one
    # counted neither way would hang it.
    with fast_thread_switching():
        for round_ in range(1500):
            futures = [DeliveryFuture() for _ in range(3)]
            for future in futures:
                assert future._start()

            def resolve_all(futures=futures, round_=round_):
                for index, future in enumerate(futures):
                    if (index + round_) % 3:
                        future._delivered()
                    else:
                        future._fail(ConnectionError("peer left"))

            def wait_all(futures=futures):
                return cf.wait(futures, timeout=10, return_when=cf.ALL_COMPLETED)

            _, (done, not_done) = race(resolve_all, wait_all)
            assert not not_done and len(done) == 3, round_
            assert all(future.done() for future in futures)


class _PausingDict(dict):
    """A future's ``__dict__`` that stops its resolver once, right before or right after the
    ``_cond`` claim, until the test lets it go: the windows a thread switch rarely hits."""

    def __init__(self, values, *, after):
        super().__init__(values)
        self.after = after
        self.paused = threading.Event()
        self.go = threading.Event()
        self.armed = True

    def setdefault(self, key, default=None):
        pause = key == "_cond" and self.armed and threading.current_thread().name == "resolver"
        if pause and not self.after:
            self._pause()
        value = super().setdefault(key, default)
        if pause and self.after:
            self._pause()
        return value

    def _pause(self):
        self.armed = False
        self.paused.set()
        assert self.go.wait(10)


def _resolve_paused(future, after):
    slots = _PausingDict(future.__dict__, after=after)
    future.__dict__ = slots
    resolver = threading.Thread(target=future._delivered, name="resolver")
    resolver.start()
    assert slots.paused.wait(10)
    return slots, resolver


def test_a_waiter_arriving_between_the_two_claims_is_told_once():
    # The resolver has claimed the outcome but not yet looked for a condition; wait() makes
    # one and installs its waiter meanwhile. The resolver must then notify through it, and
    # the future must not already count as done (wait() would count it twice, return early).
    other, future = DeliveryFuture(), DeliveryFuture()
    assert other._start() and future._start()
    slots, resolver = _resolve_paused(future, after=False)
    with cf.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(cf.wait, [other, future], 10, cf.ALL_COMPLETED)
        deadline = time.monotonic() + 10
        while not future._waiter_list and time.monotonic() < deadline:
            time.sleep(0.001)  # bounded poll: until wait() has installed its waiter
        assert future._waiter_list, "wait() never installed its waiter"
        waiter = future._waiter_list[0]
        slots.go.set()
        resolver.join(10)
        assert not waiter.event.is_set(), "wait() counted the future twice: it returns early"
        other._delivered()
        done, not_done = waiting.result(10)
    assert not not_done and done == {other, future}


def test_a_waiter_arriving_after_an_unwatched_resolution_sees_it_at_once():
    # The resolver found no condition and has not written _state yet: whoever makes the
    # condition now must publish the outcome, or result() would wait for a notify that
    # never comes.
    future = DeliveryFuture()
    assert future._start()
    slots, resolver = _resolve_paused(future, after=True)
    try:
        assert future.result(timeout=2) is None
        assert future.done()
    finally:
        slots.go.set()
        resolver.join(10)


def test_a_future_resolved_before_anyone_waited_answers_every_question():
    delivered, failed = DeliveryFuture(), DeliveryFuture()
    assert delivered._start() and failed._start()
    delivered._delivered()
    failed._fail(ConnectionError("peer left"))
    assert not delivered._finish(futures.FINISHED, RuntimeError("late"))  # resolved once
    # No condition existed when they resolved: the first question makes one and publishes.
    assert delivered.done() and delivered.result(timeout=0) is None
    assert isinstance(failed.exception(timeout=0), ConnectionError)
    assert cf.wait([delivered, failed], timeout=0).not_done == set()
    assert not delivered.running() and not delivered.cancel()


def test_a_result_that_runs_out_says_where_the_message_waits_for_each_peer():
    """result(timeout=)'s TimeoutError says, from the queues of the peers the put went to,
    whether the message is unsent (and why) or sent and unacknowledged, and what changes it."""
    from netq.session import Outgoing, PeerSession, PeerState

    def message(future):
        return Outgoing((b"x",), 1, False, future)

    peer = PeerSession(uuid.uuid4())  # a client's server before the first connection
    future = DeliveryFuture(1, (peer,))
    peer.outbox.append(message(future))
    with pytest.raises(TimeoutError, match=r"^put\(\)'s message was not acknowledged within "
                                           r"0.01 s: not sent yet: not connected to it now; "
                                           r"netq reconnects"):
        future.result(timeout=0.01)
    peer.state = PeerState.CONNECTED
    peer.credit_exhausted_since = time.monotonic()
    peer.outbox.appendleft(message(DeliveryFuture()))
    with pytest.raises(TimeoutError, match=r"not sent yet \(1 message ahead of it\): the "
                                           r"peer's receive window is full.*called get\(\)"):
        future.result(timeout=0.01)
    peer.outbox.clear()
    peer.inflight.extend([message(DeliveryFuture()), message(DeliveryFuture()), message(future)])
    with pytest.raises(TimeoutError, match=r"sent, and its acknowledgement has not come back "
                                           r"\(2 messages sent before it and not acknowledged"):
        future.result(timeout=0.01)
    peer.state = PeerState.DISCONNECTED
    with pytest.raises(TimeoutError, match="the link broke before its acknowledgement came: "
                                           "it is sent again when the session resumes"):
        future.result(timeout=0)
    # A broadcast names the peers that still hold it, and only them.
    waiting, answered = PeerSession(uuid.uuid4()), PeerSession(uuid.uuid4())
    broadcast = DeliveryFuture(2, (waiting, answered))
    waiting.outbox.append(message(broadcast))
    broadcast._start()
    broadcast._delivered()  # answered acknowledged it
    with pytest.raises(TimeoutError) as raised:
        broadcast.result(timeout=0.01)
    assert str(raised.value).startswith(
        f"put()'s message was not acknowledged within 0.01 s by 1 of the 2 peers it went to: "
        f"peer {waiting.id}: not sent yet")
    assert str(answered.id) not in str(raised.value)


def test_an_acknowledged_future_nobody_can_watch_is_not_resolved(monkeypatch):
    """The peer's ACK resolves the futures someone holds, has a callback on or a weak reference
    to; one that only its queued message refers to is dropped with it, unresolved (nothing
    could see it), and the message counts as acknowledged all the same."""
    from netq.session import Outgoing, PeerSession

    resolved = []
    deliver = DeliveryFuture._delivered

    def counting(self):
        resolved.append(self.remaining)
        deliver(self)

    monkeypatch.setattr(DeliveryFuture, "_delivered", counting)
    peer = PeerSession(uuid.uuid4())
    kept = DeliveryFuture()
    called = []
    with_callback = DeliveryFuture()
    with_callback.add_done_callback(called.append)
    weakly = DeliveryFuture()
    weak = weakref.ref(weakly)
    peer.inflight.extend(Outgoing((b"x",), 1, False, future)
                         for future in (DeliveryFuture(), kept, with_callback, weakly))
    del with_callback, weakly
    peer.next_seq = 4  # inflight holds messages 0 .. 3
    peer.acknowledge(3)
    assert len(resolved) == 3, "the unheld future resolved, or a watched one did not"
    assert kept.done() and kept.result() is None
    assert len(called) == 1 and called[0].done()
    assert weak() is None  # resolved, then let go with its message
    assert (peer.acked_messages, len(peer.inflight)) == (4, 0)
    # A message something else holds (whoever holds it can read its future) resolves too.
    message = Outgoing((b"x",), 1, False, DeliveryFuture())
    peer.inflight.append(message)
    peer.next_seq += 1
    peer.acknowledge(4)
    assert message.future.done() and len(resolved) == 4
