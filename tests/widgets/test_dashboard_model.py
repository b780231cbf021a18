"""widgets/dashboard_model.py without sockets: links paired from both ends (and from one, for a
peer in another process), connections over once every known end says closed, the direction of
a link's figures, the badge word, and a history with its gaps and its sparkline's scale.
"""

from __future__ import annotations

import dataclasses
import uuid

from netq.widgets.dashboard_model import (
    SPARK_SCALE,
    History,
    Link,
    LinkFigures,
    communicator_state,
    find_links,
)

from widget_testing import make_row, make_stats


def communicator(ident, purpose, rows, **fields):
    return dataclasses.replace(make_stats(rows), id=ident, purpose=purpose, **fields)


def test_both_ends_pair_into_one_link_from_the_server_and_an_outside_peer_is_one_ended():
    server, client, outside = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    to_client = make_row(client, bytes_out_per_s=300.0, bytes_in_per_s=100.0, queue_out=2)
    to_server = make_row(server, bytes_in_per_s=290.0, queue_in=5, credit_out=7)
    stats = {server: communicator(server, "server", [to_client, make_row(outside)]),
             client: communicator(client, "client", [to_server])}
    links = {(link.a, link.b): link for link in find_links(stats)}
    assert set(links) == {(server, client), (server, outside)}
    paired = links[(server, client)]
    assert paired.a_row is to_client and paired.b_row is to_server
    assert paired.bytes_per_s == 400.0 and paired.state == "connected"
    assert links[(server, outside)].b_row is None
    figures = LinkFigures.of(paired)
    assert (figures.forward_bytes, figures.back_bytes) == (300.0, 100.0)
    assert figures.forward_queued == 2 + 5 and figures.back_credit == 7


def test_a_connection_both_ends_report_closed_is_over():
    server, client = uuid.uuid4(), uuid.uuid4()
    stats = {server: communicator(server, "server", [make_row(client, state="closed")]),
             client: communicator(client, "client", [make_row(server, state="closed")])}
    assert find_links(stats) == []
    stats[client] = communicator(client, "client", [make_row(server)])
    assert len(find_links(stats)) == 1


def test_waits_and_the_badge_word():
    peer = uuid.uuid4()
    link = Link(uuid.uuid4(), peer, make_row(peer, blocked="no credit", blocked_for=2.5), None)
    assert link.blocked == "no credit" and link.blocked_for == 2.5
    waiting = communicator(uuid.uuid4(), "server", [], get_waiting="get() waits")
    assert communicator_state(waiting) == "waiting"
    assert communicator_state(dataclasses.replace(waiting, get_waiting="")) == "open"


def test_a_missed_tick_is_a_gap_and_the_sparkline_scales_to_its_maximum():
    history = History(4)
    history.add(0, (1.0, 4.0))
    history.add(2, (2.0, 0.0))  # tick 1 missed
    assert list(history.samples) == [(1.0, 4.0), None, (2.0, 0.0)]
    spark = history.sparkline((0, 1), lambda top: f"{top:g}")
    assert spark["max"] == "4" and spark["size"] == 3  # the samples kept span the width
    assert spark["series"] == [[SPARK_SCALE // 4, None, SPARK_SCALE // 2],
                               [SPARK_SCALE, None, 0]]
    for tick in range(3, 10):
        history.add(tick, (0.0, 0.0))
    assert len(history.samples) == 4  # bounded whatever the run time
