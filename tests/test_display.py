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
    markup = display.html_table(snapshot, {PEER: "<b>alpha</b>"})
    assert markup.count('<tr class="peer"') == 2 and "&lt;b&gt;alpha" in markup
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
        from netq import demo, display
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
    html = display.html_table(snapshot)
    assert 'class="peer blocked"' in html and "not calling get()" in html
    assert 'class="netq-waits"' in html
    healthy = display.html_table(stats(row()))
    assert "peer blocked" not in healthy and "class=\"netq-waits\"" not in healthy


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


def test_the_title_row_names_role_transport_address_and_a_coloured_state():
    snapshot = stats(row())
    title = display.title_html(snapshot)
    assert "netq TCP server" in title and "127.0.0.1:1" in title
    assert "netq-state-open" in title and display.STATE_COLOURS["open"] in title
    assert "up 2.0 s" in title and "1 peer<" in title
    assert "(" not in display.title_html(dataclasses.replace(
        snapshot, address="('127.0.0.1', 44503)")).split("netq-address")[1].split("</span>")[0]
    stopped = display.title_html(snapshot, view_state="stopped")
    assert "netq-state-stopped" in stopped and display.STATE_COLOURS["stopped"] in stopped
    closed = dataclasses.replace(snapshot, state="closed")
    assert "netq-state-closed" in display.title_html(closed, view_state="stopped")
    waiting = stats(row(blocked="no credit", blocked_for=6.0))
    assert "netq-state-waiting" in display.title_html(waiting)
    get_waits = dataclasses.replace(stats(row()), get_waiting="get() has waited 7 s")
    assert display.title_state(get_waits) == "waiting"  # the badge never says open then
    client = dataclasses.replace(stats(row(state="connecting")), purpose="client")
    assert "netq-state-connecting" in display.title_html(client)
    refused = dataclasses.replace(client, connect_error="connection refused")
    assert "netq-state-cannot-connect" in display.title_html(refused)
    idle = dataclasses.replace(stats(row()), get_waiting="get() has waited 7 s for a <message>")
    assert "get() has waited 7 s for a &lt;message&gt;" in display.title_html(idle)
    assert display.header_line(idle).endswith("  get() has waited 7 s for a <message>")
    assert "get() has waited" not in display.title_html(stats(row()))
    # the plots' colours are the table's legend
    markup = display.html_table(snapshot, colours={PEER: "#123456"})
    assert 'class="netq-swatch" style="background:#123456"' in markup


def test_static_charts_keep_their_bound_and_lines_inside_the_range():
    times = [0.0, 1.0, 2.0, 3.0]
    lines = [display.Series("a", "#1f77b4", "", [0.0, 10.0, float("nan"), 30.0])]
    svg = display.svg_chart("memory", times, lines, display.format_bytes,
                            bound=("budget", 100.0), height=130)
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "<script" not in svg
    assert svg.count("<polyline") == 2  # the NaN splits the line
    ys = [float(y) for y in re.findall(r",([0-9.]+)", " ".join(
        re.findall(r'points="([^"]+)"', svg)))]
    bound_y = float(re.search(r'stroke="#c62828" stroke-dasharray="4 3"', svg) and
                    re.findall(r'y1="([0-9.]+)"', svg)[-1])
    top, bottom = 18, 130 - 20
    assert all(top <= y <= bottom for y in [*ys, bound_y])
    assert ">100 B<" in svg  # ticks in the formatter's units, the top one round
