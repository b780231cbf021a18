"""widgets/dashboard.py: every communicator of the process and the links between them, against
a real server and clients on 127.0.0.1 (and a stalled link: a server that does not get())."""

from __future__ import annotations

import re
import threading

from netq.widgets import Dashboard, dashboard

import netq as nq
from netq_testing import wait_for
from widget_testing import Traffic


def dashboard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "netq-dashboard"]


def test_it_lists_every_communicator_and_pairs_the_ends_of_each_link(frontend):
    with Traffic(clients=3) as traffic:
        names = {traffic.server.id: "server", **traffic.names}
        board = dashboard(interval=0.1, names=names, start=True)
        assert isinstance(board, Dashboard) and dashboard_threads()

        def flowing():
            snap = board.snapshot
            ours = [link for link in snap.links if link.a == traffic.server.id]
            return len(ours) == 3 and all(link.bytes_per_s > 0 and link.b_row is not None
                                          for link in ours)
        wait_for(flowing, message="3 links with traffic, both ends known")
        snap = board.snapshot
        ids = {traffic.server.id, *(c.id for c in traffic.clients)}
        assert ids <= set(snap.communicators)
        markup = frontend.state(board.widget)["value"]  # what the browser holds
        for name in ("server", "client-0", "client-1", "client-2"):
            assert f"server → {name}" in markup or name == "server"
        assert markup.count('<tr class="link"') >= 3 and "<svg" in markup
        assert "<script" not in markup
        assert "received, not taken" in markup and " of 64.0 MiB" in markup  # budgets in use
        page = board.to_html()
        assert page.startswith("<!DOCTYPE html>") and "netq dashboard" in page
        board.stop()
        assert not dashboard_threads() and "netq-state-stopped" in board.widget.value
    board.update()
    assert "netq-state-closed" in board.render()  # all of them closed now


def test_a_stall_shows_with_its_reason_while_it_happens_and_after(frontend, tmp_path):
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
        wait_for(lambda: board.snapshot.active_stalls, 30, message="a stall on the dashboard")
        markup = board.widget.value
        stall = board.snapshot.active_stalls[0]
        assert stall.reason and re.search(r'class="netq-waits">waiting [0-9.]+ s', markup)
        assert 'class="link blocked"' in markup and "#c62828" in markup
        board.save(tmp_path / "board.html")
        assert stall.reason[:30] in (tmp_path / "board.html").read_text()
        for _ in range(12):
            server.get(timeout=30)
        wait_for(lambda: not board.snapshot.active_stalls and board.snapshot.recent_stalls, 30,
                 message="the stall to end and stay in the log")
        assert "ended, " in board.widget.value
    finally:
        client.close(timeout=5)
        server.close(timeout=5)
    # every communicator it saw is closed: the thread ends by itself
    wait_for(lambda: not dashboard_threads(), 10, message="the dashboard thread to end")
    assert not board.errors
