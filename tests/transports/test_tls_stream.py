"""The TLS link socket of the byte-stream transports (``TLSStream``: OpenSSL over memory BIOs)
keeps the contract of the non-blocking SSLSocket it replaced: ``SSLWantReadError`` /
``SSLWantWriteError`` when the socket is not ready, a send reported only once all its
ciphertext is in the socket (retried with the same data, like SSL_write), 0 at the end of the
stream. The conformance and fault suites run netq over it end to end; this pins the contract
on one socketpair, in one thread, without timing."""

from __future__ import annotations

import socket
import ssl

import pytest

from netq.transports import tls_stream

pytestmark = pytest.mark.timeout(30)

WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


@pytest.fixture
def pair(tls_files):
    """(server, client) streams with the handshake done, over a non-blocking socketpair."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tls_files.server_cert, tls_files.server_key)
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.load_verify_locations(tls_files.ca)
    server = tls_stream.TLSStream(a, server_context, True, None, tls_stream.Scratch())
    client = tls_stream.TLSStream(b, client_context, False, "localhost", tls_stream.Scratch())
    try:
        done = set()
        for _ in range(50):  # a handful of flights; each step moves at least one
            for stream in (client, server):
                if stream not in done:
                    try:
                        stream.do_handshake()
                        done.add(stream)
                    except WANT:
                        pass
            if len(done) == 2:
                break
        assert len(done) == 2, "the handshake did not complete"
        yield server, client
    finally:
        a.close()
        b.close()


def _receive_all(stream, buffer: memoryview) -> int:
    """Read what has arrived into buffer; the count."""
    got = 0
    while got < len(buffer):
        try:
            count = stream.recv_into(buffer[got:])
        except ssl.SSLWantReadError:
            break
        if count == 0:
            break
        got += count
    return got


def test_a_large_payload_arrives_intact_in_many_records_per_syscall(pair):
    server, client = pair
    payload = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB, not a multiple of a record
    received = bytearray(len(payload))
    view = memoryview(received)
    sent = got = 0
    for _ in range(10_000):
        if sent < len(payload):
            try:
                sent += client.send(memoryview(payload)[sent:])
            except ssl.SSLWantWriteError:
                pass
        got += _receive_all(server, view[got:])
        if got == len(payload):
            break
    assert sent == len(payload) and received == payload
    # The receiver's scratch grew from one record's size to the full fill by the reads that
    # filled it; the sender's, which read nothing but the handshake, stayed small.
    assert len(server.scratch.view) == tls_stream._TLS_FILL
    assert len(client.scratch.view) == tls_stream._TLS_FILL_FIRST


def test_a_scratch_buffer_is_made_on_first_use_and_grows_4x_up_to_the_fill():
    scratch = tls_stream.Scratch()
    sizes = [len(scratch.view)]
    for _ in range(6):
        scratch.grow()
        sizes.append(len(scratch.view))
    first, full = tls_stream._TLS_FILL_FIRST, tls_stream._TLS_FILL
    assert sizes[0] == first
    assert sizes == sorted(sizes) and sizes[-1] == full
    assert all(b in (min(full, 4 * a), a) for a, b in zip(sizes, sizes[1:], strict=False))


def test_a_send_counts_only_once_its_ciphertext_is_in_the_socket(pair):
    server, client = pair
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    payload = b"x" * (2 * tls_stream._TLS_WRITE)
    with pytest.raises(ssl.SSLWantWriteError):
        client.send(payload)  # the socket takes a part of the ciphertext only
    assert client.encrypted == tls_stream._TLS_WRITE  # encrypted, kept, not reported
    sink = memoryview(bytearray(tls_stream._TLS_WRITE))
    got = 0
    for _ in range(10_000):
        got += _receive_all(server, sink[got:])
        try:
            count = client.send(payload)  # the same data again, as SSL_write wants
            break
        except ssl.SSLWantWriteError:
            continue
    else:
        pytest.fail("the pending send never completed")
    assert count == tls_stream._TLS_WRITE and client.encrypted == 0 and not client.unsent
    while got < count:
        got += _receive_all(server, sink[got:])
    assert bytes(sink) == payload[:count]


def test_input_already_taken_from_the_socket_is_reported_as_buffered(pair):
    server, client = pair
    client.send(b"a" * 100)
    client.send(b"b" * 100)
    with pytest.raises(ssl.SSLWantReadError):  # nothing read from the socket yet
        server.recv_into(memoryview(bytearray(10)), False)
    assert not server.buffered
    small = memoryview(bytearray(10))
    assert _receive_all(server, small) == 10
    assert server.buffered  # the rest is out of the socket: no readable event will say so
    rest = memoryview(bytearray(190))
    assert _receive_all(server, rest) == 190 and bytes(rest).endswith(b"b" * 100)
    assert not server.buffered


def test_the_end_of_the_stream_reads_as_zero(pair):
    server, client = pair
    client.send(b"last")
    client.sock.shutdown(socket.SHUT_WR)  # no close_notify: a ragged end, read as the end
    buffer = memoryview(bytearray(16))
    assert server.recv_into(buffer) == 4 and bytes(buffer[:4]) == b"last"
    assert server.recv_into(buffer) == 0
