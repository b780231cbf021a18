"""netq/display/static_form.py: the monitor's HTML without script and the text/HTML bundle."""

from __future__ import annotations

import dataclasses
import re
import uuid

from netq.display.static_form import monitor_html, static_bundle
from netq.display.view_model import monitor_view

from .snapshots import PEER, row, stats, waiting_snapshot


def badge(snapshot, **view) -> str:
    """The badge's data-state as the static form's markup writes it."""
    markup = monitor_html(monitor_view(snapshot, **view))
    found = re.search(r'class="netq-badge" data-state="([^"]+)"', markup)
    assert found is not None, markup
    return found.group(1)


def test_the_bundle_carries_the_text_table_and_the_escaped_html():
    other = uuid.uuid4()
    snapshot = stats(row(), row(peer=other, state="disconnected"))
    markup = static_bundle(snapshot, {PEER: "<b>alpha</b>"})["text/html"]
    assert markup.count('<tr class="netq-peer"') == 2 and "&lt;b&gt;alpha" in markup
    assert "<b>alpha" not in markup and "<script" not in markup
    bundle = static_bundle(snapshot)
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"].startswith("netq TCP server on 127.0.0.1:1  snapshot")


def test_the_title_row_and_its_badge_in_the_markup():
    snapshot = stats(row())
    title = monitor_html(monitor_view(snapshot, live=True))
    assert "netq TCP server" in title and ">127.0.0.1:1<" in title
    assert "up 2.0 s" in title and ">1 peer<" in title
    assert badge(snapshot, live=True) == "open" and badge(snapshot) == "snapshot"
    assert "snapshot taken " in monitor_html(monitor_view(snapshot))
    assert 'data-live="0"' in monitor_html(monitor_view(snapshot))
    idle = dataclasses.replace(stats(row()), get_waiting="get() has waited 7 s for a <message>")
    assert "get() has waited 7 s for a &lt;message&gt;" in monitor_html(
        monitor_view(idle, live=True))
    assert "get() has waited" not in monitor_html(monitor_view(stats(row())))
    # the charts' colours are the table's legend
    markup = monitor_html(monitor_view(snapshot, colours={PEER: "#123456"}))
    assert 'class="netq-swatch" style="background:#123456"' in markup


def test_a_waiting_peer_and_a_failed_connect_stand_out():
    """What statistics() says about a wait shows in the HTML (the widget's table): a blocked
    row is marked, with its reason."""
    html = static_bundle(waiting_snapshot(
        "peer x has granted no credit for 6 s: its code is not calling get()"))["text/html"]
    assert 'class="netq-peer netq-blocked"' in html and "not calling get()" in html
    assert '<ul class="netq-waiting">' in html and "cannot connect: connection refused" in html
    healthy = static_bundle(stats(row()))["text/html"]
    assert 'class="netq-peer netq-blocked"' not in healthy
    assert '<ul class="netq-waiting">' not in healthy
