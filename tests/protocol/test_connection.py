"""netq.protocol.connection: the sans-I/O link state machine, fed bytes in every possible way.

Every stream is fed whole, byte by byte, at random split points, and through
``receive_buffer``/``receive_done`` in odd step sizes; all must yield the same events.
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from netq import _buffers
from netq._buffers import LARGE
from netq.exceptions import AuthenticationError, LocalProtocolError, RemoteProtocolError
from netq.protocol import connection as connection_module, frames
from netq.protocol.connection import DIRECT_THRESHOLD, STAGING_SIZE, Connection
from netq.protocol.events import (
    AckReceived,
    ByeReceived,
    ConnectionFailed,
    ConnectionState,
    CreditReceived,
    ErrorReceived,
    PeerAuthenticated,
    PongReceived,
    SessionOpened,
)
from netq.protocol.frames import (
    HEADER,
    HEADER_SIZE,
    MAX_PARTS,
    READONLY_BIT,
    DataFlags,
    ErrorCode,
    FrameType,
    Role,
)

from .helpers import (
    KEY,
    TOKEN,
    UNLIMITED,
    chunk_frame,
    connection,
    data_frame,
    expected_message,
    feed_all_ways,
    feed_bytewise,
    feed_manual,
    feed_split,
    frame,
    frame_types,
    make_hello,
    normalized,
    open_pair,
    payload,
    send,
    server_open,
    shuttle,
    split_frames,
)

HYPOTHESIS = settings(derandomize=True, database=None, deadline=None, max_examples=60,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def allocations(monkeypatch):
    """Sizes passed to _buffers.allocate_* as seen from the connection module."""
    sizes: list[tuple[str, int]] = []
    real_readonly = _buffers.allocate_readonly
    real_writable = _buffers.allocate_writable

    def readonly(size):
        sizes.append(("readonly", size))
        return real_readonly(size)

    def writable(size):
        sizes.append(("writable", size))
        return real_writable(size)

    monkeypatch.setattr(connection_module._buffers, "allocate_readonly", readonly)
    monkeypatch.setattr(connection_module._buffers, "allocate_writable", writable)
    return sizes


def failed_with(events, error_type, match: str | None = None):
    assert events, "expected a ConnectionFailed event"
    last = events[-1]
    assert isinstance(last, ConnectionFailed), events
    assert type(last.error) is error_type, last.error
    if match is not None:
        assert match in str(last.error), str(last.error)
    assert sum(isinstance(e, ConnectionFailed) for e in events) == 1
    return last.error


def queued_error(conn: Connection) -> int:
    """The code of the single ERROR frame at the end of ``conn``'s output."""
    out = split_frames(conn.data_to_send())
    errors = [f for f in out if f[0] == FrameType.ERROR]
    assert len(errors) == 1, [f[0] for f in out]
    assert out[-1] is errors[0]
    return HEADER.unpack_from(errors[0])[4]


def assert_fails(conn: Connection, data: bytes, error_type, code: ErrorCode,
                 match: str | None = None, prefix_events: int = 0):
    """Feed ``data``: ``prefix_events`` good events, then one ConnectionFailed; ERROR queued;
    the connection ignores everything afterwards."""
    conn.data_to_send()  # drop earlier output
    events = conn.receive_data(data)
    assert len(events) == prefix_events + 1, events
    failed_with(events, error_type, match)
    assert conn.state is ConnectionState.CLOSED
    assert queued_error(conn) == code
    assert conn.receive_data(b"\x00" * 100) == []
    assert conn.receive_eof() == []
    assert not conn.has_output
    return events


def assert_fails_all_ways(factory, data: bytes, error_type, code: ErrorCode,
                          match: str | None = None):
    """The failure is the same however ``data`` is cut, and an ERROR with ``code`` is queued."""
    events = feed_all_ways(factory, data)
    assert events[-1][0] == "failed" and events[-1][1] == error_type.__name__, events
    if match is not None:
        assert match in events[-1][2], events[-1]
    conn = factory()
    conn.data_to_send()
    conn.receive_data(data)
    assert queued_error(conn) == code
    return events


# ----------------------------------------------------------------------------- handshake


def test_handshake_without_key():
    pair = open_pair()
    c, s = pair.client, pair.server
    assert c.peer == make_hello(Role.SERVER)
    assert s.peer == make_hello(Role.CLIENT)
    assert [type(e) for e in pair.client_events] == [PeerAuthenticated, SessionOpened]
    assert [type(e) for e in pair.server_events] == [PeerAuthenticated, SessionOpened]
    assert c.can_send_data and s.can_send_data
    assert c.send_credit_bytes == s.local.recv_window
    assert c.send_credit_messages == s.local.recv_messages


def test_handshake_wire_sequence_with_key():
    c = connection(Role.CLIENT, KEY)
    s = connection(Role.SERVER, KEY)
    # HELLO goes out immediately on construction, from both sides.
    c_hello, s_hello = c.data_to_send(), s.data_to_send()
    assert frame_types(c_hello) == frame_types(s_hello) == [FrameType.HELLO]
    # On the peer's HELLO each side answers with AUTH over the peer's nonce.
    assert s.receive_data(c_hello) == []
    assert s.state is ConnectionState.AUTH
    s_auth = s.data_to_send()
    assert frame_types(s_auth) == [FrameType.AUTH]
    assert s_auth[HEADER_SIZE:] == frames.auth_digest(KEY, Role.SERVER, s.local.id,
                                                      c.local.nonce, s.local.nonce)
    # The peer is authenticated only once its AUTH checks out.
    events = c.receive_data(s_hello + s_auth)
    assert [type(e) for e in events] == [PeerAuthenticated]
    assert events[0].hello == s.local
    assert c.state is ConnectionState.SESSION
    c_auth = c.data_to_send()
    assert frame_types(c_auth) == [FrameType.AUTH]
    assert [type(e) for e in s.receive_data(c_auth)] == [PeerAuthenticated]
    # Client SESSION first, then the server's answer.
    c.send_session(TOKEN, 0, False)
    assert s.receive_data(c.data_to_send()) == [SessionOpened(TOKEN, 0, False)]
    s.send_session(TOKEN, 0, False)
    assert c.receive_data(s.data_to_send()) == [SessionOpened(TOKEN, 0, False)]
    assert c.state is s.state is ConnectionState.OPEN


@pytest.mark.parametrize("key", [None, KEY])
def test_handshake_stream_fed_every_way(key):
    # Everything a client sends through the handshake, as one stream, to fresh servers.
    client = connection(Role.CLIENT, key)
    server = connection(Role.SERVER, key)
    stream = client.data_to_send()
    server.receive_data(stream)
    client.receive_data(server.data_to_send())
    client.send_session(TOKEN, 7, True)
    client.send_ping(99)
    stream += client.data_to_send()
    expected_types = [FrameType.HELLO] + ([FrameType.AUTH] if key else []) + [
        FrameType.SESSION, FrameType.PING]
    assert frame_types(stream) == expected_types
    events = feed_all_ways(lambda: connection(Role.SERVER, key), stream)
    assert events == [("authenticated", make_hello(Role.CLIENT, auth=key is not None)),
                      ("session", TOKEN, 7, True)]


def test_wrong_key():
    c = connection(Role.CLIENT, b"key one")
    s = connection(Role.SERVER, b"key two")
    c_hello, s_hello = c.data_to_send(), s.data_to_send()
    assert s.receive_data(c_hello) == []
    # The client checks the server's proof and fails; an ERROR(AUTHENTICATION) is queued.
    events = c.receive_data(s_hello + s.data_to_send())
    err = failed_with(events, AuthenticationError)
    assert not any(isinstance(e, PeerAuthenticated) for e in events)
    assert c.state is ConnectionState.CLOSED
    c_out = split_frames(c.data_to_send())
    assert [f[0] for f in c_out] == [FrameType.AUTH, FrameType.ERROR]
    assert HEADER.unpack_from(c_out[1])[4] == ErrorCode.AUTHENTICATION
    assert str(err) in c_out[1][HEADER_SIZE:].decode()
    # The server, checking the client's proof, fails the same way.
    server_check = connection(Role.SERVER, b"key two")
    server_check.receive_data(c_hello)
    assert_fails(server_check, c_out[0], AuthenticationError, ErrorCode.AUTHENTICATION)
    # A server that gets the client's ERROR learns why.
    informed = connection(Role.SERVER, b"key two")
    informed.receive_data(c_hello)
    events = informed.receive_data(c_out[1])
    assert len(events) == 1 and isinstance(events[0], ErrorReceived)
    assert events[0].code == ErrorCode.AUTHENTICATION
    assert informed.state is ConnectionState.CLOSED
    # Nothing after an ERROR is parsed.
    assert informed.receive_data(frame(FrameType.PING)) == []


@pytest.mark.parametrize("client_key, server_key", [(KEY, None), (None, KEY)])
def test_key_on_one_side_only(client_key, server_key):
    c = connection(Role.CLIENT, client_key)
    s = connection(Role.SERVER, server_key)
    c_hello, s_hello = c.data_to_send(), s.data_to_send()
    for conn, hello, role in ((s, c_hello, Role.CLIENT), (c, s_hello, Role.SERVER)):
        # The HELLO mismatch is caught before anyone sends AUTH.
        events = conn.receive_data(hello)
        failed_with(events, AuthenticationError)
        out = split_frames(conn.data_to_send())
        assert [f[0] for f in out] == [FrameType.ERROR]
        assert HEADER.unpack_from(out[0])[4] == ErrorCode.AUTHENTICATION
        # The ERROR, fed to a fresh peer, arrives as ErrorReceived(AUTHENTICATION).
        peer = connection(role, client_key if role == Role.CLIENT else server_key)
        (received,) = peer.receive_data(out[0])
        assert isinstance(received, ErrorReceived)
        assert received.code == ErrorCode.AUTHENTICATION
        assert received.text == str(events[-1].error)


def test_connection_requires_consistent_auth_flag():
    with pytest.raises(LocalProtocolError):
        Connection(make_hello(Role.CLIENT, auth=True), None)
    with pytest.raises(LocalProtocolError):
        Connection(make_hello(Role.CLIENT, auth=False), KEY)


def test_wrong_version():
    s = connection(Role.SERVER)
    hello = frames.encode_hello(make_hello(Role.CLIENT, version=2))
    assert_fails(s, hello, RemoteProtocolError, ErrorCode.VERSION, match="protocol 2")


@pytest.mark.parametrize("role", [Role.CLIENT, Role.SERVER])
def test_same_role_both_ends(role):
    a = connection(role)
    b = connection(role)
    assert_fails(a, b.data_to_send(), RemoteProtocolError, ErrorCode.PROTOCOL,
                 match="both ends")


@pytest.mark.parametrize("key", [None, KEY])
def test_second_hello(key):
    s = connection(Role.SERVER, key)
    hello = connection(Role.CLIENT, key).data_to_send()
    events = s.receive_data(hello)
    assert s.state is (ConnectionState.AUTH if key else ConnectionState.SESSION)
    assert_fails(s, hello, RemoteProtocolError, ErrorCode.PROTOCOL, match="second HELLO")
    assert len(events) == (0 if key else 1)


def test_second_hello_when_open():
    s = server_open()
    assert_fails(s, connection(Role.CLIENT).data_to_send(), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="second HELLO")


def test_hello_bad_magic_and_role():
    good = bytearray(connection(Role.CLIENT).data_to_send())
    bad_magic = bytearray(good)
    bad_magic[HEADER_SIZE] = ord("X")
    assert_fails(connection(Role.SERVER), bytes(bad_magic), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="magic")
    bad_role = bytearray(good)
    bad_role[HEADER_SIZE + 6] = 7
    assert_fails(connection(Role.SERVER), bytes(bad_role), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="malformed HELLO")


@pytest.mark.parametrize("frame_type, size", [
    (FrameType.HELLO, 63), (FrameType.AUTH, 31), (FrameType.SESSION, 47), (FrameType.SESSION, 0),
    (FrameType.CREDIT, 0), (FrameType.CREDIT, 3),
])
def test_fixed_size_frames_with_short_payload(frame_type, size):
    assert_fails(server_open(), frame(frame_type, bytes(size)), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="payload of")


@pytest.mark.parametrize("frame_type, size", [
    (FrameType.HELLO, 65), (FrameType.AUTH, 33), (FrameType.SESSION, 49), (FrameType.CREDIT, 5),
    (FrameType.ACK, 1), (FrameType.PING, 1), (FrameType.PONG, 8), (FrameType.BYE, 1025),
    (FrameType.ERROR, 1025),
])
def test_control_frames_over_their_limit(frame_type, size):
    # Only the header is fed: the limit is checked before any payload is read.
    s = server_open()
    assert_fails(s, frame(frame_type, length=size), RemoteProtocolError, ErrorCode.LIMIT,
                 match="over the limit")


def test_data_before_session():
    c = connection(Role.CLIENT)
    s = connection(Role.SERVER)
    shuttle(c, s)
    assert s.state is ConnectionState.SESSION
    assert_fails(s, data_frame(1, [3], b"abc"), RemoteProtocolError, ErrorCode.PROTOCOL,
                 match="DATA in state session")


def test_data_before_hello():
    assert_fails(connection(Role.SERVER), data_frame(1, [3], b"abc"), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="DATA in state hello")


def test_client_rejects_data_before_server_session():
    c = connection(Role.CLIENT)
    s = connection(Role.SERVER)
    shuttle(c, s)
    c.send_session(TOKEN, 0, False)
    shuttle(c, s)
    assert c.state is ConnectionState.SESSION and s.state is ConnectionState.OPEN
    assert_fails(c, data_frame(1, [], b""), RemoteProtocolError, ErrorCode.PROTOCOL,
                 match="DATA in state session")


def test_auth_without_keys():
    c = connection(Role.CLIENT)
    s = connection(Role.SERVER)
    shuttle(c, s)
    assert_fails(s, frame(FrameType.AUTH, bytes(32)), RemoteProtocolError, ErrorCode.PROTOCOL,
                 match="AUTH in state session")


def test_auth_before_hello_and_after_open():
    assert_fails(connection(Role.SERVER, KEY), frame(FrameType.AUTH, bytes(32)),
                 RemoteProtocolError, ErrorCode.PROTOCOL, match="AUTH in state hello")
    s = open_pair(KEY, KEY).server
    assert_fails(s, frame(FrameType.AUTH, bytes(32)), RemoteProtocolError, ErrorCode.PROTOCOL,
                 match="AUTH in state open")


def test_session_out_of_state():
    assert_fails(connection(Role.SERVER), frames.encode_session(TOKEN, 0, False),
                 RemoteProtocolError, ErrorCode.PROTOCOL, match="SESSION in state hello")
    assert_fails(server_open(), frames.encode_session(TOKEN, 0, False), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="SESSION in state open")
    s = connection(Role.SERVER, KEY)
    s.receive_data(connection(Role.CLIENT, KEY).data_to_send())
    assert_fails(s, frames.encode_session(TOKEN, 0, False), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="SESSION in state auth")


@pytest.mark.parametrize("frame_bytes", [
    frame(FrameType.CREDIT, b"\x01\x00\x00\x00", value=5),
    frame(FrameType.ACK, value=1),
    frame(FrameType.BYE, b"bye"),
], ids=["CREDIT", "ACK", "BYE"])
def test_open_only_frames_during_handshake(frame_bytes):
    c = connection(Role.CLIENT)
    s = connection(Role.SERVER)
    shuttle(c, s)
    assert_fails(s, frame_bytes, RemoteProtocolError, ErrorCode.PROTOCOL, match="in state")


def test_ping_and_error_during_handshake():
    s = connection(Role.SERVER)
    s.data_to_send()
    assert s.receive_data(frame(FrameType.PING, value=0xABCDEF)) == []
    assert split_frames(s.data_to_send()) == [frame(FrameType.PONG, value=0xABCDEF)]
    assert s.receive_data(frame(FrameType.PONG, value=3)) == [PongReceived(3)]
    events = s.receive_data(frame(FrameType.ERROR, b"going away", value=ErrorCode.SHUTDOWN)
                            + frame(FrameType.PING))
    assert events == [ErrorReceived(ErrorCode.SHUTDOWN, "going away")]
    assert s.state is ConnectionState.CLOSED
    assert not s.has_output  # no PONG for the PING after the ERROR, and no ERROR back


def test_local_misuse():
    c = connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        c.send_session(TOKEN, 0, False)  # before the peer's HELLO
    with pytest.raises(LocalProtocolError):
        c.send_message(1, [], 0, False)
    assert not c.can_send_data
    with pytest.raises(LocalProtocolError):
        c.send_credit(-1, 0)
    with pytest.raises(LocalProtocolError):
        c.send_credit(0, -1)


# ----------------------------------------------------------------------------- messages

CHUNK = 1000  # sender max_size in the chunking cases

MESSAGE_CASES = {
    "empty": ([], False, None),
    "empty-parts": ([(0, True), (0, False), (0, True)], False, None),
    "one-readonly": ([(10, True)], False, None),
    "one-writable": ([(10, False)], False, None),
    "mixed": ([(5, True), (0, False), (17, False), (3, True)], False, None),
    "batch": ([(4, True), (4, False)], True, None),
    "empty-batch": ([], True, None),
    "max-parts": ([(i % 5, bool(i % 3)) for i in range(MAX_PARTS)], False, None),
    "max-parts-chunked": ([(i % 7, bool(i % 2)) for i in range(MAX_PARTS)], True, CHUNK),
    "chunk-1": ([(CHUNK - 1, True)], False, CHUNK),
    "chunk": ([(CHUNK, False)], False, CHUNK),
    "chunk+1": ([(CHUNK + 1, True)], False, CHUNK),
    "chunk-parts-across": ([(CHUNK // 2, True), (CHUNK, False), (1, True), (CHUNK - 2, False)],
                           False, CHUNK),
    "zero-parts-at-boundary": ([(CHUNK, True), (0, False), (0, True), (CHUNK, False),
                                (0, True)], False, CHUNK),
    "3-chunks-exact": ([(3 * CHUNK, False)], True, CHUNK),
    "3-chunks+1": ([(3 * CHUNK + 1, True)], False, CHUNK),
    "chunk-size-1": ([(5, True), (3, False)], False, 1),
    "direct-writable": ([(40_000, False)], False, None),
    "direct-readonly": ([(100_000, True)], False, None),
    "direct-many-parts": ([(3 * 32 * 1024 + 5, False), (10, True), (70_000, True)], True, None),
    "direct-chunked": ([(150_000, False), (50_000, True)], False, 48 * 1024),
    "direct-chunk-at-threshold": ([(DIRECT_THRESHOLD * 3, True)], False, DIRECT_THRESHOLD),
    "over-staging": ([(STAGING_SIZE + 12345, False)], False, None),
    "over-staging-chunked": ([(STAGING_SIZE * 2 + 1, True)], False, 100_000),
}
SMALL_CASES = {name for name, (specs, _, _) in MESSAGE_CASES.items()
               if sum(size for size, _ in specs) <= 20_000}


def message_stream(specs, batch, max_size, seq=1, seed=0):
    conn = {"max_size": max_size} if max_size else {}
    pair = open_pair(client_conn=conn)
    objects = send(pair.client, seq, specs, batch=batch, seed=seed)
    return pair.client.data_to_send(), objects


@pytest.mark.parametrize("name", list(MESSAGE_CASES))
def test_message_every_way(name, allocations):
    specs, batch, max_size = MESSAGE_CASES[name]
    data, objects = message_stream(specs, batch, max_size)
    events = feed_all_ways(server_open, data, bytewise=True,
                           steps=((1,), (7,), (4093,), (1, 65536, 3), (100_000,),
                                  (31, 32768, 32769)) if name in SMALL_CASES else
                           ((4093,), (1, 65536, 3), (100_000,), (31, 32768, 32769), (17,)),
                           eof=True)
    assert events == [expected_message(1, objects, batch)]
    # Writable parts are bytearrays, read-only ones bytes below LARGE and read-only
    # memoryviews from LARGE (netq._buffers).
    assert [t for t, _ in events[0][3]] == [
        "bytearray" if not ro else "bytes" if size < LARGE else "memoryview"
        for size, ro in specs]
    # Each allocation is exactly one part.
    total = sum(size for size, _ in specs)
    assert all(size <= total for _, size in allocations)


@pytest.mark.parametrize("name", [n for n in MESSAGE_CASES if MESSAGE_CASES[n][2]])
def test_chunk_layout(name):
    specs, batch, max_size = MESSAGE_CASES[name]
    data, objects = message_stream(specs, batch, max_size)
    total = sum(size for size, _ in specs)
    chunks = split_frames(data)
    assert len(chunks) == max(1, math.ceil(total / max_size))
    descriptor = frames.encode_descriptor(
        total, [s | READONLY_BIT if ro else s for s, ro in specs])
    body = b""
    for index, raw in enumerate(chunks):
        frame_type, flags, reserved, length, seq = HEADER.unpack_from(raw)
        assert (frame_type, reserved, seq) == (FrameType.DATA, 0, 1)
        expect = 0
        if index == 0:
            expect |= DataFlags.FIRST | (DataFlags.BATCH if batch else 0)
        if index == len(chunks) - 1:
            expect |= DataFlags.LAST
        assert flags == expect
        payload = raw[HEADER_SIZE:]
        if index == 0:
            assert payload.startswith(descriptor)
            payload = payload[len(descriptor):]
        assert len(payload) == (max_size if index < len(chunks) - 1 else total - len(body))
        body += payload
    assert body == b"".join(bytes(o) for o in objects)


def test_chunk_size_is_the_smaller_limit():
    pair = open_pair(server={"max_frame": 700}, client_conn={"max_size": 1000})
    assert pair.client.chunk_size == 700
    send(pair.client, 1, [(1500, True)])
    assert [len(f) - HEADER_SIZE for f in split_frames(pair.client.data_to_send())] == [
        16 + 8 + 700, 700, 100]
    pair = open_pair(server={"max_frame": 0})
    assert pair.client.chunk_size == 1


@pytest.mark.parametrize("kind", [bytes, memoryview])
def test_a_part_cut_across_chunks_is_sent_from_its_own_memory(kind):
    """A message over several chunks queues views of the caller's part, whether the part is
    a view or a ``bytes`` object (BytesSerializer's, or a large top-level bytes pickled out of
    band): slicing the bytes object itself would copy it, chunk by chunk."""
    pair = open_pair(client_conn={"max_size": 4096, "efficient_size": 1024})
    data = payload(3 * 4096 + 100)
    part = data if kind is bytes else memoryview(data)
    pair.client.send_message(1, [part], len(data), False)
    big = [buffer for buffer in pair.client.outgoing() if len(buffer) >= 1024]
    assert [len(buffer) for buffer in big] == [4096, 4096, 4096]  # the last 100 bytes: merged
    assert all(type(buffer) is memoryview and buffer.obj is data for buffer in big)
    events = pair.server.receive_data(pair.client.data_to_send())
    assert normalized(events) == [expected_message(1, [data])]


def test_several_messages_in_one_stream():
    pair = open_pair(client_conn={"max_size": 64})
    expected = []
    for seq, specs in enumerate([[(3, True)], [], [(200, False), (1, True)], [(64, True)]], 1):
        expected.append(expected_message(seq, send(pair.client, seq, specs, seed=seq)))
    data = pair.client.data_to_send()
    assert feed_all_ways(server_open, data, eof=True) == expected


@given(name=st.sampled_from(sorted(MESSAGE_CASES)), data=st.data())
@HYPOTHESIS
def test_message_random_splits(name, data):
    specs, batch, max_size = MESSAGE_CASES[name]
    stream, objects = message_stream(specs, batch, max_size)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40))
    events = feed_split(server_open(), stream, cuts)
    assert normalized(events) == [expected_message(1, objects, batch)]


def test_direct_receive_writes_into_the_final_object():
    data, objects = message_stream([(200_000, False), (100_000, True)], False, None)
    conn = server_open()
    targets = []
    position = 0
    events = []
    steps = [1000, 33_333, 7, 65_536, 4093]
    i = 0
    while position < len(data):
        target = conn.receive_buffer()
        targets.append((target.obj, len(target)))
        count = min(len(target), steps[i % len(steps)], len(data) - position)
        i += 1
        target[:count] = data[position : position + count]
        position += count
        events += conn.receive_done(count)
    (message,) = events
    writable, readonly = message.parts
    assert type(writable) is bytearray
    assert type(readonly) is memoryview and readonly.readonly  # 100_000 bytes: >= LARGE
    assert writable == objects[0] and readonly == objects[1]
    # Most of the writable body went straight into the object the user gets.
    direct = sum(size for obj, size in targets if obj is writable)
    assert direct > 150_000
    assert not conn.receiving_message


def _packets_of_one_message(specs):
    """One message's bytes cut as a packet carrier delivers them: everything before the last
    part's body, then that body as one ``bytes`` packet (it travelled as the object it is)."""
    data, objects = message_stream(specs, False, None)
    body = len(objects[-1])
    return [data[:-body], bytes(data[-body:])], objects


def test_a_packet_that_is_a_whole_read_only_part_becomes_that_part_without_a_copy():
    (front, body), objects = _packets_of_one_message([(10, True), (200_000, True)])
    conn = server_open()
    assert conn.receive_data(front) == []
    (message,) = conn.receive_data(body)
    small, large = message.parts
    assert small == objects[0] and type(small) is bytes
    assert type(large) is memoryview and large.readonly and large.obj is body  # no copy
    assert large == objects[1]
    assert not conn.receiving_message


@pytest.mark.parametrize("fed", ["bytes", "view of bytes"])
def test_a_packet_that_ends_with_a_whole_read_only_part_keeps_it_without_a_copy(fed):
    # How gRPC carries a large body: its frame header and the parts before it in front of it,
    # in one packet (a carrier may hand over a view of the bytes it read, past its own header).
    (front, body), objects = _packets_of_one_message([(10, True), (200_000, True)])
    packet = front + body
    carried = packet if fed == "bytes" else b"mqtt" + packet
    conn = server_open()
    (message,) = conn.receive_data(packet if fed == "bytes" else memoryview(carried)[4:])
    small, large = message.parts
    assert small == objects[0] and type(small) is bytes
    assert type(large) is memoryview and large.readonly and large == objects[1]
    assert large.obj is carried  # no copy
    assert not conn.receiving_message
    # The next message, a packet of its own, is parsed from its first byte as usual.
    follow = message_stream([(50, True)], False, None, seq=2)[0]
    (second,) = conn.receive_data(follow)
    assert second.seq == 2


@pytest.mark.parametrize("specs, fed", [
    ([(200_000, False)], "whole"),  # writable: the user gets a bytearray, so it is copied
    ([(200_000, True)], "split"),  # the part's first bytes came in an earlier packet
    ([(200_000, True)], "memoryview"),  # a view of a buffer its owner may fill again
    ([(200_000, True)], "trailing"),  # the packet goes on past the part: the next frame
])
def test_a_packet_is_copied_where_it_cannot_become_the_part(specs, fed):
    (front, body), objects = _packets_of_one_message(specs)
    conn = server_open()
    if fed == "split":
        front, body = front + body[:1000], body[1000:]
    elif fed == "trailing":
        front, body = b"", front + body + message_stream([(50, True)], False, None, seq=2)[0]
    conn.receive_data(front)
    events = conn.receive_data(memoryview(bytearray(body)) if fed == "memoryview" else body)
    part = events[0].parts[0]
    assert part == objects[0]
    assert not (type(part) is memoryview and part.obj is body)
    assert len(events) == (2 if fed == "trailing" else 1)


@pytest.mark.parametrize("offset", [1, 8, 15, 16, 20, 31, 32, 40, 1000, 8000])
def test_frames_straddling_the_staging_buffer(offset):
    """The second frame starts ``offset`` bytes before the end of the 256 KiB staging buffer,
    so the header, the 8 KiB descriptor or the body is cut where the buffer is compacted."""
    pair = open_pair()
    pad = STAGING_SIZE - offset - (HEADER_SIZE + 16 + 8)
    expected = [expected_message(1, send(pair.client, 1, [(pad, True)]))]
    # 1024 one-byte parts: an 8 KiB descriptor.
    specs = [(1, bool(i % 2)) for i in range(MAX_PARTS)]
    expected.append(expected_message(2, send(pair.client, 2, specs, seed=2)))
    for seq in range(3, 40):
        expected.append(expected_message(seq, send(pair.client, seq, [(seq * 97, True)])))
    data = pair.client.data_to_send()
    assert split_frames(data)[0].__len__() == STAGING_SIZE - offset
    events = feed_all_ways(server_open, data, bytewise=False, seeds=(1,),
                           steps=((STAGING_SIZE,), (STAGING_SIZE - offset + 3,), (65_536, 4093)))
    assert events == expected


def test_many_small_messages_through_the_staging_buffer():
    pair = open_pair()
    expected = []
    for seq in range(1, 401):
        specs = [(seq * 37 % 3000, seq % 2 == 0), (seq % 11, True)]
        expected.append(expected_message(seq, send(pair.client, seq, specs, seed=seq)))
    data = pair.client.data_to_send()
    assert len(data) > 2 * STAGING_SIZE
    events = feed_all_ways(server_open, data, bytewise=False,
                           steps=((4093,), (65_536,), (STAGING_SIZE,), (1, 65_535, 99_999)))
    assert events == expected


def test_receive_buffer_is_never_empty():
    pair = open_pair()
    for seq in range(1, 50):
        send(pair.client, seq, [(9000, True)])
    data = pair.client.data_to_send()
    conn = server_open()
    position = 0
    while position < len(data):
        target = conn.receive_buffer()
        assert len(target) >= 1
        count = min(len(target), len(data) - position)
        target[:count] = data[position : position + count]
        position += count
        conn.receive_done(count)
    assert conn.expected_seq == 50


# ----------------------------------------------------------------------------- round trip

part_spec = st.tuples(
    st.one_of(st.integers(0, 40), st.integers(0, 3000), st.integers(30_000, 80_000)),
    st.booleans(),
)
item = st.one_of(
    st.tuples(st.just("message"), st.lists(part_spec, max_size=6), st.booleans()),
    st.tuples(st.just("credit"), st.integers(0, 1 << 40), st.integers(0, 1000)),
    st.tuples(st.just("ack"), st.integers(0, (1 << 64) - 1)),
    st.tuples(st.just("ping"), st.integers(0, (1 << 64) - 1)),
)


@given(
    items=st.lists(item, max_size=12),
    max_size=st.one_of(st.integers(1, 5000), st.just(4 * 1024 * 1024)),
    server_frame=st.one_of(st.integers(1, 3000), st.just(1 << 20)),
    splice=st.booleans(),
    data=st.data(),
)
@settings(HYPOTHESIS, max_examples=100)
def test_round_trip(items, max_size, server_frame, splice, data):
    # Keep each example under ~300 KB.
    budget = 300_000
    pair = open_pair(server={"max_frame": server_frame},
                     client={"recv_messages": 1000}, client_conn={"max_size": max_size})
    sender = pair.client
    data_frames = []  # DATA frames, message after message
    control = []  # control frames
    ordered = []  # every frame in the order it was issued
    expected_messages = []
    seq = 0
    for entry in items:
        kind = entry[0]
        if kind == "message":
            specs = entry[1]
            if sum(s for s, _ in specs) > budget:
                continue
            budget -= sum(s for s, _ in specs)
            seq += 1
            objects = send(sender, seq, specs, batch=entry[2], seed=seq)
            chunks = split_frames(sender.data_to_send())
            data_frames += chunks
            ordered += chunks
            expected_messages.append(expected_message(seq, objects, entry[2]))
            continue
        if kind == "credit":
            sender.send_credit(entry[1], entry[2])
        elif kind == "ack":
            sender.send_ack(entry[1])
        else:
            sender.send_ping(entry[1])
        raw = sender.data_to_send()
        control.append(raw)
        ordered.append(raw)
    if splice:
        # Control frames anywhere, also between the chunks of one message.
        stream_frames = list(data_frames)
        for raw in control:
            stream_frames.insert(data.draw(st.integers(0, len(stream_frames))), raw)
    else:
        stream_frames = ordered
    stream = b"".join(stream_frames)
    expected = []
    pongs = []
    messages = iter(expected_messages)
    for raw in stream_frames:
        frame_type, flags, _, _, value = HEADER.unpack_from(raw)
        if frame_type == FrameType.DATA and flags & DataFlags.LAST:
            expected.append(next(messages))
        elif frame_type == FrameType.CREDIT:
            expected.append(("credit", value, struct.unpack_from("<I", raw, HEADER_SIZE)[0]))
        elif frame_type == FrameType.ACK:
            expected.append(("ack", value))
        elif frame_type == FrameType.PING:
            pongs.append(frame(FrameType.PONG, value=value))
    assert next(messages, None) is None

    def receiver():
        return open_pair(server={"max_frame": server_frame}, client={"recv_messages": 1000},
                         client_conn={"max_size": max_size}).server

    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    steps = data.draw(st.lists(st.integers(1, 70_000), min_size=1, max_size=5))
    for feed in (lambda c: c.receive_data(stream), lambda c: feed_split(c, stream, cuts),
                 lambda c: feed_manual(c, stream, steps)):
        conn = receiver()
        conn.data_to_send()
        assert normalized(feed(conn)) == expected
        output = split_frames(conn.data_to_send())
        assert [raw for raw in output if raw[0] != FrameType.ACK] == pongs
        # Each read that completed messages acknowledged the last of them: in order, ending
        # with the last message.
        acks = [HEADER.unpack_from(raw)[4] for raw in output if raw[0] == FrameType.ACK]
        received = [event[1] for event in expected if event[0] == "message"]
        assert acks == sorted(set(acks)) and set(acks) <= set(received)
        assert acks[-1:] == received[-1:]
        assert conn.receive_eof() == []


# ----------------------------------------------------------------------------- flow control


def test_credit_accounting_both_sides():
    pair = open_pair(server={"recv_window": 100, "recv_messages": 3})
    c, s = pair.client, pair.server
    assert (c.send_credit_bytes, c.send_credit_messages) == (100, 3)
    assert (s.recv_allowance_bytes, s.recv_allowance_messages) == (100, 3)
    # A message larger than the window may start while both credits are positive...
    objects = send(c, 1, [(1000, True)])
    assert (c.send_credit_bytes, c.send_credit_messages) == (-900, 2)
    assert not c.can_send_data
    with pytest.raises(LocalProtocolError):
        send(c, 2, [(1, True)])
    events = s.receive_data(c.data_to_send())
    assert normalized(events) == [expected_message(1, objects)]
    assert (s.recv_allowance_bytes, s.recv_allowance_messages) == (-900, 2)
    # ...and the receiver returns credit as it consumes.
    s.send_credit(950, 1)
    assert (s.recv_allowance_bytes, s.recv_allowance_messages) == (50, 3)
    events = c.receive_data(s.data_to_send())
    assert events == [AckReceived(1), CreditReceived(950, 1)]  # the receiver acknowledged it
    assert (c.send_credit_bytes, c.send_credit_messages) == (50, 3)
    assert c.can_send_data
    for seq in (2, 3):
        send(c, seq, [(10, False)])
    assert c.send_credit_messages == 1 and c.send_credit_bytes == 30
    send(c, 4, [(30, False)])
    assert (c.send_credit_bytes, c.send_credit_messages) == (0, 0)
    assert not c.can_send_data
    assert len(s.receive_data(c.data_to_send())) == 3
    assert (s.recv_allowance_bytes, s.recv_allowance_messages) == (0, 0)


def test_zero_byte_credit_blocks_even_empty_messages():
    pair = open_pair(server={"recv_window": 0, "recv_messages": 10})
    assert not pair.client.can_send_data
    pair.server.send_credit(1, 0)
    pair.client.receive_data(pair.server.data_to_send())
    assert pair.client.can_send_data
    send(pair.client, 1, [(5000, True)])  # one byte of credit lets a whole message start
    assert pair.client.send_credit_bytes == -4999


def test_message_credit_exhausted():
    pair = open_pair(server={"recv_window": 1 << 30, "recv_messages": 1})
    send(pair.client, 1, [(1, True)])
    assert pair.client.send_credit_bytes > 0 and pair.client.send_credit_messages == 0
    assert not pair.client.can_send_data


@pytest.mark.parametrize("window, messages", [(100, 10), (1 << 30, 1)])
def test_message_without_credit_is_rejected(window, messages, allocations):
    pair = open_pair(server={"recv_window": window, "recv_messages": messages})
    c, s = pair.client, pair.server
    first = send(c, 1, [(200, True)])
    # A misbehaving sender ignores the credit it has left.
    c.send_credit_bytes = c.send_credit_messages = 1 << 40
    send(c, 2, [(DIRECT_THRESHOLD * 4, False)])
    events = assert_fails(s, c.data_to_send(), RemoteProtocolError, ErrorCode.LIMIT,
                          match="without credit", prefix_events=1)
    assert normalized(events[:1]) == [expected_message(1, first)]
    assert allocations == []  # the refused message allocated nothing
    # The sender learns why.
    error = frame(FrameType.ERROR, b"message sent without credit", value=ErrorCode.LIMIT)
    assert c.receive_data(error) == [ErrorReceived(ErrorCode.LIMIT, "message sent without credit")]


def test_credit_with_unlimited_messages():
    pair = open_pair()  # recv_messages=UNLIMITED on both sides
    c, s = pair.client, pair.server
    assert c.send_credit_messages == UNLIMITED
    s.send_credit(500, 7)
    raw = s.data_to_send()
    assert raw == frame(FrameType.CREDIT, b"\x00\x00\x00\x00", value=500)  # messages dropped
    assert s.recv_allowance_messages == UNLIMITED
    assert c.receive_data(raw) == [CreditReceived(500, 0)]
    assert c.send_credit_messages == UNLIMITED
    # A CREDIT frame carrying messages anyway does not change an unlimited count.
    assert c.receive_data(frame(FrameType.CREDIT, b"\x05\x00\x00\x00", value=1)) == [
        CreditReceived(1, 5)]
    assert c.send_credit_messages == UNLIMITED
    for seq in range(1, 2001):
        c.send_message(seq, [], 0, False)
    assert c.send_credit_messages == UNLIMITED and c.can_send_data
    events = s.receive_data(c.data_to_send())
    assert len(events) == 2000 and s.recv_allowance_messages == UNLIMITED


def test_credit_frame_layout():
    pair = open_pair(client={"recv_messages": 10})
    pair.client.send_credit(0x0102030405, 0x0A0B0C0D)
    assert pair.client.data_to_send() == (
        bytes([5, 0, 0, 0, 4, 0, 0, 0]) + (0x0102030405).to_bytes(8, "little")
        + bytes([0x0D, 0x0C, 0x0B, 0x0A]))


# ----------------------------------------------------------------------------- ACK BYE PING


def test_ack_ping_pong():
    pair = open_pair()
    c, s = pair.client, pair.server
    s.send_ack(41)
    s.send_ping(7)
    assert c.receive_data(s.data_to_send()) == [AckReceived(41)]
    assert s.receive_data(c.data_to_send()) == [PongReceived(7)]


def test_bye():
    pair = open_pair()
    c, s = pair.client, pair.server
    objects = send(c, 1, [(5, True)])
    c.send_bye("done")
    assert not c.can_send_data
    c.send_bye("again")  # idempotent
    with pytest.raises(LocalProtocolError):
        send(c, 2, [])
    events = s.receive_data(c.data_to_send())
    assert normalized(events) == [expected_message(1, objects), ("bye", "done")]
    assert s.peer_said_bye and s.state is ConnectionState.OPEN
    # Control frames still flow after BYE; DATA does not.
    assert s.receive_data(frame(FrameType.ACK, value=3)) == [AckReceived(3)]
    assert_fails(s, data_frame(2, [], b""), RemoteProtocolError, ErrorCode.PROTOCOL,
                 match="DATA after BYE")


def test_bye_reason_is_truncated_and_decoded_leniently():
    pair = open_pair()
    pair.client.send_bye("x" * 5000)
    raw = pair.client.data_to_send()
    assert HEADER.unpack_from(raw)[3] == frames.MAX_TEXT
    assert pair.server.receive_data(raw) == [ByeReceived("x" * 1024)]
    s = server_open()
    assert s.receive_data(frame(FrameType.BYE, b"\xff\xfeok")) == [ByeReceived("\ufffd\ufffdok")]


def test_error_text_is_truncated():
    c = connection(Role.CLIENT)
    c.data_to_send()
    c.send_error(ErrorCode.SHUTDOWN, "y" * 3000)
    raw = c.data_to_send()
    assert HEADER.unpack_from(raw) == (FrameType.ERROR, 0, 0, 1024, ErrorCode.SHUTDOWN)


def test_error_frame_when_open():
    s = server_open()
    stream, objects = message_stream([(3, True)], False, None)
    events = s.receive_data(stream + frame(FrameType.ERROR, b"replaced", value=6) + stream)
    assert normalized(events) == [expected_message(1, objects), ("error", 6, "replaced")]
    assert s.state is ConnectionState.CLOSED
    assert not s.has_output


# ----------------------------------------------------------------------------- hostile


@pytest.mark.parametrize("frame_type", [0, 11, 12, 127, 255])
def test_unknown_frame_type(frame_type):
    assert_fails_all_ways(server_open, frame(frame_type), RemoteProtocolError,
                          ErrorCode.PROTOCOL, match="unknown frame type")


@pytest.mark.parametrize("reserved", [1, 0x8000, 0xFFFF])
@pytest.mark.parametrize("frame_type", [FrameType.PING, FrameType.DATA, FrameType.HELLO])
def test_reserved_header_bits(frame_type, reserved):
    assert_fails_all_ways(server_open, frame(frame_type, reserved=reserved),
                          RemoteProtocolError, ErrorCode.PROTOCOL, match="reserved")


@pytest.mark.parametrize("frame_type", list(FrameType))
def test_header_claiming_4_gib(frame_type, allocations):
    s = server_open()
    assert_fails(s, frame(frame_type, length=0xFFFFFFFF), RemoteProtocolError,
                 ErrorCode.LIMIT, match="over the limit")
    assert allocations == []


def test_data_length_limit_is_max_frame_plus_descriptor(allocations):
    limit = 1000 + frames.MAX_DESCRIPTOR
    s = server_open(max_frame=1000)
    assert s.receive_data(frame(FrameType.DATA, length=limit, flags=0x03, value=1)) == []
    assert s.state is ConnectionState.OPEN  # waiting for the descriptor
    assert_fails(server_open(max_frame=1000), frame(FrameType.DATA, length=limit + 1),
                 RemoteProtocolError, ErrorCode.LIMIT)
    assert allocations == []


def test_descriptor_claiming_1_tib(allocations):
    s = server_open()
    tib = 1 << 40
    raw = data_frame(1, [tib], b"", flags=DataFlags.FIRST)[: HEADER_SIZE + 16 + 8]
    assert_fails(s, raw, RemoteProtocolError, ErrorCode.LIMIT, match="over max_message")
    # Byte by byte: refused on the descriptor's last byte, before any body byte.
    s = server_open()
    for i in range(len(raw) - 1):
        assert s.receive_data(raw[i : i + 1]) == []
    failed_with(s.receive_data(raw[-1:]), RemoteProtocolError, "over max_message")
    assert allocations == []


def test_message_over_max_message(allocations):
    s = server_open(max_message=1000)
    assert_fails(s, data_frame(1, [1001], b"", flags=DataFlags.FIRST)[:HEADER_SIZE + 24],
                 RemoteProtocolError, ErrorCode.LIMIT, match="max_message=1000")
    assert allocations == []
    # Exactly max_message passes.
    s = server_open(max_message=1000)
    body = bytes(range(250)) * 4
    assert normalized(s.receive_data(data_frame(1, [1000], body))) == [
        ("message", 1, False, (("bytearray", body),), 1000)]


def test_nparts_over_max_parts(allocations):
    raw = data_frame(1, [0] * (MAX_PARTS + 1), b"")
    # Refused on the 16-byte descriptor head, before the 8 KiB of sizes arrive.
    assert_fails(server_open(), raw[: HEADER_SIZE + 16], RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="malformed message descriptor")
    assert_fails_all_ways(server_open, raw, RemoteProtocolError, ErrorCode.PROTOCOL)
    assert allocations == []


@pytest.mark.parametrize("raw, match", [
    (data_frame(1, [3], b"abc", reserved=1), "malformed message descriptor"),
    (data_frame(1, [3], b"abc", length=16 + 8 - 1), "malformed message descriptor"),
    (data_frame(1, [2, 2], b"abc", total=3), "disagree"),  # sizes sum to 4, total 3
    (data_frame(1, [3 | READONLY_BIT, 1], b"abc", total=3), "disagree"),
    (data_frame(1, [3], b"abcd", total=3), "disagree"),  # body longer than total
    (data_frame(1, [4], b"abc"), "disagree"),  # LAST but incomplete
    (data_frame(1, [3], b"abc", flags=DataFlags.FIRST), "disagree"),  # complete, no LAST
    (data_frame(1, [3], b"", flags=DataFlags.FIRST), "empty first chunk"),
    (data_frame(1, [], b"", flags=DataFlags.FIRST), "disagree"),  # empty message without LAST
    (data_frame(2, [1], b"a"), "out of order"),  # gap
    (data_frame(0, [1], b"a"), "out of order"),
    (chunk_frame(1, b"abc", last=True), "continuation without a first chunk"),
    (data_frame(1, [3], b"a", flags=DataFlags.FIRST) + chunk_frame(2, b"bc", last=True),
     "continuation without a first chunk"),  # wrong sequence number
    (data_frame(1, [3], b"a", flags=DataFlags.FIRST) + chunk_frame(1, b"", last=False),
     "chunk sizes disagree"),
    (data_frame(1, [3], b"a", flags=DataFlags.FIRST) + chunk_frame(1, b"bcd", last=True),
     "chunk sizes disagree"),
    (data_frame(1, [3], b"a", flags=DataFlags.FIRST) + chunk_frame(1, b"b", last=True),
     "chunk sizes disagree"),
    (data_frame(1, [3], b"a", flags=DataFlags.FIRST) + chunk_frame(1, b"bc", last=False),
     "chunk sizes disagree"),
    (data_frame(1, [3], b"a", flags=DataFlags.FIRST) + data_frame(2, [1], b"x"),
     "new message before the last one ended"),
    (data_frame(1, [3], b"a", flags=DataFlags.FIRST) + data_frame(1, [3], b"abc"),
     "new message before the last one ended"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_malformed_data(raw, match, allocations):
    assert_fails_all_ways(server_open, raw, RemoteProtocolError, ErrorCode.PROTOCOL,
                          match=match)
    assert all(size <= 3 for _, size in allocations)


def test_sequence_duplicate_and_gap_after_good_messages():
    pair = open_pair()
    first = send(pair.client, 1, [(1, True)])
    second = send(pair.client, 2, [(2, True)])
    good = pair.client.data_to_send()
    for bad, match in ((data_frame(2, [1], b"a"), "message 2 out of order (expected 3)"),
                       (data_frame(4, [1], b"a"), "message 4 out of order (expected 3)")):
        events = assert_fails_all_ways(server_open, good + bad, RemoteProtocolError,
                                       ErrorCode.PROTOCOL, match=match)
        assert events[:2] == [expected_message(1, first), expected_message(2, second)]


def test_good_message_then_garbage_in_one_call():
    stream, objects = message_stream([(10, True), (20, False)], False, None)
    garbage = b"\xee" * 40
    s = server_open()
    events = assert_fails(s, stream + garbage, RemoteProtocolError, ErrorCode.PROTOCOL,
                          match="unknown frame type 238", prefix_events=1)
    assert normalized(events[:1]) == [expected_message(1, objects)]
    assert feed_all_ways(server_open, stream + garbage)[0] == expected_message(1, objects)


@pytest.mark.parametrize("cut", ["header", "control", "descriptor", "body", "between-chunks",
                                 "direct-body"])
def test_eof_mid_frame(cut):
    big, _ = message_stream([(200_000, False)], False, None)
    chunked, _ = message_stream([(3000, True)], False, 1000)
    data = {
        "header": frame(FrameType.PING)[:9],
        "control": frame(FrameType.BYE, b"reason")[:20],
        "descriptor": data_frame(1, [5, 5], b"abcdefghij")[: HEADER_SIZE + 20],
        "body": data_frame(1, [5, 5], b"abcdefghij")[:-3],
        "between-chunks": split_frames(chunked)[0],
        "direct-body": big[: len(big) // 2],
    }[cut]
    events = feed_all_ways(server_open, data, bytewise=cut != "direct-body", eof=True)
    assert events == [("failed", "RemoteProtocolError", "connection closed mid-frame")]


def test_clean_eof():
    stream, objects = message_stream([(3, True)], False, None)
    s = server_open()
    assert normalized(s.receive_data(stream)) == [expected_message(1, objects)]
    assert s.receive_eof() == []
    assert s.state is ConnectionState.CLOSED
    assert s.receive_eof() == []
    assert s.receive_data(stream) == []
    assert connection(Role.SERVER).receive_eof() == []


def test_nothing_parsed_after_failure():
    s = server_open()
    stream, _ = message_stream([(3, True)], False, None)
    events = s.receive_data(frame(99) + stream)
    assert len(events) == 1 and isinstance(events[0], ConnectionFailed)
    assert s.receive_data(stream) == []
    assert s.receive_done(0) == []


# ----------------------------------------------------------------------------- session resume


def test_session_frames_carry_last_received():
    pair = open_pair(client_last=17, server_last=42, resumed=True)
    assert pair.server_events[-1] == SessionOpened(TOKEN, 17, False)
    assert pair.client_events[-1] == SessionOpened(TOKEN, 42, True)


def test_resume_continues_the_sequence():
    # Link 1: the client sends 1..5; the server receives only 1..3 before the link breaks.
    pair = open_pair()
    sent = [send(pair.client, seq, [(seq * 10, True)], seed=seq) for seq in range(1, 6)]
    chunks = split_frames(pair.client.data_to_send())
    events = pair.server.receive_data(b"".join(chunks[:3]) + chunks[3][:7])
    assert [e.seq for e in events] == [1, 2, 3]
    assert pair.server.receive_eof()[0].error.args[0] == "connection closed mid-frame"
    # Link 2: the server resumes and says it has everything up to 3. The session layer tells
    # the new link where numbering continues (netq.communicator does this on SessionOpened).
    pair = open_pair(client_last=0, server_last=3, resumed=True)
    assert pair.client_events[-1] == SessionOpened(TOKEN, 3, True)
    assert pair.server.expected_seq == 1  # a fresh Connection starts at 1...
    pair.server.expected_seq = 3 + 1  # ...until told otherwise
    # The client resends the unacknowledged messages from last_received + 1.
    for seq in (4, 5):
        send(pair.client, seq, [(seq * 10, True)], seed=seq)
    events = pair.server.receive_data(pair.client.data_to_send())
    assert normalized(events) == [expected_message(4, sent[3]), expected_message(5, sent[4])]
    # A duplicate of something already received is impossible to accept...
    pair = open_pair(server_last=3, resumed=True)
    pair.server.expected_seq = 4
    send(pair.client, 3, [(30, True)], seed=3)
    assert_fails(pair.server, pair.client.data_to_send(), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="message 3 out of order (expected 4)")
    # ...and so is a gap.
    pair = open_pair(server_last=3, resumed=True)
    pair.server.expected_seq = 4
    send(pair.client, 5, [(30, True)], seed=3)
    assert_fails(pair.server, pair.client.data_to_send(), RemoteProtocolError,
                 ErrorCode.PROTOCOL, match="message 5 out of order (expected 4)")


@pytest.mark.parametrize("same_token", [True, False])
def test_server_data_right_behind_its_session_reply(same_token):
    """The server's SESSION and its first DATA arrive in one read: the client's Connection
    numbers that DATA itself (resume: after what it asked with; a new session: from 1)."""
    client = connection(Role.CLIENT)
    server = connection(Role.SERVER)
    shuttle(client, server)
    client.send_session(TOKEN, 6, False)
    shuttle(client, server)
    reply_token = TOKEN if same_token else bytes(16)
    first = 7 if same_token else 1
    server.send_session(reply_token, 0, same_token)
    server.send_credit(0, 0)
    sent = send(server, first, [(100, True)], seed=1)
    data = server.data_to_send()

    def fresh():
        conn = connection(Role.CLIENT)
        peer = connection(Role.SERVER)
        shuttle(conn, peer)
        conn.send_session(TOKEN, 6, False)
        conn.data_to_send()
        return conn

    for events in (fresh().receive_data(data), feed_bytewise(fresh(), data)):
        assert normalized(events)[-1] == expected_message(first, sent)
        assert not any(isinstance(event, ConnectionFailed) for event in events)


def test_held_messages_shrink_the_new_links_credit():
    """A peer reconnecting to a receiver that still holds its messages gets the window minus
    what is held (bytes and messages), on both sides of the link, not a fresh window."""
    client = connection(Role.CLIENT, recv_window=1000, recv_messages=10)
    server = connection(Role.SERVER, recv_window=5000, recv_messages=50)
    shuttle(client, server)
    client.send_session(TOKEN, 0, False, held_bytes=400, held_messages=4)
    shuttle(client, server)
    assert client.recv_allowance_bytes == 600 and client.recv_allowance_messages == 6
    assert server.send_credit_bytes == 600 and server.send_credit_messages == 6
    server.send_session(TOKEN, 0, False, held_bytes=5000, held_messages=1)
    events, _ = shuttle(client, server)
    assert events == [SessionOpened(TOKEN, 0, False, 5000, 1)]
    assert server.recv_allowance_bytes == 0
    assert client.send_credit_bytes == 0 and not client.can_send_data  # wait for CREDIT
    server.send_credit(100, 0)
    shuttle(client, server)
    assert client.send_credit_bytes == 100 and client.can_send_data


def test_held_amounts_are_never_negative():
    client = connection(Role.CLIENT)
    server = connection(Role.SERVER)
    shuttle(client, server)
    with pytest.raises(LocalProtocolError):
        client.send_session(TOKEN, 0, False, held_bytes=-1)
