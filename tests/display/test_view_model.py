"""netq/display/view_model.py: the monitor's title row and its badge, live and static.

(The busiest-first order, the ``others`` row and the footnotes are tested beside the live
widget that draws them, in tests/widgets/test_view_model.py.)
"""

from __future__ import annotations

import dataclasses

from netq.display.view_model import (
    LIVE_STATES,
    STATIC_STATES,
    FinalPicture,
    monitor_view,
    snapshot_sentence,
    static_badge,
)

from .snapshots import row, stats


def badge(snapshot, **view) -> str:
    """The badge's data-state in the static or live view of ``snapshot``."""
    return monitor_view(snapshot, **view)["title"]["state"]


def test_the_title_row_names_role_transport_address_and_uptime():
    title = monitor_view(stats(row()), live=True)["title"]
    assert title["role"] == "netq TCP server" and title["address"] == "127.0.0.1:1"
    assert title["uptime"] == "up 2.0 s" and title["facts"][0] == "1 peer"
    assert monitor_view(dataclasses.replace(
        stats(row()), address="('127.0.0.1', 44503)"))["title"]["address"] == "127.0.0.1:44503"


def test_the_badge_is_never_a_live_state_when_static():
    snapshot = stats(row())
    assert badge(snapshot, live=True) == "open"
    # a static form is a snapshot, stopped or closed: never a live state's badge
    assert badge(snapshot) == "snapshot"
    assert monitor_view(snapshot)["snapshot"].startswith("snapshot taken ")
    assert badge(snapshot, view_state="stopped") == "stopped"
    assert badge(dataclasses.replace(snapshot, state="closed")) == "closed"
    # a view stopped (or frozen) before its communicator closed keeps saying so
    assert badge(dataclasses.replace(snapshot, state="closed"), view_state="stopped") == "stopped"
    waiting = stats(row(blocked="no credit", blocked_for=6.0))
    assert badge(waiting, live=True) == "waiting"
    client = dataclasses.replace(stats(row(state="connecting")), purpose="client")
    assert badge(client, live=True) == "connecting"
    refused = dataclasses.replace(client, connect_error="connection refused")
    assert badge(refused, live=True) == "cannot-connect"
    assert monitor_view(refused, live=True)["title"]["label"] == "cannot connect"
    assert {badge(s, live=True) for s in (snapshot, waiting, client, refused)} <= LIVE_STATES
    assert {badge(snapshot), badge(snapshot, view_state="stopped")} <= STATIC_STATES


def test_a_waiting_get_is_listed_with_the_waits():
    idle = dataclasses.replace(stats(row()), get_waiting="get() has waited 7 s for a <message>")
    assert monitor_view(idle, live=True)["waiting"] == ["get() has waited 7 s for a <message>"]
    assert monitor_view(stats(row()), live=True)["waiting"] == []


def keep(*sizes: int) -> str | None:
    """What FinalPicture keeps after samples named by their index and of these sizes."""
    final: FinalPicture[str] = FinalPicture()
    assert final.final() is None
    for index, size in enumerate(sizes):
        final.add(f"s{index}", size)
    return final.final()


def test_the_final_picture_is_the_last_sample_before_the_closing_began():
    assert keep(3, 3, 3) == "s2"  # nothing closing: the newest
    assert keep(0, 3, 3, 2, 1, 0) == "s2"  # 3 peers, then the decline to 0
    assert keep(32, 32, 20, 20, 3) == "s1"  # one sample holding the size inside a decline
    assert keep(32, 31, 31, 31, 30) == "s3"  # one left long before: a decline of its own
    assert keep(32, 31, 32, 32, 0) == "s3"  # the late joiner ended the first decline
    assert keep(3, 2, 4) == "s2"  # growing ends a decline


def test_the_static_badge_and_sentence_say_why_a_form_is_not_live():
    assert static_badge(False) == "snapshot" and static_badge(True) == "closed"
    assert static_badge(True, "stopped") == "stopped"  # stopped before it closed
    assert static_badge(False, "open") == "snapshot"  # never a live state
    sentence = snapshot_sentence("snapshot", 0.0, "frozen")
    assert sentence.startswith("snapshot taken ") and sentence.endswith(", not live (frozen)")
    assert snapshot_sentence("closed", 0.0).endswith("(the communicator is closed)")
    assert "msg/s" not in " ".join(monitor_view(dataclasses.replace(
        stats(row()), state="closed"))["title"]["facts"])  # no rate as current


def test_the_memory_budget_counts_a_send_budget_per_peer():
    """A server may hold its receive budget and, for each peer, that peer's send budget."""
    import uuid

    from netq.display.view_model import memory_budget

    three = dataclasses.replace(stats(*(row(peer=uuid.uuid4()) for _ in range(3))),
                                recv_budget=64 << 20, send_budget=32 << 20)
    assert memory_budget(three) == (64 + 3 * 32) << 20
    alone = dataclasses.replace(three, peers=())  # a client before it connects: one peer
    assert memory_budget(alone) == (64 + 32) << 20
