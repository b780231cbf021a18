"""Held ACKs (netq.link_driver): an ACK that waits for the reply a waiting get() may send.

Over a socket, the ACK for a message read while a get() waits may be held for a moment
(``netq.transports.sockets.ACK_HOLD``), so that the reply the caller is about to put() carries
it in the same write. When no reply comes, the sender's future must not wait out the hold:

* a get() that comes back without a put() (it leads the loop, or goes back to sleep on its
  gate) sends the held ACKs;
* the ACK of a large message is not held at all: one more small write is nothing beside it,
  and a sender that waits for each future ("put, wait, put again") would wait for the
  consumer too;
* once a hold went without a reply, the next ACKs of that link are not held (a back-off,
  ``netq.link_driver.HOLD_SKIP_LIMIT``): a consumer that goes on with other work after get()
  would make each sender wait out a hold, and then the GIL its thread holds.

The hold is made a minute long here, so that only these rules, not its deadline, can resolve
the futures within the tests' bound.
"""

from __future__ import annotations

import threading

import pytest

import netq as nq
from netq.transports import sockets
from netq_testing import wait_for

MiB = 1024 * 1024
T = 20.0  # seconds any blocking step may take before the test is considered stuck
# Seconds a future may take here: far below the hold, and below the heartbeat whose PING
# would carry a held ACK too.
FUTURE = 5.0
HOLD = 60.0  # seconds an ACK may be held in these tests

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.parametrize("transport", ["tcp", "unix-noshm"], indirect=True)]


class Consumer:
    """A thread that takes ``count`` messages with get(), then waits in one more get() until
    ``stop()`` sends the message that ends it (with ``pause``: not before ``stop()``, so that
    no get() comes back after the last message until then)."""

    def __init__(self, server, client, count: int, pause: bool = False) -> None:
        self.server, self.client, self.count = server, client, count
        self.taken: list[object] = []
        self.resume = threading.Event()
        if not pause:
            self.resume.set()
        self.thread = threading.Thread(target=self._run, name="test-consumer")
        self.thread.start()

    def _run(self) -> None:
        for _ in range(self.count):
            self.taken.append(self.server.get(timeout=T).data)
        self.resume.wait(T)
        self.server.get(timeout=T)  # back without a put(): ends with stop()'s message

    def stop(self) -> None:
        self.resume.set()
        stopped = self.client.put(b"stop")
        self.thread.join(T)
        assert not self.thread.is_alive()
        # Its ACK may be held for a reply (the consumer's get() waited for it): a get() back
        # without a put() sends it.
        with pytest.raises(nq.Empty):
            self.server.get(timeout=0.2)
        stopped.result(FUTURE)


def _pair(transport, monkeypatch):
    monkeypatch.setattr(sockets, "ACK_HOLD", HOLD)
    # A window that these messages never use up: no CREDIT frame goes out to carry an ACK.
    server = transport.make_server(window_min=32 * MiB, recv_budget=64 * MiB)
    client = transport.connect(server)
    client.put(b"warm-up").result(T)
    assert server.get(timeout=T).data == b"warm-up"
    return server, client


def test_a_get_back_without_a_put_sends_the_held_ack(transport, monkeypatch):
    server, client = _pair(transport, monkeypatch)
    try:
        consumer = Consumer(server, client, 1)
        wait_for(lambda: server._inboxes.getters == 1, T, message="the get() to wait")
        client.put(b"small").result(FUTURE)  # its ACK was held for a reply that never comes
        consumer.stop()
        assert consumer.taken == [b"small"]
    finally:
        client.close()
        server.close()


def test_the_ack_of_a_large_message_is_not_held_for_a_reply(transport, monkeypatch):
    """Its consumer takes it and does not call get() again: the future resolves anyway."""
    server, client = _pair(transport, monkeypatch)
    big = bytes(range(256)) * 4096  # 1 MiB
    try:
        # Several, so that the window has grown: no CREDIT frame carries the last one's ACK.
        consumer = Consumer(server, client, 6, pause=True)
        for _ in range(6):
            wait_for(lambda: server._inboxes.getters == 1, T, message="the get() to wait")
            client.put(big).result(FUTURE)
        wait_for(lambda: len(consumer.taken) == 6, T, message="the messages to be taken")
        assert all(bytes(data) == big for data in consumer.taken)
        consumer.stop()
    finally:
        client.close()
        server.close()


def test_after_a_hold_no_reply_carried_the_next_ack_is_not_held(transport, monkeypatch):
    """The consumer's first get() comes back without a put() (the hold went unanswered); the
    second message's consumer then works on and calls get() no more: its future resolves
    anyway, not after the hold."""
    server, client = _pair(transport, monkeypatch)
    try:
        consumer = Consumer(server, client, 2, pause=True)
        wait_for(lambda: server._inboxes.getters == 1, T, message="the get() to wait")
        client.put(b"first").result(FUTURE)  # released when the get() came back for more
        wait_for(lambda: len(consumer.taken) == 1 and server._inboxes.getters == 1, T,
                 message="the second get() to wait")
        client.put(b"second").result(FUTURE)  # the consumer calls no get() until stop()
        # The future resolved on receipt: the consumer's thread may not have stored it yet.
        wait_for(lambda: len(consumer.taken) == 2, T, message="the second to be taken")
        assert consumer.taken == [b"first", b"second"]
        consumer.stop()
    finally:
        client.close()
        server.close()
