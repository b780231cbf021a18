"""The receive budget and credit (netq.credit) on their own, over a real sans-I/O Connection
pair (no engine, no socket): totals, grants, message credit, the waiters, the lent list."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable

import pytest

from netq import credit, flow
from netq.contract import Link
from netq.credit import STARVED_RECHECK, ReceiveBudget
from netq.protocol import MessageReceived
from netq.session import PeerSession
from protocol.helpers import open_pair  # tests/protocol (tests/ is on sys.path)

KiB = 1024


class Budget:
    """A ReceiveBudget for one peer, with the link's server end as ours."""

    def __init__(self, budget: int = 1024 * KiB, window: int = 64 * KiB,
                 recv_messages: int = flow.UNLIMITED_MESSAGES,
                 peer_count: Callable[[], int] = lambda: 1) -> None:
        self.scheduled: list[PeerSession] = []
        self.now = 100.0
        self.budget = ReceiveBudget(flow.FlowLimits(budget, window, 4 * window),
                                    recv_messages=recv_messages, stall_warning=5.0,
                                    peer_count=peer_count, schedule=self.scheduled.append,
                                    clock=lambda: self.now)
        grant = self.budget.hello_grant()
        self.pair = open_pair(server={"recv_window": grant, "recv_messages": recv_messages})
        self.link = Link(self.pair.server, "memory")
        self.session = PeerSession(uuid.uuid4(), window=window)
        self.link.session = self.session
        self.seq = 0

    def arrive(self, size: int) -> list[MessageReceived]:
        """The peer sends one message of ``size`` bytes; we count it and top up."""
        self.seq += 1
        client = self.pair.client
        client.send_message(self.seq, [memoryview(bytes(size))], size, False)
        events = [e for e in self.pair.server.receive_data(client.data_to_send())
                  if isinstance(e, MessageReceived)]
        self.budget.arrived(self.session, self.link, events)
        return events

    def credit_sent(self) -> bool:
        """Did our side queue a CREDIT frame (delivered to the peer now)?"""
        before = self.pair.client.send_credit_bytes
        self.pair.client.receive_data(self.pair.server.data_to_send())
        return self.pair.client.send_credit_bytes != before


def test_the_hello_grant_is_outstanding_until_the_link_closes():
    b = Budget()
    assert b.budget.outstanding_bytes == 64 * KiB == b.link.credit_counted
    assert b.budget.room() == 1024 * KiB - 64 * KiB
    b.budget.link_closed(b.link)
    assert b.budget.outstanding_bytes == 0 and b.link.credit_counted == 0


def test_a_small_arrival_is_counted_and_not_worth_a_credit_frame():
    b = Budget()
    b.arrive(4 * KiB)
    assert b.budget.held_bytes == 4 * KiB
    assert b.budget.outstanding_bytes == 60 * KiB  # the allowance shrank by what arrived
    assert not b.credit_sent()  # over three quarters of the window left


def test_credit_returns_as_messages_arrive_once_a_quarter_is_used():
    b = Budget()
    b.arrive(20 * KiB)
    assert b.credit_sent()
    assert b.budget.outstanding_bytes == 64 * KiB  # topped up to the window
    assert b.budget.held_bytes == 20 * KiB


def test_get_consumes_on_the_next_get_and_a_failed_get_gives_back():
    b = Budget()
    b.arrive(8 * KiB)
    b.budget.lend(b.session, 8 * KiB)
    assert b.budget.lent_bytes(b.session) == 8 * KiB and b.budget.held_bytes == 8 * KiB
    b.budget.settle_lent()  # the next get()
    assert b.budget.held_bytes == 0 and b.budget.lent_bytes(b.session) == 0
    b.budget.give_back(b.session, 8 * KiB)  # lent list already settled: consumption undone
    assert b.budget.held_bytes == 8 * KiB and b.session.consumed_messages == 0
    b.budget.lend(b.session, 8 * KiB)
    b.budget.give_back(b.session, 8 * KiB)  # still lent: simply not lent any more
    assert b.budget.held_bytes == 8 * KiB and b.budget.lent_bytes(b.session) == 0


def test_message_credit_is_requested_after_a_quarter_of_queue_size():
    b = Budget(recv_messages=8)
    b.arrive(100)
    b.arrive(100)
    for _ in range(2):  # get() takes both, with nothing arriving meanwhile
        b.budget.lend(b.session, 100)
        b.budget.settle_lent()
    assert b.session.credit_requested and b.scheduled == [b.session]
    b.budget.grant(b.session, b.link)  # the I/O thread's turn
    assert b.session.credited_messages == 2 and not b.session.credit_requested
    assert b.pair.client.send_credit_messages == 6  # 8, less the two it sent
    b.pair.client.receive_data(b.pair.server.data_to_send())
    assert b.pair.client.send_credit_messages == 8


def test_a_full_budget_makes_peers_wait_and_get_wakes_them():
    b = Budget(budget=64 * KiB, window=32 * KiB)
    b.session.link = b.link  # attached, as the engine does after the handshake
    b.arrive(48 * KiB)  # nearly everything is held: the top-up is capped
    assert b.session.credit_waiting and b.link.conn.recv_allowance_bytes > 0
    # The capped grant still lets the peer send: it is held up by nothing yet.
    assert b.budget.watch(b.now) == (None, 5.0) and b.budget.waiting_peers == 0
    assert b.credit_sent()
    b.arrive(b.link.conn.recv_allowance_bytes)  # it spends what it has: now it waits
    b.now += STARVED_RECHECK
    full, wait = b.budget.watch(b.now)
    assert full is not None and wait == 5.0 and b.budget.full_since == b.now
    assert b.budget.waiting_peers == 1
    b.budget.lend(b.session, 64 * KiB)
    assert b.budget.settle_lent()  # room freed: the waiter is scheduled, wake the I/O thread
    assert b.scheduled == [b.session]
    b.budget.grant(b.session, b.link)
    assert not b.session.credit_waiting and b.budget.waiting_peers == 0
    assert b.budget.watch(b.now) == (None, 5.0)


def test_the_probe_grows_the_window_when_a_round_fills_it_and_backs_off_when_not():
    b = Budget(window=64 * KiB)
    b.budget.probe(b.session, b.link, 60 * KiB)
    assert b.session.bdp_token & (1 << 63) and b.session.bdp_bytes == 60 * KiB
    b.budget.probe_answered(b.session)
    assert b.session.window == 120 * KiB and b.scheduled == [b.session]
    b.budget.probe(b.session, b.link, 1 * KiB)
    b.budget.probe_answered(b.session)
    assert b.session.window == 120 * KiB and b.session.bdp_backoff == 0.01
    b.budget.probe(b.session, b.link, 1 * KiB)
    assert b.session.bdp_token == 0  # backing off: no probe until bdp_next_at
    b.now += 1
    b.budget.probe(b.session, b.link, 1 * KiB)
    assert b.session.bdp_token


@pytest.mark.parametrize(("window", "allowance", "suffices"), [
    (64, 49, True), (64, 48, False), (64, 0, False), (64, -5, False)])
def test_credit_suffices_is_plan_grants_frame_worth_rule(window, allowance, suffices):
    assert flow.credit_suffices(window=window * KiB, allowance=allowance * KiB) is suffices
    if suffices:
        plan = flow.plan_grant(flow.FlowLimits(1 << 30, window * KiB, window * KiB),
                               window=window * KiB, allowance=allowance * KiB, held=0,
                               room=1 << 30, starved=False)
        assert plan.nbytes == 0


def test_message_credit_rules():
    assert not flow.message_credit_due(consumed=3, credited=0, recv_messages=16)
    assert flow.message_credit_due(consumed=4, credited=0, recv_messages=16)
    assert flow.message_credit_due(consumed=1, credited=0, recv_messages=1)
    assert not flow.message_credit_due(consumed=10**6, credited=0,
                                       recv_messages=flow.UNLIMITED_MESSAGES)
    assert flow.message_credit(consumed=7, credited=3, recv_messages=16) == (4, 7)
    assert flow.message_credit(consumed=7, credited=3,
                               recv_messages=flow.UNLIMITED_MESSAGES) == (0, 7)


def test_one_read_of_several_messages_is_counted_in_one_arrival():
    b = Budget()
    client = b.pair.client
    for size in (1 * KiB, 2 * KiB, 3 * KiB):
        b.seq += 1
        client.send_message(b.seq, [memoryview(bytes(size))], size, False)
    events = [e for e in b.pair.server.receive_data(client.data_to_send())
              if isinstance(e, MessageReceived)]
    assert len(events) == 3
    b.budget.arrived(b.session, b.link, events)
    assert b.session.received_messages == 3 and b.session.received_bytes == 6 * KiB
    assert b.budget.held_bytes == 6 * KiB
    assert b.budget.outstanding_bytes == 58 * KiB == b.link.credit_counted
    assert not b.credit_sent()  # still over three quarters of the window: no frame


@pytest.mark.parametrize("window", [1, 3, 4, 5, 64 * KiB, 64 * KiB + 1, 64 * KiB + 3])
def test_ample_credit_is_the_threshold_of_credit_suffices(window):
    ample = flow.ample_credit(window)
    for allowance in range(ample - 2, ample + 3):
        assert flow.credit_suffices(window=window, allowance=allowance) is (allowance > ample)
        assert (allowance * flow.FRAME_WORTH > window * (flow.FRAME_WORTH - 1)) \
            is (allowance > ample)


def test_message_credit_batch():
    assert flow.message_credit_batch(16) == 4
    assert flow.message_credit_batch(1) == 1
    assert flow.message_credit_batch(flow.UNLIMITED_MESSAGES) == 0


def test_no_probe_while_the_window_is_the_largest_and_again_once_a_peer_leaves():
    peers = [object(), object()]  # two peers share the budget: 64 KiB each
    b = Budget(budget=128 * KiB, window=64 * KiB, peer_count=peers.__len__)
    b.arrive(1 * KiB)
    assert b.session.bdp_token == 0  # the window is this peer's share already
    peers.pop()  # the other peer's session is forgotten: the share grows
    b.budget.forget(PeerSession(uuid.uuid4()))
    b.arrive(1 * KiB)
    assert b.session.bdp_token  # the window may grow again: a probe went out


def test_an_arrival_with_credit_to_spare_asks_no_policy():
    """The common arrival (credit left, probes backing off) is counted and recounted in the
    one call: no call into netq.flow or the budget's other methods."""
    b = Budget()
    b.arrive(1 * KiB)  # the first arrival probes: answer it with a round too small to grow
    b.budget.probe_answered(b.session)
    assert b.session.bdp_backoff and not b.session.bdp_token
    b.seq += 1
    b.pair.client.send_message(b.seq, [memoryview(bytes(1024))], 1024, False)
    events = b.pair.server.receive_data(b.pair.client.data_to_send())
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename in (credit.__file__, flow.__file__):
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        b.budget.arrived(b.session, b.link, [e for e in events if isinstance(e, MessageReceived)])
    finally:
        sys.setprofile(None)
    assert calls == ["arrived"]
    assert b.budget.held_bytes == 2 * KiB and b.budget.outstanding_bytes == 62 * KiB


class Getters:
    """The get() side, as the budget sees it: how many get() calls wait now."""

    def __init__(self) -> None:
        self.getters = 0


def consumer_budget(getters: Getters, looks: list[float]) -> Budget:
    """A Budget whose ReceiveBudget sees ``getters`` and records the looks it asks for."""
    b = Budget(budget=64 * 64 * KiB, window=64 * KiB)
    # A window that cannot grow: a starved peer would otherwise double it.
    limits = flow.FlowLimits(64 * 64 * KiB, 64 * KiB, 64 * KiB)
    b.budget = ReceiveBudget(limits, recv_messages=flow.UNLIMITED_MESSAGES,
                             stall_warning=5.0, peer_count=lambda: 1,
                             schedule=b.scheduled.append, clock=lambda: b.now,
                             look_within=looks.append, consumers=getters)
    b.budget.hello_grant()
    b.budget.recount(b.link)
    return b


def test_a_consumer_is_seen_by_a_waiting_get_a_lent_message_or_consumption_and_forgotten():
    getters, looks = Getters(), []
    b = consumer_budget(getters, looks)
    assert not b.budget.consuming()
    getters.getters = 1
    assert b.budget.consuming()  # a get() waits
    getters.getters = 0
    b.now += credit.CONSUMER_RECENT
    assert not b.budget.consuming()
    b.budget.lend(b.session, 10)
    assert b.budget.consuming()  # get() handed a message out
    b.now += credit.CONSUMER_RECENT
    assert not b.budget.consuming()
    b.budget.settle_lent()
    assert b.budget.consuming()  # the next get() consumed it
    b.now += credit.CONSUMER_RECENT / 2
    assert b.budget.consuming()


def test_a_peer_the_consumer_holds_back_is_granted_against_the_budget_once_it_stops():
    """A stream of 64 KiB messages (the window): with a consumer, the peer gets no credit while
    one is held; once nobody took a message for CONSUMER_RECENT, watch() schedules it again
    and its grant is planned against the budget alone (a batch put before it is got)."""
    getters, looks = Getters(), []
    b = consumer_budget(getters, looks)
    getters.getters = 1
    b.arrive(64 * KiB)  # out of credit: a top-up is planned, held back by the consumer
    assert not b.credit_sent()
    assert looks == [credit.CONSUMER_RECENT]  # the timers look once the consumer may be gone
    _, wait = b.budget.watch(b.now)
    assert wait == pytest.approx(credit.CONSUMER_RECENT) and b.scheduled == []
    getters.getters = 0
    b.now += credit.CONSUMER_RECENT
    b.budget.watch(b.now)
    assert b.scheduled == [b.session]  # nobody consumes: planned again
    b.budget.grant(b.session, b.link)
    assert b.credit_sent() and b.budget.outstanding_bytes == 64 * KiB
    assert looks == [credit.CONSUMER_RECENT]


def test_get_frees_what_the_consumer_held_back():
    getters, looks = Getters(), []
    b = consumer_budget(getters, looks)
    getters.getters = 1
    b.arrive(64 * KiB)
    assert not b.credit_sent()
    getters.getters = 0
    b.budget.lend(b.session, 64 * KiB)  # taken ...
    assert b.budget.settle_lent()  # ... and consumed by the next get(): the peer is woken
    assert b.scheduled == [b.session]
    b.budget.grant(b.session, b.link)
    assert b.credit_sent() and b.budget.outstanding_bytes == 64 * KiB
