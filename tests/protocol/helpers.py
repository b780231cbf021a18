"""Shared tools for the sans-I/O protocol tests.

Everything here is deterministic: HELLOs carry fixed ids and nonces, so two pairs built with the
same arguments produce byte-identical streams. That is what lets one test feed the same bytes to
several fresh receivers (whole, byte by byte, at random split points) and compare the events.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

from netq._buffers import LARGE
from netq.protocol import frames
from netq.protocol.connection import Connection
from netq.protocol.events import (
    AckReceived,
    ByeReceived,
    ConnectionFailed,
    ConnectionState,
    CreditReceived,
    ErrorReceived,
    MessageReceived,
    PeerAuthenticated,
    PongReceived,
    SessionOpened,
)
from netq.protocol.frames import HEADER, HEADER_SIZE, VERSION, Hello, Role

CLIENT_ID = uuid.UUID("c0000000-0000-4000-8000-000000000001")
SERVER_ID = uuid.UUID("5e000000-0000-4000-8000-000000000002")
CLIENT_NONCE = bytes(range(0x10, 0x20))
SERVER_NONCE = bytes(range(0x20, 0x30))
TOKEN = bytes(range(0xA0, 0xB0))
KEY = b"correct horse battery staple"
UNLIMITED = frames.UNLIMITED_MESSAGES

DEFAULT_LIMITS = dict(
    max_message=64 * 1024 * 1024,
    max_frame=1024 * 1024,
    recv_window=1 << 40,
    recv_messages=UNLIMITED,
)


def make_hello(role: Role, *, auth: bool = False, version: int = VERSION,
               peer_id: uuid.UUID | None = None, nonce: bytes | None = None,
               **limits) -> Hello:
    """A HELLO with a fixed id and nonce per role (tests need byte-identical streams)."""
    values = dict(DEFAULT_LIMITS)
    values.update(limits)
    client = role == Role.CLIENT
    return Hello(
        version=version,
        role=role,
        auth=auth,
        id=peer_id or (CLIENT_ID if client else SERVER_ID),
        nonce=nonce or (CLIENT_NONCE if client else SERVER_NONCE),
        **values,
    )


def connection(role: Role, key: bytes | None = None, *, conn_kw: dict | None = None,
               **hello_kw) -> Connection:
    return Connection(make_hello(role, auth=key is not None, **hello_kw), key, **(conn_kw or {}))


def shuttle(a: Connection, b: Connection, rounds: int = 20) -> tuple[list, list]:
    """Move ``data_to_send()`` between two connections until both are quiet."""
    events_a: list = []
    events_b: list = []
    for _ in range(rounds):
        data_a = a.data_to_send()
        data_b = b.data_to_send()
        if not data_a and not data_b:
            break
        if data_a:
            events_b += b.receive_data(data_a)
        if data_b:
            events_a += a.receive_data(data_b)
    return events_a, events_b


@dataclass
class Pair:
    client: Connection
    server: Connection
    client_events: list = field(default_factory=list)
    server_events: list = field(default_factory=list)


def open_pair(client_key: bytes | None = None, server_key: bytes | None = None, *,
              client: dict | None = None, server: dict | None = None,
              client_conn: dict | None = None, server_conn: dict | None = None,
              token: bytes = TOKEN, client_last: int = 0, server_last: int = 0,
              resumed: bool = False) -> Pair:
    """A client and a server taken through HELLO (+AUTH) and both SESSION frames.

    ``client``/``server`` are HELLO fields (limits), ``*_conn`` are Connection options
    (``max_size``, ``merge_size``, ``efficient_size``).
    """
    c = connection(Role.CLIENT, client_key, conn_kw=client_conn, **(client or {}))
    s = connection(Role.SERVER, server_key, conn_kw=server_conn, **(server or {}))
    pair = Pair(c, s)
    ce, se = shuttle(c, s)
    pair.client_events += ce
    pair.server_events += se
    assert [type(e) for e in ce] == [PeerAuthenticated], ce
    assert [type(e) for e in se] == [PeerAuthenticated], se
    assert c.state is s.state is ConnectionState.SESSION
    c.send_session(token, client_last, False)
    ce, se = shuttle(c, s)
    assert se == [SessionOpened(token, client_last, False)], se
    assert s.state is ConnectionState.OPEN
    s.send_session(token, server_last, resumed)
    ce2, se2 = shuttle(c, s)
    assert ce + ce2 == [SessionOpened(token, server_last, resumed)], ce + ce2
    assert c.state is ConnectionState.OPEN
    pair.client_events += ce + ce2
    pair.server_events += se + se2
    return pair


# ----------------------------------------------------------------------------- messages


def server_open(**server_hello) -> Connection:
    """A fresh server that has completed the handshake (the receiver in most tests)."""
    return open_pair(server=server_hello).server


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def make_parts(specs, seed: int = 0) -> tuple[list[memoryview], list]:
    """``specs``: (size, readonly) pairs -> (views to send, the objects they view)."""
    views = []
    objects = []
    for index, (size, readonly) in enumerate(specs):
        data = payload(size, seed * 7919 + index)
        obj = data if readonly else bytearray(data)
        objects.append(obj)
        views.append(memoryview(obj))
    return views, objects


def send(conn: Connection, seq: int, specs, *, batch: bool = False, seed: int = 0) -> list:
    """Queue one message built from ``specs``; returns the part objects (expected content)."""
    views, objects = make_parts(specs, seed)
    conn.send_message(seq, views, sum(len(v) for v in views), batch)
    return objects


def expected_kind(obj) -> str:
    """What a part sent from ``obj`` arrives as (netq._buffers): writable ones as bytearray,
    read-only ones as bytes below LARGE and as read-only memoryviews from LARGE."""
    if type(obj) is bytearray:
        return "bytearray"
    return "bytes" if len(obj) < LARGE else "memoryview"


def kind(part) -> str:
    """A received part's kind, as expected_kind() names it (a writable view is an error)."""
    if type(part) is memoryview:
        return "memoryview" if part.readonly and part.format == "B" else "writable memoryview"
    return type(part).__name__


def expected_message(seq: int, objects, batch: bool = False) -> tuple:
    """The normalized form of the MessageReceived the receiver must produce."""
    return ("message", seq, batch, tuple((expected_kind(o), bytes(o)) for o in objects),
            sum(len(o) for o in objects))


# ----------------------------------------------------------------------------- events


def normalize(event) -> tuple:
    """A comparable form of an event: part types matter (bytes vs bytearray), identity not."""
    if isinstance(event, MessageReceived):
        return ("message", event.seq, event.batch,
                tuple((kind(p), bytes(p)) for p in event.parts), event.size)
    if isinstance(event, ConnectionFailed):
        return ("failed", type(event.error).__name__, str(event.error))
    if isinstance(event, CreditReceived):
        return ("credit", event.nbytes, event.messages)
    if isinstance(event, AckReceived):
        return ("ack", event.seq)
    if isinstance(event, PongReceived):
        return ("pong", event.token)
    if isinstance(event, ByeReceived):
        return ("bye", event.reason)
    if isinstance(event, ErrorReceived):
        return ("error", event.code, event.text)
    if isinstance(event, SessionOpened):
        return ("session", event.token, event.last_received, event.resumed)
    if isinstance(event, PeerAuthenticated):
        return ("authenticated", event.hello)
    raise AssertionError(f"unknown event {event!r}")


def normalized(events) -> list[tuple]:
    return [normalize(e) for e in events]


def check_terminal(events) -> None:
    """ConnectionFailed / ErrorReceived appear at most once, and only as the last event."""
    for index, event in enumerate(events):
        if isinstance(event, (ConnectionFailed, ErrorReceived)):
            assert index == len(events) - 1, f"terminal event not last: {events!r}"


# ----------------------------------------------------------------------------- feeding


def feed_whole(conn: Connection, data: bytes) -> list:
    return conn.receive_data(data)


def feed_bytewise(conn: Connection, data: bytes) -> list:
    events = []
    for i in range(len(data)):
        events += conn.receive_data(data[i : i + 1])
    return events


def feed_split(conn: Connection, data: bytes, cuts) -> list:
    """Feed ``data`` cut at the sorted positions ``cuts``."""
    events = []
    previous = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        if cut > previous:
            events += conn.receive_data(data[previous:cut])
            previous = cut
    return events


def feed_manual(conn: Connection, data: bytes, steps) -> list:
    """Drive ``receive_buffer``/``receive_done`` like a socket loop whose ``recv_into``
    returns at most ``steps[i % len(steps)]`` bytes per call."""
    events = []
    position = 0
    i = 0
    while position < len(data) and conn.state is not ConnectionState.CLOSED:
        target = conn.receive_buffer()
        assert len(target) > 0, "receive_buffer() returned an empty buffer"
        count = min(len(target), steps[i % len(steps)], len(data) - position)
        target[:count] = data[position : position + count]
        position += count
        i += 1
        events += conn.receive_done(count)
    return events


def random_cuts(length: int, rng: random.Random, count: int | None = None) -> list[int]:
    if length <= 1:
        return []
    if count is None:
        count = rng.randint(1, min(64, length - 1))
    return sorted(rng.sample(range(1, length), min(count, length - 1)))


def feed_all_ways(factory, data: bytes, *, bytewise: bool = True, seeds=(1, 2, 3),
                  steps=((1,), (7,), (4093,), (1, 65536, 3), (100_000,), (31, 32768, 32769)),
                  eof: bool = False) -> list[tuple]:
    """Feed ``data`` to fresh receivers from ``factory()`` in every way; all must agree.

    Returns the normalized events. With ``eof``, ``receive_eof()`` is called after the data
    and its events are included.
    """
    ways = [("whole", lambda c: feed_whole(c, data))]
    if bytewise:
        ways.append(("bytewise", lambda c: feed_bytewise(c, data)))
    for seed in seeds:
        rng = random.Random(seed)
        cuts = random_cuts(len(data), rng)
        ways.append((f"split{seed}", lambda c, cuts=cuts: feed_split(c, data, cuts)))
    for step in steps:
        ways.append((f"manual{step}", lambda c, step=step: feed_manual(c, data, step)))
    reference = None
    for name, way in ways:
        conn = factory()
        events = way(conn)
        if eof:
            events += conn.receive_eof()
        check_terminal(events)
        got = normalized(events)
        if reference is None:
            reference = got
        else:
            assert got == reference, f"feeding {name} differs from whole"
    return reference


# ----------------------------------------------------------------------------- frames


def split_frames(data: bytes) -> list[bytes]:
    """Cut a well-formed stream into whole frames (header + payload)."""
    out = []
    position = 0
    while position < len(data):
        length = HEADER.unpack_from(data, position)[3]
        out.append(bytes(data[position : position + HEADER_SIZE + length]))
        position += HEADER_SIZE + length
    assert position == len(data)
    return out


def frame_types(data: bytes) -> list[int]:
    return [f[0] for f in split_frames(data)]


def frame(frame_type: int, payload: bytes = b"", *, flags: int = 0, value: int = 0,
          reserved: int = 0, length: int | None = None) -> bytes:
    """A raw frame; ``length`` overrides the header's length field."""
    size = len(payload) if length is None else length
    return HEADER.pack(frame_type, flags, reserved, size, value) + payload


def data_frame(seq: int, sizes, body: bytes, *, flags: int = 0x03, total: int | None = None,
               nparts: int | None = None, reserved: int = 0, length: int | None = None) -> bytes:
    """A raw FIRST DATA frame (default FIRST|LAST) with a hand-made descriptor."""
    sizes = list(sizes)
    if total is None:
        total = sum(s & ~frames.READONLY_BIT for s in sizes)
    descriptor = frames.DESCRIPTOR.pack(total, len(sizes) if nparts is None else nparts,
                                        reserved)
    descriptor += b"".join(frames.PART_SIZE.pack(s) for s in sizes)
    return frame(frames.FrameType.DATA, descriptor + body, flags=flags, value=seq, length=length)


def chunk_frame(seq: int, body: bytes, *, last: bool) -> bytes:
    """A raw continuation DATA frame."""
    return frame(frames.FrameType.DATA, body, flags=0x02 if last else 0, value=seq)
