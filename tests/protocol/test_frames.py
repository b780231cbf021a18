"""netq.protocol.frames: the wire constants, layouts and encoders (no state)."""

from __future__ import annotations

import hashlib
import hmac
import struct
import uuid

import pytest
from hypothesis import given, settings, strategies as st

from netq.protocol import frames
from netq.protocol.frames import (
    DESCRIPTOR,
    HEADER,
    HEADER_SIZE,
    HELLO,
    MAGIC,
    MAX_PARTS,
    READONLY_BIT,
    SESSION,
    DataFlags,
    ErrorCode,
    FrameType,
    Hello,
    Role,
)

HYPOTHESIS = settings(derandomize=True, database=None, deadline=None, max_examples=200)

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)


# ----------------------------------------------------------------------------- constants


def test_wire_constants_are_frozen():
    # Changing any of these breaks interoperability: they are the specification.
    assert frames.VERSION == 1
    assert MAGIC == b"NETQ"
    assert HEADER_SIZE == 16
    assert HELLO.size == 64
    assert SESSION.size == 48
    assert DESCRIPTOR.size == 16
    assert frames.PART_SIZE.size == 8
    assert frames.CREDIT_PAYLOAD.size == 4
    assert frames.AUTH_SIZE == 32
    assert MAX_PARTS == 1024
    assert frames.MAX_DESCRIPTOR == 16 + 1024 * 8
    assert frames.MAX_TEXT == 1024
    assert READONLY_BIT == 1 << 63
    assert frames.UNLIMITED_MESSAGES == 0xFFFFFFFF
    assert {t.name: t.value for t in FrameType} == {
        "HELLO": 1, "AUTH": 2, "SESSION": 3, "DATA": 4, "CREDIT": 5, "ACK": 6, "BYE": 7,
        "PING": 8, "PONG": 9, "ERROR": 10,
    }
    assert {f.name: f.value for f in DataFlags} == {"FIRST": 1, "LAST": 2, "BATCH": 4,
                                                 "FOLLOWS": 8}
    assert {c.name: c.value for c in ErrorCode} == {
        "PROTOCOL": 1, "VERSION": 2, "AUTHENTICATION": 3, "LIMIT": 4, "SHUTDOWN": 5,
        "REPLACED": 6,
    }
    assert Role.SERVER == 0 and Role.CLIENT == 1


def test_header_layout_is_little_endian():
    raw = frames.encode_header(FrameType.DATA, 0x03, 0x01020304, 0x0102030405060708)
    assert raw == bytes([4, 3, 0, 0, 4, 3, 2, 1, 8, 7, 6, 5, 4, 3, 2, 1])
    assert HEADER.unpack(raw) == (4, 3, 0, 0x01020304, 0x0102030405060708)


@given(t=u8, flags=u8, length=u32, value=u64)
@HYPOTHESIS
def test_header_round_trip(t, flags, length, value):
    raw = frames.encode_header(t, flags, length, value)
    assert len(raw) == HEADER_SIZE
    assert HEADER.unpack(raw) == (t, flags, 0, length, value)


# ----------------------------------------------------------------------------- HELLO

hellos = st.builds(
    Hello,
    version=u16,
    role=st.sampled_from(Role),
    auth=st.booleans(),
    id=st.builds(uuid.UUID, int=st.integers(0, (1 << 128) - 1)),
    nonce=st.binary(min_size=16, max_size=16),
    max_message=u64,
    max_frame=u32,
    recv_window=u64,
    recv_messages=u32,
    shm=st.booleans(),
    array_parts=st.booleans(),
)


@given(hellos)
@HYPOTHESIS
def test_hello_round_trip(hello):
    raw = frames.encode_hello(hello)
    assert len(raw) == HEADER_SIZE + HELLO.size
    assert HEADER.unpack_from(raw) == (FrameType.HELLO, 0, 0, HELLO.size, 0)
    assert frames.decode_hello(raw[HEADER_SIZE:]) == hello


def test_hello_byte_layout():
    hello = Hello(version=1, role=Role.CLIENT, auth=True, id=uuid.UUID(int=0x1122),
                  nonce=bytes(range(16)), max_message=0x0A0B, max_frame=0x0C0D,
                  recv_window=0x0E0F, recv_messages=0xFFFFFFFF)
    p = frames.encode_hello(hello)[HEADER_SIZE:]
    assert p[0:4] == b"NETQ"
    assert p[4:6] == b"\x01\x00"  # version u16
    assert p[6] == 1  # role
    assert p[7] == frames.HELLO_FLAG_AUTH
    assert p[8:24] == uuid.UUID(int=0x1122).bytes  # RFC 4122 byte order (big-endian)
    assert p[24:40] == bytes(range(16))
    assert p[40:48] == (0x0A0B).to_bytes(8, "little")
    assert p[48:52] == (0x0C0D).to_bytes(4, "little")
    assert p[52:60] == (0x0E0F).to_bytes(8, "little")
    assert p[60:64] == b"\xff\xff\xff\xff"


def test_hello_flags_say_what_the_sender_reads():
    base = dict(version=1, role=Role.SERVER, auth=False, id=uuid.UUID(int=1), nonce=bytes(16),
                max_message=1, max_frame=1, recv_window=1, recv_messages=1)
    for shm, array_parts, flags in [(False, False, 0), (True, False, 0x02),
                                    (False, True, 0x04), (True, True, 0x06)]:
        hello = Hello(**base, shm=shm, array_parts=array_parts)
        payload = frames.encode_hello(hello)[HEADER_SIZE:]
        assert payload[7] == flags
        assert frames.decode_hello(payload) == hello
    # A peer that predates a flag leaves it clear: it reads neither segments nor ARRAY_BIT.
    old = frames.decode_hello(frames.encode_hello(Hello(**base))[HEADER_SIZE:])
    assert not old.shm and not old.array_parts


def test_hello_bad_magic():
    raw = bytearray(frames.encode_hello(Hello(1, Role.SERVER, False, uuid.UUID(int=1),
                                              bytes(16), 1, 1, 1, 1))[HEADER_SIZE:])
    raw[0:4] = b"NETZ"
    with pytest.raises(ValueError, match="magic"):
        frames.decode_hello(bytes(raw))


def test_hello_bad_role():
    raw = bytearray(frames.encode_hello(Hello(1, Role.SERVER, False, uuid.UUID(int=1),
                                              bytes(16), 1, 1, 1, 1))[HEADER_SIZE:])
    raw[6] = 2
    with pytest.raises(ValueError):
        frames.decode_hello(bytes(raw))


def test_hello_wrong_length_is_struct_error():
    with pytest.raises(struct.error):
        frames.decode_hello(b"NETQ" + bytes(10))


# ----------------------------------------------------------------------------- SESSION


@given(token=st.binary(min_size=16, max_size=16), last=u64, resumed=st.booleans(),
       held_bytes=u64, held_messages=u64)
@HYPOTHESIS
def test_session_round_trip(token, last, resumed, held_bytes, held_messages):
    raw = frames.encode_session(token, last, resumed, held_bytes, held_messages)
    assert len(raw) == HEADER_SIZE + 48
    assert HEADER.unpack_from(raw) == (FrameType.SESSION, 0, 0, 48, 0)
    payload = raw[HEADER_SIZE:]
    assert payload[0:16] == token
    assert payload[16:24] == last.to_bytes(8, "little")
    assert payload[24] == (1 if resumed else 0)
    assert payload[25:32] == bytes(7)
    assert payload[32:40] == held_bytes.to_bytes(8, "little")
    assert payload[40:48] == held_messages.to_bytes(8, "little")
    assert frames.decode_session(payload) == (token, last, resumed, held_bytes, held_messages)


# ----------------------------------------------------------------------------- descriptor


@given(st.lists(st.tuples(st.integers(0, (1 << 63) - 1), st.booleans()), max_size=MAX_PARTS))
@settings(derandomize=True, database=None, deadline=None, max_examples=60)
def test_descriptor_round_trip(parts):
    sizes = [s | READONLY_BIT if ro else s for s, ro in parts]
    total = sum(s for s, _ in parts)
    raw = frames.encode_descriptor(total, sizes)
    assert len(raw) == DESCRIPTOR.size + 8 * len(sizes) <= frames.MAX_DESCRIPTOR
    got_total, nparts, reserved = DESCRIPTOR.unpack_from(raw)
    assert (got_total, nparts, reserved) == (total, len(sizes), 0)
    got = struct.unpack_from(f"<{nparts}Q", raw, DESCRIPTOR.size)
    assert [(g & ~READONLY_BIT, bool(g & READONLY_BIT)) for g in got] == parts


def test_descriptor_byte_layout():
    raw = frames.encode_descriptor(5, [3 | READONLY_BIT, 2])
    assert raw == (
        (5).to_bytes(8, "little") + (2).to_bytes(4, "little") + bytes(4)
        + bytes([3, 0, 0, 0, 0, 0, 0, 0x80]) + bytes([2, 0, 0, 0, 0, 0, 0, 0])
    )


def test_empty_descriptor():
    assert frames.encode_descriptor(0, []) == bytes(16)


# ----------------------------------------------------------------------------- limits


@pytest.mark.parametrize("frame_type, limit", [
    (FrameType.HELLO, 64),
    (FrameType.AUTH, 32),
    (FrameType.SESSION, 48),
    (FrameType.CREDIT, 4),
    (FrameType.ACK, 0),
    (FrameType.BYE, 1024),
    (FrameType.PING, 0),
    (FrameType.PONG, 0),
    (FrameType.ERROR, 1024),
])
def test_max_payload_control(frame_type, limit):
    assert frames.max_payload(frame_type, 0) == limit
    assert frames.max_payload(frame_type, 1 << 30) == limit  # independent of max_frame


@pytest.mark.parametrize("max_frame", [0, 1, 1000, 1 << 20, 0xFFFFFFFF])
def test_max_payload_data(max_frame):
    assert frames.max_payload(FrameType.DATA, max_frame) == max_frame + 16 + 1024 * 8


def test_exact_length_types():
    assert frames.EXACT_LENGTH == {FrameType.HELLO, FrameType.AUTH, FrameType.SESSION,
                                   FrameType.CREDIT}


def test_max_payload_unknown_type():
    with pytest.raises(KeyError):
        frames.max_payload(0, 1000)


# ----------------------------------------------------------------------------- AUTH


def test_auth_digest_known_answer():
    key = b"k"
    sender = uuid.UUID(int=7)
    receiver_nonce = b"R" * 16
    sender_nonce = b"S" * 16
    expected = hmac.new(key, b"netq-auth-v1" + b"\x01" + sender.bytes + receiver_nonce
                        + sender_nonce, hashlib.sha256).digest()
    assert frames.auth_digest(key, Role.CLIENT, sender, receiver_nonce, sender_nonce) == expected
    assert len(expected) == frames.AUTH_SIZE


def test_auth_digest_binds_every_input():
    args = (b"k", Role.CLIENT, uuid.UUID(int=7), b"R" * 16, b"S" * 16)
    base = frames.auth_digest(*args)
    variants = [
        (b"K", *args[1:]),
        (args[0], Role.SERVER, *args[2:]),
        (*args[:2], uuid.UUID(int=8), *args[3:]),
        (*args[:3], b"r" * 16, args[4]),
        (*args[:4], b"s" * 16),
        (*args[:3], args[4], args[3]),  # nonces swapped: a reflected proof
    ]
    assert all(frames.auth_digest(*v) != base for v in variants)
