"""netq/display/view_model.py: the monitor's title row and its badge, live and static.

(The busiest-first order, the ``others`` row and the footnotes are tested beside the live
widget that draws them, in tests/widgets/test_view_model.py.)
"""

from __future__ import annotations

import dataclasses

from netq.display.view_model import LIVE_STATES, STATIC_STATES, monitor_view

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
