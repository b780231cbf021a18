"""Fault injection: killed processes, silent and hostile sockets, slow consumers, crashes.

Every test runs per transport (``conftest.TRANSPORTS``); those that speak raw bytes to the
server skip transports that are not byte streams. Child processes run ``tests/netq_child.py``
(a communicator driven over pipes) so that they can be SIGKILLed or SIGSTOPped for real.

Timing: the machine may be loaded. Bounds that are the point of a test (a session expiring
after ``session_timeout``, a silent link dropped after three heartbeats) are asserted with a
wide margin; everything else waits up to T seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import ssl
import threading
import time
import uuid

import pytest

import netq as nq
from netq import protocol as proto
from netq.protocol import frames
from netq_testing import (
    Sampler,
    cpu_fraction,
    error_codes,
    frames_in,
    peer_row,
    rss,
    sequence_payload,
    wait_for,
)

KiB, MiB = nq.KiB, nq.MiB
T = 30.0

pytestmark = pytest.mark.timeout(90)


def round_trip(server: nq.Communicator, client: nq.Communicator, tag) -> None:
    """The client still reaches the server and back."""
    client.put(("ping", tag)).result(T)
    assert server.get(client.id, timeout=T).data == ("ping", tag)
    server.put(("pong", tag), client.id).result(T)
    assert client.get(timeout=T).data == ("pong", tag)


def read_until_closed(sock, timeout: float) -> tuple[bytes, float]:
    """Read until the peer closes (EOF or reset); what was read and when it closed."""
    sock.settimeout(timeout)
    received = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() >= deadline:
            raise AssertionError(f"the server kept the link open for {timeout} s")
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return bytes(received), time.monotonic()
        except TimeoutError:
            raise AssertionError(f"the server kept the link open for {timeout} s") from None
        if not data:
            return bytes(received), time.monotonic()
        received += data


def client_hello(**limits) -> bytes:
    values = dict(auth=False, max_message=64 * MiB, max_frame=1 * MiB, recv_window=8 * MiB,
                  recv_messages=frames.UNLIMITED_MESSAGES)
    values.update(limits)
    return frames.encode_hello(proto.make_hello(proto.Role.CLIENT, uuid.uuid4(), **values))


def raw_handshake(sock) -> proto.Connection:
    """Drive a real protocol core over ``sock`` up to OPEN, as a client with no session."""
    conn = proto.Connection(proto.make_hello(
        proto.Role.CLIENT, uuid.uuid4(), auth=False, max_message=64 * MiB, max_frame=1 * MiB,
        recv_window=8 * MiB, recv_messages=frames.UNLIMITED_MESSAGES))
    sock.settimeout(T)
    sock.sendall(conn.data_to_send())
    while conn.state is not proto.ConnectionState.OPEN:
        data = sock.recv(65536)
        assert data, "the server closed the link during the handshake"
        for event in conn.receive_data(data):
            if isinstance(event, proto.PeerAuthenticated):
                conn.send_session(bytes(16), 0, False)
            assert not isinstance(event, proto.ConnectionFailed), event
        sock.sendall(conn.data_to_send())
    return conn


def all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in state T (stopped by a signal)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
    except FileNotFoundError:
        return False
    return bool(states) and all(state == "T" for state in states)


# ============================================================================ killed processes


@pytest.mark.timeout(120)
def test_client_killed_mid_large_message(transport):
    """SIGKILL a client process in the middle of a 256 MiB message to the server (about
    8-16 MiB of it received): the server stays healthy, another client is unaffected, nothing
    of the partial message surfaces, the server's memory grew by what it received, not by
    the announced 256 MiB, the dead peer's session expires after session_timeout (1 s) and
    the server's futures to it fail with ConnectionLost."""
    session_timeout = 1.0
    server = transport.make_server(session_timeout=session_timeout)
    other = transport.connect(server)
    child = transport.spawn_client(server, queue_size=1)  # holds one unconsumed message at most
    child.request("put", data=["hello", "from the child"])
    assert server.get(child.id, timeout=T).data == ["hello", "from the child"]
    server.put("first", child.id).result(T)  # the child's netq holds it (it never gets)
    stuck = server.put("second", child.id)  # no message credit left: waits at the server

    # A slow link in the child (64 KiB per write, 4 ms apart: ~16 MB/s): 256 MiB would take
    # ~16 s; zero-filled, so the child does not need 256 MiB to hold it either.
    baseline = rss()
    child.request("throttle", chunk=64 * KiB, pause=0.004)
    child.request("put_bytes", size=256 * MiB, wait=False, zeros=True)
    with Sampler(rss, 0.02) as resident:
        # The server has accepted the message's descriptor (its credit went negative) ...
        wait_for(lambda: peer_row(server, child.id).credit_in < 0, T,
                 message="the large message to start arriving")
        # ... and is receiving its body into the message's buffer.
        wait_for(lambda: rss() - baseline >= 8 * MiB, T, message="8 MiB of the body")
        round_trip(server, other, "during")
        child.kill()
    killed_at = time.monotonic()
    after_kill = server.put("third", child.id)  # queued for a session that will expire

    round_trip(server, other, "after")
    error = stuck.exception(T)
    expired_after = time.monotonic() - killed_at
    assert isinstance(error, nq.ConnectionLost), error
    assert error.peer == child.id
    assert isinstance(after_kill.exception(T), nq.ConnectionLost)
    assert session_timeout * 0.9 <= expired_after < session_timeout + 15, expired_after
    # Nothing of the half-received message ever surfaces, and its memory is released.
    with pytest.raises(nq.Empty):
        server.get(timeout=0.5)
    assert child.id not in server.peers
    wait_for(lambda: server.statistics().memory == 0, T, message="the partial message freed")
    # What arrived (8 MiB and a bit: ~16 MB/s) plus slack, never the announced 256 MiB.
    assert resident.peak - baseline < 96 * MiB, resident.peak - baseline
    # The server still accepts newcomers.
    late = transport.connect(server)
    round_trip(server, late, "late")
    round_trip(server, other, "end")


@pytest.mark.timeout(120)
def test_server_killed_mid_large_message_to_a_client(transport):
    """SIGKILL the server process in the middle of a 256 MiB message to a client (8 MiB and
    a bit of it received): the client never surfaces the partial message, holds no more
    memory than it received, reconnects to a server restarted at the same address, and each
    of its put futures resolves exactly once (delivered; none hangs); what it put while no
    server was up reaches the new server once, in order."""
    old = transport.spawn_server()
    location = transport.location(old)
    client = transport.make_client(location, reconnect_max=0.2)
    client.put("hello").result(T)
    assert old.request("get", count=1) == ["hello"]
    calls: dict = {}

    def put(data):
        future = client.put(data)
        calls[future] = 0

        def resolved(done):
            calls[done] += 1
        future.add_done_callback(resolved)
        return future

    old.request("throttle", chunk=64 * KiB, pause=0.004)  # ~16 MB/s: 256 MiB would take 16 s
    baseline = rss()
    with Sampler(rss, 0.02) as resident:
        old.request("put_bytes", size=256 * MiB, wait=False, zeros=True)
        wait_for(lambda: rss() - baseline >= 8 * MiB, T, message="8 MiB of the body")
        before = [put(("before", index)) for index in range(5)]
        old.kill()
        during = [put(("during", index)) for index in range(5)]
        wait_for(lambda: client.statistics().peers[0].state != "connected", T,
                 message="the client to notice the crash")
        with pytest.raises(nq.Empty):
            client.get(timeout=0.5)  # nothing of the half-received message
        new = transport.make_server(netloc=location)
        got = []
        while True:
            try:
                got.append(new.get(timeout=2).data)
            except nq.Empty:
                break
    assert [item for item in got if item[0] == "during"] == [("during", i) for i in range(5)]
    resent = [item for item in got if item[0] == "before"]
    assert resent == sorted(set(resent)), resent  # unacknowledged ones again, once, in order
    for future in before + during:
        assert future.result(T) is None
    wait_for(lambda: all(count == 1 for count in calls.values()), T,
             message="every done-callback")
    assert client.statistics().peers[0].reconnects >= 1
    new.put("welcome back", client.id).result(T)
    assert client.get(timeout=T).data == "welcome back"  # the first thing it ever got
    assert client.statistics().memory == 0
    assert resident.peak - baseline < 96 * MiB, resident.peak - baseline


# ============================================================================ hostile sockets


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
        time.sleep(0.2)  # both handshakes started
        cpu = cpu_fraction(1.5 * heartbeat)
    finally:
        raw.close()
        silent.close()
    assert cpu < 0.10, f"{cpu:.0%} of a core while both handshakes wait"


def _garbage_cases():
    return ["junk", "http", "header-2**32-1", "hello-2**32-1", "data-1-TiB", "plaintext-to-tls"]


@pytest.mark.parametrize("garbage", _garbage_cases())
def test_garbage_drops_only_that_link(transport, garbage, caplog):
    """Bytes that are not netq: the server answers ERROR (where it can), closes that link
    only, logs it, and allocates nothing for absurd sizes."""
    tls = getattr(transport.spec, "tls", False)
    if garbage == "plaintext-to-tls" and not tls:
        pytest.skip("only for TLS")
    caplog.set_level(logging.INFO, logger="netq")
    server = transport.make_server(session_timeout=1.0)
    other = transport.connect(server)
    round_trip(server, other, "before")
    baseline = rss()
    expected_code = frames.ErrorCode.PROTOCOL
    raw = transport.raw_connect(server, wrap=garbage != "plaintext-to-tls")
    caplog.clear()
    try:
        if garbage == "junk":
            raw.sendall(b"\xff" + os.urandom(4095))
        elif garbage == "http":
            raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        elif garbage == "header-2**32-1":
            raw.sendall(frames.encode_header(frames.FrameType.DATA, 0, 2**32 - 1, 1))
            expected_code = frames.ErrorCode.LIMIT
        elif garbage == "hello-2**32-1":
            raw.sendall(frames.encode_header(frames.FrameType.HELLO, 0, 2**32 - 1, 0))
            expected_code = frames.ErrorCode.LIMIT
        elif garbage == "data-1-TiB":
            conn = raw_handshake(raw)
            assert conn.state is proto.ConnectionState.OPEN
            tib = 2**40
            descriptor = frames.encode_descriptor(tib, [tib])
            raw.sendall(frames.encode_header(frames.FrameType.DATA, frames.DataFlags.FIRST,
                                             len(descriptor) + 4096, 1)
                        + descriptor + bytes(4096))
            expected_code = frames.ErrorCode.LIMIT
        elif garbage == "plaintext-to-tls":
            raw.sendall(client_hello())
            expected_code = None  # the TLS layer refuses; there is no netq ERROR to read
        received, _ = read_until_closed(raw, T)
    finally:
        raw.close()
    if expected_code is not None:
        assert expected_code in error_codes(received), frames_in(received)
        wait_for(lambda: any(record.name.startswith("netq") and record.levelno >= logging.INFO
                             for record in caplog.records),
                 T, message="the server to log the failed link")
    assert rss() - baseline < 64 * MiB
    round_trip(server, other, "after")
    if garbage != "data-1-TiB":  # that one got as far as a session, now disconnected
        assert server.peers == (other.id,)


# ============================================================================ slow consumers


@pytest.mark.timeout(120)
def test_slow_receiver_fast_sender_memory_bounded_nothing_lost(transport):
    window = 1 * MiB
    size = 64 * KiB
    count = 200
    server = transport.make_server(recv_window=window)
    client = transport.connect(server, send_window=window)
    futures: list = []
    errors: list = []

    def produce():
        try:
            for index in range(count):
                futures.append(client.put((index, sequence_payload(index, size))))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    def netq_memory():
        return server.statistics().memory + client.statistics().memory

    baseline = rss()
    producer = threading.Thread(target=produce, name="test-producer")
    with Sampler(netq_memory) as memory, Sampler(rss) as resident:
        producer.start()
        for expected in range(count):
            index, payload = server.get(timeout=T).data
            assert index == expected
            assert payload == sequence_payload(index, size)
            time.sleep(0.01)  # a slow consumer: one message per 10 ms
        producer.join(T)
    assert not errors, errors
    for future in futures:
        assert future.result(T) is None
    # receiver <= window + one message; sender <= window unsent + one, + in flight (credit)
    assert memory.peak <= 3 * (window + size) + size, memory.peak
    assert resident.peak - baseline < 64 * MiB


# ============================================================================ crashes and restarts


@pytest.mark.timeout(120)
def test_server_restarted_on_same_address_client_reconnects(transport):
    """The server process is frozen (SIGSTOP) with client messages on the wire, then killed
    (SIGKILL), and a new server starts at the same address.

    What happens to messages unacknowledged at the crash: the client keeps every message
    until it is acknowledged, so those that were in flight (in the dead server's socket
    buffers, possibly even read by it) are sent again, to the new server, in order, at least
    once overall and exactly once to the new server; messages put while no server was up
    wait in the client and follow them. Acknowledged messages are never resent (if the old
    server acknowledged but never consumed them, they died with it)."""
    old = transport.spawn_server()
    location = transport.location(old)
    client = transport.make_client(location, reconnect_max=0.2)
    acked = [client.put(("acked", index)) for index in range(5)]
    for future in acked:
        assert future.result(T) is None

    os.kill(old.pid, signal.SIGSTOP)  # frozen: the kernel still buffers what the client sends
    try:
        wait_for(lambda: all_threads_stopped(old.pid), T, message="SIGSTOP to take effect")
        in_flight = [client.put(("in flight", index)) for index in range(20)]
        time.sleep(0.3)
        assert not any(future.done() for future in in_flight)
    finally:
        old.kill()  # SIGKILL works on a stopped process
    wait_for(lambda: client.statistics().peers[0].state != "connected", T,
             message="the client to notice the crash")
    during = [client.put(("during", index)) for index in range(10)]
    # Waiting for a server with work pending, the client (this process) stays near idle.
    cpu = cpu_fraction(1.5)
    assert cpu < 0.10, f"{cpu:.0%} of a core while waiting for a server"

    new = transport.make_server(netloc=location)
    expected = [("in flight", i) for i in range(20)] + [("during", i) for i in range(10)]
    got = [new.get(timeout=T).data for _ in expected]
    assert got == expected
    for future in in_flight + during:
        assert future.result(T) is None
    with pytest.raises(nq.Empty):
        new.get(timeout=0.3)  # no duplicates
    client.put(("after", 0)).result(T)
    assert new.get(timeout=T).data == ("after", 0)
    assert client.statistics().peers[0].reconnects >= 1
    new.put("welcome back", client.id).result(T)
    assert client.get(timeout=T).data == "welcome back"


@pytest.mark.timeout(90)
def test_client_idle_while_its_server_is_dead(transport):
    """A client waiting to reconnect to a dead server burns < 10 % of a core."""
    old = transport.spawn_server()
    location = transport.location(old)
    child = transport.spawn_client(location)
    child.request("put", data="hello")
    old.kill()
    child.request("put", data="while the server is dead", wait=False)  # work pending
    time.sleep(0.5)  # let it notice and settle into its reconnect backoff
    cpu = cpu_fraction(2.0, child.pid)
    assert cpu < 0.10, f"{cpu:.0%} of a core in the client waiting for its server"
    # ... and it was still trying: a new server gets the pending message.
    new = transport.make_server(netloc=location)
    assert new.get(timeout=T).data == "while the server is dead"
    child.request("close", timeout=T)
