"""The receive budget and credit: how much each peer may send us, counted and granted here.

:mod:`netq.flow` is the policy (pure functions of numbers); this module keeps the numbers and
acts on them, for one communicator (:class:`ReceiveBudget`):

* the totals: bytes received and not yet taken by ``get()`` ("held"), and credit granted to
  live links and not yet used ("outstanding"); ``recv_budget`` covers both;
* what ``get()`` has handed out (:attr:`ReceiveBudget.lent`, :meth:`ReceiveBudget.lend`): a
  message counts as held until the next ``get()`` (the caller may still be using it), then as
  consumed (:meth:`ReceiveBudget.settle_lent`);
* grants: a new link's HELLO grant, the SESSION frame's take-back, top-ups as messages arrive
  and as ``get()`` frees room (peers whose grant the budget capped wait in a queue, served
  when room frees), message credit (``queue_size``);
* the bandwidth-delay probe that lets a window grow on a long path;
* whether the budget is full, for warnings and statistics (:class:`netq.diagnostics
  .BudgetView`);
* the buffers large parts are received into (:attr:`ReceiveBudget.receive_pool`, shared by
  the links), bounded by the budget.

Threads: the I/O thread grants, probes and counts arrivals; ``get()`` (under the
communicator's receive lock) counts consumption (:meth:`settle_lent`, :meth:`returned`, the
lent list). Each total has one writer.

Both hot paths cost one call each: :meth:`ReceiveBudget.arrived` once per read, whatever it
brought, and :meth:`ReceiveBudget.settle_lent` once per ``get()``. Each counts in plain
attributes and calls into the policy only when a threshold it keeps says something may be due
(a top-up, message credit, a probe, peers waiting for room).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Protocol

from . import flow
from ._buffers import ReceivePool
from .contract import Link
from .protocol.events import MessageReceived
from .session import PeerSession
from .stall import StallWarning

__all__ = ("BDP_PING", "ReceiveBudget")

BDP_PING = 1 << 63  # PING tokens with this bit are bandwidth-delay probes, not heartbeats
_BDP_BACKOFF_MAX = 1.0  # seconds between probes at most, while rounds show the path limits
STARVED_RECHECK = 1.0  # seconds between counts of the peers out of credit (one pass over them)
# A consumer that waited in get() or took a message within this many seconds is taking
# messages now: held bytes count against each peer's window (netq.flow.plan_grant's
# ``consuming``). Longer than a consumer's work on one large message (or the first one's, which
# may import numpy); short, because a peer held back this way waits that long once the
# consumer stops (a batch put right after a loop of get()s).
CONSUMER_RECENT = 0.5


class Consumers(Protocol):
    """What the budget reads of the get() side (netq.inbox.Inboxes)."""

    @property
    def getters(self) -> int:
        """get() calls waiting now."""


class ReceiveBudget:
    """One communicator's receive budget and the credit its peers have."""

    def __init__(self, limits: flow.FlowLimits, *, recv_messages: int, stall_warning: float,
                 peer_count: Callable[[], int], schedule: Callable[[PeerSession], None],
                 clock: Callable[[], float],
                 look_within: Callable[[float], None] | None = None,
                 consumers: Consumers | None = None) -> None:
        """``recv_messages``: the message count a peer may have unread (queue_size, or
        flow.UNLIMITED_MESSAGES). ``peer_count``: how many peers share the budget.
        ``schedule``: ask the I/O thread to service a session (grant it credit) soon.
        ``clock``: monotonic seconds (time.monotonic; a test may pass its own).
        ``look_within``: ask the I/O thread to call :meth:`watch` within that many seconds
        (a peer the consumer holds back is granted again once the consumer stops).
        ``consumers``: the get() side, whose waiting calls say a consumer is there."""
        self.limits = limits
        self.recv_messages = recv_messages
        self._counts_messages = recv_messages != flow.UNLIMITED_MESSAGES
        # Messages get() takes before their message credit is worth sending (0: never).
        self._message_credit_every = flow.message_credit_batch(recv_messages)
        # flow.ample_credit of the window last looked at: the peers of a communicator mostly
        # share one window, so an arrival finds it here (a window of -1 matches none).
        self._ample_window = -1
        self._ample_credit = 0
        self._stall_warning = stall_warning
        self._peer_count = peer_count
        self._schedule = schedule
        self._clock = clock
        # largest_window() as of the last change of the peer count, which happens only where
        # this budget hears of it (session_opened, forget): arrivals compare against it.
        self._largest_window = self.largest_window()
        # held = received - consumed (two writers, one each); outstanding: I/O thread.
        self._received_total = 0
        self._consumed_total = 0
        self._outstanding = 0
        # The peers the budget holds back, in the order they began to wait: a dict, so that
        # one stops waiting in O(1) (a storm of thousands of small peers all wait; a deque's
        # remove() scanned them all, once per grant).
        self._waiters: dict[PeerSession, None] = {}
        # Peers out of credit among the waiters, counted in one pass at most once per
        # STARVED_RECHECK (thousands of idle waiters make a pass per I/O step costly).
        self._starved = 0
        self._starved_counted_at = -STARVED_RECHECK
        # _consumed_total from which every waiter is served again (a window's worth freed)
        self._next_wake_total = limits.window_min
        self._full: StallWarning | None = None  # the budget too full to grant credit
        # What get() had taken when the budget was last seen full (consumed, handed out): a
        # full budget that get() keeps emptying is busy, not stalled.
        self._taken_when_full = (0, 0)
        self._bdp_tokens = itertools.count(1)
        # (session, size) handed out by get(): counted as consumed on the next get(), so a
        # peer cannot send the next large message while the caller still holds this one.
        # get() appends under the receive lock (lend(), or inline on its hot path).
        self.lent: list[tuple[PeerSession, int]] = []
        # Whether a consumer is taking messages (flow.plan_grant's ``consuming``): the consumed
        # total and the count of lent messages as of the last look, and when the consumer was
        # last seen (they moved, or a get() waited).
        self._consumed_seen = 0
        self._lent_seen = 0
        self._consumer_at = -CONSUMER_RECENT
        self._look_within = look_within
        self._consumers = consumers
        # Peers whose grant the consumer's rule held back: granted again when it stops.
        self._held_back: dict[PeerSession, None] = {}
        # The large part buffers every link of this communicator receives into, reused once
        # get()'s caller drops a message: within the budget, so that the free ones and the
        # messages held stay within recv_budget (netq._buffers.ReceivePool).
        self.receive_pool = ReceivePool(limits.budget)

    # ------------------------------------------------------------------ totals

    @property
    def held_bytes(self) -> int:
        """Bytes received from all peers and not yet taken by get()."""
        return self._received_total - self._consumed_total

    @property
    def outstanding_bytes(self) -> int:
        """Credit our peers still have (what may still arrive without a new grant)."""
        return self._outstanding

    @property
    def budget_bytes(self) -> int:
        return self.limits.budget

    @property
    def waiting_peers(self) -> int:
        """Peers the budget holds back with no credit left: they wait for get() to free
        room (counted at most once per STARVED_RECHECK, see :meth:`watch`)."""
        return min(self._starved, len(self._waiters))

    @property
    def full_since(self) -> float | None:
        return self._full.since if self._full is not None else None

    def room(self) -> int:
        """What the budget can still promise: recv_budget - held - outstanding (may be < 0)."""
        return self.limits.budget - self.held_bytes - self._outstanding

    def share(self) -> int:
        """Each peer's share of the receive budget (netq.flow)."""
        return self.limits.budget // max(1, self._peer_count())

    def largest_window(self) -> int:
        limits = self.limits
        return max(limits.window_min, min(limits.window_max, self.share()))

    def recount(self, link: Link) -> None:
        """Bring the outstanding total up to date with this link's allowance (I/O thread)."""
        allowance = max(link.conn.recv_allowance_bytes, 0)
        self._outstanding += allowance - link.credit_counted
        link.credit_counted = allowance

    # ------------------------------------------------------------------ links (I/O thread)

    def hello_grant(self) -> int:
        """The credit a new link's HELLO grants, counted as outstanding from now on (the Link
        built around the connection counts it as ``credit_counted``)."""
        grant = flow.initial_grant(self.limits, self.room())
        self._outstanding += grant
        return grant

    def session_takeback(self, session: PeerSession, link: Link) -> int:
        """Of the link's HELLO grant, the bytes our SESSION frame takes back for ``session``:
        a peer reconnecting to a stalled receiver cannot add a grant per link."""
        self.recount(link)
        granted = max(link.conn.recv_allowance_bytes, 0)
        return flow.takeback(self.limits, granted=granted, window=session.window,
                             held=session.held_bytes, room=self.room() + granted,
                             share=self.share())

    def session_opened(self, session: PeerSession, link: Link) -> None:
        """Our SESSION frame went out: count its take-back; message credit starts afresh."""
        self.recount(link)
        session.credited_messages = session.consumed_messages
        session.credit_requested = False
        self._largest_window = self.largest_window()  # the peer may be new: shares change

    def link_closed(self, link: Link) -> None:
        """The link's credit can no longer be used."""
        self._outstanding -= link.credit_counted
        link.credit_counted = 0

    def forget(self, session: PeerSession) -> None:
        """The session is gone: it waits for nothing, and the others' shares grow."""
        self._stop_waiting(session)
        self._held_back.pop(session, None)
        self._largest_window = self.largest_window()

    # ------------------------------------------------------------------ arrivals (I/O thread)

    def arrived(self, session: PeerSession, link: Link,
                messages: Iterable[MessageReceived]) -> None:
        """``messages`` (one read's worth) just arrived from ``session`` on ``link``: count them
        as held, probe, top up (send lock held).

        The common case, a peer with credit to spare and no probe due, costs this call (and a
        clock read while probes back off): the thresholds (:func:`flow.ample_credit` of the
        window, the largest window, the probe's backoff, message credit) are compared here,
        and the policy is asked only when one of them is crossed.
        """
        count = size = 0
        for message in messages:
            count += 1
            size += message.size
        session.received_messages += count
        session.received_bytes += size
        self._received_total += size
        if session.bdp_token:
            if session.bdp_link is link:
                session.bdp_bytes += size  # a probe is under way: this round's bytes
            else:
                self.probe(session, link, size)  # it went out on a link that is gone
        elif session.window < self._largest_window and (
                not session.bdp_backoff or self._clock() >= session.bdp_next_at):
            self.probe(session, link, size)  # the window may still grow, and no backoff
        allowance = link.conn.recv_allowance_bytes
        window = session.window
        if window != self._ample_window:
            self._ample_window, self._ample_credit = window, flow.ample_credit(window)
        if allowance > self._ample_credit and not session.credit_requested and (
                session.consumed_messages == session.credited_messages
                or not self._counts_messages):
            # flow.credit_suffices and no message credit pending: nothing to grant yet, only
            # the outstanding count changes (recount, inline).
            counted = allowance if allowance > 0 else 0
            self._outstanding += counted - link.credit_counted
            link.credit_counted = counted
        else:
            self.grant(session, link, size)

    def grant(self, session: PeerSession, link: Link, arrived: int = 0) -> None:
        """Top the peer's credit up as the flow policy says (send lock held).

        ``arrived``: bytes of the messages this top-up answers (not yet seen by get()).
        """
        conn = link.conn
        self.recount(link)
        allowance = conn.recv_allowance_bytes
        held = session.held_bytes + conn.incoming_bytes  # a message under way counts already
        consuming = self.consuming()
        plan = flow.plan_grant(self.limits, window=session.window, allowance=allowance,
                               held=held, room=self.room(), starved=allowance <= 0,
                               backlog=held - arrived, share=self.share(), consuming=consuming)
        session.window = plan.window
        if consuming and plan.limited:
            if session not in self._held_back:
                self._held_back[session] = None
                if self._look_within is not None:
                    self._look_within(CONSUMER_RECENT)  # watch() grants it once nobody takes
        elif self._held_back:
            self._held_back.pop(session, None)
        messages = 0
        if session.credit_requested or session.consumed_messages != session.credited_messages:
            session.credit_requested = False
            messages, session.credited_messages = flow.message_credit(
                consumed=session.consumed_messages, credited=session.credited_messages,
                recv_messages=self.recv_messages)
        if plan.nbytes or messages:
            conn.send_credit(plan.nbytes, messages)
            self.recount(link)
        if plan.limited:
            if not session.credit_waiting:
                session.credit_waiting = True
                self._waiters[session] = None
        else:
            self._stop_waiting(session)

    def consuming(self) -> bool:
        """Has a consumer waited in get() or taken a message within :data:`CONSUMER_RECENT`
        seconds (as seen from the I/O thread: a get() waits now, or what get() handed out or
        consumed changed since the last look)?"""
        now = self._clock()
        consumed, lent = self._consumed_total, len(self.lent)
        if consumed != self._consumed_seen or lent != self._lent_seen or (
                self._consumers is not None and self._consumers.getters):
            self._consumed_seen, self._lent_seen = consumed, lent
            self._consumer_at = now
        return now - self._consumer_at < CONSUMER_RECENT

    def _stop_waiting(self, session: PeerSession) -> None:
        if session.credit_waiting:
            session.credit_waiting = False
            self._waiters.pop(session, None)

    # ------------------------------------------------------------------ the probe (I/O thread)

    def probe(self, session: PeerSession, link: Link, size: int) -> None:
        """Measure the bandwidth-delay product while the window may still grow (netq.flow).

        A PING goes out with the first data of a round trip; the bytes that arrive until its
        PONG, with the data that prompted it, are one round trip's worth of this peer's
        traffic. (The peer answers the PING before it sends what our credit lets it send
        next, so the data behind the PONG is the next round's; the data that prompted the
        PING was this round's, and without it a window of a few large messages would look
        one short.)
        """
        if session.bdp_token:
            if session.bdp_link is link:
                session.bdp_bytes += size
                return
            session.bdp_token = 0  # the probe went out on a link that is gone
        if session.window >= self.largest_window():
            return
        if session.bdp_backoff and self._clock() < session.bdp_next_at:
            return
        token = BDP_PING | next(self._bdp_tokens)
        link.conn.send_ping(token)
        session.bdp_token, session.bdp_bytes, session.bdp_link = token, size, link

    def probe_answered(self, session: PeerSession) -> None:
        """The probe's PONG arrived: grow the window if the round says it limits."""
        window = flow.bdp_window(self.limits, window=session.window, sample=session.bdp_bytes,
                                 backlog=session.held_bytes, share=self.share())
        session.bdp_token, session.bdp_link = 0, None
        if window > session.window:
            session.window = window
            session.bdp_backoff = 0.0  # the window was the limit: measure the next round too
            if not session.scheduled:
                self._schedule(session)  # top the credit up to the new window
        else:
            # The path, not the window, limited that round: probe less and less often (a
            # PING per round costs small messages about a tenth of their rate), yet often
            # enough to notice when the traffic grows.
            backoff = min(max(2 * session.bdp_backoff, 0.01), _BDP_BACKOFF_MAX)
            session.bdp_backoff, session.bdp_next_at = backoff, self._clock() + backoff

    # ------------------------------------------------------------------ get() (receive lock)

    def lend(self, session: PeerSession, size: int) -> None:
        """get() hands out a message of ``size`` bytes: it stays held until the next get()."""
        self.lent.append((session, size))

    def lent_bytes(self, session: PeerSession) -> int:
        """Bytes of ``session``'s that the caller of the last get() still holds."""
        return sum(size for owner, size in list(self.lent) if owner is session)

    def taken_bytes(self) -> int:
        """Bytes the caller of the last get() holds: taken out of the queues, still counted
        in :attr:`held_bytes` (their credit returns on the next get())."""
        return sum(size for _owner, size in list(self.lent))

    def settle_lent(self) -> bool:
        """The next get(): what was handed out before is consumed now. True when it scheduled
        sessions for the I/O thread (the caller wakes it).

        Message credit (``queue_size``) returns here; byte credit returned when the message
        arrived, so this only has to wake peers the budget held back once enough is free.
        """
        wake = False
        lent = self.lent
        every = self._message_credit_every
        for session, size in lent:
            consumed = session.consumed_messages = session.consumed_messages + 1
            session.consumed_bytes += size
            self._consumed_total += size
            # flow.message_credit_due, inline: checked per message taken.
            if every and not session.credit_requested \
                    and consumed - session.credited_messages >= every:
                session.credit_requested = True
                self._schedule(session)
                wake = True
            # _wake_waiters' two tests, inline: most messages pass neither.
            if self._waiters and (self._consumed_total >= self._next_wake_total
                                  or session.credit_waiting and not session.scheduled):
                wake |= self._wake_waiters(session)
        lent.clear()
        return wake

    def _wake_waiters(self, session: PeerSession) -> bool:
        """Peers the budget held back may get credit once ``session``'s get() consumed a
        message. True when it scheduled sessions."""
        if self._consumed_total >= self._next_wake_total:
            # A window's worth freed since the last look: every waiter may get some.
            self._next_wake_total = self._consumed_total + self.limits.window_min
            for waiter in list(self._waiters):
                if not waiter.scheduled:
                    self._schedule(waiter)
            return True
        if session.credit_waiting and not session.scheduled:
            # Less freed, by a peer that waits itself: it tops up from what its own
            # message freed. (Waking every waiter on each such message made a storm of
            # thousands of waiting peers cost a grant per waiter per message taken.)
            self._schedule(session)
            return True
        return False

    def give_back(self, session: PeerSession, size: int) -> None:
        """A message handed out goes back to its inbox (its get() failed): held again."""
        entry = (session, size)
        if entry in self.lent:
            self.lent.remove(entry)
        else:
            self.returned(session, size)

    def returned(self, session: PeerSession, nbytes: int) -> None:
        """A message settle_lent() consumed went back to ``session``'s inbox.

        Undoes the counting, so that the message counts once when it is taken again. Credit
        that went out for it in between stays out: the peer may send one message early.
        """
        session.consumed_messages -= 1
        session.consumed_bytes -= nbytes
        self._consumed_total -= nbytes

    # ------------------------------------------------------------------ fullness (I/O thread)

    def watch(self, now: float) -> tuple[StallWarning | None, float]:
        """Is the budget too full to grant credit to peers that wait for it? Returns the stall
        (None when not full) and seconds until a warning could first be due (or until the
        peers the consumer's rule held back are granted again: see :meth:`consuming`)."""
        again = self._grant_held_back()
        if self._waiters and self.room() < flow.CREDIT_FLOOR \
                and now - self._starved_counted_at >= STARVED_RECHECK:
            self._starved_counted_at, self._starved = now, self._count_starved()
        if self._waiters and self.room() < flow.CREDIT_FLOOR and self._starved:
            taken = (self._consumed_total, len(self.lent))
            if self._full is None:
                self._full = StallWarning(self._stall_warning, now)
            elif taken != self._taken_when_full:
                # get() took messages since the last look: peers wait for credit because
                # they send faster than the consumer takes (messages as large as the budget
                # fill it each time), which is news only once get() stops taking.
                self._full.progress(now)
            self._taken_when_full = taken
            return self._full, min(self._full.until_due(now), again)
        if not self._waiters:
            self._starved = 0
        self._full = None
        return None, min(self._stall_warning, again)

    def _grant_held_back(self) -> float:
        """Once no consumer takes messages, schedule the peers its rule held back (their
        grant is planned again, against the budget alone). Seconds until the next look."""
        if not self._held_back:
            return self._stall_warning
        if self.consuming():
            return max(self._consumer_at + CONSUMER_RECENT - self._clock(), 0.001)
        held_back = list(self._held_back)
        self._held_back.clear()
        for session in held_back:
            if not session.scheduled:
                self._schedule(session)
        return self._stall_warning

    def _count_starved(self) -> int:
        return len(self.starved_sessions())

    def starved_sessions(self) -> list[PeerSession]:
        """Peers the budget holds back that have no credit left. The others (idle peers
        keeping their floor, however many) can still send: the budget holds nobody up."""
        return [session for session in list(self._waiters)  # a copy: get() may remove
                if session.link is not None and session.link.conn.recv_allowance_bytes <= 0]
