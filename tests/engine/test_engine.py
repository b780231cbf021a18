"""The session engine, driven through the real facade over an in-memory network.

No thread, socket or sleep: bytes move only when the test runs the network
(:class:`MemoryNetwork.run`), so each step below is deterministic.
"""

from __future__ import annotations

import random
import time

import pytest

import netq as nq
from netq.flow import CREDIT_FLOOR
from netq.protocol.frames import Role

from .memory_transport import MemoryNetwork, MemoryTransport

KiB = 1024
MiB = 1024 * KiB


def pair(**connection):
    network = MemoryNetwork()
    server = network.communicator(nq.Purpose.SERVER, **connection)
    client = network.communicator(nq.Purpose.CLIENT, **connection)
    network.connect(client)
    network.run()
    assert server.peers == (client.id,) and client.peers == (server.id,)
    return network, server, client


def put_until_full(network, client, payload) -> int:
    count = 0
    while True:
        try:
            client.put(payload, block=False)
        except nq.Full:
            return count
        count += 1
        network.run()


def test_a_link_may_open_while_the_engine_is_still_being_built(monkeypatch):
    """A carrier's thread may open a link inside the transport's constructor, before the
    engine that owns it is complete: a broker hands a waiting client's packet to a server the
    moment it subscribes. The link gets its connection, a server's HELLO queued."""
    network = MemoryNetwork()
    opened = []
    build = MemoryTransport.__init__

    def build_and_open(self, engine, options, purpose):
        build(self, engine, options, purpose)
        opened.append(self.open_link())  # SessionEngine.__init__ has not returned yet

    monkeypatch.setattr(MemoryTransport, "__init__", build_and_open)
    server = network.communicator(nq.Purpose.SERVER)
    (link,) = opened
    assert link.conn.local.role is Role.SERVER and link.conn.local.id == server.id
    assert link.conn.has_output  # its HELLO


def test_handshake_grants_window_min_and_statistics_show_the_budget():
    network, server, client = pair(recv_budget=8 * MiB, window_min=128 * KiB)
    stats = server.statistics()
    assert stats.recv_budget == 8 * MiB and stats.recv_held == 0
    assert stats.peers[0].window == 128 * KiB
    assert client.statistics().peers[0].credit_out == 128 * KiB
    assert stats.recv_outstanding == 128 * KiB  # what the client may still send us


def test_one_thread_puts_64_mib_of_mixed_sizes_then_gets_them_all():
    """The notebook pattern with default options: no put() has to wait."""
    network, server, client = pair()
    rng = random.Random(7)
    sizes, total = [], 0
    while total < 64 * MiB:
        size = rng.randrange(0, MiB)
        client.put(bytes(size), block=False)  # raises Full if it would have to wait
        network.run()
        sizes.append(size)
        total += size
    stats = server.statistics()
    connection = server.options.connection
    assert stats.recv_held <= connection.recv_budget + MiB + CREDIT_FLOOR
    assert client.statistics().peers[0].queue_out_bytes <= connection.send_budget
    for size in sizes:
        assert len(server.get_nowait().data) == size
        network.run()
    with pytest.raises(nq.Empty):
        server.get_nowait()  # done with the last one: its bytes are free
    network.run()
    assert server.statistics().recv_held == 0
    assert client.statistics().peers[0].queue_out == 0


def test_a_message_get_returned_is_no_longer_counted_as_received_and_not_taken():
    """recv_held, the per-peer queue and memory agree right after get(), not one get() later
    (the taken message's credit returns on the next get(); statistics() does not wait)."""
    network, server, client = pair()
    client.put(b"x" * 27)
    network.run()
    assert server.statistics().recv_held > 0
    assert server.get_nowait().data == b"x" * 27
    stats = server.statistics()
    (row,) = stats.peers
    assert (stats.recv_held, row.queue_in, row.queue_in_bytes, row.memory) == (0, 0, 0, 0)


def test_a_stalled_receiver_bounds_both_ends_and_says_why():
    network, server, client = pair(recv_budget=4 * MiB, send_budget=2 * MiB)
    accepted = put_until_full(network, client, bytes(256 * KiB))
    assert accepted * 256 * KiB >= 6 * MiB - 256 * KiB  # budget + send budget, nearly
    server_stats, client_stats = server.statistics(), client.statistics()
    assert server_stats.recv_held <= 4 * MiB + 256 * KiB + CREDIT_FLOOR
    assert client_stats.peers[0].queue_out_bytes <= 2 * MiB + 256 * KiB
    why = client._engine.diagnostics.explain_send_wait(client._engine.server_session)
    assert "not calling get()" in why and "granted no credit" in why
    assert "recv_budget" in server._engine.diagnostics.explain_budget(5.0)
    with pytest.raises(nq.Full, match="not calling get"):
        client.put(b"x", block=False)
    for _ in range(accepted):
        assert len(server.get_nowait().data) == 256 * KiB
        network.run()
    network.run()
    assert client.statistics().peers[0].queue_out == 0


def test_the_window_grows_while_the_consumer_keeps_up():
    network, server, client = pair(recv_budget=64 * MiB, window_min=64 * KiB)
    held_peak = 0
    for _ in range(40):
        client.put(bytes(MiB))
        network.run()
        held_peak = max(held_peak, server.statistics().recv_held)
        server.get_nowait()
    window = server.statistics().peers[0].window
    assert window >= 1 * MiB, window  # grew from 64 KiB: each 1 MiB message starved it
    assert window <= server.options.connection.window_max
    assert held_peak <= 2 * MiB + 64  # the consumer kept up: the message in hand + one


def test_the_window_stays_put_while_data_piles_up_unread():
    network, server, client = pair(recv_budget=64 * MiB, window_min=64 * KiB)
    for _ in range(8):
        client.put(bytes(MiB))
        network.run()
    # The first message found nothing waiting (room for two such messages); from the next on
    # the backlog says nobody reads, and the window stays.
    assert server.statistics().peers[0].window <= 2 * MiB + 64
    assert 8 * MiB <= server.statistics().recv_held <= 8 * MiB + 8 * 64  # + pickle headers


def test_one_peers_backlog_cannot_starve_another():
    network = MemoryNetwork()
    server = network.communicator(nq.Purpose.SERVER, recv_budget=1 * MiB)
    flooder = network.communicator(nq.Purpose.CLIENT, recv_budget=1 * MiB)
    quiet = network.communicator(nq.Purpose.CLIENT, recv_budget=1 * MiB)
    network.connect(flooder)
    network.connect(quiet)
    network.run()
    put_until_full(network, flooder, bytes(64 * KiB))
    stats = server.statistics()
    flooded = stats.peer(flooder.id)
    # The flooder fills its share of the budget (half: two peers) and no more.
    assert 512 * KiB - 64 * KiB <= flooded.queue_in_bytes + flooded.credit_in
    assert flooded.queue_in_bytes + max(flooded.credit_in, 0) <= 512 * KiB + 64 * KiB
    future = quiet.put("still gets through")
    network.run()
    assert future.done()
    assert server.get(quiet.id, block=False).data == "still gets through"


def test_reconnecting_to_a_stalled_receiver_adds_no_credit():
    network, server, client = pair(recv_budget=1 * MiB, send_budget=8 * MiB)
    for _ in range(64):
        client.put(bytes(64 * KiB), block=False)
    network.run()
    held = server.statistics().recv_held
    assert 1 * MiB - 64 * KiB <= held <= 1 * MiB + 64 * KiB + CREDIT_FLOOR
    for _ in range(5):
        link = client._engine.server_session.link
        network.cut(link)
        network.connect(client)
        network.run()
        assert server.statistics().recv_held == held  # not one more message per link
    received = 0
    while received < 64:
        server.get_nowait()
        received += 1
        network.run()
    assert client.statistics().peers[0].queue_out == 0


def test_close_is_flushed_once_the_server_netq_has_everything_unread():
    network, server, client = pair(recv_budget=8 * MiB)
    for _ in range(20):
        client.put(bytes(200_000))
    network.run()
    client._engine.begin_close()
    network.run()
    assert client._engine.flushed()  # acknowledged although the server's code read nothing
    assert 20 * 200_000 <= server.statistics().recv_held <= 20 * 200_100



def test_the_bandwidth_probe_backs_off_while_the_path_is_the_limit(monkeypatch):
    """Small messages never fill a 256 KiB window: after a round that shows it, the probe
    (a PING per round) waits longer and longer instead of pinging every round."""
    from netq.credit import BDP_PING
    from netq.protocol import Connection

    pings: list[int] = []
    send_ping = Connection.send_ping

    def counting(self, token):
        if token & BDP_PING:
            pings.append(token)
        send_ping(self, token)

    monkeypatch.setattr(Connection, "send_ping", counting)
    network, server, client = pair()
    for index in range(300):
        client.put(index)
        network.run()
        assert server.get_nowait().data == index
    assert 1 <= len(pings) <= 10, len(pings)  # one per round would be 300
    session = server._engine.peers.get(client.id)
    assert session.bdp_backoff > 0 and session.window == 256 * KiB


def test_an_idle_link_sleeps_until_its_next_ping_is_due():
    # A link that heard from its peer a second ago, and sent its own PING long ago (the peer's
    # PINGs kept it alive since), has its next PING due in heartbeat - 1 s: the I/O loop sleeps
    # that long instead of waking every millisecond.
    network, server, client = pair(heartbeat=5.0)
    now = time.monotonic()
    for communicator in (client, server):
        engine = communicator._engine
        for link in engine.loop.links():
            link.last_received_at = now - 1.0
            link.ping_sent_at = now - 60.0
        engine._timers_changed()
        assert 3.9 <= engine.service(now) <= 4.0
    # A thousand links' due times spread over the heartbeat do not wake the loop more often
    # than every tenth of a heartbeat.
    engine = client._engine
    link = engine.loop.links()[0]
    link.last_received_at = now - 4.99
    link.ping_sent_at = now - 4.99
    engine._timers_changed()
    assert engine.service(now) >= 0.5


def test_send_budget_counts_what_a_queued_small_message_costs_in_memory():
    """A 64-byte put holds a future and bookkeeping several times its size: send_budget
    counts QUEUED_MESSAGE_COST per queued message, and that figure is what they really hold."""
    import tracemalloc

    from netq.session import QUEUED_MESSAGE_COST

    network = MemoryNetwork()
    network.communicator(nq.Purpose.SERVER)
    client = network.communicator(nq.Purpose.CLIENT, send_budget=4 * MiB,
                                  send_messages=1_000_000)  # never connected
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        queued = put_until_full(network, client, bytes(64))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    row = client.statistics().peers[0]
    assert row.queue_out == queued
    pickled = row.queue_out_bytes // queued  # the payload as it goes on the wire
    assert row.queue_out_bytes == queued * pickled
    # The budget stops the queue where payload and cost together reach it (not at
    # 4 MiB / 64 B = 65 536 messages) ...
    assert queued == -(-4 * MiB // (pickled + QUEUED_MESSAGE_COST))
    # ... and the cost is not understated: what each queued message holds, all told.
    assert held / queued <= pickled + QUEUED_MESSAGE_COST, held / queued


def test_send_messages_bounds_what_is_held_for_a_peer_and_a_put_waits_for_acks():
    """Queued plus unacknowledged messages stop at send_messages; only an ACK makes room."""
    network = MemoryNetwork()
    server = network.communicator(nq.Purpose.SERVER)
    client = network.communicator(nq.Purpose.CLIENT, send_messages=8)
    for _ in range(8):
        client.put(b"x", block=False)  # not connected yet: all eight queued
    with pytest.raises(nq.Full) as caught:
        client.put(b"x", block=False)
    assert "8 of send_messages=8 held, 0 of them sent" in str(caught.value)

    client_link, server_link = network.connect(client)
    for _ in range(3):  # the handshake, both ways
        network.move(client_link)
        network.move(server_link)
    client._engine.service(time.monotonic())  # the client sends the eight ...
    network.move(client_link)  # ... the server receives them; its ACK is not delivered
    row = client.statistics().peers[0]
    assert (row.queue_out, row.inflight) == (0, 8)
    with pytest.raises(nq.Full) as caught:
        client.put(b"x", block=False)
    assert "8 of send_messages=8 held, 8 of them sent and not yet acknowledged" \
        in str(caught.value)
    network.move(server_link)  # the ACK arrives: room again
    client.put(b"x", block=False)
    network.run()
    assert len(server.get_many(max_messages=100)) == 9


def test_a_stale_attempt_finishing_its_handshake_late_does_not_take_the_session():
    """Issue 39: in a storm, a client gives up an attempt whose handshake the server has not
    finished (A) and connects again (B). If B's handshake is done first and A's SESSION is read
    only then, A must not replace B: the client has closed A, so the session would wait on a
    dead link, expire after session_timeout and fail a broadcast while its client is connected
    on B (and B, told it was replaced, would not reconnect)."""
    network = MemoryNetwork()
    server = network.communicator(nq.Purpose.SERVER, session_timeout=5.0)
    client = network.communicator(nq.Purpose.CLIENT, session_timeout=5.0)
    client_a, server_a = network.connect(client)
    assert network.move(client_a) and network.move(server_a)  # the HELLOs, both ways
    stale = client_a.conn.data_to_send()  # A's SESSION: on its way, not read yet
    assert stale
    network._pairs.pop(id(client_a))  # the client closes A; the server reads what A sent later
    client._loop.drop(client_a)
    network.connect(client)  # attempt B: its handshake completes, the client's put arrives
    put = client.put("hello")
    network.run()
    assert put.result(0) is None and server.get(timeout=0).data == "hello"
    # Only now does the server read A's SESSION, then A's end.
    with server_a.lock:
        server._engine.handle_events(server_a, server_a.conn.receive_data(stale))
    network.run()
    server._loop.drop(server_a)
    network.run()
    assert server.peers == (client.id,) and client.peers == (server.id,)
    # Long past session_timeout: the session is the client's live one, not expired.
    server._engine.handshake.expire_sessions(time.monotonic() + 60)
    broadcast = server.put("to all")
    network.run()
    assert broadcast.result(0) is None
    assert client.get(timeout=0).data == "to all"


def test_a_session_does_not_expire_while_its_client_is_back_and_handshaking():
    """Issue 39: a client whose link broke is back on a new link, but a storm holds up the
    handshake on the server past session_timeout: the session waits for that handshake instead
    of expiring (which would fail what was queued for the client, a broadcast's share too)."""
    network, server, client = pair(session_timeout=5.0)
    (old,) = client._loop.links()
    network.cut(old)
    queued = server.put("while you were away")
    client_b, server_b = network.connect(client)
    assert network.move(client_b)  # the client's HELLO: the server knows who is back
    assert server_b.peer_id == client.id and server_b.session is None
    server._engine.handshake.expire_sessions(time.monotonic() + 60)
    assert not queued.done()
    network.run()
    assert queued.result(0) is None and client.get(timeout=0).data == "while you were away"
    # A handshake that ends without a SESSION no longer keeps the session: it expires.
    network.cut(client_b)
    client_c, server_c = network.connect(client)
    assert network.move(client_c)
    lost = server.put("lost")
    network.cut(client_c)
    server._engine.handshake.expire_sessions(time.monotonic() + 60)
    with pytest.raises(nq.ConnectionLost, match="session_timeout"):
        lost.result(0)
    assert not server._engine.handshake._handshaking


def _count_calls(monkeypatch, owner, name: str) -> list[int]:
    """Count the calls of ``owner.name`` (an instance's method) from now on."""
    calls = [0]
    method = getattr(owner, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return method(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_storm_costs_the_server_work_linear_in_its_clients(monkeypatch):
    """Issue 39: what grew with the number of links. 200 clients connect one after another to
    a server whose receive budget holds most of them back (as thousands of default clients
    do), each puts one message, and the server takes them one by one. A handshake must not
    make the server look at its timers (each look scans every link and session: one per
    handshake was quadratic), and a message taken must not schedule a credit grant for every
    peer the budget holds back (34 056 grants here before, 567 now)."""
    clients_count = 200
    network = MemoryNetwork()
    # A long heartbeat: a look comes due every tenth of one, and a loaded machine must not
    # make this test slow enough for that.
    server = network.communicator(nq.Purpose.SERVER, recv_budget=4 * MiB, heartbeat=60.0)
    engine = server._engine
    looks = _count_calls(monkeypatch, engine, "_timers")
    grants = _count_calls(monkeypatch, engine.budget, "grant")
    clients = []
    for _ in range(clients_count):
        client = network.communicator(nq.Purpose.CLIENT)
        network.connect(client)
        network.run()
        clients.append(client)
    assert len(server.peers) == clients_count
    assert looks[0] <= 2, looks  # the first look (and a second, if a tick passed)
    for client in clients:
        client.put("hello")
    network.run()
    assert len(engine.budget._waiters) > clients_count // 2  # the budget holds most back
    for _ in clients:
        assert server.get(timeout=0).data == "hello"
        network.run()
    assert grants[0] <= 4 * clients_count, grants
