"""widgets/monitor.py + sampler.py against a real server and clients on 127.0.0.1.

The recorded ``frontend`` holds what a browser would: the table widget's HTML and the plots'
ColumnDataSource rebuilt from the PATCH-DOC messages. Every check compares it with the
kernel-side snapshot the monitor showed.
"""

from __future__ import annotations

import html
import math
import re
import threading

from netq.widgets import Monitor, Sampler

import netq
from netq.display import html_table, peer_fields
from netq_testing import wait_for
from widget_testing import Traffic, same_columns

ROW = re.compile(r'<tr class="peer" data-peer="([0-9a-f-]+)">(.*?)</tr>')
CELL = re.compile(r'<td class="([a-z_]+)">(.*?)</td>')
SWATCH = re.compile(r'<span class="netq-swatch"[^>]*></span>')  # the plots' legend


def table_rows(markup: str) -> dict[str, dict[str, str]]:
    """The per-peer rows of a rendered table: peer id -> {column key: text}."""
    return {peer: {key: html.unescape(SWATCH.sub("", text)) for key, text in CELL.findall(cells)}
            for peer, cells in ROW.findall(markup)}


def monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("netq-monitor-")]


def frontend_view(frontend, monitor):
    """(table HTML, source data) as the browser has them, with the snapshot shown, atomically."""
    with monitor._lock:
        return (frontend.state(monitor.table.root)["value"],
                frontend.source(monitor.plots.source),
                monitor.stats,
                {k: list(v) for k, v in monitor.plots.source.data.items()})


def test_live_view_follows_real_traffic(frontend):
    with Traffic(clients=3) as traffic:
        names = traffic.names
        monitor = Monitor(traffic.server, interval=0.1, names=names, history=15, start=True)
        sampler = monitor.sampler
        assert monitor.running and sampler.thread.name.startswith("netq-monitor-")

        def flowing():
            stats = monitor.stats
            return len(stats.peers) == 3 and all(r.messages_in_per_s > 0 for r in stats.peers)
        wait_for(flowing, message="3 peers sending")
        markup, source, stats, kernel_source = frontend_view(frontend, monitor)
        # the browser's table is the snapshot's table, row by row
        assert markup == html_table(stats, names, 50, colours=monitor.plots.colours())
        # the plots' colours are the table's legend: one distinct swatch per plotted peer
        swatches = re.findall(r'class="netq-swatch" style="background:(#[0-9a-f]{6})"', markup)
        assert len(swatches) == len(set(swatches)) == 3
        rows = table_rows(markup)
        assert set(rows) == {str(c.id) for c in traffic.clients}
        for row in stats.peers:
            assert rows[str(row.peer)] == peer_fields(row, names)
            assert rows[str(row.peer)]["state"] == "connected"
            assert rows[str(row.peer)]["msg_in"] not in ("0", "-")
        # the browser's plot data is the kernel's, and rolls over at `history` points
        assert same_columns(source, kernel_source)
        wait_for(lambda: len(monitor.plots.source.data["t"]) == 15, message="rollover")
        _, source, stats, kernel_source = frontend_view(frontend, monitor)
        assert len(source["t"]) == 15 and same_columns(source, kernel_source)
        assert source["t"] == sorted(source["t"]) and len(set(source["t"])) == 15
        first = traffic.clients[0]
        assert max(monitor.plots.series(first.id, "mb_in")) > 0

        # a peer joining at runtime gets a row and lines
        late = traffic.add_client()
        wait_for(lambda: str(late.id) in table_rows(frontend.state(monitor.table.root)["value"]),
                   message="the new peer's row")
        wait_for(lambda: late.id in monitor.plots.peers, message="the new peer's lines")
        markup, source, stats, kernel_source = frontend_view(frontend, monitor)
        assert "client-3" in markup and same_columns(source, kernel_source)
        index = monitor.plots.peers[late.id]
        assert f"p{index}_mb_in" in source

        # a peer leaving loses its row; its lines end (NaN) and its legend says so
        traffic.remove_client(first)
        wait_for(lambda: str(first.id) not in table_rows(
            frontend.state(monitor.table.root)["value"]), message="the departed peer's row gone")
        wait_for(lambda: math.isnan(monitor.plots.series(first.id, "mb_in")[-1]),
                   message="the departed peer's lines ending")
        labels = monitor.plots.legend_labels()
        assert "client-0 (left)" in labels
        assert sampler.errors == type(sampler.errors)()  # nothing went wrong on the thread

    # the server closed: the sampler shows it once more and its thread ends
    sampler.thread.join(5)
    assert not sampler.thread.is_alive() and not monitor.running
    assert monitor.stats.state == "closed"
    assert "closed" in frontend.state(monitor.table.root)["value"]
    assert not monitor_threads()
    assert sampler.cpu_seconds > 0 and sampler.ticks > 10


def test_two_views_share_one_sampler_and_both_update(frontend):
    with Traffic(clients=2) as traffic:
        first = Monitor(traffic.server, interval=0.1, start=True)
        second = traffic.server.monitor(interval=0.1, start=True)
        assert isinstance(second, Monitor) and first.sampler is second.sampler
        assert len(monitor_threads()) == 1
        for monitor in (first, second):
            wait_for(lambda m=monitor: len(frontend.source(m.plots.source)["t"]) >= 5,
                       message="both views updating")
        # same snapshots: the same points in both
        with first._lock, second._lock:
            assert first.plots.source.data["t"][-1] == second.plots.source.data["t"][-1]
        first.stop()
        assert not first.running and second.running
        count = len(second.plots.source.data["t"])
        wait_for(lambda: len(second.plots.source.data["t"]) > count + 2,
                   message="the other view still updating")
        frozen = len(first.plots.source.data["t"])
        sampler = second.sampler
        second.stop()
        sampler.thread.join(5)
        assert not sampler.thread.is_alive()
        assert len(first.plots.source.data["t"]) == frozen
        assert not traffic.server.closed  # stopping a monitor leaves the communicator alone


def test_restart_after_stop_and_after_close(frontend):
    with Traffic(clients=1) as traffic:
        monitor = Monitor(traffic.server, interval=0.1, start=True)
        monitor.stop()
        wait_for(lambda: not monitor_threads(), message="the thread to end")
        monitor.start()
        assert monitor.running and len(monitor_threads()) == 1
    wait_for(lambda: not monitor_threads(), message="the thread to end with the server")
    monitor.start()  # closed communicator: shows the final state, starts nothing
    assert not monitor.running and monitor.stats.state == "closed" and not monitor_threads()


def test_displayed_in_a_kernel_it_is_live(frontend, monkeypatch):
    import netq.widgets.monitor as monitor_module
    import netq.widgets.replaceable as replaceable_module

    import netq.display

    loads = []
    monkeypatch.setattr(netq.display, "in_kernel", lambda: True)
    monkeypatch.setattr(replaceable_module, "in_kernel", lambda: True)
    monkeypatch.setattr(monitor_module, "load_bokeh", lambda: loads.append(1))
    with Traffic(clients=2) as traffic:
        bundle = traffic.server._repr_mimebundle_()  # a communicator as a cell's last line
        view = bundle["application/vnd.jupyter.widget-view+json"]
        assert view["model_id"] in frontend.states  # the VBox the browser renders
        assert "peer" in bundle["text/plain"] and "netq-table" in bundle["text/html"]
        sampler = Sampler.running(traffic.server)
        assert sampler is not None and loads
        (monitor,) = sampler.views
        wait_for(lambda: len(frontend.source(monitor.plots.source)["t"]) >= 3,
                   message="updates after display")
        assert set(frontend.states[view["model_id"]]["children"]) == {
            f"IPY_MODEL_{monitor.table.root.model_id}", f"IPY_MODEL_{monitor.bokeh.model_id}"}
        again = traffic.server.monitor(interval=0.1)  # not displayed yet: not running
        assert not again.running
        again._repr_mimebundle_()
        assert again.running and again.sampler is sampler
    sampler.thread.join(5)
    assert not sampler.thread.is_alive()


def test_without_a_kernel_the_display_is_static(frontend):
    with Traffic(clients=2) as traffic:
        wait_for(lambda: len(traffic.server.peers) == 2, message="2 peers")
        bundle = traffic.server._repr_mimebundle_()
        assert set(bundle) == {"text/plain", "text/html"}
        assert len(table_rows(bundle["text/html"])) == 2
        assert bundle["text/plain"].splitlines()[0].startswith("netq server tcp")
        monitor = traffic.server.monitor()
        assert set(monitor._repr_mimebundle_()) == {"text/plain", "text/html"}
        assert repr(monitor).splitlines()[0].startswith("netq server tcp")
        assert len(table_rows(monitor._repr_html_())) == 2
        assert not monitor.running and not monitor_threads()


def test_a_failing_view_is_detached_without_printing(frontend, capfd):
    class Broken:
        def _sample(self, stats):
            raise RuntimeError("boom")

        def _sampler_stopped(self, stats):
            pass

    with Traffic(clients=1) as traffic:
        broken = Broken()
        sampler = Sampler.attach(traffic.server, broken, 0.05)
        sampler.thread.join(5)  # its only view failed: the thread ends
        assert not sampler.thread.is_alive()
        assert [str(e) for e in sampler.errors] == ["boom"]
    out, err = capfd.readouterr()
    assert "boom" not in out and "boom" not in err


def test_names_are_escaped(frontend):
    with Traffic(clients=1) as traffic:
        client = traffic.clients[0]
        names = {client.id: "<script>alert(1)</script>"}
        monitor = Monitor(traffic.server, names=names)
        markup = frontend.state(monitor.table.root)["value"]
        assert "<script>alert" not in markup and "&lt;script&gt;" in markup
        assert netq.display.peer_name(client.id, names) == names[client.id]


def test_a_client_that_cannot_connect_is_visibly_different(frontend):
    """The widget's table shows what statistics() says about a wait: the header names the
    failed connection, the row is marked blocked and its reason is spelled out below."""
    import socket

    with socket.socket() as probe:  # a port nobody listens on (bound, then released)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = netq.CommunicatorOptions(
        netloc=netq.NetworkLocation("127.0.0.1", port),
        connection=netq.ConnectionOptions(stall_warning=0.5))
    client = netq.new(netq.Protocol.TCP, netq.Purpose.CLIENT, options)
    monitor = Monitor(client, interval=0.1, start=True)
    try:
        client.put("anyone?")
        wait_for(lambda: "CANNOT CONNECT" in monitor.table.root.value
                 and 'class="peer blocked"' in monitor.table.root.value, 20,
                 message="the widget to show the failed connection")
        assert "refused" in monitor.table.root.value
        assert 'class="netq-waits"' in monitor.table.root.value
    finally:
        monitor.close()
        client.close(timeout=1)


def test_a_stopped_or_closed_view_says_so_and_leaves_its_static_form(frontend, monkeypatch):
    """stop() turns the badge to "stopped" and puts the static form (title, table, SVG charts)
    in the displayed widget's place; start() brings the live widget back; the communicator
    closing leaves the static form with a "closed" badge."""
    import IPython.display
    import netq.widgets.monitor as monitor_module
    import netq.widgets.replaceable as replaceable_module

    shown: list[tuple[str, dict]] = []
    monkeypatch.setattr(replaceable_module, "in_kernel", lambda: True)  # shown, and swapped
    monkeypatch.setattr(monitor_module, "load_bokeh", lambda: None)
    monkeypatch.setattr(IPython.display, "display",
                        lambda bundle, raw, display_id=None: shown.append(("display", bundle)))
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda bundle, raw, display_id: shown.append((display_id, bundle)))
    with Traffic(clients=2) as traffic:
        monitor = Monitor(traffic.server, interval=0.1)
        monitor._ipython_display_()
        assert monitor.running and monitor.display_id
        assert "application/vnd.jupyter.widget-view+json" in shown[0][1]
        assert "netq-state-open" in monitor.table.root.value
        wait_for(lambda: len(monitor.plots.source.data["t"]) >= 3 and
                 len(monitor.plots.peers) == 2, message="a few points for 2 peers")
        monitor.stop()
        assert "netq-state-stopped" in monitor.table.root.value  # the live widget too
        display_id, static = shown[-1]
        assert display_id == monitor.display_id
        assert set(static) == {"text/plain", "text/html"}
        assert "netq-state-stopped" in static["text/html"]
        assert static["text/html"].count("<svg") == 3 and "<script" not in static["text/html"]
        assert static["text/html"].count("<polyline") >= 2 * 3  # a line per peer and chart
        monitor.start()
        assert "application/vnd.jupyter.widget-view+json" in shown[-1][1]
        assert "netq-state-open" in monitor.table.root.value
        sampler = monitor.sampler
    sampler.thread.join(5)
    display_id, final = shown[-1]
    assert display_id == monitor.display_id and "netq-state-closed" in final["text/html"]
    assert "application/vnd.jupyter.widget-view+json" not in final
