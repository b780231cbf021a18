"""The communicator's receive side when a get() fails after it took a message.

An interrupt (Ctrl-C in a script, "interrupt kernel" in a notebook) raises ``KeyboardInterrupt``
wherever the main thread is; while a get() unpickles a large message, that is inside ``load``.
The message is not at fault: it must come back on the next get(), in order, and the receive
budget must count it exactly once. A message that cannot be loaded (DeserializationError) is
dropped, but what get_many() opened before it is not.

These tests raise the ``KeyboardInterrupt`` from a ``load`` that stands in for the unpickler at
the moment the signal lands: the same exception, at the same place, without a timing race. The
transport does not matter here (the communicator is the same over all of them): TCP on loopback.
"""

from __future__ import annotations

import threading

import pytest

import netq as nq
from netq.serializers import PickleSerializer
from netq_testing import blocked_get, wait_for

T = 30.0  # seconds any single blocking step may take before the test is considered stuck

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("transport", ["tcp"],
                                                               indirect=True)]


class InterruptedLoad:
    """``load`` that raises ``error`` while loading the objects for which ``when(obj)`` holds,
    ``times`` times in all, and loads everything else as the default serializer does."""

    def __init__(self, when, error: BaseException | None = None, times: int = 1) -> None:
        self.when = when
        self.error = error if error is not None else KeyboardInterrupt()
        self.left = times
        self.serializer = PickleSerializer()

    def __call__(self, stream):
        obj = self.serializer.load(stream)
        if self.left and self.when(obj):
            self.left -= 1
            raise self.error
        return obj


def settled(server: nq.Communicator) -> None:
    """Every message was taken: nothing queued, and no received byte counts as held."""
    with pytest.raises(nq.Empty):
        server.get_nowait()  # releases the message get() returned last
    stats = server.statistics()
    assert stats.recv_held == 0, stats
    assert all(row.queue_in == 0 and row.queue_in_bytes == 0 for row in stats.peers), stats


def test_interrupted_get_gives_the_message_back(transport):
    load = InterruptedLoad(lambda obj: obj == ("big", 1))
    server = transport.make_server(load=load)
    client = transport.connect(server)
    for index in range(3):
        client.put(("big", index)).result(T)

    assert server.get(timeout=T).data == ("big", 0)
    with pytest.raises(KeyboardInterrupt):
        server.get(timeout=T)
    assert server.statistics().peers[0].queue_in == 2  # the message is back in the queue
    assert [server.get(timeout=T).data for _ in range(2)] == [("big", 1), ("big", 2)]
    settled(server)


def test_interrupted_get_many_gives_back_everything_it_took_in_order(transport):
    load = InterruptedLoad(lambda obj: obj == "third")
    server = transport.make_server(load=load)
    client = transport.connect(server)
    client.put("first").result(T)
    client.put_many(["batch 0", "batch 1", "batch 2"]).result(T)
    client.put("third").result(T)
    client.put("fourth").result(T)
    wait_for(lambda: server.statistics().peers[0].queue_in == 4, T,
             message="the four messages to arrive")

    with pytest.raises(KeyboardInterrupt):
        server.get_many(max_messages=100, timeout=T)
    expected = ["first", "batch 0", "batch 1", "batch 2", "third", "fourth"]
    assert [m.data for m in server.get_many(max_messages=100, timeout=T)] == expected
    settled(server)


def test_get_many_drops_only_the_unreadable_message(transport):
    load = InterruptedLoad(lambda obj: obj == "unreadable", ValueError("bad pickle"))
    server = transport.make_server(load=load)
    client = transport.connect(server)
    for data in ("before 0", "before 1", "unreadable", "after"):
        client.put(data).result(T)
    wait_for(lambda: server.statistics().peers[0].queue_in == 4, T,
             message="the four messages to arrive")

    with pytest.raises(nq.DeserializationError) as caught:
        server.get_many(max_messages=100, timeout=T)
    assert caught.value.peer == client.id
    assert [m.data for m in server.get_many(max_messages=100, timeout=T)] == [
        "before 0", "before 1", "after"]
    settled(server)


def test_interrupted_get_counts_its_message_once_when_another_get_ran_meanwhile(transport):
    """Thread A's get() is inside load when thread B's get() takes the next message (which
    counts A's message as consumed); then A is interrupted. A's message goes back and the
    budget still counts it once: nothing held at the end."""
    inside, release = threading.Event(), threading.Event()
    serializer = PickleSerializer()

    def load(stream):
        obj = serializer.load(stream)
        if obj == "slow" and not inside.is_set():
            inside.set()
            assert release.wait(T)
            raise KeyboardInterrupt
        return obj

    server = transport.make_server(load=load)
    client = transport.connect(server)
    client.put("slow").result(T)
    client.put("quick").result(T)
    wait_for(lambda: server.statistics().peers[0].queue_in == 2, T,
             message="both messages to arrive")

    outcome: list[KeyboardInterrupt] = []

    def interrupted_get() -> None:
        try:
            server.get(timeout=T)
        except KeyboardInterrupt as error:  # the expected outcome
            outcome.append(error)

    thread_a = threading.Thread(target=interrupted_get)
    thread_a.start()
    assert inside.wait(T)
    assert server.get(timeout=T).data == "quick"
    release.set()
    thread_a.join(T)
    assert not thread_a.is_alive() and isinstance(outcome[0], KeyboardInterrupt)

    assert server.statistics().peers[0].queue_in == 1
    # The message load lets through now: the slow one, loaded on the second try.
    assert server.get(timeout=T).data == "slow"
    settled(server)


def test_a_get_ends_when_the_io_thread_dies_under_it_and_after(transport, monkeypatch):
    """A blocked get() looks at the engine's state only when it wakes with nothing to take: the
    I/O thread's death must wake it with ConnectionLost, and a later get() must not wait."""
    server = transport.make_server()
    client = transport.connect(server)
    client.put("hello").result(T)
    assert server.get(timeout=T).data == "hello"
    getter, outcome = blocked_get(server)
    wait_for(lambda: server._inboxes.getters == 1, T, message="the get() to wait")

    def broken_service(now: float) -> float:
        raise RuntimeError("the loop broke")

    monkeypatch.setattr(server._engine, "service", broken_service)
    server._loop.wake()
    getter.join(T)
    assert not getter.is_alive(), "get() slept through the I/O thread's death"
    assert len(outcome) == 1 and isinstance(outcome[0], nq.ConnectionLost), outcome
    assert server._engine.closed.wait(T)
    # The loop has ended: nothing more will come, and every later get() says why (it broke),
    # however the woken one raced the loop's end.
    with pytest.raises(nq.ConnectionLost):
        server.get()
    with pytest.raises(nq.ConnectionLost):
        server.get_nowait()


def test_transport_is_a_deprecated_name_of_the_loop(transport):
    """``Communicator.loop`` is the I/O loop (what ``transport`` used to name): the old name
    still answers, with the same object and a DeprecationWarning that names the new one."""
    server = transport.make_server()
    assert server.loop is server._loop
    assert server.loop.address == server.address
    with pytest.warns(DeprecationWarning, match=r"Communicator\.loop"):
        assert server.transport is server.loop
