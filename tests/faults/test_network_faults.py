"""Network faults on every transport, through a fault-injecting relay (tests/fault_proxy.py).

A client reaches its server through a :class:`fault_proxy.FaultProxy` (for MQTT the proxy sits
between the client and the broker; the server talks to the broker directly). Both sides keep a
steady stream of numbered messages going (:class:`Traffic`) while the proxy delays, silences
(blackhole), resets, truncates or refuses, and then the test asserts:

* every message arrived exactly once and in order, both ways (a receiver checks each index
  against the next one expected, and the payload against its index);
* every put future resolved exactly once, without an error (a done-callback counts calls);
* a silent network (blackhole) was noticed by both ends within 3 heartbeats (+ a margin for
  this loaded 2-core machine), and a loud one (reset, truncation) at once;
* the client reconnected (``statistics().peers[0].reconnects``);
* memory stayed bounded: netq's own ``statistics().memory`` of both ends within the windows,
  and the process RSS (server, client and proxy all live in this process) grew by less than
  :data:`RSS_GROWTH_LIMIT`;
* the process was near idle while the network was cut (< 10 % of a core over 1.5 s, the bound
  of ``test_client_idle_while_its_server_is_dead``): nothing spins on a dead socket.

A silent peer is a network fault too: a link that opens and then says nothing (or half a
HELLO, or no TLS handshake) is dropped within three heartbeats, and a TLS handshake waiting on
a silent peer waits in select, not in a spin.

Set ``NETQ_FAULT_FIGURES=<file>`` to append each test's measurements to it as JSON lines.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time

import psutil
import pytest

import netq as nq
from fault_proxy import FaultProxy
from netq_testing import (
    Sampler,
    cpu_fraction,
    pair_through,
    peer_row,
    recv_exactly,
    rss,
    sequence_payload,
    wait_for,
)

from .helpers import T, client_hello, read_until_closed, round_trip

KiB, MiB = nq.KiB, nq.MiB

HEARTBEAT = 0.3  # s: a silent link is dropped after 3 of them (0.9 s)
DETECTION_MARGIN = 2.5  # s on top of 3 heartbeats: scheduling delays on a loaded machine
PACE = 0.004  # s between two puts of one sender (~250 messages/s each way)
SEND_BUDGET = 1 * MiB
RECV_BUDGET = 256 * KiB
LARGE = 64 * KiB  # every 50th message: several chunks, out-of-band buffer
CPU_WINDOW = 1.5  # s over which "idle while cut" is measured
IDLE_LIMIT = 0.10  # fraction of one core
# While every connect is refused the client still retries (at most 1 / reconnect_max a second),
# and each attempt's set-up (TLS, a gRPC channel) costs more CPU the more loaded the machine is;
# a retry loop without backoff would take a whole core, so this bound still catches one.
REFUSED_LIMIT = 0.25
# Each end holds at most send_budget unsent + what the peer granted (recv_budget, in flight)
# + its own recv_budget of received messages + one message started on positive credit: about
# 1.6 MiB per end, 3.3 MiB for both. The RSS limit adds the proxy's buffers (1 MiB per
# direction, at most a few connections), interpreter and library arenas that grow on first
# use after the baseline (TLS records, gRPC and paho buffers, thread stacks of reconnects):
# 32 MiB is ~10x what netq may hold, and far below what an unbounded queue would reach (the
# senders put ~1.5 MiB/s each way; a stall that buffered everything for the test would show).
NETQ_MEMORY_LIMIT = 2 * (SEND_BUDGET + 2 * RECV_BUDGET + 2 * LARGE)
RSS_GROWTH_LIMIT = 32 * MiB

pytestmark = pytest.mark.timeout(120)


def size_of(index: int) -> int:
    return LARGE if index % 50 == 25 else (index * 37) % 3000


def record(figures: dict) -> None:
    path = os.environ.get("NETQ_FAULT_FIGURES")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(figures) + "\n")


class Traffic:
    """Numbered messages both ways between ``server`` and ``client`` at a steady pace, each
    receiver checking order and content as it goes, until :meth:`finish`."""

    def __init__(self, server: nq.Communicator, client: nq.Communicator) -> None:
        self.server = server
        self.client = client
        self.sent = {"c": 0, "s": 0}
        self.received = {"c": [], "s": []}  # by sender tag
        self.futures: list = []  # [future, number of done-callback calls]
        self.errors: list = []
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._parked = {"c": threading.Event(), "s": threading.Event()}  # set while paused
        self._threads = [
            threading.Thread(target=self._send, args=(client, "c"), name="test-send"),
            threading.Thread(target=self._send, args=(server, "s", client.id), name="test-send"),
            threading.Thread(target=self._receive, args=(server, "c"), name="test-recv"),
            threading.Thread(target=self._receive, args=(client, "s"), name="test-recv"),
        ]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join(T * 2)

    def _send(self, comm, tag, *peers) -> None:
        try:
            index = 0
            while not self._stop.is_set():
                if not self._go.is_set():
                    self._parked[tag].set()
                    self._go.wait()
                    self._parked[tag].clear()
                    continue
                entry = [None, 0]

                def resolved(_future, entry=entry):
                    entry[1] += 1

                try:
                    # A put that waits on a full send window gives up now and then, so that a
                    # pause() finds this sender parked; the same message is put again after.
                    future = comm.put((tag, index, sequence_payload(index, size_of(index))),
                                      *peers, timeout=0.1)
                except nq.Full:
                    continue
                entry[0] = future
                future.add_done_callback(resolved)
                self.futures.append(entry)
                index += 1
                self.sent[tag] = index
                time.sleep(PACE)  # paces the producer (a steady stream), not a wait for a state
        except BaseException as error:  # noqa: BLE001 - reported by finish()
            self.errors.append((tag, "send", error))

    def _receive(self, comm, tag) -> None:
        out = self.received[tag]
        try:
            deadline = None
            while True:
                try:
                    message = comm.get(timeout=0.1)
                except nq.Empty:
                    if self._stop.is_set():
                        if len(out) >= self.sent[tag]:
                            return
                        deadline = deadline or time.monotonic() + T
                        if time.monotonic() > deadline:
                            raise AssertionError(f"{tag}: {len(out)} of {self.sent[tag]} "
                                                 f"arrived") from None
                    continue
                got_tag, index, payload = message.data
                assert got_tag == tag, got_tag
                assert index == len(out), f"{tag}: got #{index}, expected #{len(out)}"
                assert payload == sequence_payload(index, size_of(index)), index
                out.append(index)
        except BaseException as error:  # noqa: BLE001 - reported by finish()
            self.errors.append((tag, "receive", error))

    def flowing(self, more: int = 30, timeout: float = T) -> None:
        """Wait until ``more`` messages more arrived each way."""
        start = {tag: len(out) for tag, out in self.received.items()}
        wait_for(lambda: self.errors or all(len(out) >= start[tag] + more
                                            for tag, out in self.received.items()),
                 timeout, message=f"{more} more messages each way")
        assert not self.errors, self.errors

    def pause(self) -> None:
        """Stop both senders: when this returns, neither is inside put()."""
        self._go.clear()
        wait_for(lambda: self.errors or all(event.is_set() for event in self._parked.values()),
                 T, message="both senders to park")
        assert not self.errors, self.errors

    def resume(self) -> None:
        self._go.set()

    def finish(self) -> None:
        """Stop sending; every message arrived once, in order; every future resolved once."""
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join(T * 2)
            assert not thread.is_alive(), "a traffic thread hung"
        assert not self.errors, self.errors
        for tag in ("c", "s"):
            assert self.sent[tag] > 50, self.sent  # the fault struck mid-stream
            assert self.received[tag] == list(range(self.sent[tag])), tag
        for future, _ in self.futures:
            assert future.result(T) is None
        wait_for(lambda: all(calls == 1 for _, calls in self.futures), T,
                 message="every done-callback to have run")
        assert all(calls == 1 for _, calls in self.futures)


def client_state(client) -> str:
    return client.statistics().peers[0].state


def server_state(server, client) -> str:
    row = peer_row(server, client.id)
    return row.state if row is not None else "gone"


def wait_reconnected(client, before: int, timeout: float = T) -> None:
    wait_for(lambda: (row := client.statistics().peers[0]).reconnects > before
             and row.state == "connected", timeout, message="the client to reconnect")


# ============================================================================ the proxy itself


@pytest.fixture
def echo_upstream(loopback_listener):
    return loopback_listener


def test_proxy_relays_delays_and_counts(echo_upstream):
    with FaultProxy(echo_upstream.getsockname()) as proxy:
        client, server = pair_through(proxy.address, echo_upstream, timeout=5)
        with client, server:
            client.sendall(b"ping")
            assert recv_exactly(server, 4) == b"ping"
            server.sendall(b"pong!")
            assert recv_exactly(client, 5) == b"pong!"
            proxy.delay(0.2)
            sent = time.monotonic()
            client.sendall(b"late")
            assert recv_exactly(server, 4) == b"late"
            assert time.monotonic() - sent >= 0.19
            proxy.delay(0)
            big = os.urandom(3 * MiB)  # more than the proxy buffers: backpressure, no loss
            threading.Thread(target=client.sendall, args=(big,), name="test-send").start()
            assert recv_exactly(server, len(big)) == big
            client.shutdown(socket.SHUT_WR)  # half-close passes through
            assert server.recv(1) == b""
            server.sendall(b"after half-close")
            assert recv_exactly(client, 16) == b"after half-close"
        stats = proxy.stats()
        assert stats.bytes_up == 8 + len(big) and stats.bytes_down == 5 + 16
        assert stats.accepted == 1


def test_proxy_blackhole_reset_truncate_refuse(echo_upstream):
    with FaultProxy(echo_upstream.getsockname()) as proxy:
        client, server = pair_through(proxy.address, echo_upstream, timeout=5)
        with client, server:
            proxy.blackhole()
            client.sendall(b"held")
            server.settimeout(0.3)
            with pytest.raises(socket.timeout):
                server.recv(4)
            proxy.restore()
            server.settimeout(5)
            assert recv_exactly(server, 4) == b"held"  # held, not lost (TCP retransmits)
            assert proxy.reset() == 1
            with pytest.raises(ConnectionResetError):
                client.recv(1)
        client, server = pair_through(proxy.address, echo_upstream, timeout=5)
        with client, server:
            proxy.truncate(3)
            client.sendall(b"abcdef")
            assert recv_exactly(server, 3) == b"abc"
            assert server.recv(1) == b""  # then the connection ends
        proxy.refuse()
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            with socket.create_connection(proxy.address, timeout=5) as refused:
                refused.sendall(b"x")
                refused.recv(1)
        proxy.restore()
        client, server = pair_through(proxy.address, echo_upstream, timeout=5)
        with client, server:
            client.sendall(b"ok")
            assert recv_exactly(server, 2) == b"ok"
        stats = proxy.stats()
        assert (stats.accepted, stats.refused, stats.reset, stats.truncated) == (3, 1, 1, 1)


# ============================================================================ silent peers


@pytest.mark.parametrize("behaviour", ["silent", "half-hello", "no-tls-handshake"])
def test_half_open_link_dropped_within_three_heartbeats(transport, behaviour):
    if behaviour == "no-tls-handshake" and not getattr(transport.spec, "tls", False):
        pytest.skip("only TLS has a handshake below netq")
    heartbeat = 0.25
    server = transport.make_server(heartbeat=heartbeat)
    other = transport.connect(server)
    raw = transport.raw_connect(server, wrap=behaviour != "no-tls-handshake")
    try:
        opened = time.monotonic()
        if behaviour == "half-hello":
            raw.sendall(client_hello()[:40])
        round_trip(server, other, "while a link hangs")
        _, closed = read_until_closed(raw, 3 * heartbeat + 10)
    finally:
        raw.close()
    elapsed = closed - opened
    assert heartbeat <= elapsed <= 3 * heartbeat + 5, elapsed  # ~3 heartbeats, load-tolerant
    round_trip(server, other, "after")
    assert server.peers == (other.id,)


def both_handshakes_started(raw: socket.socket, silent: socket.socket) -> bool:
    """This process holds the server's accepted end of ``raw`` and a client link to ``silent``
    (established: the handshake over it is under way)."""
    links = psutil.Process().net_connections(kind="inet")
    accepted = any(link.raddr and tuple(link.raddr) == raw.getsockname()[:2] for link in links)
    reached = any(link.raddr and tuple(link.raddr) == silent.getsockname()[:2]
                  and link.status == psutil.CONN_ESTABLISHED for link in links)
    return accepted and reached


def test_tls_handshake_with_a_silent_peer_does_not_spin(transport):
    """A TLS handshake waiting for a peer that accepted TCP and says nothing (a frozen
    process, a silent network) waits in select, on both sides: < 10 % of a core, until
    the heartbeat drops the link."""
    if not (transport.spec.byte_stream and getattr(transport.spec, "tls", False)):
        pytest.skip("only TLS over a byte stream")
    heartbeat = 1.0
    server = transport.make_server(heartbeat=heartbeat)
    raw = transport.raw_connect(server, wrap=False)  # the server's handshake waits for us
    family = socket.AF_INET6 if ":" in transport.location(server).host else socket.AF_INET
    silent = socket.socket(family, socket.SOCK_STREAM)  # accepts (backlog), never answers
    try:
        silent.bind((transport.location(server).host, 0))
        silent.listen(8)
        transport.make_client(nq.NetworkLocation(*silent.getsockname()[:2]), heartbeat=heartbeat)
        wait_for(lambda: both_handshakes_started(raw, silent), T,
                 message="the server to accept our link and the client to reach the silent one")
        cpu = cpu_fraction(1.5 * heartbeat)
    finally:
        raw.close()
        silent.close()
    assert cpu < 0.10, f"{cpu:.0%} of a core while both handshakes wait"


# ============================================================================ netq through it


def _setup(transport):
    server = transport.make_server(heartbeat=HEARTBEAT, session_timeout=30,
                                   recv_budget=RECV_BUDGET, send_budget=SEND_BUDGET)
    proxy = transport.proxy(server)
    client = transport.connect_via(proxy, server, heartbeat=HEARTBEAT, reconnect_max=0.2,
                                   recv_budget=RECV_BUDGET, send_budget=SEND_BUDGET)
    return server, proxy, client


def test_resume_with_messages_waiting_takes_one_reconnect(transport):
    """Messages the server queued for a disconnected client follow its SESSION frame on the
    new link, often in the same read: the client must number them from where the session
    resumes (a bug reset its expected sequence number after reading them, failed the new link
    with "message N out of order" and needed another reconnect, again and again under load)."""
    server, proxy, client = _setup(transport)
    # The client's I/O thread pauses 50 ms after writing its SESSION frame, as a loaded
    # machine would: the server's SESSION and the messages behind it are all in the socket
    # when it reads again, so one read carries them all.
    handshake, loop = client._engine.handshake, client._loop
    authenticated, write_now = handshake.authenticated, loop.write_now
    session_written = threading.Event()

    def io_authenticated(link, hello):
        session_written.set()
        return authenticated(link, hello)

    def slow_write_now(link):
        write_now(link)
        if session_written.is_set():
            session_written.clear()
            time.sleep(0.05)  # simulates the loaded machine this test is about

    handshake.authenticated = io_authenticated
    loop.write_now = slow_write_now
    for attempt in range(3):
        client_before = client.statistics().peers[0].reconnects
        server_before = peer_row(server, client.id).reconnects
        proxy.refuse()
        proxy.reset()
        wait_for(lambda: server_state(server, client) != "connected", T,
                 message="the server to lose the link")
        futures = [server.put((attempt, index), client.id) for index in range(20)]
        proxy.restore()
        for index in range(20):
            assert client.get(timeout=T).data == (attempt, index)
        futures.append(server.put((attempt, "after"), client.id))  # numbered after them
        assert client.get(timeout=T).data == (attempt, "after")
        for future in futures:
            assert future.result(T) is None
        assert client.statistics().peers[0].reconnects == client_before + 1
        assert peer_row(server, client.id).reconnects == server_before + 1


def test_client_connects_over_a_slow_network(transport):
    """150 ms each way (a 300 ms round trip, a handshake of several round trips) with a
    reconnect backoff capped at 200 ms: the connection attempt must be given the time the
    handshake needs, not the backoff (gRPC took its minimum connect timeout from the backoff
    and a TLS channel never connected)."""
    server = transport.make_server(heartbeat=1.0)
    proxy = transport.proxy(server)
    proxy.delay(0.15)
    client = transport.connect_via(proxy, server, heartbeat=1.0, reconnect_max=0.2)
    client.put("over a slow network").result(T)
    assert server.get(timeout=T).data == "over a slow network"
    server.put("and back", client.id).result(T)
    assert client.get(timeout=T).data == "and back"
    assert client.statistics().peers[0].reconnects == 0


FAULTS = ["delay", "blackhole", "reset", "truncate", "refuse"]


@pytest.mark.parametrize("fault", FAULTS)
def test_network_fault_loses_and_duplicates_nothing(transport, fault):
    server, proxy, client = _setup(transport)
    figures = {"transport": transport.name, "fault": fault}

    def netq_memory():
        return server.statistics().memory + client.statistics().memory

    baseline = rss()
    started = time.monotonic()
    with Sampler(rss, 0.05) as resident, Sampler(netq_memory, 0.05) as held, \
            Traffic(server, client) as traffic:
        traffic.flowing()
        reconnects_before = client.statistics().peers[0].reconnects
        if fault == "delay":
            proxy.delay(0.05, jitter=0.15)  # 50-200 ms per chunk, order kept
            traffic.flowing(100)
            proxy.delay(0)
            traffic.flowing()
            # A slow network is not a dead one: the link never dropped.
            assert client.statistics().peers[0].reconnects == reconnects_before
        elif fault == "blackhole":
            cut_at = time.monotonic()
            proxy.blackhole()
            wait_for(lambda: client_state(client) != "connected", T,
                     message="the client to notice the silence")
            figures["client_detected_s"] = client_detected = time.monotonic() - cut_at
            wait_for(lambda: server_state(server, client) != "connected", T,
                     message="the server to notice the silence")
            figures["server_detected_s"] = server_detected = time.monotonic() - cut_at
            bound = 3 * HEARTBEAT + DETECTION_MARGIN
            # Silence is measured from the last byte received; traffic flowed until the cut.
            assert 2 * HEARTBEAT <= client_detected <= bound, client_detected
            assert 2 * HEARTBEAT <= server_detected <= bound, server_detected
            traffic.pause()
            figures["cpu_while_cut"] = cpu = cpu_fraction(CPU_WINDOW)
            assert cpu < IDLE_LIMIT, f"{cpu:.1%} of a core while the network is silent"
            traffic.resume()
            proxy.restore()
            wait_reconnected(client, reconnects_before)
            traffic.flowing()
        elif fault == "reset":
            for _ in range(2):
                before = client.statistics().peers[0].reconnects
                cut_at = time.monotonic()
                assert proxy.reset() >= 1
                wait_reconnected(client, before)
                figures.setdefault("reconnected_after_reset_s", []).append(
                    round(time.monotonic() - cut_at, 3))
                traffic.flowing()
        elif fault == "truncate":
            # Mid-header (5 bytes of the next chunk), then mid-payload of a large message.
            def truncated_more_than(count: int) -> bool:
                return proxy.stats().truncated > count

            for keep in (5, LARGE // 2):
                before = client.statistics().peers[0].reconnects
                truncated = proxy.stats().truncated
                proxy.truncate(keep)
                wait_for(functools.partial(truncated_more_than, truncated), T,
                         message=f"a chunk longer than {keep} bytes to be cut")
                wait_reconnected(client, before)
                traffic.flowing()
        elif fault == "refuse":
            proxy.refuse()
            proxy.reset()
            wait_for(lambda: client_state(client) != "connected", T,
                     message="the client to lose its link")
            refused = proxy.stats().refused
            traffic.pause()
            figures["cpu_while_cut"] = cpu = cpu_fraction(CPU_WINDOW)
            assert cpu < REFUSED_LIMIT, f"{cpu:.1%} of a core while every connect is refused"
            traffic.resume()
            wait_for(lambda: proxy.stats().refused > refused, T,
                     message="the client to keep trying (with backoff)")
            figures["refused"] = proxy.stats().refused
            proxy.restore()
            wait_reconnected(client, reconnects_before)
            traffic.flowing()
        traffic.finish()
    figures["reconnects"] = reconnects = client.statistics().peers[0].reconnects
    # One reconnect per broken link, no more: a resumed link that fails again (as it did
    # when the client mis-numbered what followed the server's SESSION) shows up here.
    expected = {"delay": 0, "blackhole": 1, "reset": 2, "truncate": 2, "refuse": 1}[fault]
    if fault == "blackhole":
        assert reconnects >= reconnects_before + expected, reconnects  # retries may succeed late
    else:
        assert reconnects == reconnects_before + expected, reconnects
    figures.update(messages_each_way=min(traffic.sent.values()),
                   netq_memory_peak=held.peak, rss_growth=resident.peak - baseline,
                   seconds=round(time.monotonic() - started, 2))
    record(figures)
    assert held.peak <= NETQ_MEMORY_LIMIT, held.peak
    assert resident.peak - baseline < RSS_GROWTH_LIMIT, resident.peak - baseline
