"""netq/display.py: the shared display fields, the static summaries, the lazy widget hooks."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from netq import display
from netq.statistics import CommunicatorStatistics, PeerStatistics

REPO = Path(__file__).resolve().parent.parent
PEER = uuid.UUID("12345678-0000-0000-0000-000000000000")


def row(**fields) -> PeerStatistics:
    values = dict(peer=PEER, state="connected", queue_in=3, queue_in_bytes=30, queue_out=1200,
                  queue_out_bytes=10, inflight=0, inflight_bytes=0, messages_in=5, bytes_in=50,
                  messages_out=1, bytes_out=10, credit_out=4 << 20, credit_in=65536,
                  memory=1536, reconnects=0, connected_for=1.0, messages_in_per_s=12345.0,
                  bytes_in_per_s=2.5 * (1 << 20), messages_out_per_s=0.0, bytes_out_per_s=0.0)
    values.update(fields)
    return PeerStatistics(**values)


def stats(*rows) -> CommunicatorStatistics:
    return CommunicatorStatistics(
        id=uuid.uuid4(), purpose="server", protocol="tcp", address="127.0.0.1:1",
        state="open", uptime=2.0, time=2.0, peers=rows, messages_in=5, bytes_in=50,
        messages_out=1, bytes_out=10, messages_in_per_s=12345.0, bytes_in_per_s=2.5 * (1 << 20),
        messages_out_per_s=0.0, bytes_out_per_s=0.0, memory=1536)


def test_formatters():
    assert display.format_count(950) == "950"
    assert display.format_count(12345) == "12.3k" and display.format_count(1.2e6) == "1.20M"
    assert display.format_rate(0) == "0" and display.format_rate(2.5) == "2.50"
    assert display.format_rate(123.4) == "123"
    assert display.format_bytes(0) == "0 B" and display.format_bytes(65536) == "64.0 KiB"
    assert display.format_bytes(4 << 20) == "4.00 MiB"
    assert display.format_count(float("nan")) == "-"


def test_peer_fields_and_values_share_the_columns():
    fields = display.peer_fields(row(), {PEER: "alpha"})
    assert fields == {"peer": "alpha", "state": "connected", "queue_in": "3",
                      "queue_out": "1.20k", "msg_in": "12.3k", "mb_in": "2.50", "msg_out": "0",
                      "mb_out": "0", "memory": "1.50 KiB", "credit_in": "64.0 KiB",
                      "credit_out": "4.00 MiB"}
    values = display.peer_values(row())
    assert values["mb_in"] == 2.5 and values["queue_out"] == 1200 and values["memory"] == 1536
    assert list(values) == [c.key for c in display.COLUMNS]
    assert display.peer_fields(row())["peer"] == "12345678"  # no name: first 8 hex digits


def test_text_and_html_tables():
    other = uuid.uuid4()
    snapshot = stats(row(), row(peer=other, state="disconnected"))
    text = display.text_table(snapshot, {PEER: "alpha", other: "bravo"})
    lines = text.splitlines()
    assert lines[0].startswith("netq server tcp on 127.0.0.1:1  open")
    assert lines[1].split()[:3] == ["peer", "state", "queue"]
    assert lines[2].startswith("alpha") and "12.3k" in lines[2] and "2.50" in lines[2]
    assert lines[3].startswith("bravo") and "disconnected" in lines[3]
    assert lines[4].startswith("total")
    markup = display.static_bundle(snapshot, {PEER: "<b>alpha</b>"})["text/html"]
    assert markup.count('<tr class="netq-peer"') == 2 and "&lt;b&gt;alpha" in markup
    assert "<b>alpha" not in markup
    short = display.text_table(snapshot, max_rows=1)
    assert "... and 1 more peers" in short
    bundle = display.static_bundle(snapshot)
    assert set(bundle) == {"text/plain", "text/html"}


def test_not_in_a_kernel_here():
    assert display.in_kernel() is False


def test_core_netq_works_without_the_widget_dependencies(tmp_path):
    """ipywidgets, anywidget and bokeh made unimportable: netq imports, serves, and its
    displays fall back to static text/HTML (the monitor's static form, a snapshot)."""
    script = textwrap.dedent("""
        import sys, warnings
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("ipywidgets", "anywidget", "bokeh", "comm"):
                    raise ImportError(f"blocked {name}")
        sys.meta_path.insert(0, Block())
        import netq as nq
        from netq import display
        from netq.lab import demo
        assert not [m for m in sys.modules
                    if m.startswith(("ipywidgets", "anywidget", "bokeh", "netq.widgets"))]
        server = nq.new(purpose=nq.Purpose.SERVER, options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))
        bundle = server._repr_mimebundle_()
        assert set(bundle) == {"text/plain", "text/html"}, bundle
        assert 'data-live="0"' in bundle["text/html"] and "snapshot taken" in bundle["text/html"]
        assert ".netq-monitor" in bundle["text/html"]  # the shipped stylesheet, inlined
        widget = server._display_()  # marimo's hook: the static summary
        assert isinstance(widget, display.StaticSummary), widget
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            view = server.monitor()
        assert isinstance(view, display.StaticSummary), view
        assert "netq[widgets]" in str(caught[0].message)
        assert repr(view).startswith("netq server tcp") and "netq-peers" in view._repr_html_()
        server.close()
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_netq_widgets_importable_when_its_dependencies_are():
    """With ipywidgets and anywidget installed, netq.widgets must import (it is mapped from
    the top-level widgets/ folder; tests/widgets is not collected otherwise)."""
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("ipywidgets", "anywidget")):
        import pytest

        pytest.skip("the [widgets] dependencies are not installed")
    try:
        import netq.widgets  # noqa: F401
    except ImportError as error:
        raise AssertionError(
            f"netq.widgets is not importable ({error}): it is mapped from the top-level "
            "widgets/ folder by pyproject.toml; reinstall this checkout: "
            "pip install -e '.[widgets]'") from None


def test_a_waiting_peer_and_a_failed_connect_stand_out():
    """What statistics() says about a wait shows in the text table, the HTML (the widget's
    table) and the header: a blocked row is marked, with its reason."""
    why = "peer x has granted no credit for 6 s: its code is not calling get()"
    waiting = row(blocked=why, blocked_for=6.2)
    snapshot = CommunicatorStatistics(**{**{f: getattr(stats(waiting), f) for f in (
        "id", "purpose", "protocol", "address", "state", "uptime", "time", "peers",
        "messages_in", "bytes_in", "messages_out", "bytes_out", "messages_in_per_s",
        "bytes_in_per_s", "messages_out_per_s", "bytes_out_per_s", "memory")},
        "connect_error": "connection refused"})
    text = display.text_table(snapshot)
    assert f"! 12345678 waits 6 s: {why}" in text
    assert "CANNOT CONNECT: connection refused" in text.splitlines()[0]
    html = display.static_bundle(snapshot)["text/html"]
    assert 'class="netq-peer netq-blocked"' in html and "not calling get()" in html
    assert '<ul class="netq-waiting">' in html and "cannot connect: connection refused" in html
    healthy = display.static_bundle(stats(row()))["text/html"]
    assert 'class="netq-peer netq-blocked"' not in healthy
    assert '<ul class="netq-waiting">' not in healthy


def test_addresses_durations_and_rates_read_as_people_write_them():
    assert display.format_address("('127.0.0.1', 44503)") == "127.0.0.1:44503"
    assert display.format_address(("::1", 80, 0, 0)) == "[::1]:80"
    assert display.format_address("('::1', 80, 0, 0)") == "[::1]:80"
    assert display.format_address("/tmp/netq.sock") == "/tmp/netq.sock"
    assert display.format_duration(4.24) == "4.2 s"
    assert display.format_duration(192) == "3 min 12 s"
    assert display.format_duration(7500) == "2 h 05 min"
    assert display.format_byte_rate(2.5 * (1 << 20)) == "2.50 MiB/s"
    assert display.format_byte_rate(512) == "512 B/s"
    # one unit convention: no decimal MB anywhere in what the tables show
    assert all("MB" not in column.header for column in display.COLUMNS)


def badge(snapshot: CommunicatorStatistics, **view) -> str:
    """The badge's data-state in the static or live form of ``snapshot``."""
    markup = display.monitor_html(display.monitor_view(snapshot, **view))
    found = re.search(r'class="netq-badge" data-state="([^"]+)"', markup)
    assert found is not None, markup
    return found.group(1)


def test_the_title_row_names_role_transport_address_and_a_state_never_live_when_static():
    snapshot = stats(row())
    title = display.monitor_html(display.monitor_view(snapshot, live=True))
    assert "netq TCP server" in title and ">127.0.0.1:1<" in title
    assert "up 2.0 s" in title and ">1 peer<" in title
    assert display.monitor_view(dataclasses.replace(
        snapshot, address="('127.0.0.1', 44503)"))["title"]["address"] == "127.0.0.1:44503"
    assert badge(snapshot, live=True) == "open"
    # a static form is a snapshot, stopped or closed: never a live state's badge
    assert badge(snapshot) == "snapshot"
    assert "snapshot taken " in display.monitor_html(display.monitor_view(snapshot))
    assert badge(snapshot, view_state="stopped") == "stopped"
    assert badge(dataclasses.replace(snapshot, state="closed"), view_state="stopped") == "closed"
    waiting = stats(row(blocked="no credit", blocked_for=6.0))
    assert badge(waiting, live=True) == "waiting"
    get_waits = dataclasses.replace(stats(row()), get_waiting="get() has waited 7 s")
    assert display.title_state(get_waits) == "waiting"  # the badge never says open then
    client = dataclasses.replace(stats(row(state="connecting")), purpose="client")
    assert badge(client, live=True) == "connecting"
    refused = dataclasses.replace(client, connect_error="connection refused")
    assert badge(refused, live=True) == "cannot-connect"
    idle = dataclasses.replace(stats(row()), get_waiting="get() has waited 7 s for a <message>")
    assert "get() has waited 7 s for a &lt;message&gt;" in display.monitor_html(
        display.monitor_view(idle, live=True))
    assert display.header_line(idle).endswith("  get() has waited 7 s for a <message>")
    assert "get() has waited" not in display.monitor_html(display.monitor_view(stats(row())))
    # the charts' colours are the table's legend
    markup = display.monitor_html(display.monitor_view(snapshot, colours={PEER: "#123456"}))
    assert 'class="netq-swatch" style="background:#123456"' in markup


def test_static_charts_keep_their_lines_inside_the_range():
    times = [0.0, 1.0, 2.0, 3.0]
    plotted = [{"key": "p0", "peer": "a", "label": "a", "colour": "#1f77b4", "width": 2}]
    memory = [0.0, 10.0, None, 30.0]
    frame = display.chart_frame(times, plotted, {"memory": 30.0}, history=600)
    chart = next(c for c in frame["charts"] if c["metric"] == "memory")
    series = {"p0": [[0.0, 0.0, 0.0, 0.0, m] if m is not None else None for m in memory]}
    svg = display.chart_svg(chart, frame, times, series)
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "<script" not in svg
    assert chart["top"] >= 30.0  # the top tick is at or above every value: nothing clipped
    ys = [float(y) for y in re.findall(r"[ML][0-9.]+[ ,]([0-9.]+)", svg)]
    assert ys and all(display.CHART_TOP <= y <= display.CHART_HEIGHT - display.CHART_BOTTOM
                      for y in ys)


