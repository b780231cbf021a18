"""netq.lab.relay: the link emulator's shaping (delay, jitter, rate, bounded buffers), its faults
and its own-process mode. (The netem namespace link is tests/lab/test_netem.py.)

Margins: delays are checked within [configured, configured + SLACK] and rates against the cap
x 1.1 from above and x 0.5 from below, wide enough for a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from netq.lab.relay import BOTH, DOWN, UP, Relay
from netq.lab.shaping import Shape
from netq_testing import pair_through, recv_exactly, seconds_to_move

SLACK = 0.15  # s a delayed chunk may arrive late on a loaded machine (never early)
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def upstream(loopback_listener):
    return loopback_listener


def _thread_cpu(native_id: int) -> float:
    """CPU seconds (user + system) of one thread of this process (Linux /proc)."""
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_delay_each_way_and_round_trip(upstream):
    with Relay(upstream.getsockname(), delay=0.05) as relay:
        client, server = pair_through(relay.address, upstream)
        with client, server:
            for _ in range(3):
                started = time.monotonic()
                client.sendall(b"ping")
                assert recv_exactly(server, 4) == b"ping"
                one_way = time.monotonic() - started
                server.sendall(b"pong")
                assert recv_exactly(client, 4) == b"pong"
                rtt = time.monotonic() - started
                assert 0.05 <= one_way <= 0.05 + SLACK, one_way
                assert 0.10 <= rtt <= 0.10 + SLACK, rtt


def test_each_direction_has_its_own_shape(upstream):
    with Relay(upstream.getsockname()) as relay:
        relay.shape(UP, delay=0.2)
        assert relay.shapes()[UP].delay == 0.2 and relay.shapes()[DOWN].delay == 0
        client, server = pair_through(relay.address, upstream)
        with client, server:
            started = time.monotonic()
            client.sendall(b"up")
            recv_exactly(server, 2)
            up = time.monotonic() - started
            started = time.monotonic()
            server.sendall(b"down")
            recv_exactly(client, 4)
            down = time.monotonic() - started
        assert 0.2 <= up <= 0.2 + SLACK and down < 0.1, (up, down)
        relay.shape(BOTH, rate=1e6)  # the delay stays, the rate is added
        assert relay.shapes()[UP] == Shape(0.2, 0.0, 1e6) and relay.shapes()[DOWN].rate == 1e6
        relay.shape(rate=None)
        assert relay.shapes()[UP].rate is None
    with pytest.raises(ValueError):
        Shape(delay=-1)


def test_jitter_keeps_order_and_stays_within_its_range(upstream):
    with Relay(upstream.getsockname(), delay=0.02, jitter=0.03) as relay:
        client, server = pair_through(relay.address, upstream)
        with client, server:
            for index in range(20):
                started = time.monotonic()
                client.sendall(bytes([index]))
                assert recv_exactly(server, 1) == bytes([index])
                assert 0.02 <= time.monotonic() - started <= 0.05 + SLACK
            # A burst of separately sent bytes, each with its own jitter: still in order.
            for index in range(50):
                client.sendall(bytes([index]))
                time.sleep(0.001)
            assert recv_exactly(server, 50) == bytes(range(50))


def test_rate_cap_holds_and_is_reached(upstream):
    rate = 8e6
    with Relay(upstream.getsockname(), rate=rate) as relay:
        client, server = pair_through(relay.address, upstream)
        with client, server:
            size = 4_000_000  # 0.5 s at the cap
            elapsed = seconds_to_move(client, server, size)
            assert rate * 0.5 <= size / elapsed <= rate * 1.1, size / elapsed
            elapsed = seconds_to_move(server, client, size)  # the other way has its own cap
            assert rate * 0.5 <= size / elapsed <= rate * 1.1, size / elapsed


def test_delay_does_not_limit_throughput(upstream):
    """A long fat pipe: 100 ms round trip at 20 MB/s. The relay holds everything in flight at
    once (the default buffer is the bandwidth-delay product + 1 MiB), so a transfer that
    keeps the pipe full moves at the cap, not at one buffer per round trip."""
    rate, delay = 20e6, 0.05
    with Relay(upstream.getsockname(), delay=delay, rate=rate) as relay:
        assert relay.shapes()[UP].limit >= rate * delay
        client, server = pair_through(relay.address, upstream)
        with client, server:
            for sock in (client, server):  # room in the kernel for the pipe
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            size = 16_000_000  # 0.8 s at the cap, + one delay
            elapsed = seconds_to_move(client, server, size)
            assert elapsed >= size / rate * 0.9 + delay, elapsed
            assert size / elapsed >= rate * 0.5, f"{size / elapsed / 1e6:.1f} MB/s"


def test_a_slow_reader_gets_backpressure_not_unbounded_buffering(upstream):
    limit = 256 * 1024
    with Relay(upstream.getsockname(), buffer=limit) as relay:
        client, server = pair_through(relay.address, upstream)
        with client, server:
            client.setblocking(False)
            sent, stuck_since = 0, None
            block = bytes(64 * 1024)
            deadline = time.monotonic() + 20
            # Write until the whole chain is full: the server never reads.
            while time.monotonic() < deadline:
                try:
                    sent += client.send(block)
                    stuck_since = None
                except BlockingIOError:
                    stuck_since = stuck_since or time.monotonic()
                    if time.monotonic() - stuck_since > 0.5:
                        break
                    time.sleep(0.01)
            held = relay.stats().held
            assert held <= limit + 256 * 1024, held  # + one chunk read on positive room
            # Waiting for a reader costs nothing: the relay sleeps until the target is writable.
            cpu = _thread_cpu(relay._thread.native_id)
            time.sleep(0.5)
            assert _thread_cpu(relay._thread.native_id) - cpu < 0.05
            assert sent > held  # the rest waits in the kernel buffers on both sides
            client.setblocking(True)
            assert len(recv_exactly(server, sent)) == sent  # nothing lost
        assert relay.stats().bytes_up == sent


def test_drop_loses_bytes_until_restore(upstream):
    with Relay(upstream.getsockname()) as relay:
        client, server = pair_through(relay.address, upstream)
        with client, server:
            relay.drop(UP)
            client.sendall(b"lost")
            server.sendall(b"down still flows")
            assert recv_exactly(client, 16) == b"down still flows"
            deadline = time.monotonic() + 10
            while relay.stats().dropped < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            relay.restore()
            client.sendall(b"kept")
            assert recv_exactly(server, 4) == b"kept"
        stats = relay.stats()
        assert stats.dropped == 4 and stats.bytes_up == 4


def _unix_pair_through(relay: Relay, listener: socket.socket) -> tuple:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(relay.address)
    listener.settimeout(10)
    server, _ = listener.accept()
    server.settimeout(10)
    return client, server


def _send_fd(sock: socket.socket, data: bytes, fd: int) -> None:
    socket.send_fds(sock, [data], [fd])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_pass_fds_forwards_descriptors_with_their_bytes_and_closes_the_lost(tmp_path):
    """With pass_fds a Unix relay forwards SCM_RIGHTS descriptors (the same open file, with
    the bytes they came with); those of dropped or truncated-away chunks, and of chunks held
    when a connection ends, are closed: the relay keeps none."""
    before = _open_fds()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "up.sock"))
    listener.listen(4)
    marker = tmp_path / "marker"
    marker.write_bytes(b"m")
    with listener, Relay(str(tmp_path / "up.sock"), path=str(tmp_path / "relay.sock"),
                         pass_fds=True) as relay:
        client, server = _unix_pair_through(relay, listener)
        with client, server:
            with open(marker, "rb") as sent:
                _send_fd(client, b"one", sent.fileno())
                data, fds, _, _ = socket.recv_fds(server, 16, 4)
                assert data == b"one" and len(fds) == 1
                assert os.fstat(fds[0]).st_ino == os.fstat(sent.fileno()).st_ino
                os.close(fds[0])
                relay.drop(UP)
                _send_fd(client, b"lost", sent.fileno())
                wait = time.monotonic() + 10
                while relay.stats().dropped < 4 and time.monotonic() < wait:
                    time.sleep(0.01)
                relay.restore()
                relay.truncate(0)
                _send_fd(client, b"cut", sent.fileno())
                assert server.recv(16) == b""  # truncate(0): closed, nothing forwarded
        assert relay.stats().descriptors == 1
        client, server = _unix_pair_through(relay, listener)
        with client, server, open(marker, "rb") as sent:
            relay.delay(60)  # read and held, not yet due
            _send_fd(client, b"held", sent.fileno())
            wait = time.monotonic() + 10
            while relay.stats().held < 4 and time.monotonic() < wait:
                time.sleep(0.01)
            assert relay.stats().held == 4
            relay.reset()
    wait = time.monotonic() + 10
    while _open_fds() > before and time.monotonic() < wait:
        time.sleep(0.01)
    assert _open_fds() <= before


def test_pass_fds_needs_a_unix_upstream(upstream):
    with pytest.raises(ValueError, match="Unix upstream"):
        Relay(upstream.getsockname(), pass_fds=True, start=False)


def test_relay_in_its_own_process(upstream):
    relay = subprocess.Popen(
        [sys.executable, "-m", "netq.lab.relay", "--upstream",
         f"127.0.0.1:{upstream.getsockname()[1]}", "--delay", "0.02", "--rate", "50e6"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = relay.stdout.readline()
        assert ready.startswith("READY "), ready
        host, port = json.loads(ready[6:])["addr"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            upstream.settimeout(10)
            server, _ = upstream.accept()
            with server:
                started = time.monotonic()
                client.sendall(b"hello")
                assert recv_exactly(server, 5) == b"hello"
                assert 0.02 <= time.monotonic() - started <= 0.02 + SLACK
        relay.stdin.close()
        result = relay.stdout.readline()
        assert result.startswith("RESULT ") and json.loads(result[7:])["bytes_up"] == 5
        assert relay.wait(10) == 0
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        relay.stdout.close()
