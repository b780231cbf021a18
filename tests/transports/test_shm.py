"""Shared memory over Protocol.UNIX (netq/_shm.py): large parts in sealed memfd segments whose
descriptors cross the socket (SCM_RIGHTS).

Real Unix sockets and, where a process must die, real processes. Leaks are checked with the
descriptors themselves (the autouse ``leak_check`` compares ``/proc/self/fd`` before and
after every test; the SIGKILL tests look at the survivor's ``/proc/<pid>/fd``) and with the
memory the kernel charges for the segments (both peers in a memory cgroup of their own:
``tests/transports/memory_cgroup.py``), not timers.
"""

from __future__ import annotations

import array
import contextlib
import gc
import inspect
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

import netq as nq
from netq import _shm, protocol as proto
from netq._buffers import LARGE
from netq.protocol import frames
from netq_testing import error_codes, wait_for

np = pytest.importorskip("numpy")

KiB, MiB = nq.KiB, nq.MiB
T = 30.0

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(_shm.unavailable() is not None, reason="no memfds here")]


@pytest.fixture
def sock_path():
    directory = tempfile.mkdtemp(prefix="netq-shm-")
    yield os.path.join(directory, "s.sock")
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)


def _options(path: str, **connection) -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(netloc=nq.NetworkLocation(path=path),
                                  connection=nq.ConnectionOptions(**connection))


@pytest.fixture
def make(sock_path):
    made: list[nq.Communicator] = []

    def new(purpose: str, **connection) -> nq.Communicator:
        comm = nq.new(nq.Protocol.UNIX, purpose, _options(sock_path, **connection))
        made.append(comm)
        return comm

    yield new
    for comm in reversed(made):
        comm.close(timeout=3)


def _pair(make, server_options=None, client_options=None):
    server = make("server", **(server_options or {}))
    client = make("client", **(client_options or {}))
    client.put("hello").result(T)
    assert server.get(timeout=T).data == "hello"
    return server, client


def _fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ============================================================================ round trips


@pytest.mark.parametrize("size", [4 * KiB, MiB - 8, MiB, 3 * MiB + 8, 9 * MiB])
def test_arrays_and_buffers_round_trip_intact(make, size):
    """Arrays, bytearrays and bytes below and above the threshold arrive intact both ways;
    those above went through shared memory (statistics say so), bytes too."""
    server, client = _pair(make)
    rng = np.random.default_rng(size)
    array_ = rng.integers(0, 255, size, dtype=np.uint8)
    client.put(array_).result(T)
    got = server.get(timeout=T).data
    assert isinstance(got, np.ndarray) and got.flags.writeable
    assert np.array_equal(got, array_)
    got[:1] = 0  # copy-on-write: the receiver's own pages
    blob = bytearray(array_.tobytes())
    server.put(blob, client.id).result(T)
    back = client.get(timeout=T).data
    assert type(back) is bytearray and back == blob  # a bytearray put, a bytearray got
    client.put(bytes(blob)).result(T)
    plain = server.get(timeout=T).data
    # From LARGE read-only parts arrive as read-only views (of the receive buffer, or from
    # the threshold of a read-only map of the segment: netq._buffers), below as bytes.
    if size < LARGE:
        assert type(plain) is bytes
    else:
        assert type(plain) is memoryview and plain.readonly
    assert plain == bytes(blob)
    shm = client.statistics()
    expected = 1 if size >= MiB else 0
    assert shm.shm_messages_out == 2 * expected and shm.shm_messages_in == expected
    assert shm.shm_bytes_out == (2 * size if expected else 0)
    assert server.statistics().shm_bytes_in == (2 * size if expected else 0)
    assert server.statistics().shm_messages_in == 2 * expected
    del got, back, plain


def test_multi_part_and_mixed_messages(make):
    """A pickle with several large out-of-band arrays and small parts between them."""
    server, client = _pair(make, {"max_size": 64 * KiB}, {"max_size": 64 * KiB})
    data = {"a": np.arange(MiB // 4, dtype=np.int32), "b": "x" * 70_000,
            "c": np.ones((512, 1024)), "d": bytearray(b"q" * (2 * MiB))}
    client.put(data).result(T)
    got = server.get(timeout=T).data
    assert np.array_equal(got["a"], data["a"]) and np.array_equal(got["c"], data["c"])
    assert got["b"] == data["b"] and type(got["d"]) is bytearray and got["d"] == data["d"]
    assert client.statistics().shm_messages_out == 1


def test_off_switch_and_a_peer_without_it(make, caplog):
    """shared_memory=False on either end: every byte through the socket, one log line."""
    caplog.set_level(logging.INFO, logger="netq")
    server, client = _pair(make, {}, {"shared_memory": False})
    _both_ways_through_the_socket(server, client)
    assert any("does not take shared memory" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("size", [_shm._SPLIT_MIN - 1, _shm._SPLIT_MIN, 9 * MiB + 13])
def test_the_pools_copy_of_a_large_part_is_exact_and_its_thread_ends_with_it(size,
                                                                             monkeypatch):
    """A part of _SPLIT_MIN or more is copied in two halves on two threads (where the
    process has two cores and one is idle, as here): every byte lands where one memmove
    would put it, and the helper thread ends when the pool closes."""
    monkeypatch.setattr(_shm.CopyChoice, "_idle_core", lambda self: True)
    pool = _shm.SendPool(_shm.ShmCounters())
    try:
        source = np.frombuffer(os.urandom(size), np.uint8).copy()
        for _ in range(2):  # the second time through the same (reused) helper
            segment, pooled = pool.acquire(size)
            assert pooled
            segment.fill(memoryview(source), pool.copy)
            assert segment.view[:size] == memoryview(source)
            segment.map[segment.capacity] = 0  # as a receiver's release does
    finally:
        pool.close()
    assert not [t for t in threading.enumerate() if t.name == "netq-shm-copy"]


def test_the_copy_goes_the_way_that_was_faster_and_keeps_trying_the_other():
    """CopyChoice: two threads while they copy faster, one once one is faster (a busy
    machine), and back; one copy in _TRY_OTHER_EVERY goes the other way all along."""
    choice = _shm.CopyChoice(idle_core=lambda: True)  # a core idle throughout
    size = 8 * MiB

    def run(copies: int, seconds_one: float, seconds_two: float) -> list[bool]:
        ways = []
        for _ in range(copies):
            split = choice.split()
            choice.record(split, size, seconds_two if split else seconds_one)
            ways.append(split)
        return ways

    every = _shm._TRY_OTHER_EVERY
    quiet = run(4 * every, seconds_one=1.0e-3, seconds_two=0.6e-3)
    assert quiet.count(False) == 4 and quiet[-every:].count(True) == every - 1
    busy = run(4 * every, seconds_one=1.0e-3, seconds_two=1.3e-3)
    assert busy[-every:].count(False) == every - 1  # settled on one thread
    again = run(6 * every, seconds_one=1.0e-3, seconds_two=0.6e-3)
    assert again[-every:].count(True) == every - 1  # seen within a few tries of the other


def test_the_copy_stays_on_one_thread_while_no_core_is_idle():
    """Without an idle core, every copy goes one way, even where two threads copied faster
    and when a try of the slower way is due; with one again, the rates decide as before."""
    idle = [False]
    choice = _shm.CopyChoice(idle_core=lambda: idle[0])
    size = 8 * MiB
    for _ in range(3 * _shm._TRY_OTHER_EVERY):
        assert not choice.split()
        choice.record(False, size, 1.0e-3)
    choice.rates[True] = size / 0.6e-3  # two threads were faster when last measured
    assert not choice.split()
    idle[0] = True
    assert choice.split()


@pytest.mark.parametrize(("runnable", "cores", "idle"),
                         [("1/180", 2, True), ("2/180", 2, False), ("7/180", 2, False),
                          ("3/180", 4, True), ("garbage", 2, True)])
def test_an_idle_core_is_read_from_the_count_of_runnable_tasks(tmp_path, monkeypatch,
                                                               runnable, cores, idle):
    """/proc/loadavg's fourth field counts the tasks runnable now, the reader among them: a
    core is idle while that count is below the process's cores. Unreadable: the rates decide."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"0.52 0.58 0.59 {runnable} 4242\n")
    monkeypatch.setattr(_shm, "_RUNNABLE", str(loadavg))
    monkeypatch.setattr(_shm, "_cores", lambda: cores)
    choice = _shm.CopyChoice()
    try:
        assert choice.idle_core() is idle
        # Read again from the start through the same descriptor: the count of the moment.
        loadavg.write_text("0.52 0.58 0.59 9/180 4242\n")
        assert choice.idle_core() is False
    finally:
        choice.close()
    monkeypatch.setattr(_shm, "_RUNNABLE", str(tmp_path / "missing"))
    choice = _shm.CopyChoice()
    assert choice.idle_core() is True
    choice.close()


def test_an_interrupt_during_a_split_copy_waits_for_the_other_half(monkeypatch):
    """Ctrl-C on the calling thread in the middle of its half: the exception goes on only
    once the helper's half is copied (the segment is neither sent nor reused half-written,
    and the next copy does not take the old half's completion for its own)."""
    if _shm._cores() < 2:
        pytest.skip("the copy is split only where the process may run on two cores")
    import ctypes

    caller = threading.get_ident()
    real = ctypes.memmove
    interrupted = [False]

    def memmove(target, source, size):
        if threading.get_ident() != caller:
            time.sleep(0.2)  # the helper's half ends well after the caller's
        result = real(target, source, size)
        if threading.get_ident() == caller and not interrupted[0]:
            interrupted[0] = True
            raise KeyboardInterrupt
        return result

    # Split, however busy the machine.
    monkeypatch.setattr(_shm.CopyChoice, "_idle_core", lambda self: True)
    pool = _shm.SendPool(_shm.ShmCounters())
    try:
        size = 2 * _shm._SPLIT_MIN
        source = np.frombuffer(os.urandom(size), np.uint8).copy()
        segment, _ = pool.acquire(size)
        monkeypatch.setattr(_shm.ctypes, "memmove", memmove)
        with pytest.raises(KeyboardInterrupt):
            segment.fill(memoryview(source), pool.copy)
        assert segment.view[:size] == memoryview(source)  # both halves were done
        again = source[::-1].copy()
        segment.fill(memoryview(again), pool.copy)
        assert segment.view[:size] == memoryview(again)
    finally:
        monkeypatch.undo()
        pool.close()


def test_release_lets_the_pool_reuse_segments(make):
    """A receiver that lets go of each array: the sender's pool keeps reusing one or two
    segments, never a one-shot one."""
    server, client = _pair(make)
    big = np.full(2 * MiB // 8, 3.0)
    for _ in range(20):
        client.put(big).result(T)
        got = server.get(timeout=T).data
        assert got[0] == 3.0 and got[-1] == 3.0
        del got
    stats = client.statistics()
    assert stats.shm_messages_out == 20
    assert 1 <= stats.shm_segments <= 3 and stats.shm_one_shot == 0


def test_what_the_receiver_holds_does_not_change(make):
    """The receiver holds many arrays: the pool is full of held segments, later messages go
    in one-shot segments, and none of the held arrays changes under the receiver."""
    server, client = _pair(make)
    held = []
    for index in range(_shm.POOL_SEGMENTS + 4):
        client.put(np.full(MiB // 8, float(index))).result(T)
        held.append(server.get(timeout=T).data)
    for index, got in enumerate(held):
        assert got[0] == index and got[-1] == index and (got == index).all()
    stats = client.statistics()
    assert stats.shm_segments == _shm.POOL_SEGMENTS and stats.shm_one_shot == 4
    assert stats.shm_held == _shm.POOL_SEGMENTS
    held.clear()
    gc.collect()
    client.put(np.zeros(MiB // 8)).result(T)  # a released segment is reused
    assert server.get(timeout=T).data.sum() == 0
    assert client.statistics().shm_one_shot == 4


@pytest.mark.parametrize("writable", [True, False], ids=["writable", "readonly"])
def test_refilling_the_array_once_its_future_resolved_changes_nothing_received(make, writable):
    """The loop "fill the array, put(), wait for the future, fill it again", with the same
    array each time (writable, or a read-only view of a buffer the sender refills): every
    array the receiver got keeps what was sent, whether it still holds it (its segment is
    not written again) or let it go (its segment is reused by a later put)."""
    server, client = _pair(make)
    buffer = np.zeros(4 * MiB // 8)
    sent = buffer.view()
    sent.flags.writeable = writable
    held: list = []
    for index in range(8):
        buffer[:] = index  # the refill: after the previous put's future resolved
        for value, got in held:
            assert (got == value).all()
        client.put(sent).result(T)
        got = server.get(timeout=T).data
        assert got.flags.writeable == writable and got.shape == sent.shape
        held.append((index, got))
        del got
        if index % 3 == 2:
            held = held[-1:]  # let the older ones go: their segments are free for reuse
    buffer[:] = -1
    for value, got in held:
        assert (got == value).all()
    stats = client.statistics()
    assert stats.shm_messages_out == 8 and server.statistics().shm_messages_in == 8
    assert stats.shm_segments < 8  # released segments were reused
    held.clear()


def test_handed_out_buffers_travel_without_a_copy(make):
    """comm.shared_array / shared_buffer: put() sends the segment itself."""
    server, client = _pair(make)
    shared = client.shared_array((256, 1024), np.float64)
    shared[:] = np.arange(256 * 1024).reshape(256, 1024)
    client.put(shared).result(T)
    got = server.get(timeout=T).data
    assert np.array_equal(got, shared)
    buffer = client.shared_buffer(3 * MiB)
    buffer[:3] = b"abc"
    client.put(buffer).result(T)
    assert bytes(server.get(timeout=T).data[:3]) == b"abc"
    assert client._loop.shm.handed == 2 and client._loop.shm.copied == 0
    del got, shared, buffer


def test_segments_count_against_the_receive_budget(make):
    """A receiver that does not get(): what the sender may have outstanding through shared
    memory is bounded by the receive budget as on the socket path."""
    server, client = _pair(make, {"recv_budget": 4 * MiB, "window_min": 256 * KiB},
                           {"send_budget": 64 * MiB})
    for _ in range(12):
        client.put(np.ones(MiB // 8), block=False)
    wait_for(lambda: server.statistics().shm_messages_in >= 3, T, message="arrivals")
    # Give the sender every chance to overrun: it needs credit the receiver does not give.
    wait_for(lambda: client.statistics().peers[0].queue_out > 0, T, message="a stalled queue")
    stats = server.statistics()
    assert stats.shm_bytes_in <= 4 * MiB + MiB + 16 * KiB
    for _ in range(12):
        assert server.get(timeout=T).data.sum() == MiB // 8
    assert server.statistics().shm_messages_in == 12


def test_a_path_that_drops_descriptors_falls_back_to_the_socket(make, sock_path, tmp_path):
    """Between the peers, a proxy that forwards bytes only (netq.lab.relay reads with recv):
    both HELLOs say SHM, but neither probe descriptor arrives, so neither side sends
    segments, and large arrays arrive intact through the socket."""
    from netq.lab.relay import Relay

    server = make("server")
    relay = Relay(sock_path, path=str(tmp_path / "relay.sock"), name="netq-test-relay")
    try:
        client = nq.new(nq.Protocol.UNIX, "client", _options(relay.address))
        try:
            _both_ways_through_the_socket(server, client)
        finally:
            client.close(timeout=3)
    finally:
        relay.close()


def test_a_path_that_passes_descriptors_keeps_shared_memory_through_a_reset(make, sock_path,
                                                                            tmp_path):
    """Between the peers, a relay that forwards descriptors too (pass_fds): the probe
    arrives, large arrays go in segments both ways, and again after the relay resets the
    link mid-traffic (the segments of what was cut are closed, not leaked: leak_check)."""
    from netq.lab.relay import Relay

    server = make("server")
    relay = Relay(sock_path, path=str(tmp_path / "relay.sock"), name="netq-test-relay",
                  pass_fds=True)
    try:
        client = nq.new(nq.Protocol.UNIX, "client", _options(relay.address))
        try:
            big = np.arange(2 * MiB // 8, dtype=np.float64)
            for round_ in range(2):
                client.put(big).result(T)
                assert np.array_equal(server.get(timeout=T).data, big)
                server.put(big, client.id).result(T)
                assert np.array_equal(client.get(timeout=T).data, big)
                if not round_:
                    futures = [client.put(big) for _ in range(4)]
                    relay.reset()
                    for future in futures:
                        future.result(T)  # resent on the next link, acknowledged there
                    for _ in futures:
                        assert np.array_equal(server.get(timeout=T).data, big)
            for comm in (server, client):
                stats = comm.statistics()
                assert stats.shm_bytes_in >= 2 * big.nbytes, stats
                assert stats.shm_bytes_out >= 2 * big.nbytes, stats
            assert relay.stats().descriptors > 0
        finally:
            client.close(timeout=3)
    finally:
        relay.close()


# ============================================================================ hostile peers


def _raw_shm_client(path: str) -> tuple[socket.socket, proto.Connection]:
    """A hand-driven client that says (in its HELLO) it takes shared memory, up to OPEN."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(T)
    sock.connect(path)
    conn = proto.Connection(proto.make_hello(
        proto.Role.CLIENT, uuid.uuid4(), auth=False, max_message=64 * MiB, max_frame=MiB,
        recv_window=8 * MiB, recv_messages=frames.UNLIMITED_MESSAGES, shm=True))
    probe = _memfd(0, seals=None)  # what an honest peer's HELLO comes with
    _send_with_fds(sock, conn.data_to_send(), [probe])
    os.close(probe)
    while conn.state is not proto.ConnectionState.OPEN:
        data = sock.recv(65536)
        assert data, "the server closed the link during the handshake"
        for event in conn.receive_data(data):
            if isinstance(event, proto.PeerAuthenticated):
                conn.send_session(bytes(16), 0, False)
        sock.sendall(conn.data_to_send())
    return sock, conn


def _segment_frame(size: int, readonly: bool = False) -> bytes:
    flags = frames.SEGMENT_BIT | (frames.READONLY_BIT if readonly else 0)
    descriptor = frames.encode_descriptor(size, [size | flags])
    return frames.encode_header(frames.FrameType.DATA, frames.DataFlags.FIRST
                                | frames.DataFlags.LAST, len(descriptor), 1) + descriptor


def _send_with_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                           array.array("i", fds).tobytes())] if fds else [])


def _memfd(size: int, seals: int | None = _shm.REQUIRED_SEALS) -> int:
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        import fcntl
        fcntl.fcntl(fd, _shm.F_ADD_SEALS, seals)
    return fd


def _read_all(sock: socket.socket) -> bytes:
    received = bytearray()
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        received += data
    return bytes(received)


HOSTILE = ["pipe", "regular-file", "unsealed-memfd", "size-lie", "too-many-fds",
           "fd-without-frame", "frame-without-fd"]
# The cases whose frame names a segment, once more for a read-only part (mapped read-only).
HOSTILE_READONLY = ["pipe", "regular-file", "unsealed-memfd", "size-lie", "frame-without-fd"]


@pytest.mark.parametrize(("case", "readonly"),
                         [(case, False) for case in HOSTILE]
                         + [(case, True) for case in HOSTILE_READONLY],
                         ids=HOSTILE + [f"{case}-readonly" for case in HOSTILE_READONLY])
def test_hostile_descriptors_fail_the_link(make, sock_path, case, readonly, caplog, tmp_path):
    """Descriptors no honest peer sends, for a writable or a read-only part: the link fails
    with a clear error (an ERROR frame where the server can say it), nothing is mapped, every
    received descriptor is closed (leak_check), and other clients carry on."""
    caplog.set_level(logging.INFO, logger="netq")
    server, client = _pair(make)
    sock, _ = _raw_shm_client(sock_path)
    ours: list[int] = []
    size = 2 * MiB
    expect = {"pipe": "not a memfd", "regular-file": "not a memfd",
              "unsealed-memfd": "unsealed memfd", "size-lie": "lies about its size",
              "too-many-fds": "more than 32 descriptors",
              "fd-without-frame": "without a DATA frame",
              "frame-without-fd": "1 segment(s), 0 descriptor(s)"}[case]
    try:
        if case == "pipe":
            ours += os.pipe()
            _send_with_fds(sock, _segment_frame(size, readonly), [ours[0]])
        elif case == "regular-file":
            path = tmp_path / "file"
            path.write_bytes(bytes(size + mmap.PAGESIZE))
            ours.append(os.open(path, os.O_RDWR))
            _send_with_fds(sock, _segment_frame(size, readonly), ours)
        elif case == "unsealed-memfd":
            ours.append(_memfd(size + mmap.PAGESIZE, seals=None))
            _send_with_fds(sock, _segment_frame(size, readonly), ours)
        elif case == "size-lie":
            ours.append(_memfd(size // 2 + mmap.PAGESIZE))
            _send_with_fds(sock, _segment_frame(size, readonly), ours)
        elif case == "too-many-fds":
            ours += [_memfd(mmap.PAGESIZE) for _ in range(_shm.MAX_FDS_PER_WRITE + 8)]
            _send_with_fds(sock, frames.encode_header(frames.FrameType.PING, 0, 0, 7), ours)
        elif case == "fd-without-frame":
            ours.append(_memfd(size + mmap.PAGESIZE))
            _send_with_fds(sock, frames.encode_header(frames.FrameType.PING, 0, 0, 7), ours)
            sock.shutdown(socket.SHUT_WR)  # and nothing else comes
        elif case == "frame-without-fd":
            _send_with_fds(sock, _segment_frame(size, readonly), [])
        received = _read_all(sock)
    finally:
        sock.close()
        for fd in ours:
            os.close(fd)
    if case not in ("too-many-fds", "fd-without-frame"):
        assert frames.ErrorCode.PROTOCOL in error_codes(received)
    wait_for(lambda: any(expect in record.getMessage() for record in caplog.records), 3,
             message=f"the server to say {expect!r}: {[r.getMessage() for r in caplog.records]}")
    assert server.statistics().shm_messages_in == 0
    client.put(np.ones(MiB // 8)).result(T)
    assert server.get(client.id, timeout=T).data.sum() == MiB // 8
    client.put(np.ones(MiB // 8).tobytes()).result(T)  # and a read-only part
    assert server.get(client.id, timeout=T).data == np.ones(MiB // 8).tobytes()


# ============================================================================ processes dying


# Every kind of large part that takes a segment: a writable array, a read-only one over
# bytes, a read-only np.memmap (of an unlinked file) and bytes.
KINDS = ["writable", "readonly", "memmap", "bytes"]


def make_part(kind: str, size: int, value: float):
    """A part of ``kind`` and ``size`` bytes, float64 ``value``s (child scripts have it too)."""
    if kind == "writable":
        return np.full(size // 8, value)
    if kind == "readonly":
        return np.frombuffer(np.full(size // 8, value).tobytes(), np.float64)
    if kind == "memmap":
        with tempfile.TemporaryFile() as backing:  # the map outlives the file object
            backing.write(np.full(size // 8, value).tobytes())
            backing.flush()
            return np.memmap(backing, np.float64, "r")
    return np.full(size // 8, value).tobytes()


_MAKE = "import tempfile\nimport numpy as np\n" + inspect.getsource(make_part)

_SENDER = _MAKE + textwrap.dedent("""
    import sys, netq as nq
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(path=sys.argv[1]))
    comm = nq.new(nq.Protocol.UNIX, "client", options)
    comm.put("ready").result(30)
    print("ready", flush=True)
    big = make_part(sys.argv[3], int(sys.argv[2]), 1.0)
    while True:
        comm.put(big)
""")

_HOLDER = textwrap.dedent("""
    import sys, numpy as np, netq as nq
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(path=sys.argv[1]))
    comm = nq.new(nq.Protocol.UNIX, "client", options)
    comm.put("ready").result(30)
    held = [comm.get(timeout=30).data for _ in range(int(sys.argv[2]))]
    comm.put("holding").result(30)
    print("holding", len(held), flush=True)
    sys.stdin.read()
""")


def _spawn(script: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(nq.__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def _both_ways_through_the_socket(server, client) -> None:
    """A 2 MiB array each way arrives intact, and none of it went through shared memory."""
    big = np.arange(2 * MiB // 8, dtype=np.float64)
    client.put(big).result(T)
    assert np.array_equal(server.get(timeout=T).data, big)
    server.put(big, client.id).result(T)
    assert np.array_equal(client.get(timeout=T).data, big)
    for comm in (server, client):
        stats = comm.statistics()
        assert stats.shm_bytes_in == stats.shm_bytes_out == 0


def _reap(child: subprocess.Popen) -> None:
    """A child process of a test: killed if it still runs, waited for, its pipes closed."""
    if child.poll() is None:
        child.kill()
        child.wait(T)
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()


@pytest.mark.parametrize("kind", KINDS)
def test_sender_killed_mid_message_leaks_nothing(make, sock_path, kind):
    """A sender SIGKILLed while its segments are on their way: once its link is gone and
    what arrived is taken and dropped, the receiver holds no descriptor more than before."""
    server = make("server", session_timeout=0.5)
    before = _fd_count()
    child = _spawn(_SENDER, sock_path, str(4 * MiB), kind)
    try:
        assert server.get(timeout=T).data == "ready"
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for _ in range(3):
            assert memoryview(server.get(timeout=T).data).nbytes == 4 * MiB
        os.kill(child.pid, signal.SIGKILL)
        child.wait(T)
    finally:
        _reap(child)
    wait_for(lambda: not server.peers, T, message="the dead sender's session to end")
    # What arrived whole before the kill was acknowledged: it stays to be taken (a closed
    # session hands out what it received), each message holding its segment. Take it.
    while True:
        try:
            server.get(timeout=0)
        except nq.Empty:
            break
    gc.collect()
    wait_for(lambda: _fd_count() <= before, T, message="the receiver's descriptors to close")


@pytest.mark.parametrize("kind", KINDS)
def test_receiver_killed_holding_arrays_leaks_nothing(make, sock_path, kind):
    """A receiver SIGKILLed while it holds parts mapped from our segments (copy-on-write or
    read-only): our link ends and every segment of our pool is closed (our /proc/self/fd
    back where it was)."""
    server = make("server", session_timeout=0.5)
    before = _fd_count()
    child = _spawn(_HOLDER, sock_path, "5")
    try:
        assert server.get(timeout=T).data == "ready"
        peer = server.peers[0]
        for index in range(5):
            part = make_part(kind, 2 * MiB, float(index))
            server.put(part, peer).result(T)
            del part
        assert server.get(timeout=T).data == "holding"
        assert child.stdout is not None and child.stdout.readline().split()[0] == "holding"
        assert server.statistics().shm_segments == 5
        assert _fd_count(child.pid) >= 5  # the holder's mappings keep descriptors or maps
        os.kill(child.pid, signal.SIGKILL)
        child.wait(T)
    finally:
        _reap(child)
    wait_for(lambda: server.statistics().shm_segments == 0, T,
             message="the pool to close with the link")
    wait_for(lambda: _fd_count() <= before, T, message="our descriptors to close")


# ============================================================================ the memory cgroup

# A process that waits for a line on stdin before it starts: the test moves it into its
# cgroup first, so that every segment page it touches is charged there.
_GATE = "import sys; sys.stdin.readline()\n"

# The survivor: a server that does what stdin says, one command a line, and answers each.
_CGROUP_SERVER = _MAKE + textwrap.dedent("""
    import gc, json, os, sys, time
    import netq as nq
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(path=sys.argv[1]),
                                     connection=nq.ConnectionOptions(session_timeout=0.5))
    server = nq.new(nq.Protocol.UNIX, "server", options)
    print("listening", flush=True)
    for line in sys.stdin:
        op, *args = line.split()
        if op == "get":  # take that many messages and drop them
            for _ in range(int(args[0])):
                server.get(timeout=30)
            gc.collect()
            print("got", flush=True)
        elif op == "send":  # that many parts of that many bytes, of that kind, to the client
            peer = server.peers[0]
            for index in range(int(args[0])):
                server.put(make_part(args[2], int(args[1]), float(index)), peer).result(30)
            print("sent", flush=True)
        elif op == "gone":  # until the client's session ended and no segment is pooled
            deadline = time.monotonic() + 30
            while (server.peers or server.statistics().shm_segments) \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            # What arrived before the link ended is taken and dropped: a message in the
            # queue keeps its mapping until get() takes it (kept, not leaked).
            while True:
                try:
                    server.get_nowait()
                except (nq.Empty, nq.ResourceClosed):
                    break
            gc.collect()
            print(json.dumps({"peers": len(server.peers),
                              "segments": server.statistics().shm_segments}), flush=True)
    server.close(timeout=3)
""")


@pytest.fixture
def memory_cgroup():
    from transports.memory_cgroup import CgroupUnavailable, MemoryCgroup

    try:
        group = MemoryCgroup.create()
    except CgroupUnavailable as error:
        pytest.skip(f"no memory cgroup for the leak check: {error}")
    yield group
    group.close()


def _start_in(group, script: str, *args: str) -> subprocess.Popen:
    child = _spawn(_GATE + script, *args)
    group.add(child.pid)
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    return child


def _ask(child: subprocess.Popen, command: str) -> str:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(command + "\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


_SLACK = MiB  # shared memory the interpreters may hold of their own (none, in practice)


@contextlib.contextmanager
def _server_and_peer(group, sock_path: str, script: str, *args: str):
    """``(server, peer, baseline)``: the survivor server in ``group``, listening, the cgroup's
    shared memory then, and the peer ``script`` in ``group`` too, whose first message the
    server took; both reaped at the end."""
    server = _start_in(group, _CGROUP_SERVER, sock_path)
    peer = None
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        baseline = group.shmem()
        peer = _start_in(group, script, sock_path, *args)
        assert _ask(server, "get 1") == "got"  # its "ready"
        yield server, peer, baseline
    finally:
        for child in (peer, server):
            if child is not None:
                _reap(child)


def _kill_and_see_it_freed(group, victim: subprocess.Popen, server: subprocess.Popen,
                          baseline: int, survivor: str) -> None:
    """SIGKILL ``victim``; the server sees its session end and its pool empty, takes what is
    queued, and the cgroup's shared memory falls back to ``baseline`` while it still runs."""
    import json

    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(T)
    assert json.loads(_ask(server, "gone")) == {"peers": 0, "segments": 0}
    wait_for(lambda: group.shmem() <= baseline + _SLACK, T,
             message=f"the segments' pages to be freed while the {survivor} lives")
    assert server.poll() is None


@pytest.mark.parametrize("kind", KINDS)
def test_receiver_killed_holding_arrays_frees_its_segments_in_the_cgroup(memory_cgroup,
                                                                          sock_path, kind):
    """Sender and receiver in a memory cgroup of their own: the receiver, SIGKILLed while it
    holds 5 parts mapped from the sender's segments, leaves no shared memory charged there
    once the sender saw the link end (the sender is still running)."""
    with _server_and_peer(memory_cgroup, sock_path, _HOLDER, "5") as (server, holder, baseline):
        assert _ask(server, f"send 5 {4 * MiB} {kind}") == "sent"
        assert _ask(server, "get 1") == "got"  # its "holding"
        assert holder.stdout is not None and holder.stdout.readline().split()[0] == "holding"
        held = memory_cgroup.shmem()
        assert held >= baseline + 5 * 4 * MiB, (baseline, held)  # the check sees segments
        _kill_and_see_it_freed(memory_cgroup, holder, server, baseline, "sender")


@pytest.mark.parametrize("kind", KINDS)
def test_sender_killed_mid_message_frees_its_segments_in_the_cgroup(memory_cgroup, sock_path,
                                                                    kind):
    """Sender and receiver in a memory cgroup of their own: the sender, SIGKILLed while its
    4 MiB parts stream in, leaves no shared memory charged there once the receiver saw the
    link end and dropped what it got (the receiver is still running)."""
    with _server_and_peer(memory_cgroup, sock_path, _SENDER, str(4 * MiB),
                          kind) as (server, sender, baseline):
        assert sender.stdout is not None and sender.stdout.readline().strip() == "ready"
        assert _ask(server, "get 3") == "got"
        assert memory_cgroup.shmem() >= baseline + 4 * MiB  # the check sees segments
        _kill_and_see_it_freed(memory_cgroup, sender, server, baseline, "receiver")
