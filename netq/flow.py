"""Receive-side credit policy: how much a peer may send us, decided in one place.

A communicator has one receive budget (``ConnectionOptions.recv_budget`` bytes) shared by all
its peers. It covers two things: bytes received and not yet taken by ``get()`` ("held"), and
credit granted to peers and not yet used ("outstanding": what may still arrive). The engine
keeps both totals; this module only decides, from numbers, what to grant. No I/O, no clock.

Each peer has a *window*: the credit we aim to keep outstanding with it, so that the pipe
stays full while its messages are being received. Credit returns as soon as a message
*arrives* (not when ``get()`` takes it), so the credit loop runs on the I/O thread alone and
the window only has to cover the path's bandwidth-delay product. The window starts at
``window_min`` and doubles (or grows to two of the messages that ran it dry, if that is more)
whenever the peer ran out of credit before our top-up reached it
(the sender was starved, so the window was smaller than the path needs) while the consumer
keeps up (what the peer had waiting before its latest messages is no larger than its window)
and the budget can afford it; it never exceeds ``window_max`` nor the peer's share. This is
TCP receive autotuning's rule (grow when the sender fills the window within a round trip)
applied to netq's credit. On a long path the receiver cannot see the sender starve (the
window's bytes are still on their way when the sender runs dry), so the engine also measures
the bandwidth-delay product as gRPC's BDP probe does: a PING goes out with the first data of a
round, the bytes that arrive until its PONG are one round trip's worth, and a round that
carried most of the window means the window is what limits (:func:`bdp_window`).

Unread data piles up into the budget while nobody consumes: an absent consumer (a batch put
before it is got) makes ``held`` grow until the budget is full, and from then on the peers get
no more credit (the window stops growing because held exceeds it) until ``get()`` frees room.
While a consumer is taking messages (``consuming``: the engine says one took a message
recently), a peer's held bytes count against its window as well, as a TCP receive window
shrinks by what the application has not read: credit tops held + outstanding up to the
window, not to the budget. A consumer that lags a little then queues a window (for messages
as large as half the window: one queued while the next arrives), not the budget: the receive
memory of a stream of large messages stays near two of them. Each peer's
held + outstanding credit stays within its *share* of the budget (``recv_budget`` divided by
the number of peers), so one peer's backlog cannot crowd out the others, and a peer may always
have :data:`CREDIT_FLOOR` bytes, so that no peer is starved completely (``get(other_peer)``
still makes progress).

Memory bound (receive side): held + outstanding <= ``recv_budget`` + per peer
(:data:`CREDIT_FLOOR` + one message), because a message may start on any positive credit;
while a consumer is taking messages, per peer held + outstanding <= its window + one message.
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol.frames import UNLIMITED_MESSAGES

__all__ = ("CREDIT_FLOOR", "FlowLimits", "Grant", "plan_grant", "initial_grant", "takeback",
           "bdp_window", "ample_credit", "credit_suffices", "message_credit",
           "message_credit_batch", "message_credit_due", "UNLIMITED_MESSAGES")

CREDIT_FLOOR = 16 * 1024  # bytes every peer may hold + have outstanding, whatever the budget
# A byte grant smaller than this fraction of the window, to a peer that still has credit, is
# not worth a frame: it waits until more is due (1/FRAME_WORTH of the window).
FRAME_WORTH = 4


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """The receive budget and a peer window's range, in bytes."""

    budget: int
    window_min: int
    window_max: int
    floor: int = CREDIT_FLOOR

    def __post_init__(self) -> None:
        if not 0 < self.window_min <= self.window_max:
            raise ValueError("need 0 < window_min <= window_max")
        if self.budget < self.window_min:
            raise ValueError("the receive budget must hold at least one window_min")


@dataclass(frozen=True, slots=True)
class Grant:
    """What to grant now (bytes, possibly 0) and the peer's window from now on."""

    nbytes: int
    window: int
    limited: bool  # the budget, not the window, capped the grant: top up when room frees


def plan_grant(limits: FlowLimits, *, window: int, allowance: int, held: int, room: int,
               starved: bool, backlog: int | None = None, share: int | None = None,
               consuming: bool = False) -> Grant:
    """Credit to grant one peer now.

    ``window``     the peer's current window.
    ``allowance``  credit the peer still has from us (granted - received; negative when a
                   message started on positive credit ran past it).
    ``held``       bytes of this peer's we hold, received and not yet taken by ``get()``.
    ``room``       recv_budget - held (all peers) - outstanding (all peers, this one included).
    ``share``      this peer's share of the budget (default: all of it).
    ``starved``    the peer used up its credit before this top-up (it was waiting for us).
    ``backlog``    of ``held``, what was there before the messages that just arrived (default:
                   all of it). The consumer keeps up while this stays within the window or
                   within what just arrived (the message the caller is holding, taken by the
                   last get() and released by the next, counts as held).
    ``consuming``  a consumer is taking this communicator's messages now: ``held`` counts
                   against the window (held + credit <= window), as unread bytes count against
                   a TCP receive window, so a consumer that lags queues at most a window, not
                   the budget. With no consumer (a batch put before it is got) the budget
                   alone bounds what waits.
    """
    if backlog is None:
        backlog = held
    share = limits.budget if share is None else share
    arrived = held - backlog
    largest = max(limits.window_min, min(limits.window_max, share))
    if starved and backlog <= max(window, arrived) and window < largest and room >= window:
        # Double, or make room for two of the messages that ran it dry: a window smaller than
        # the messages is stop-and-wait, and doubling from 256 KiB would take one round trip
        # per doubling before 16 MiB messages overlap.
        window = min(max(window * 2, 2 * arrived), largest)
    # A negative allowance is the tail of a message that started on positive credit: those
    # bytes have arrived and are counted in ``held``, so paying the debt back lets nothing new
    # arrive. Only credit above zero costs room in the budget.
    debt = max(-allowance, 0)
    credit = max(allowance, 0)
    want = window - credit
    if want <= 0:
        return Grant(0, window, False)
    floor_room = limits.floor - held - credit
    budget_cap = max(min(room, share - held - credit), floor_room)
    consumer_cap = want - held if consuming else want
    grant = min(consumer_cap, budget_cap)
    limited = grant < want
    if grant <= 0:
        return Grant(0, window, True)
    if credit and grant < window // FRAME_WORTH and (not limited or grant < budget_cap):
        # The peer has credit left: not worth a frame yet (limited by the consumer: more is
        # due as it takes messages).
        return Grant(0, window, limited)
    return Grant(debt + grant, window, limited)


def initial_grant(limits: FlowLimits, room: int) -> int:
    """Credit a new link's HELLO grants, before we know which peer it is.

    A connection storm must not promise more than the budget: each new link gets a window's
    start only while there is room for it, and :data:`CREDIT_FLOOR` at least (so the links of
    a storm add at most a floor each beyond the budget, the same bound as the floors).
    """
    return max(limits.floor, min(limits.window_min, room))


def takeback(limits: FlowLimits, *, granted: int, window: int, held: int, room: int,
             share: int | None = None) -> int:
    """How much of a new link's HELLO grant the SESSION frame takes back, for this peer.

    The HELLO was sent before the peer was known; once it is, the link's credit must be what
    :func:`plan_grant` would allow a peer with ``held`` bytes unread and no credit. ``room``
    excludes the HELLO grant itself. Without this, a peer that reconnects again and again to a
    stalled receiver would add a fresh grant per link.
    """
    allowed = plan_grant(limits, window=window, allowance=0, held=held, room=room,
                         starved=False, share=share).nbytes
    return max(0, granted - allowed)


def bdp_window(limits: FlowLimits, *, window: int, sample: int, backlog: int,
               share: int | None = None) -> int:
    """The window after a bandwidth-delay probe: ``sample`` bytes arrived in one round trip.

    A round trip that carried at least two thirds of the window was limited by the window, not
    by the path: the window becomes twice the sample (gRPC's BDP estimator uses the same
    rule), within ``window_max`` and the peer's share, and only while the consumer keeps up
    (``backlog``: what waits unread is within the window).
    """
    share = limits.budget if share is None else share
    largest = max(limits.window_min, min(limits.window_max, share))
    if sample * 3 < window * 2 or backlog > window or window >= largest:
        return window
    return max(window, min(2 * sample, largest))


def ample_credit(window: int) -> int:
    """Credit above which a peer needs no top-up yet: (FRAME_WORTH - 1) / FRAME_WORTH of its
    ``window``, in bytes (rounded down). :func:`credit_suffices` compares against it; the
    receive budget keeps it per window so that an arrival costs no call when nothing is due.
    """
    return window * (FRAME_WORTH - 1) // FRAME_WORTH


def credit_suffices(*, window: int, allowance: int) -> bool:
    """The peer still has more credit than a top-up would be worth: over (FRAME_WORTH - 1) /
    FRAME_WORTH of its window. :func:`plan_grant` would grant no bytes then (not worth a frame,
    and a peer with that much credit is not starved), so the engine may skip planning.
    """
    return allowance > ample_credit(window)


def message_credit_batch(recv_messages: int) -> int:
    """Messages ``get()`` takes before the message credit they free is worth sending (a
    quarter of ``queue_size``, at least one); 0 when the count is unlimited (never)."""
    if recv_messages == UNLIMITED_MESSAGES:
        return 0
    return max(1, recv_messages // FRAME_WORTH)


def message_credit_due(*, consumed: int, credited: int, recv_messages: int) -> bool:
    """``get()`` has taken enough messages since the last message credit went out (a
    :func:`message_credit_batch`) that it is worth sending it now; never when the count is
    unlimited (``recv_messages`` is :data:`UNLIMITED_MESSAGES`)."""
    batch = message_credit_batch(recv_messages)
    return batch > 0 and consumed - credited >= batch


def message_credit(*, consumed: int, credited: int, recv_messages: int) -> tuple[int, int]:
    """(messages to grant now, the new count of messages credited back).

    Every message ``get()`` took since the last grant is returned; none are granted when the
    count is unlimited, but the count still moves (the peer was never limited by it).
    """
    returned = max(0, consumed - credited)
    return (0 if recv_messages == UNLIMITED_MESSAGES else returned), credited + returned
