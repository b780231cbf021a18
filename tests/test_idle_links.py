"""Idle links (issue 21): a connected, idle client costs the server a few KiB, and a server
with many idle clients does not claim that its receive budget is full.

* 2000 idle clients in 8 child processes of 250 (``bench/idle.py``, which runs bench/storm.py's
  children and server at CI size) connect to a default TCP server: the server's RSS grows by
  at most :data:`RSS_PER_CLIENT_KIB` per client, every client gets a broadcast, and the server
  logs no "receive budget full" WARNING. The 10 000-client figure is the bench row
  (``python3 bench/idle.py``), reported in docs/performance.md.
* Idle peers keep the credit floor (16 KiB each) that a peer may always have, so with enough
  of them the floors alone exceed ``recv_budget``: nothing waits for credit, and no WARNING
  or ``statistics()`` row may say that the budget is full. A peer that really runs out of
  credit while the budget is full is still reported (the same server, at the end).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

import netq as nq
from netq.flow import CREDIT_FLOOR
from netq_testing import wait_for
from test_load import LoadChild

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import idle  # noqa: E402 - bench/idle.py, found through the path above

T = 60.0
CI_CLIENTS, CI_PROCESSES = 2000, 8
# The target at 10 000 clients, kept at 2000. Measured: ~15 KiB per client (the
# protocol core's first staging buffer, the peer session, the socket objects); before the
# staging buffer was sized on demand: ~270 KiB. The baseline is taken once the server listens,
# so first-use costs (lazy imports, the reader thread, allocator arenas) count as well; spread
# over 2000 clients they are well under 1 KiB each, and the bound leaves twice the measured
# figure for them and for allocator noise on a loaded machine.
RSS_PER_CLIENT_KIB = idle.TARGET_KIB
BUDGET_FULL = "receive budget has had no room"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_2000_idle_clients_cost_the_server_little_memory_and_all_get_a_broadcast(tmp_path):
    # Clients at the server's priority: at this size they leave it enough CPU, and a niced
    # client would wait behind everything else a shared CI machine runs.
    result = idle.run_idle(CI_CLIENTS, CI_PROCESSES, timeout=120, log_dir=tmp_path,
                           client_nice=0)
    print(f"\nidle: {idle.summary(result)}")
    assert not result["fd_note"], result["fd_note"]  # CI must run the full 2000
    assert result["connected"] == CI_CLIENTS, result
    assert result["put_failures"] == 0 and result["lost"] == 0, result
    assert result["broadcast_ok"] and result["lost_broadcast"] == 0, result
    assert result["budget_warnings"] == 0, (tmp_path / "server.log").read_text()
    assert result["rss_per_client_kib"] <= RSS_PER_CLIENT_KIB, idle.summary(result)
    assert result["rss_per_client_kib_broadcast"] <= RSS_PER_CLIENT_KIB, idle.summary(result)
    assert result["ok"], result


def _budget_warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "netq" and record.levelno >= logging.WARNING
            and BUDGET_FULL in record.getMessage()]


@pytest.mark.timeout(180)
def test_idle_peers_whose_floors_exceed_the_budget_do_not_fill_it(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="netq")
    stall_warning = 0.5
    idle_clients = 100  # their floors: 100 x 16 KiB, over the 1 MiB budget
    budget = 1024 * 1024
    assert idle_clients * CREDIT_FLOOR > budget
    connection = nq.ConnectionOptions(recv_budget=budget, stall_warning=stall_warning)
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", 0), connection=connection))
    child = LoadChild(nq.Protocol.TCP, server.address, 0, idle_clients, 0,
                      tmp_path / "idle-clients.log")
    flood = None
    try:
        child.ready(T)
        wait_for(lambda: len(server.peers) == idle_clients, T,
                 message=f"{idle_clients} idle clients to connect")
        stats = server.statistics()
        # What used to warn: the outstanding floors leave less than a floor of room.
        assert stats.recv_budget - stats.recv_held - stats.recv_outstanding < CREDIT_FLOOR
        # A negative over a bounded window: six times the delay after which a full budget
        # is reported (the server's housekeeping looks at least that often).
        quiet_until = time.monotonic() + 6 * stall_warning
        while time.monotonic() < quiet_until:
            assert not _budget_warnings(caplog), _budget_warnings(caplog)
            assert not server.statistics().blocked, server.statistics().blocked
            time.sleep(0.05)
        # The same server still reports a budget that really is full: a peer runs out of
        # credit because nobody calls get().
        flood = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(*server.address[:2])))
        block = bytes(64 * 1024)
        futures = [flood.put(block) for _ in range(24)]  # 1.5 MiB: more than the budget
        wait_for(lambda: _budget_warnings(caplog), T,
                 message="the server to warn that its budget is full")
        assert "1 peer has no credit left (" in _budget_warnings(caplog)[0]
        assert f"{flood.id}: " in _budget_warnings(caplog)[0]  # the starved one, alone
        for _ in futures:
            assert server.get(timeout=T).data == block
        for future in futures:
            future.result(T)
    finally:
        if flood is not None:
            flood.close(timeout=10)
        child.send("close")
        child.read(T)
        child.close()
        server.close(timeout=5)
