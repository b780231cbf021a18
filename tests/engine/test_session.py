"""PeerSession's send queue, sans I/O: when a put() blocked by send_budget is woken.

The pump moves messages onto a link's connection; here the connection is the few attributes
and the one method ``PeerSession.pump`` uses of it (credit, state, the peer's limit,
``queue_message``), so that each pump moves exactly the messages the test grants credit for.
"""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace

import netq.session
from netq.protocol.events import ConnectionState
from netq.session import Outgoing, PeerSession
from netq.stall import StallWarning

MiB = 1024 * 1024
WAIT_S = 10.0


class _Connection:
    """What PeerSession.pump reads and calls of a link's connection."""

    state = ConnectionState.OPEN
    sent_bye = False

    def __init__(self) -> None:
        self.send_credit_bytes = 1 << 40
        self.send_credit_messages = 0  # granted one message at a time by the test
        self.peer = SimpleNamespace(max_message=1 << 40)
        self.queued: list[int] = []

    @property
    def can_send_data(self) -> bool:
        return self.send_credit_messages > 0

    def queue_message(self, seq: int, parts, size: int, batch: bool, queued_behind=()) -> None:
        self.send_credit_messages -= 1
        self.queued.append(seq)


class _CountingCondition(threading.Condition):
    notified = 0

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


def _message(size: int) -> Outgoing:
    future = SimpleNamespace(start_gate=bytearray())
    return Outgoing((b"",), size, False, future)  # type: ignore[arg-type]


def test_a_put_blocked_by_the_budget_is_woken_once_a_quarter_of_it_is_free(monkeypatch):
    # The put() looks for itself only after the test: what ends its wait is the pump's call.
    monkeypatch.setattr(netq.session, "_SPACE_POLL", WAIT_S)
    session = PeerSession(uuid.uuid4())
    session.space = space = _CountingCondition(session.put_lock)
    budget = 8 * MiB
    for _ in range(8):  # eight 1 MiB messages queued: the budget is full
        session.outbox.append(_message(MiB))
        session.queued_bytes += MiB
    assert not session.has_room(budget, 1000)
    returned = threading.Event()

    def blocked_put() -> None:
        with session.put_lock:
            session.wait_for_space(budget, 1000, WAIT_S, StallWarning(60.0, time.monotonic()),
                                   lambda: False, lambda: "full", "test")
        returned.set()

    putter = threading.Thread(target=blocked_put)
    putter.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while session.space_waiters != 1:  # bounded poll: the put() is waiting
            assert time.monotonic() < deadline, "the put() never waited"
            time.sleep(0.001)
        conn = _Connection()
        link = SimpleNamespace(conn=conn)
        for moved in (1, 2):  # 7 MiB, then 6 MiB (three quarters) still queued: not yet
            conn.send_credit_messages = 1
            with session.send_lock:
                session.pump(link)  # type: ignore[arg-type]
            assert len(conn.queued) == moved
            assert space.notified == 0, f"woken with {8 - moved} MiB of 8 queued"
        conn.send_credit_messages = 1
        with session.send_lock:
            session.pump(link)  # type: ignore[arg-type]
        assert space.notified == 1  # 5 MiB queued: more than a quarter free
        assert returned.wait(WAIT_S)
    finally:
        putter.join(WAIT_S)
    assert not putter.is_alive()
