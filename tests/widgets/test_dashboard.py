"""widgets/dashboard.py against real servers and clients on 127.0.0.1: links paired, history
bounded and growing, a real stall (a server that does not get()), the static forms, the saved
page, the thread's end. What the browser would hold is recorded by :class:`RecordedBrowser`
(every widget comm message JSON-encoded as a kernel session would, states rebuilt from them).
"""

from __future__ import annotations

import gc
import json
import re
import threading
import uuid

import comm as comm_package
import pytest
from netq.widgets import Dashboard, dashboard
from netq.widgets.dashboard import DashboardWidget

import netq as nq
from netq_testing import wait_for
from widget_testing import Traffic

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
LIVE_BADGES = {"open", "waiting", "connecting", "closing", "cannot-connect"}


class _Comm:
    kernel = "recorded"  # ipywidgets sends only when comm.kernel is not None

    def __init__(self, browser: RecordedBrowser, data=None, comm_id=None, **_options) -> None:
        self.comm_id = comm_id or uuid.uuid4().hex
        self.browser = browser
        browser.receive(self.comm_id, "open", data)

    def send(self, data=None, metadata=None, buffers=None) -> None:
        self.browser.receive(self.comm_id, "msg", data)

    def close(self, data=None, metadata=None, buffers=None, deleting=False) -> None:
        pass

    def on_msg(self, callback) -> None:
        pass

    def on_close(self, callback) -> None:
        pass


class RecordedBrowser:
    """The widget states a browser would hold, rebuilt from the JSON the kernel sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: dict[str, dict] = {}
        self.updates: dict[str, int] = {}

    def create_comm(self, **options) -> _Comm:
        return _Comm(self, **options)

    def receive(self, comm_id: str, kind: str, data) -> None:
        wire = json.loads(json.dumps(data or {}, allow_nan=False))  # what a session sends
        with self.lock:
            if kind == "open":
                self.states[comm_id] = dict(wire.get("state", {}))
            elif wire.get("method") == "update":
                self.states.setdefault(comm_id, {}).update(wire.get("state", {}))
                self.updates[comm_id] = self.updates.get(comm_id, 0) + 1

    def view(self, widget: DashboardWidget) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.states[widget.model_id]["view"]))


@pytest.fixture
def browser(monkeypatch) -> RecordedBrowser:
    recorded = RecordedBrowser()
    monkeypatch.setattr(comm_package, "create_comm", recorded.create_comm)
    return recorded


def dashboard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "netq-dashboard"]


def assert_static(page: str, state: str) -> None:
    """A static form: not live, says it is a snapshot and when, never a live badge."""
    assert 'class="netq-view netq-dashboard" data-live="0"' in page
    assert re.search(r'class="netq-snapshot">snapshot taken \d\d:\d\d:\d\d, not live', page)
    badges = set(re.findall(r'class="netq-title">.*?class="netq-badge" data-state="([a-z-]+)"',
                            page))
    assert badges == {state}, badges
    assert "<script" not in page


def test_links_pair_both_ends_and_their_history_grows_then_stays_bounded(browser):
    with Traffic(clients=3) as traffic:
        names = {traffic.server.id: "server", **traffic.names}
        board = dashboard(interval=0.05, names=names, history=12, start=True)
        try:
            assert isinstance(board, Dashboard) and dashboard_threads()
            client_0 = traffic.clients[0]

            def flowing():
                ours = [link for link in board.snapshot.links if link.a == traffic.server.id]
                return len(ours) == 3 and all(link.bytes_per_s > 0 and link.b_row is not None
                                              for link in ours)
            wait_for(flowing, message="3 links with traffic, both ends known")
            early = len(board.link_history(traffic.server.id, client_0.id))
            wait_for(lambda: len(board.link_history(traffic.server.id, client_0.id)) > early,
                     message="the link's history to grow")
            wait_for(lambda: board.ticks > 20, message="more samples than the history keeps")
            assert len(board.link_history(traffic.server.id, client_0.id)) == 12

            view = browser.view(board.widget)  # what the browser draws
            assert view["live"] is True and view["state"] == "open"
            keys = {row["key"] for row in view["links"]}
            ours = {"server→client-0", "server→client-1", "server→client-2"}
            assert keys >= ours  # (communicators of other tests still open would add theirs)
            for row in (row for row in view["links"] if row["key"] in ours):
                assert row["state"] == "connected" and not row["outside"]
                rates = row["spark_rate"]["series"]
                assert len(rates) == 2 and all(len(line) == 12 for line in rates)
                assert all(v is None or 0 <= v <= 100 for line in rates for v in line)
                assert max(v for v in rates[0] + rates[1] if v is not None) == 100
                assert row["forward_rate"].endswith("/s") and row["back_rate"].endswith("/s")
            communicators = {row["name"]: row for row in view["communicators"]}
            assert set(communicators) >= {"server", "client-0", "client-1", "client-2"}
            server_row = communicators["server"]
            assert server_row["role"] == "server" and server_row["transport"] == "TCP"
            assert server_row["address"] == f"127.0.0.1:{traffic.port}"
            assert server_row["received"]["text"].endswith(" of 64.0 MiB")
            assert len(server_row["spark"]["series"][0]) == 12
            assert view["map"]["nodes"] and len(view["map"]["edges"]) >= 3
            assert not UUID.search(json.dumps(view))  # names everywhere, never an id

            page = board.static_html()  # beside the live widget: a snapshot
            assert_static(page, "snapshot")
            assert page.count('<tr class="netq-link" data-link=') >= 3
            assert 'data-link="server→client-1"' in page
            assert 'tr class="netq-communicator" data-name="client-2"' in page
            assert page.count('class="netq-sparkline"') >= 3 * 2 + 4
            assert 'class="netq-map"' in page and 'class="netq-stalls"' in page

            # a client that leaves: its row goes at once, its history once out of the window
            traffic.remove_client(client_0)
            wait_for(lambda: "server→client-0" not in
                     {row["key"] for row in browser.view(board.widget)["links"]},
                     message="the left client's row to go")
            assert board.link_history(traffic.server.id, client_0.id)  # still in the window
            tracked = board.tracked_links
            wait_for(lambda: not board.link_history(traffic.server.id, client_0.id),
                     message="the left link's history to be forgotten")
            assert board.tracked_links < tracked
        finally:
            board.stop()
        assert not dashboard_threads()
        view = browser.view(board.widget)
        assert view["live"] is False and view["state"] == "stopped"
        assert view["snapshot"].startswith("snapshot taken ")
        assert_static(board.static_html(), "stopped")
    kept = board.static_bundle()
    board.update()  # all of them closed now: a stopped dashboard keeps its picture
    assert board.view_state == "stopped" and board.static_bundle() == kept
    assert not board.errors


def test_a_real_stall_shows_waiting_with_names_collapsed_and_the_thread_ends(browser, tmp_path):
    options = nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port=0),
        connection=nq.ConnectionOptions(recv_budget=1 << 20, stall_warning=0.5))
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, options)
    client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port=server.address[1]),
        connection=nq.ConnectionOptions(stall_warning=0.5)))
    board = Dashboard(interval=0.1, names={server.id: "server", client.id: "worker"},
                      start=True)
    try:
        payload = bytes(256 << 10)
        for _ in range(12):  # 3 MiB against a 1 MiB receive budget nobody reads
            client.put(payload, block=False)
        wait_for(lambda: browser.view(board.widget)["stalls"]["active"], 30,
                 message="a wait on the dashboard")
        view = browser.view(board.widget)
        assert view["state"] == "waiting" and view["live"] is True  # red, not green OPEN
        assert f"{len(board.snapshot.active_stalls)} waiting" in view["facts"]
        stall = view["stalls"]["active"][0]
        assert stall["link"] in ("worker → server", "server → worker")
        raw = f"peer {client.id} has granted no credit; peer {server.id} holds it"
        assert board.named(raw) == "peer worker has granted no credit; peer server holds it"
        assert not UUID.search(json.dumps(view)), "a UUID on screen"
        waiting_rows = [row for row in view["links"] if row["waiting"]]
        assert waiting_rows and waiting_rows[0]["reason"] and waiting_rows[0]["waited"]
        states = {row["name"]: row["state"] for row in view["communicators"]}
        assert "waiting" in states.values()
        assert any(edge["tone"] == "waiting" for edge in view["map"]["edges"])

        path = tmp_path / "board.html"
        board.save(path)
        page = path.read_text(encoding="utf-8")
        assert page.startswith("<!DOCTYPE html>") and "<style>" in page
        assert_static(page, "snapshot")
        # the sentence is one collapsed line (a <details> not open) with the whole text inside
        details = re.findall(r'<details class="netq-stall" data-active="1"[^>]*>', page)
        assert details and all(" open" not in tag for tag in details)
        assert stall["reason"][:40] in page and not UUID.search(page)

        for _ in range(12):
            server.get(timeout=30)
        wait_for(lambda: not browser.view(board.widget)["stalls"]["active"]
                 and browser.view(board.widget)["stalls"]["ended"], 30,
                 message="the wait to end and stay in the log")
        assert browser.view(board.widget)["state"] == "open"
    finally:
        client.close(timeout=5)
        server.close(timeout=5)
    # every communicator it saw is closed: the thread ends by itself, its view not live
    wait_for(lambda: not dashboard_threads(), 10, message="the dashboard thread to end")
    view = browser.view(board.widget)
    assert view["live"] is False and view["state"] == "closed"
    assert "every communicator closed" in view["snapshot"]
    assert not board.errors


def test_many_links_fold_into_an_aggregate_row_and_the_map_stays_bounded(browser):
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))
    clients = []
    try:
        for _ in range(24):
            clients.append(nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
                netloc=nq.NetworkLocation(host="127.0.0.1", port=server.address[1]))))
        ids = {c.id for c in clients}
        wait_for(lambda: {r.peer for r in server.statistics().peers} >= ids, 30,
                 message="24 clients connected")
        clients[5].put(bytes(50_000))  # the busiest link comes first
        wait_for(lambda: server.statistics().bytes_in >= 50_000, message="the put to land")
        board = Dashboard(interval=0.1, max_links=10, max_communicators=6)
        board.update()
        board.update()
        view = browser.view(board.widget)
        assert view["live"] is False and view["state"] == "snapshot"  # never started
        assert len(view["links"]) == 10
        more = view["links_more"]
        assert more is not None and more["count"] == len(board.snapshot.links) - 10
        assert len(view["communicators"]) == 6 and view["communicators_more"]["count"] >= 19
        sides: dict[float, int] = {}
        for node in view["map"]["nodes"]:
            sides[node["x"]] = sides.get(node["x"], 0) + 1
        assert max(sides.values()) <= 10  # MAP_NODES a side, the rest folded
        assert any(node["state"] == "more" for node in view["map"]["nodes"])
        page = board.static_html()
        assert page.count('<tr class="netq-link"') == 10
        assert page.count('<tr class="netq-others"') == 2
    finally:
        for client in clients:
            client.close(timeout=5)
        server.close(timeout=5)


def test_the_marimo_hook_shows_the_live_widget_and_stop_keeps_it_static(browser):
    # A board shows every communicator still alive in this process: one an earlier test closed
    # but left in a reference cycle would make it "closed" until the collector runs.
    gc.collect()
    board = Dashboard(interval=0.05)
    assert not board.running and board.view_state == "snapshot"
    assert board._display_() is board.widget and board.running  # marimo's display protocol
    wait_for(lambda: browser.view(board.widget)["live"], message="the view to go live")
    first = board.ticks
    wait_for(lambda: board.ticks > first + 2, message="samples while displayed")
    board.stop()
    assert not dashboard_threads() and board.view_state in ("stopped", "closed")
    assert board._display_() is board.widget and not board.running  # stop() is final
    assert browser.view(board.widget)["live"] is False


def test_cpu_per_tick_stays_small_at_8_links():
    with Traffic(clients=8) as traffic:
        board = Dashboard(interval=0.1, names={traffic.server.id: "server", **traffic.names},
                          start=True)
        try:
            wait_for(lambda: board.ticks >= 30, 60, message="30 samples")
        finally:
            board.stop()
    per_tick = board.cpu_per_tick()
    assert 0 < per_tick < 0.02, f"{per_tick * 1000:.2f} ms per tick at 8 links"
