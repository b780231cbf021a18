"""netq.flow: the receive credit policy, from numbers alone."""

from __future__ import annotations

import pytest

from netq.flow import CREDIT_FLOOR, FlowLimits, initial_grant, plan_grant, takeback

KiB = 1024
MiB = 1024 * KiB
LIMITS = FlowLimits(budget=64 * MiB, window_min=256 * KiB, window_max=32 * MiB)


def grant(**values):
    base = {"window": 256 * KiB, "allowance": 0, "held": 0, "room": 64 * MiB, "starved": False}
    base.update(values)
    return plan_grant(LIMITS, **base)


def test_tops_the_window_up():
    plan = grant(allowance=100 * KiB)
    assert plan.nbytes == 156 * KiB and plan.window == 256 * KiB and not plan.limited


def test_a_small_top_up_waits_while_the_peer_has_credit():
    assert grant(allowance=250 * KiB).nbytes == 0  # 6 KiB < a quarter window
    assert grant(allowance=0).nbytes == 256 * KiB  # out of credit: always worth a frame


def test_a_starved_sender_doubles_the_window_up_to_window_max():
    window = 256 * KiB
    for _ in range(20):
        window = grant(window=window, starved=True).window
    assert window == LIMITS.window_max
    assert grant(window=256 * KiB, starved=True).window == 512 * KiB


def test_the_window_does_not_grow_while_data_piles_up_unread():
    assert grant(window=256 * KiB, held=300 * KiB, starved=True).window == 256 * KiB


def test_the_window_does_not_grow_past_what_the_budget_can_afford():
    assert grant(window=256 * KiB, room=100 * KiB, starved=True).window == 256 * KiB


def test_a_full_budget_caps_the_grant_and_says_so():
    plan = grant(allowance=0, held=CREDIT_FLOOR, room=10 * KiB)
    assert plan.nbytes == 10 * KiB and plan.limited
    plan = grant(allowance=0, held=64 * MiB, room=-MiB)
    assert plan.nbytes == 0 and plan.limited


def test_the_floor_survives_a_budget_full_of_other_peers_messages():
    plan = grant(allowance=0, held=0, room=-10 * MiB)
    assert plan.nbytes == CREDIT_FLOOR and plan.limited


def test_the_debt_of_a_message_that_ran_past_its_credit_is_forgiven_once_room_frees():
    # A 256 KiB message started on 64 KiB of credit: the allowance is -192 KiB, and those
    # bytes are held (or consumed). Paying that back costs no room; the new credit does.
    small = FlowLimits(budget=64 * KiB, window_min=64 * KiB, window_max=64 * KiB)
    held = plan_grant(small, window=64 * KiB, allowance=-192 * KiB, held=256 * KiB,
                      room=64 * KiB - 256 * KiB, starved=True)
    assert held.nbytes == 0  # unread: nothing more may come
    taken = plan_grant(small, window=64 * KiB, allowance=-192 * KiB, held=0, room=64 * KiB,
                       starved=True)
    assert taken.nbytes == 192 * KiB + 64 * KiB  # back to a positive 64 KiB


def test_a_connection_storm_gets_windows_while_there_is_room_then_floors():
    assert initial_grant(LIMITS, 64 * MiB) == 256 * KiB
    assert initial_grant(LIMITS, 100 * KiB) == 100 * KiB
    assert initial_grant(LIMITS, -5 * MiB) == CREDIT_FLOOR


def test_takeback_leaves_a_stalled_peer_no_new_credit():
    taken = takeback(LIMITS, granted=256 * KiB, window=256 * KiB, held=64 * MiB, room=0)
    assert taken == 256 * KiB
    assert takeback(LIMITS, granted=256 * KiB, window=256 * KiB, held=0, room=64 * MiB) == 0


def test_limits_are_checked():
    with pytest.raises(ValueError):
        FlowLimits(budget=MiB, window_min=2 * MiB, window_max=2 * MiB)
    with pytest.raises(ValueError):
        FlowLimits(budget=MiB, window_min=512 * KiB, window_max=256 * KiB)


def test_a_peer_stays_within_its_share_of_the_budget():
    plan = grant(allowance=0, held=2 * MiB, room=60 * MiB, share=2 * MiB + 100 * KiB)
    assert plan.nbytes == 100 * KiB and plan.limited
    # The window grows no further than the share either.
    window = 256 * KiB
    for _ in range(20):
        window = grant(window=window, starved=True, share=MiB).window
    assert window == MiB


def test_a_round_trip_that_carried_most_of_the_window_doubles_it():
    assert LIMITS.window_max == 32 * MiB
    # The window limited that round: twice what arrived.
    from netq.flow import bdp_window

    assert bdp_window(LIMITS, window=1 * MiB, sample=900 * KiB, backlog=0) == 1800 * KiB
    # The path limited it: the window stays.
    assert bdp_window(LIMITS, window=4 * MiB, sample=1 * MiB, backlog=0) == 4 * MiB
    # Data piling up unread: no growth, whatever the sample.
    assert bdp_window(LIMITS, window=1 * MiB, sample=1 * MiB, backlog=2 * MiB) == 1 * MiB
    # Within window_max and the share.
    assert bdp_window(LIMITS, window=30 * MiB, sample=30 * MiB, backlog=0) == 32 * MiB
    assert bdp_window(LIMITS, window=1 * MiB, sample=1 * MiB, backlog=0, share=MiB + 5) == MiB + 5


def test_a_window_smaller_than_the_messages_grows_to_two_of_them_at_once():
    plan = grant(window=256 * KiB, allowance=-(16 * MiB - 256 * KiB), held=16 * MiB,
                 backlog=0, starved=True)
    assert plan.window == 32 * MiB  # two 16 MiB messages in flight, not 512 KiB


def test_while_a_consumer_takes_messages_held_bytes_count_against_the_window():
    """Two 16 MiB messages in a 32 MiB window: one taken and held by the caller, one on its
    way. Without a consumer the budget alone bounds what waits; with one, held + credit stay
    within the window, and what get() frees is granted again."""
    window = 32 * MiB
    idle = grant(window=window, allowance=0, held=16 * MiB, room=48 * MiB)
    assert idle.nbytes == 32 * MiB and not idle.limited
    busy = grant(window=window, allowance=0, held=16 * MiB, room=48 * MiB, consuming=True)
    assert busy.nbytes == 16 * MiB and busy.limited  # limited: get() freeing room wakes it
    full = grant(window=window, allowance=16 * MiB, held=16 * MiB, room=32 * MiB,
                 consuming=True)
    assert full.nbytes == 0 and full.limited
    freed = grant(window=window, allowance=16 * MiB, held=0, room=48 * MiB, consuming=True)
    assert freed.nbytes == 16 * MiB and not freed.limited


def test_a_consumer_held_top_up_smaller_than_a_quarter_window_waits_while_credit_lasts():
    small = grant(window=256 * KiB, allowance=100 * KiB, held=130 * KiB, consuming=True)
    assert small.nbytes == 0 and small.limited  # 26 KiB: not worth a frame, wait for more
    starved = grant(window=256 * KiB, allowance=0, held=230 * KiB, consuming=True)
    assert starved.nbytes == 26 * KiB and starved.limited  # out of credit: worth a frame


def test_a_consumer_held_message_larger_than_the_window_waits_until_taken():
    """A 256 MiB message held (its tail paid on credit it ran past): nothing more until get()
    takes it, then the debt and a window."""
    plan = grant(window=32 * MiB, allowance=-224 * MiB, held=256 * MiB, room=-160 * MiB,
                 consuming=True)
    assert plan.nbytes == 0 and plan.limited
    plan = grant(window=32 * MiB, allowance=-224 * MiB, held=0, room=64 * MiB, consuming=True)
    assert plan.nbytes == 224 * MiB + 32 * MiB
