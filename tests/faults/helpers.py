"""Shared by the fault suites: a round trip, reading a raw socket until the server drops it,
a hand-made client HELLO and handshake (for bytes no netq client would send), and a check that
a SIGSTOPped process really stopped."""

from __future__ import annotations

import os
import ssl
import time
import uuid

import netq as nq
from netq import protocol as proto
from netq.protocol import frames

KiB, MiB = nq.KiB, nq.MiB
T = 30.0  # seconds any single blocking step may take before the test is considered stuck


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
