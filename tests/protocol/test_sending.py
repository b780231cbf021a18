"""netq.protocol.sending: the output side of a connection, what it queues and what was written.

Moved from test_connection.py with the send side (``SendSide``): iovec lists, partial writes,
merging of small frames, zero-copy views of large parts, the send limits and
``output_is_only_acks``.
"""

from __future__ import annotations

import mmap

import pytest

from netq._buffers import MMAP_MIN
from netq.exceptions import LocalProtocolError
from netq.protocol import frames, sending
from netq.protocol.connection import Connection
from netq.protocol.frames import (
    ARRAY_BIT,
    DESCRIPTOR,
    HEADER_SIZE,
    MAX_PARTS,
    READONLY_BIT,
    ErrorCode,
    FrameType,
    Role,
)
from netq.protocol.sending import BY_REFERENCE_MIN, IOV_MAX

from .helpers import (
    connection,
    frame_types,
    open_pair,
    send,
    server_open,
)

# ----------------------------------------------------------------------------- output side


def write_prefix(conn: Connection, count: int) -> bytes:
    """Like sendmsg writing ``count`` bytes of ``outgoing()``; reports them with sent()."""
    buffers = conn.outgoing()
    assert len(buffers) <= IOV_MAX
    out = bytearray()
    for buf in buffers:
        if len(out) >= count:
            break
        out += memoryview(buf).cast("B")[: count - len(out)]
    conn.sent(len(out))
    return bytes(out)


def drain(conn: Connection, steps) -> bytes:
    out = bytearray()
    i = 0
    while conn.outgoing():
        out += write_prefix(conn, steps[i % len(steps)])
        i += 1
    assert conn.bytes_queued == 0 and not conn.has_output
    return bytes(out)


def zero_copy_sender(**conn_kw):
    pair = open_pair(client_conn=conn_kw)
    return pair.client


def queue_mixed(conn: Connection):
    """Control frames, merged parts and zero-copy views, in a few hundred bytes."""
    send(conn, 1, [(3, True), (40, False), (5, True), (40, True)])
    conn.send_ack(9)
    send(conn, 2, [(100, False)])
    conn.send_ping(1)
    send(conn, 3, [(0, True), (33, True), (2, False)], batch=True)


def test_outgoing_respects_iov_max():
    conn = zero_copy_sender(efficient_size=16)
    for seq in range(1, 4):
        send(conn, seq, [(16 + seq % 2, bool(i % 2)) for i in range(MAX_PARTS)], seed=seq)
    assert len(conn.outgoing_all()) > 3 * MAX_PARTS
    reference = zero_copy_sender(efficient_size=16)
    for seq in range(1, 4):
        send(reference, seq, [(16 + seq % 2, bool(i % 2)) for i in range(MAX_PARTS)], seed=seq)
    expected = reference.data_to_send()
    out = bytearray()
    rounds = 0
    while conn.outgoing():
        buffers = conn.outgoing()
        assert len(buffers) <= IOV_MAX
        size = sum(len(b) for b in buffers)
        out += b"".join(buffers)
        conn.sent(size)
        rounds += 1
    assert rounds >= 3
    assert bytes(out) == expected
    events = server_open().receive_data(expected)
    assert [e.seq for e in events] == [1, 2, 3]


def test_partial_sent_at_every_split_point():
    def sender():
        conn = zero_copy_sender(efficient_size=32)
        queue_mixed(conn)
        return conn

    reference = sender().data_to_send()
    assert len(sender().outgoing()) > 5  # merged runs and views alternate
    for cut in range(len(reference) + 1):
        conn = sender()
        head = write_prefix(conn, cut)
        assert head == reference[:cut]
        assert conn.bytes_queued == len(reference) - cut
        # has_output reads bytes_queued: it holds because no queued buffer is ever empty.
        assert conn.has_output is (cut < len(reference))
        assert all(len(buffer) for buffer in conn.outgoing_all())
        assert head + conn.data_to_send() == reference
    for steps in ((1,), (3, 1, 40), (17,), (1000,)):
        assert drain(sender(), steps) == reference


def test_partial_sent_then_more_output():
    conn = zero_copy_sender(efficient_size=32)
    queue_mixed(conn)
    head = write_prefix(conn, 57)
    send(conn, 4, [(64, True)])
    conn.send_ping(2)
    rest = drain(conn, (5, 100))
    reference = zero_copy_sender(efficient_size=32)
    queue_mixed(reference)
    send(reference, 4, [(64, True)])
    reference.send_ping(2)
    assert head + rest == reference.data_to_send()


def test_small_messages_are_merged():
    conn = zero_copy_sender()
    for seq in range(1, 1001):
        send(conn, seq, [(64, True)], seed=seq)
    buffers = conn.outgoing()
    assert len(buffers) <= 2
    assert conn.bytes_queued == 1000 * (HEADER_SIZE + 16 + 8 + 64)
    conn = zero_copy_sender(merge_size=4096)
    for seq in range(1, 1001):
        send(conn, seq, [(64, True)], seed=seq)
    buffers = conn.outgoing()
    assert len(buffers) <= 1000 * 104 // 4096 + 1
    assert all(len(b) >= 4096 for b in buffers[:-1])


@pytest.mark.parametrize("readonly", [True, False])
def test_large_parts_are_zero_copy_views(readonly):
    conn = zero_copy_sender()
    efficient = conn.efficient_size
    big = bytes(efficient) if readonly else bytearray(efficient)
    small = b"s" * (efficient - 1)
    conn.send_message(1, [memoryview(small), memoryview(big)], len(small) + len(big), False)
    views = [b for b in conn.outgoing() if isinstance(b, memoryview)]
    assert any(v.obj is big for v in views)
    assert not any(v.obj is small for v in views)  # below efficient_size: copied
    assert not any(v.obj is big and v.readonly != readonly for v in views)


def queue_bytes_and_bytearrays(conn: Connection) -> tuple[bytes, bytes, bytearray]:
    """One-part messages (the put() path) and a message of three parts, around the bound."""
    large = bytes(range(256)) * (BY_REFERENCE_MIN // 256)
    small = large[:-1]
    writable = bytearray(large)
    conn.send_message(1, [large], len(large), False)
    conn.send_message(2, [small], len(small), False)
    conn.send_message(3, [writable], len(writable), False)  # type: ignore[list-item]
    conn.send_message(4, [small, large, writable], 3 * len(large) - 1,  # type: ignore[list-item]
                      True)
    return large, small, writable


def test_bytes_parts_from_by_reference_min_are_queued_as_they_are(monkeypatch):
    # Written from the object itself, not copied into the merge buffer: a bytes object
    # cannot change while it waits. A smaller one, and a writable part, are copied.
    conn = zero_copy_sender()
    assert conn.efficient_size > BY_REFERENCE_MIN  # the bound applies below efficient_size
    large, small, writable = queue_bytes_and_bytearrays(conn)
    queued = conn.outgoing_all()
    assert sum(buffer is large for buffer in queued) == 2  # message 1, and message 4's part
    assert not any(buffer is small or buffer is writable for buffer in queued)
    writable[:] = bytes(len(writable))  # the caller reuses its buffer: what was queued stays
    wire = conn.data_to_send()
    # The same bytes as when every part below efficient_size is copied.
    monkeypatch.setattr(sending, "BY_REFERENCE_MIN", 1 << 62)
    reference = zero_copy_sender()
    queue_bytes_and_bytearrays(reference)
    assert not any(buffer is large for buffer in reference.outgoing_all())
    assert wire == reference.data_to_send()
    events = server_open().receive_data(wire)
    assert [[bytes(part) for part in event.parts] for event in events] == [
        [large], [small], [large], [small, large, large]]


def test_chunked_large_parts_are_views_of_the_caller_object():
    conn = zero_copy_sender(max_size=100_000)
    big = bytes(range(256)) * 1100  # 281_600 bytes: 3 chunks, each >= efficient_size
    small = bytes(range(256)) * 1001  # 256_256 bytes: the 56_256-byte tail chunk is copied
    conn.send_message(1, [memoryview(big)], len(big), False)
    views = [b for b in conn.outgoing() if isinstance(b, memoryview)]
    assert len(views) == 3 and all(v.obj is big for v in views)
    assert [len(v) for v in views] == [100_000, 100_000, 81_600]
    conn.send_message(2, [memoryview(small)], len(small), False)
    views = [b for b in conn.outgoing() if isinstance(b, memoryview) and b.obj is small]
    assert [len(v) for v in views] == [100_000, 100_000]
    data = conn.data_to_send()
    first, second = server_open().receive_data(data)
    assert first.parts == [big] and second.parts == [small]


def _part_sizes(data: bytes) -> list[int]:
    """The part sizes, flags included, of the first DATA frame in ``data``."""
    nparts = DESCRIPTOR.unpack_from(data, HEADER_SIZE)[1]
    offset = HEADER_SIZE + DESCRIPTOR.size
    return [int.from_bytes(data[offset + 8 * i: offset + 8 * i + 8], "little")
            for i in range(nparts)]


@pytest.mark.parametrize("peer_reads_it", [True, False], ids=["peer-reads-array-bit", "older-peer"])
def test_a_writable_part_that_is_no_bytearray_is_marked_array_for_a_peer_that_reads_it(
        peer_reads_it):
    """ARRAY_BIT frees the receiver to hold an array's part in a map (no zero-filling pass);
    a bytearray part keeps its plain size, so a bytearray put comes back a bytearray."""
    np = pytest.importorskip("numpy")
    pair = open_pair(server={"array_parts": peer_reads_it, "max_message": 3 * MMAP_MIN})
    array = np.arange(MMAP_MIN, dtype=np.uint8)
    raw = bytearray(b"r") * MMAP_MIN
    frozen = bytes(1000)
    parts = [memoryview(frozen), memoryview(array), memoryview(raw)]
    total = sum(len(part) for part in parts)
    pair.client.send_message(1, parts, total, False)
    data = pair.client.data_to_send()
    array_flag = ARRAY_BIT if peer_reads_it else 0
    assert _part_sizes(data) == [1000 | READONLY_BIT, MMAP_MIN | array_flag, MMAP_MIN]
    (message,) = pair.server.receive_data(data)
    mapped, copied = message.parts[1], message.parts[2]
    assert type(mapped) is (mmap.mmap if peer_reads_it else bytearray)
    assert type(copied) is bytearray and copied == raw
    assert np.array_equal(np.frombuffer(mapped, np.uint8), array)
    assert np.frombuffer(mapped, np.uint8).flags.writeable


def test_send_message_limits():
    pair = open_pair(server={"max_message": 100})
    c = pair.client
    with pytest.raises(LocalProtocolError, match="over the peer's limit"):
        c.send_message(1, [memoryview(bytes(101))], 101, False)
    with pytest.raises(LocalProtocolError, match="parts"):
        c.send_message(1, [memoryview(b"")] * (MAX_PARTS + 1), 0, False)
    assert c.send_credit_bytes == pair.server.local.recv_window  # nothing was charged
    c.send_message(1, [memoryview(b"")] * MAX_PARTS, 0, False)
    c.send_message(2, [memoryview(bytes(100))], 100, False)
    events = pair.server.receive_data(c.data_to_send())
    assert [len(e.parts) for e in events] == [MAX_PARTS, 1]


@pytest.mark.parametrize("parts", [[b"x" * 10], [b"a", bytes(70_000)], [b""] * 3])
def test_queue_message_writes_the_frames_send_message_writes(parts):
    # queue_message is send_message without its checks (the engine checked them once):
    # the same bytes and the same credit charged.
    checked, unchecked = open_pair().client, open_pair().client
    total = sum(len(part) for part in parts)
    checked.send_message(1, [memoryview(p) for p in parts], total, True)
    unchecked.queue_message(1, [memoryview(p) for p in parts], total, True)
    assert checked.send_credit_bytes == unchecked.send_credit_bytes
    assert checked.send_credit_messages == unchecked.send_credit_messages
    assert drain(checked, [1 << 20]) == drain(unchecked, [1 << 20])


def test_data_to_send_and_has_output():
    c = connection(Role.CLIENT)
    assert c.has_output
    hello = c.data_to_send()
    assert len(hello) == HEADER_SIZE + 64 and c.bytes_queued == 0
    assert not c.has_output and c.outgoing() == [] and c.data_to_send() == b""
    c.send_ping(5)
    assert c.has_output and c.bytes_queued == HEADER_SIZE


# ----------------------------------------------------------------------------- write_to


class ShortWrites:
    """A writer (a socket's sendmsg, a carrier's write bound to its channel) that takes at most
    ``limits[i]`` bytes on its i-th call (then raises BlockingIOError once the limits run
    out), recording what it was given."""

    def __init__(self, *limits: int) -> None:
        self.limits = list(limits)
        self.out = bytearray()
        self.calls = 0

    def __call__(self, buffers: list) -> int:
        assert 1 <= len(buffers) <= IOV_MAX
        self.calls += 1
        if not self.limits:
            raise BlockingIOError
        data = b"".join(bytes(b) for b in buffers)[: self.limits.pop(0)]
        self.out += data
        return len(data)


def test_write_to_writes_everything_through_partial_writes_in_order():
    pair = open_pair()
    c = pair.client
    send(c, 1, [(100, True)])
    send(c, 2, [(70_000, False)])  # a view of its own in the output, after merged bytes
    c.send_ack(4)
    expected = b"".join(bytes(b) for b in c.outgoing_all())
    write = ShortWrites(7, 100, 1, 10**9)
    assert c.write_to(write) is False
    assert bytes(write.out) == expected and write.calls == 4
    assert not c.has_output and c.bytes_queued == 0
    assert c.write_to(write) is False and write.calls == 4  # nothing: no write


def test_write_to_stops_when_a_write_takes_nothing_and_keeps_the_rest_queued():
    c = connection(Role.CLIENT, recv_messages=10)
    hello = c.bytes_queued
    write = ShortWrites(5, 0)
    assert c.write_to(write) is True
    assert c.bytes_queued == hello - 5 and c.has_output
    rest = ShortWrites(10**9)
    assert c.write_to(rest) is False
    assert bytes(write.out + rest.out) == frames.encode_hello(c.local)


def test_write_to_lets_what_the_write_raises_through_with_the_output_kept():
    c = connection(Role.CLIENT, recv_messages=10)
    hello = c.bytes_queued
    with pytest.raises(BlockingIOError):
        c.write_to(ShortWrites(3))  # 3 bytes, then the socket is full
    assert c.bytes_queued == hello - 3
    c.send_ack(1)
    assert c.output_is_only_acks() is False  # the HELLO's tail is still ahead of the ACK
    rest = ShortWrites(hello - 3, 0)
    assert c.write_to(rest) is True  # the HELLO's tail only: the ACK remains
    assert c.output_is_only_acks() and c.bytes_queued == HEADER_SIZE


# ----------------------------------------------------------------------------- output_is_only_acks


def _write(conn: Connection, count: int) -> bytes:
    """Take ``count`` bytes of the output as a transport would (a partial write)."""
    data = b"".join(bytes(b) for b in conn.outgoing())[:count]
    conn.sent(len(data))
    return data


def test_output_is_only_acks_empty_and_lone_frames():
    c = connection(Role.CLIENT, recv_messages=10)
    assert not c.output_is_only_acks() and not c.output_is_only_acks(credit=True)  # the HELLO
    c.data_to_send()
    assert not c.output_is_only_acks() and not c.output_is_only_acks(credit=True)  # nothing
    c.send_ack(1)
    assert c.output_is_only_acks() and c.output_is_only_acks(credit=True)
    assert frame_types(c.data_to_send()) == [FrameType.ACK]
    assert not c.output_is_only_acks()  # written: empty again
    c.send_credit(4096, 1)
    assert not c.output_is_only_acks() and c.output_is_only_acks(credit=True)
    c.send_ack(2)
    assert not c.output_is_only_acks() and c.output_is_only_acks(credit=True)
    assert frame_types(c.data_to_send()) == [FrameType.CREDIT, FrameType.ACK]
    for _ in range(100):  # no size limit: a long run of ACKs is still only ACKs
        c.send_ack(3)
    assert c.output_is_only_acks() and c.bytes_queued == 100 * HEADER_SIZE


@pytest.mark.parametrize("other", ["ping", "bye", "error", "data"])
def test_output_is_only_acks_is_false_with_anything_else_queued(other):
    def queue_other(c):
        if other == "ping":
            c.send_ping(7)
        elif other == "bye":
            c.send_bye("done")
        elif other == "error":
            c.send_error(ErrorCode.LIMIT, "no")
        else:
            send(c, 1, [(10, True)])

    c = open_pair().client
    queue_other(c)
    c.send_ack(1)  # ACK after something else
    assert not c.output_is_only_acks() and not c.output_is_only_acks(credit=True)
    c = open_pair().client
    c.send_ack(1)
    c.send_credit(100, 0)
    queue_other(c)  # something else after ACK and CREDIT
    assert not c.output_is_only_acks() and not c.output_is_only_acks(credit=True)


def test_output_is_only_acks_pong_reply_is_not_an_ack():
    pair = open_pair()
    c, s = pair.client, pair.server
    s.send_ping(9)
    c.send_ack(1)
    assert c.output_is_only_acks()
    c.receive_data(s.data_to_send())  # the PONG goes after the ACK
    assert not c.output_is_only_acks()


def test_output_is_only_acks_when_other_frames_are_written_partially():
    pair = open_pair()
    c = pair.client
    send(c, 1, [(100, True)])  # one DATA frame
    data_size = c.bytes_queued
    c.send_ack(5)
    c.send_ack(6)
    assert not c.output_is_only_acks()
    _write(c, data_size - 3)  # DATA not finished
    assert not c.output_is_only_acks()
    _write(c, 3)  # DATA written: two ACKs left
    assert c.output_is_only_acks()
    _write(c, HEADER_SIZE + 5)  # into the second ACK: what is left is still ACK bytes
    assert c.output_is_only_acks() and c.bytes_queued == HEADER_SIZE - 5
    c.send_ping(1)
    assert not c.output_is_only_acks()
    _write(c, c.bytes_queued - HEADER_SIZE)  # the ACK's tail, not the PING
    assert not c.output_is_only_acks()
    assert frame_types(c.data_to_send()) == [FrameType.PING]
    assert not c.output_is_only_acks()


def test_output_is_only_acks_across_a_credit_and_sealed_buffers():
    pair = open_pair(client_conn={"merge_size": HEADER_SIZE})  # every frame its own buffer
    c = pair.client
    c.send_ack(1)
    c.send_credit(100, 0)
    c.send_ack(2)
    assert len(c.outgoing()) == 3
    assert not c.output_is_only_acks() and c.output_is_only_acks(credit=True)
    _write(c, HEADER_SIZE + HEADER_SIZE + frames.CREDIT_PAYLOAD.size)  # ACK and CREDIT out
    assert c.output_is_only_acks() and c.output_is_only_acks(credit=True)
    c.send_ack(3)
    assert c.output_is_only_acks()
    assert frame_types(c.data_to_send()) == [FrameType.ACK, FrameType.ACK]


def test_the_public_ack_offsets_say_what_output_is_only_acks_says():
    """The link driver compares acks_start, acks_end and sent_total itself after every read:
    the same answer as output_is_only_acks(), in every state the tests above walk through."""

    def inline(c: Connection) -> bool:
        return c.bytes_queued > 0 and c.acks_end == c.sent_total + c.bytes_queued \
            and c.sent_total >= c.acks_start

    pair = open_pair()
    c = pair.client
    seen = []
    steps = [
        lambda: None,
        lambda: send(c, 1, [(100, True)]),
        lambda: c.send_ack(5),
        lambda: _write(c, 7),
        lambda: _write(c, c.bytes_queued - HEADER_SIZE),  # the DATA written: the ACK left
        lambda: _write(c, 3),  # into the ACK
        lambda: c.send_ping(1),
        lambda: c.data_to_send(),
        lambda: c.send_credit(4096, 1),
        lambda: c.send_ack(6),
        lambda: _write(c, HEADER_SIZE + frames.CREDIT_PAYLOAD.size),  # the CREDIT written
        lambda: c.data_to_send(),
    ]
    for step in steps:
        step()
        assert inline(c) == c.output_is_only_acks(), (step, c.bytes_queued)
        seen.append(inline(c))
    assert True in seen and False in seen
