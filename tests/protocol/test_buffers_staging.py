"""The receive staging buffer is sized to what the link carries (issue 21).

A fresh or idle link holds at most :data:`STAGING_MIN` bytes of staging; a read that fills
the buffer doubles it (up to :data:`STAGING_SIZE`), so a busy link keeps its full-size buffer;
``release_buffers()`` frees it when nothing is waiting in it. Every case checks the exact
bytes received, fed whole, byte by byte and at split points (the same helpers as
test_connection.py), and what :attr:`Connection.buffered_bytes` reports.
"""

from __future__ import annotations

from netq.protocol.connection import STAGING_MIN, STAGING_SIZE, Connection
from netq.protocol.frames import MAX_DESCRIPTOR, MAX_PARTS

from .helpers import (
    expected_message,
    feed_all_ways,
    feed_manual,
    normalized,
    open_pair,
    send,
)


def _stream(messages, seq: int = 1) -> tuple[bytes, list[tuple]]:
    """The client's bytes for ``messages`` (lists of (size, readonly) parts) from ``seq``
    on, and the normalized events the server must produce for them."""
    pair = open_pair()
    expected = []
    for offset, specs in enumerate(messages):
        objects = send(pair.client, seq + offset, specs, seed=offset)
        expected.append(expected_message(seq + offset, objects))
    return pair.client.data_to_send(), expected


def _server() -> Connection:
    return open_pair().server


def _staging(conn: Connection) -> int:
    """The staging buffer's size (buffered_bytes less the pool, with the output written: the
    ACKs its reads queued)."""
    conn.data_to_send()
    return conn.buffered_bytes


def test_a_fresh_link_holds_a_small_staging_buffer():
    server = _server()
    assert 0 < _staging(server) <= STAGING_MIN


def test_a_large_message_after_a_small_one_arrives_exactly_every_way():
    # The second message's descriptor alone (MAX_PARTS parts) is larger than a fresh staging
    # buffer: the buffer must grow for the header to be parsed at all.
    many_parts = [(17, index % 2 == 0) for index in range(MAX_PARTS)]
    assert MAX_DESCRIPTOR > STAGING_MIN
    data, expected = _stream([[(10, True)], many_parts, [(300_000, False)], [(5, True)]])
    assert feed_all_ways(_server, data, seeds=(1, 2)) == expected


def test_a_busy_link_grows_to_the_full_buffer_and_keeps_it():
    data, expected = _stream([[(100, True)]] * 4000)  # ~0.5 MiB of small messages
    server = _server()
    # A socket loop that always has more to read: every read fills what it was given.
    events = feed_manual(server, data, (STAGING_SIZE,))
    assert normalized(events) == expected
    assert _staging(server) == STAGING_SIZE
    more, expected_more = _stream([[(100, True)]] * 50, seq=4001)
    events = feed_manual(server, more, (STAGING_SIZE,))
    assert normalized(events) == expected_more
    assert _staging(server) == STAGING_SIZE


def test_short_reads_never_grow_the_buffer():
    data, expected = _stream([[(100, True)]] * 200)
    server = _server()
    events = feed_manual(server, data, (150,))  # reads shorter than the buffer: a quiet link
    assert normalized(events) == expected
    assert _staging(server) == STAGING_MIN


def test_an_idle_link_frees_its_staging_buffer_and_receives_again():
    first, expected_first = _stream([[(100, True)]] * 3000)
    server = _server()
    assert normalized(feed_manual(server, first, (STAGING_SIZE,))) == expected_first
    assert _staging(server) == STAGING_SIZE
    server.release_buffers()
    assert _staging(server) == 0
    later, expected_later = _stream([[(100, True)]] * 10, seq=3001)
    assert normalized(server.receive_data(later)) == expected_later
    assert 0 < _staging(server) <= STAGING_SIZE


def test_release_keeps_a_partly_received_frame():
    data, expected = _stream([[(5000, False)], [(20, True)]])
    for cut in (len(data) - 30, len(data) - 2):  # inside the second frame's header or body
        server = _server()
        events = server.receive_data(data[:cut])
        staged = _staging(server)
        server.release_buffers()
        assert _staging(server) == staged  # bytes wait in it: nothing is freed
        events += server.receive_data(data[cut:])
        assert normalized(events) == expected
        server.release_buffers()
        assert _staging(server) == 0


def test_buffered_bytes_counts_queued_output_and_the_receive_pool():
    pair = open_pair()
    client, server = pair.client, pair.server
    send(client, 1, [(3 * 1024 * 1024, False)])  # large enough for the receive pool
    events = server.receive_data(client.data_to_send())
    assert normalized(events)[0][1] == 1
    assert server.buffered_bytes >= 3 * 1024 * 1024  # the pool remembers the part
    server.release_buffers()
    assert server.buffered_bytes > 0  # the message's ACK waits in the output merge buffer
    server.data_to_send()
    assert server.buffered_bytes == 0
    server.send_ack(1)
    assert server.buffered_bytes > 0
