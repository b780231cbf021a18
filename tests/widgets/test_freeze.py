"""A view's static form keeps its point: ``freeze()``, and the picture kept at close.

Real servers and clients on 127.0.0.1 (``Traffic``) for what a notebook does; scripted
snapshots (``make_stats``) where a test needs one exact state (a wait and its reason).
"""

from __future__ import annotations

import gc
import re
import threading
import uuid

from netq.widgets import Monitor
from netq.widgets.dashboard import Dashboard, DashboardSnapshot, _final_size
from netq.widgets.sampler import SamplingThread

from netq.display.view_model import FinalPicture
from netq_testing import wait_for
from widget_testing import Traffic, make_row, make_stats

ROW = re.compile(r'<tr class="netq-peer[^"]*" data-peer="([^"]+)"')


def netq_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("netq-monitor-", "netq-dashboard"))]


def html_rows(page: str) -> list[str]:
    return ROW.findall(page)


def badge(page: str) -> str:
    found = re.search(r'class="netq-badge" data-state="([a-z-]+)"', page)
    assert found is not None
    return found.group(1)


def assert_board_forms_agree(bundle: dict[str, str], links: int) -> None:
    """A dashboard's text/plain and text/html: the same badge word, links and sentence."""
    page, text = bundle["text/html"], bundle["text/plain"]
    keys = re.findall(r'<tr class="netq-link[^"]*" data-link="([^"]+)"', page)
    assert len(keys) == links, keys
    for key in keys:
        assert key.replace("→", " → ") + ":" in text, (key, text)
    assert f"netq dashboard ({badge(page)})" in text and f"{links} links" in text
    sentence = re.search(r'class="netq-snapshot">([^<]+)<', page)
    assert sentence is not None and sentence.group(1) in text


def assert_forms_agree(bundle: dict[str, str], rows: int) -> None:
    """text/plain and text/html: the same badge word, the same rows, the same sentence."""
    page, text = bundle["text/html"], bundle["text/plain"]
    names = html_rows(page)
    assert len(names) == rows, names
    state = badge(page)
    assert text.splitlines()[0].split("  ")[1] == state
    body = text.splitlines()
    for name in names:
        assert any(line.startswith(name[:10]) for line in body), (name, text)
    sentence = re.search(r'class="netq-snapshot">([^<]+)<', page)
    assert sentence is not None and sentence.group(1) in text


class Script:
    """A communicator whose ``statistics()`` returns the snapshots given, in order (the last
    one again and again): one exact state for the view to show."""

    def __init__(self, *snapshots) -> None:
        self.id = uuid.uuid4()
        self.snapshots = list(snapshots)

    def statistics(self):
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


def test_freeze_keeps_the_monitor_as_it_is_whatever_follows(frontend):
    with Traffic(clients=3) as traffic:
        monitor = Monitor(traffic.server, interval=0.05, names=traffic.names, start=True)
        wait_for(lambda: len(monitor.table.rows) == 3, message="3 rows")
        assert monitor.freeze() is monitor
        assert monitor.frozen and not monitor.running and monitor.view_state == "snapshot"
        kept = monitor.static_bundle()
        view = frontend.state(monitor.widget)["view"]
        assert view["live"] is False and view["title"]["state"] == "snapshot"
        assert view["snapshot"] == f"snapshot taken {view['taken']}, not live (frozen)"
        assert_forms_agree(kept, 3)
        assert "(frozen)" in kept["text/html"] and 'data-live="0"' in kept["text/html"]
        # every figure from one sample: the table's total is the title's in-rate's sample
        assert monitor.stats.peers and len(monitor.stats.peers) == 3
        taken = monitor.stats.time
        wait_for(lambda: traffic.server.statistics().time > taken + 0.2, message="time passing")
        assert monitor.freeze() is monitor  # twice: harmless
        monitor.stop()  # a later cell's stop() leaves the frozen picture alone
        monitor.update()
        assert repr(monitor) == kept["text/plain"]
        assert monitor.static_bundle() == kept and monitor.view_state == "snapshot"
        assert frontend.state(monitor.widget)["view"] == view
        wait_for(lambda: not netq_threads(), message="the sampler thread to end")
    assert monitor.static_bundle() == kept  # the communicator's closing too
    monitor.start()  # closed now: it keeps its picture, starts nothing
    assert monitor.static_bundle() == kept and not netq_threads()


def test_at_close_the_monitor_keeps_its_last_live_picture(frontend):
    with Traffic(clients=3) as traffic:
        monitor = Monitor(traffic.server, interval=0.05, names=traffic.names, start=True)
        wait_for(lambda: len(monitor.table.rows) == 3, message="3 rows")
        # Traffic closes its clients one by one, then the server
    wait_for(lambda: not netq_threads(), message="the sampler thread to end at close")
    assert monitor.frozen and monitor.view_state == "closed"
    bundle = monitor.static_bundle()
    page = bundle["text/html"]
    assert badge(page) == "closed" and "(the communicator closed after it)" in page
    assert_forms_agree(bundle, 3)  # the 3 clients, not the empty table after the closing
    assert "(left)" not in page  # the legend as it was then
    assert "3 peers" in bundle["text/plain"] and "0 peers" not in page
    assert monitor.static_bundle() == bundle  # frozen once


def test_the_static_form_after_close_shows_every_row_and_the_wait():
    peers = [uuid.uuid4() for _ in range(32)]
    names = {peer: f"client-{n:02d}" for n, peer in enumerate(peers)}
    reason = f"no credit: {peers[5]} takes nothing"

    def rows(count, now):
        return make_stats([make_row(peer, messages_in_per_s=10.0 + n, bytes_in_per_s=1e3 * n,
                                    blocked=reason if n == 5 else "",
                                    blocked_for=6.0 if n == 5 else 0.0)
                           for n, peer in enumerate(peers[:count])], now=now)

    closing = [rows(32, 1.0), rows(32, 1.5), rows(20, 2.0), rows(3, 2.5),
               make_stats([], now=3.0, state="closed")]
    monitor = Monitor(Script(*closing), names=names, max_rows=20, start=False)
    for _ in range(4):
        monitor.update()
    assert monitor.frozen and monitor.view_state == "closed"
    bundle = monitor.static_bundle()
    page, text = bundle["text/html"], bundle["text/plain"]
    assert_forms_agree(bundle, 20)  # max_rows rows, the 12 others in one row
    assert '<tr class="netq-others">' in page and "(12 peers)" in text
    assert "32 peers" in page and "32 peers" in text
    assert "client-05 waits 6 s: no credit: client-05 takes nothing" in page
    assert "! client-05 waits 6 s: no credit: client-05 takes nothing" in text
    assert monitor.stats.uptime == 1.5  # the last sample before the decline, whole


def test_a_closed_communicator_states_no_rate_as_current():
    closed = make_stats([], now=3.0, state="closed")
    monitor = Monitor(Script(closed), start=False)
    bundle = monitor.static_bundle()
    assert badge(bundle["text/html"]) == "closed"
    assert "msg/s," not in bundle["text/html"].split('class="netq-table-box"')[0]
    assert "(the communicator is closed)" in bundle["text/plain"]


def test_freeze_keeps_the_dashboard_and_its_links(frontend):
    gc.collect()  # closed communicators of earlier tests would be listed until collected
    with Traffic(clients=3) as traffic:
        names = {traffic.server.id: "server", **traffic.names}
        board = Dashboard(interval=0.05, names=names, start=True)
        wait_for(lambda: len(board.snapshot.links) == 3 and board.ticks > 3,
                 message="3 links sampled")
        assert board.freeze() is board and board.freeze() is board
        assert board.frozen and not board.running and board.view_state == "snapshot"
        kept = board.static_bundle()
        page, text = kept["text/html"], kept["text/plain"]
        assert page.count('<tr class="netq-link"') == 3 and "No links yet" not in page
        assert_board_forms_agree(kept, 3)
        assert "(frozen)" in page and "(frozen)" in text
        assert badge(page) == "snapshot" and "netq dashboard (snapshot)" in text
        board.stop()
        board.update()
        assert board.static_bundle() == kept and repr(board) == kept["text/plain"]
    assert board.static_bundle() == kept


def test_a_dashboard_sample_missing_a_closing_clients_link_is_not_the_one_kept():
    """A client's close() can take its link away in a sample that still shows the client
    open: that sample starts the decline, so the picture kept is the one with every link."""
    ids = [uuid.UUID(int=i) for i in (1, 2, 3)]  # a server and two clients

    def snapshot(links: int, states: tuple[str, str, str]) -> DashboardSnapshot:
        stats = [make_stats([], state=state) for state in states]
        return DashboardSnapshot(taken=0.0, communicators=dict(zip(ids, stats, strict=True)),
                                 links=[object()] * links)  # type: ignore[list-item]

    final: FinalPicture[str] = FinalPicture()
    for name, snap in [("full", snapshot(2, ("open", "open", "open"))),
                       ("full", snapshot(2, ("open", "open", "open"))),
                       ("link gone", snapshot(1, ("open", "open", "open"))),
                       ("closing", snapshot(1, ("open", "closing", "open"))),
                       ("closed", snapshot(0, ("open", "closed", "closing")))]:
        final.add(name, _final_size(snap))
    assert final.final() == "full"


class _EndsAtOnce(SamplingThread):
    """A sampling thread whose first tick ends it; its hook records what a reader sees."""

    def __init__(self) -> None:
        super().__init__("netq-test-sampling", 0.001)
        self.alive_in_hook: bool | None = None
        self.ended = threading.Event()

    def _tick(self) -> bool:
        return False

    def _finished(self) -> None:
        self.alive_in_hook = self.alive
        self.ended.set()


def test_a_thread_that_a_tick_ended_is_alive_until_its_hook_froze_the_views():
    """A view's badge reads ``stopped`` off a thread that is not alive: while the hook of a
    thread that a tick ended still freezes the view (``closed``), it must count as alive."""
    sampling = _EndsAtOnce()
    sampling.start()
    assert sampling.ended.wait(10)
    sampling.thread.join(10)
    assert sampling.alive_in_hook is True
    assert not sampling.alive


def test_a_thread_stopped_by_stop_is_not_alive_in_its_hook():
    sampling = _EndsAtOnce()
    sampling.stop()  # before the first tick: the hook runs at once
    sampling.start()
    assert sampling.ended.wait(10)
    sampling.thread.join(10)
    assert sampling.alive_in_hook is False


def test_at_close_the_dashboard_keeps_its_links(frontend):
    gc.collect()
    with Traffic(clients=3) as traffic:
        names = {traffic.server.id: "server", **traffic.names}
        board = Dashboard(interval=0.05, names=names, start=True)
        wait_for(lambda: len(board.snapshot.links) == 3 and board.ticks > 3,
                 message="3 links sampled")
    wait_for(lambda: not board.running, message="the dashboard's thread to end at close")
    assert board.view_state == "closed"
    bundle = board.static_bundle()
    page, text = bundle["text/html"], bundle["text/plain"]
    assert page.count('<tr class="netq-link"') == 3 and "No links yet" not in page
    assert_board_forms_agree(bundle, 3)
    assert "(every communicator closed after it)" in page and badge(page) == "closed"
    assert "3 links" in text and "netq dashboard (closed)" in text
    # one sample: the server's row counts the 3 peers its links show, its rates current then
    server_row = next(line for line in text.splitlines() if line.startswith("  server: "))
    assert "  open  peers 3  " in server_row and " - " not in server_row, server_row
