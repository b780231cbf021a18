"""Small helpers shared by the transport test suites (no fixtures: see conftest.py)."""

from __future__ import annotations

import os
import socket
import threading
import time

from netq.protocol import frames


def wait_for(predicate, timeout: float = 20, interval: float = 0.01, message: str = ""):
    """Poll until ``predicate()`` is truthy; its value, or AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for "
                                 f"{message or predicate}")
        time.sleep(interval)


def blocked_get(comm) -> tuple[threading.Thread, list[BaseException]]:
    """A started thread blocked in ``comm.get()``, and the list where what that get() raised
    lands (join the thread, then look)."""
    outcome: list[BaseException] = []

    def get_forever() -> None:
        try:
            comm.get()
        except BaseException as error:  # noqa: BLE001 - the outcome is the assertion
            outcome.append(error)

    getter = threading.Thread(target=get_forever, name="test-blocked-get")
    getter.start()
    return getter, outcome


def shut_down_below(fd: int) -> bool:
    """Cut the connection behind ``fd`` as a network failure would: shut down a duplicate
    descriptor (for every descriptor, below TLS or a library's socket object, touching none
    of them). False if that is no longer possible."""
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    finally:
        duplicate.close()
    return True


def cpu_fraction(seconds: float, pid: int | None = None) -> float:
    """CPU use of a process (default: this one) over the next ``seconds``, in cores (1.0 = one
    core busy). Idle-while-waiting checks assert it stays small (a spinning thread shows ~1)."""
    import psutil  # where used: conftest imports this module, and tests/protocol needs no psutil

    process = psutil.Process(pid)
    before = process.cpu_times()
    started = time.monotonic()
    time.sleep(seconds)  # the interval measured (CPU time over it, not a wait)
    after = process.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return used / (time.monotonic() - started)


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class Sampler:
    """Calls ``probe()`` every ``interval`` s on a thread; keeps the maximum it returned."""

    def __init__(self, probe, interval: float = 0.01) -> None:
        self.probe = probe
        self.interval = interval
        self.peak = probe()
        self.samples = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            value = self.probe()
            self.samples += 1
            if value > self.peak:
                self.peak = value

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        value = self.probe()
        self.peak = max(self.peak, value)


def sequence_payload(index: int, size: int) -> bytes:
    """``size`` bytes that encode ``index`` (so a swapped or corrupted payload is caught)."""
    stamp = index.to_bytes(4, "little")
    return (stamp * (size // 4 + 1))[:size]


def peer_row(comm, peer):
    """``comm``'s statistics row for ``peer``, or None."""
    for row in comm.statistics().peers:
        if row.peer == peer:
            return row
    return None


def frames_in(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, value, payload) of each whole frame in ``data``."""
    found, offset = [], 0
    while offset + frames.HEADER_SIZE <= len(data):
        kind, _, _, length, value = frames.HEADER.unpack_from(data, offset)
        end = offset + frames.HEADER_SIZE + length
        if end > len(data):
            break
        found.append((kind, value, data[offset + frames.HEADER_SIZE:end]))
        offset = end
    return found


def error_codes(data: bytes) -> list[int]:
    return [value for kind, value, _ in frames_in(data) if kind == frames.FrameType.ERROR]


def pair_through(address, upstream: socket.socket, timeout: float = 10) -> tuple:
    """``(client, server)``: a socket connected to ``address`` (a relay in front of
    ``upstream``, a listening socket) and the upstream's accepted end of that connection."""
    client = socket.create_connection(address, timeout=timeout)
    upstream.settimeout(timeout)
    server, _ = upstream.accept()
    server.settimeout(timeout)
    return client, server


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``; fails the test on an early EOF."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1 << 20))
        assert chunk, f"EOF after {len(data)} of {n} bytes"
        data += chunk
    return bytes(data)


def seconds_to_move(sock_in: socket.socket, sock_out: socket.socket, size: int) -> float:
    """Seconds to move ``size`` random bytes from ``sock_in`` to ``sock_out`` (sent by a
    thread, received here and compared)."""
    payload = os.urandom(size)
    sender = threading.Thread(target=sock_in.sendall, args=(payload,), name="test-send")
    started = time.monotonic()
    sender.start()
    assert recv_exactly(sock_out, size) == payload
    elapsed = time.monotonic() - started
    sender.join(10)
    return elapsed
