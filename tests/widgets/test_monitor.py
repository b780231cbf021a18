"""widgets/monitor.py + sampler.py against a real server and clients on 127.0.0.1.

The recorded ``frontend`` holds what a browser would: the anywidget's synced state (``view``,
``frame``, ``point``) and the point history its ES module keeps (each point appended, the
whole window once on request). Every check compares it with what the kernel side showed.
"""

from __future__ import annotations

import json
import re
import sys
import threading

from netq.widgets import Monitor, MonitorWidget, Sampler
from netq.widgets.replaceable import PARKED_ESM

import netq
from netq.display.tables import peer_fields
from netq.display.view_model import LIVE_STATES, STATIC_STATES
from netq_testing import wait_for
from widget_testing import Traffic

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("netq-monitor-")]


def browser_view(frontend, monitor) -> tuple[dict, dict, object]:
    """(the browser's view and frame, the kernel's last snapshot), taken atomically."""
    with monitor._lock:
        state = frontend.state(monitor.widget)
        return state["view"], state["frame"], monitor.stats


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
        view, frame, stats = browser_view(frontend, monitor)
        # the browser's view is the kernel's, as JSON (what the wire carries)
        assert view == json.loads(json.dumps(monitor.table.view))
        assert view["live"] is True and view["snapshot"] == ""
        assert view["title"]["state"] == "open" and view["title"]["role"] == "netq TCP server"
        rows = {row["peer"]: row for row in view["rows"]}
        assert set(rows) == {"client-0", "client-1", "client-2"}  # names, not ids
        for row in stats.peers:
            shown = rows[names[row.peer]]
            assert dict(zip([c[0] for c in view["columns"]], shown["cells"], strict=True)) == \
                peer_fields(row, names)
            assert shown["cells"][1] == "connected"
        # busiest first: bytes/s in + out never grows down the table
        rates = [row["sort"][5] + row["sort"][7] for row in view["rows"]]
        assert rates == sorted(rates, reverse=True)
        # every plotted peer's colour is its swatch in the table and its legend entry
        colours = {entry["peer"]: entry["colour"] for entry in frame["plotted"]}
        assert len(set(colours.values())) == 3
        assert all(rows[name]["colour"] == colour for name, colour in colours.items())
        assert monitor.table.rows == [dict(zip([c[0] for c in view["columns"]], row["cells"],
                                               strict=True)) for row in view["rows"]]

        # the browser's history: every point once, bounded to `history`, the kernel's values
        wait_for(lambda: len(frontend.history(monitor.widget).t) == 15, message="rollover")
        with monitor._lock:
            held = frontend.history(monitor.widget)
            kernel = json.loads(json.dumps(monitor.plots.series_json()))
            times = list(monitor.plots.times)
        assert held.t == times and held.series == kernel
        assert held.t == sorted(held.t) and len(set(held.t)) == 15
        # a browser that loads the page later asks for the whole window once
        frontend.ask_history(monitor.widget)
        assert monitor.history_requests == 1
        answer = frontend.custom[-1]
        assert answer["type"] == "history" and len(answer["t"]) == 15

        # a peer joining at runtime gets a row and lines
        late = traffic.add_client()
        wait_for(lambda: "client-3" in {r["peer"] for r in frontend.state(monitor.widget)[
            "view"]["rows"]}, message="the new peer's row")
        wait_for(lambda: str(late.id) in frontend.history(monitor.widget).series,
                 message="the new peer's lines")

        # a peer leaving loses its row; its lines end and its legend entry says so
        first = traffic.clients[0]
        traffic.remove_client(first)
        wait_for(lambda: "client-0" not in {r["peer"] for r in frontend.state(monitor.widget)[
            "view"]["rows"]}, message="the departed peer's row gone")
        wait_for(lambda: frontend.history(monitor.widget).series[str(first.id)][-1] is None,
                 message="the departed peer's lines ending")
        labels = [e["label"] for e in frontend.state(monitor.widget)["frame"]["plotted"]]
        assert "client-0 (left)" in labels and first.id in monitor.plots.departed
        assert sampler.errors == type(sampler.errors)()  # nothing went wrong on the thread

    # the server closed: the view keeps its last live picture, and the sampler thread ends
    sampler.thread.join(5)
    assert not sampler.thread.is_alive() and not monitor.running
    view = frontend.state(monitor.widget)["view"]
    assert monitor.frozen and monitor.view_state == "closed"
    assert monitor.stats.state == "open" and view["rows"]  # the picture before the closing
    assert view["title"]["state"] == "closed" and view["live"] is False
    assert view["snapshot"].startswith("snapshot taken ")
    assert view["snapshot"].endswith("(the communicator closed after it)")
    assert not monitor_threads()
    assert sampler.cpu_seconds > 0 and sampler.ticks > 10


def test_two_views_share_one_sampler_and_both_update(frontend):
    with Traffic(clients=2) as traffic:
        first = Monitor(traffic.server, interval=0.1, start=True)
        second = traffic.server.monitor(interval=0.1, start=True)
        assert isinstance(second, Monitor) and first.sampler is second.sampler
        assert len(monitor_threads()) == 1
        for monitor in (first, second):
            wait_for(lambda m=monitor: len(frontend.history(m.widget).t) >= 5,
                     message="both views updating")
        with first._lock, second._lock:  # same snapshots: the same points in both
            assert first.plots.times[-1] == second.plots.times[-1]
        first.stop()
        assert not first.running and second.running
        assert frontend.state(first.widget)["view"]["title"]["state"] == "stopped"
        count = len(second.plots.times)
        wait_for(lambda: len(second.plots.times) > count + 2,
                 message="the other view still updating")
        frozen = list(first.plots.times)
        sampler = second.sampler
        second.stop()
        sampler.thread.join(5)
        assert not sampler.thread.is_alive()
        assert list(first.plots.times) == frozen
        assert not traffic.server.closed  # stopping a monitor leaves the communicator alone


def test_restart_after_stop_and_after_close(frontend):
    with Traffic(clients=1) as traffic:
        monitor = Monitor(traffic.server, interval=0.1, start=True)
        monitor.stop()
        wait_for(lambda: not monitor_threads(), message="the thread to end")
        monitor.start()
        assert monitor.running and len(monitor_threads()) == 1
        assert frontend.state(monitor.widget)["view"]["live"] is True
    wait_for(lambda: not monitor_threads(), message="the thread to end with the server")
    monitor.start()  # closed communicator: keeps its last live picture, starts nothing
    assert not monitor.running and monitor.view_state == "closed" and not monitor_threads()


def test_displayed_in_a_kernel_it_is_live_beside_a_static_snapshot(frontend, monkeypatch):
    import netq.widgets.replaceable as replaceable_module

    import netq.display.notebook

    monkeypatch.setattr(netq.display.notebook, "in_kernel", lambda: True)
    monkeypatch.setattr(replaceable_module, "in_kernel", lambda: True)
    with Traffic(clients=2) as traffic:
        bundle = traffic.server._repr_mimebundle_()  # a communicator as a cell's last line
        view = bundle[WIDGET_VIEW]
        state = frontend.states[view["model_id"]]  # the anywidget the browser renders
        assert state["_model_name"] == "AnyModel" and "export default" in state["_esm"]
        assert ".netq-monitor" in state["_css"]
        assert state["view"]["live"] is True
        sampler = Sampler.running(traffic.server)
        assert sampler is not None
        (monitor,) = sampler.views
        wait_for(lambda: len(frontend.history(monitor.widget).t) >= 3,
                 message="updates after display")
        # beside the widget, for frontends without a widget manager: a snapshot, never live
        static = bundle["text/html"]
        assert 'data-live="0"' in static and 'class="netq-snapshot"' in static
        assert 'data-state="snapshot"' in static and "<script" not in static
        assert bundle["text/plain"].startswith("netq TCP server on ")
        again = traffic.server.monitor(interval=0.1)  # not displayed yet: not running
        assert not again.running
        again._repr_mimebundle_()
        assert again.running and again.sampler is sampler
    sampler.thread.join(5)
    assert not sampler.thread.is_alive()


def test_displayed_by_marimo_it_starts_and_hands_over_the_anywidget(frontend):
    """marimo asks ``_display_`` before any ``_repr_*``: a monitor (and a communicator as a
    cell's last expression) starts sampling and gives marimo the anywidget to render."""
    with Traffic(clients=1) as traffic:
        widget = traffic.server._display_()
        assert isinstance(widget, MonitorWidget)
        sampler = Sampler.running(traffic.server)
        assert sampler is not None
        (monitor,) = sampler.views
        assert monitor.widget is widget and monitor.running
        wait_for(lambda: len(frontend.history(widget).t) >= 3, message="marimo view updating")
        monitor.stop()
        assert monitor._display_() is widget and not monitor.running  # stopped stays stopped
        assert frontend.state(widget)["view"]["title"]["state"] == "stopped"
    sampler.thread.join(5)
    assert not sampler.thread.is_alive()


def test_without_a_kernel_the_display_is_static(frontend):
    with Traffic(clients=2) as traffic:
        wait_for(lambda: len(traffic.server.peers) == 2, message="2 peers")
        bundle = traffic.server._repr_mimebundle_()
        assert set(bundle) == {"text/plain", "text/html"}
        assert bundle["text/html"].count('<tr class="netq-peer"') == 2
        assert 'data-live="0"' in bundle["text/html"]
        assert bundle["text/plain"].splitlines()[0].startswith("netq TCP server on ")
        monitor = traffic.server.monitor()
        assert set(monitor._repr_mimebundle_()) == {"text/plain", "text/html"}
        assert repr(monitor).splitlines()[0].startswith("netq TCP server on ")
        assert monitor._repr_html_().count('<tr class="netq-peer"') == 2
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


def test_names_are_escaped_in_the_static_form_and_text_in_the_widget(frontend):
    with Traffic(clients=1) as traffic:
        client = traffic.clients[0]
        names = {client.id: "<script>alert(1)</script>"}
        wait_for(lambda: len(traffic.server.peers) == 1, message="1 peer")
        monitor = Monitor(traffic.server, names=names)
        markup = monitor.static_html()
        assert "<script>alert" not in markup and "&lt;script&gt;" in markup
        # the widget carries the name as text (the module sets textContent, never HTML)
        rows = frontend.state(monitor.widget)["view"]["rows"]
        assert rows[0]["peer"] == names[client.id]


def test_a_client_that_cannot_connect_is_visibly_different(frontend):
    """The widget shows what statistics() says about a wait: the title names the failed
    connection, the badge is red, the row is marked blocked and its reason is spelled out."""
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

        def shown():
            view = frontend.state(monitor.widget)["view"]
            return view["title"]["alerts"] and any(r["blocked"] for r in view["rows"]) and view
        view = wait_for(shown, 20, message="the widget to show the failed connection")
        assert view["title"]["state"] in ("cannot-connect", "waiting")
        assert "refused" in view["title"]["alerts"][0]
        assert view["waiting"]
        assert re.search(r'class="netq-peer netq-blocked"', monitor.static_html())
    finally:
        monitor.close()
        client.close(timeout=1)


def test_a_stopped_or_closed_view_says_so_and_leaves_its_static_form(frontend, monkeypatch):
    """stop() turns the badge to "stopped" and puts the static form (title, SVG charts, table,
    the snapshot sentence) in the displayed widget's place; start() brings the live widget
    back; the communicator closing leaves the static form with a "closed" badge."""
    import IPython.display
    import netq.widgets.replaceable as replaceable_module

    shown: list[tuple[str, dict]] = []
    monkeypatch.setattr(replaceable_module, "in_kernel", lambda: True)  # shown, and swapped
    monkeypatch.setattr(IPython.display, "display",
                        lambda bundle, raw, display_id=None: shown.append(("display", bundle)))
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda bundle, raw, display_id: shown.append((display_id, bundle)))
    with Traffic(clients=2) as traffic:
        monitor = Monitor(traffic.server, interval=0.1)
        monitor._ipython_display_()
        assert monitor.running and monitor.display_id
        assert WIDGET_VIEW in shown[0][1]
        assert frontend.state(monitor.widget)["view"]["title"]["state"] == "open"
        wait_for(lambda: len(monitor.plots.times) >= 3 and len(monitor.plots.peers) == 2,
                 message="a few points for 2 peers")
        live_model = frontend.state(monitor.widget)
        assert len(live_model["_esm"]) > 5000 and live_model["frame"]
        monitor.stop()
        # Its output now shows the static form: the model is parked, so a notebook executor
        # that stores every model's last state stores a few hundred bytes, not the front end.
        parked = frontend.state(monitor.widget)
        assert parked["_esm"] == PARKED_ESM and parked["_css"] == ""
        assert parked["view"] == parked["frame"] == parked["point"] == {}
        assert len(json.dumps(parked)) < 2048
        display_id, static = shown[-1]
        assert display_id == monitor.display_id
        assert set(static) == {"text/plain", "text/html"}
        markup = static["text/html"]
        assert 'data-state="stopped"' in markup and 'data-live="0"' in markup
        assert "snapshot taken " in markup and "<script" not in markup
        assert markup.count('<svg class="netq-chart"') == 3
        assert markup.count('class="netq-legend-entry"') == 2
        assert markup.count('<path class="netq-series"') >= 2 * 5  # 5 lines per peer
        monitor.start()
        assert WIDGET_VIEW in shown[-1][1]
        unparked = frontend.state(monitor.widget)
        assert unparked["_esm"] == live_model["_esm"] and unparked["frame"]["charts"]
        assert unparked["view"]["title"]["state"] == "open"
        sampler = monitor.sampler
    sampler.thread.join(5)
    display_id, final = shown[-1]
    assert display_id == monitor.display_id and 'data-state="closed"' in final["text/html"]
    assert WIDGET_VIEW not in final
    body = final["text/html"].split("</style>", 1)[1]  # the markup, not the stylesheet
    (state,) = re.findall(r'data-state="([a-z-]+)"', body)
    assert state in STATIC_STATES and state not in LIVE_STATES


def test_in_colab_the_display_carries_anywidget_metadata(frontend, monkeypatch):
    """Colab renders third-party widgets through a custom widget manager that anywidget names
    in the display's metadata; the views pass it on (Colab itself cannot run here: its module
    is stood in for by the one call anywidget makes of it)."""
    import types

    import IPython.display
    import netq.widgets.replaceable as replaceable_module

    colab = types.ModuleType("google.colab.output")
    colab.enable_custom_widget_manager = lambda: None  # type: ignore[attr-defined]
    colab._widgets = types.SimpleNamespace(  # type: ignore[attr-defined]
        _installed_url="https://colab.invalid/widget-manager.js")  # never fetched
    monkeypatch.setitem(sys.modules, "google.colab.output", colab)
    monkeypatch.setattr(replaceable_module, "in_kernel", lambda: True)
    shown: list[dict] = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda bundle, raw, display_id=None, metadata=None:
                        shown.append({"bundle": bundle, "metadata": metadata}))
    with Traffic(clients=1) as traffic:
        monitor = Monitor(traffic.server, interval=0.1)
        monitor._ipython_display_()
        (call,) = shown
        assert WIDGET_VIEW in call["bundle"] and "text/html" in call["bundle"]
        assert call["metadata"] and WIDGET_VIEW in call["metadata"], call["metadata"]
        bundle, metadata = monitor._repr_mimebundle_()
        assert metadata == call["metadata"] and WIDGET_VIEW in bundle
        monitor.stop()


def test_a_dropped_monitor_and_its_communicator_are_not_kept_alive_by_its_widget(frontend):
    """ipywidgets keeps every open widget in a process-wide registry; the monitor's widget
    must not keep the monitor (and through it the communicator, which the dashboard would go
    on listing) alive once nothing else refers to them."""
    import gc
    import weakref

    server = netq.new(purpose=netq.Purpose.SERVER, options=netq.CommunicatorOptions(
        netloc=netq.NetworkLocation(host="127.0.0.1", port=0)))
    monitor = Monitor(server, interval=0.1)
    widget = monitor.widget  # still open: in ipywidgets' registry
    gone = weakref.ref(monitor), weakref.ref(server)
    server.close()
    del monitor, server
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
    assert widget.comm is not None  # the widget itself was not closed
    widget.close()
