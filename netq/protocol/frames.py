"""netq wire frames: layouts, limits and encoders. No I/O, no state.

Every frame starts with the same 16-byte header (little-endian)::

    offset  size  field
    0       1     type      FrameType
    1       1     flags     type-specific bits (DATA: FIRST, LAST, BATCH, FOLLOWS)
    2       2     reserved  must be 0
    4       4     length    payload bytes that follow the header
    8       8     value     type-specific (DATA: message sequence number, CREDIT: bytes,
                            ACK: cumulative sequence number, PING/PONG: token, ERROR: code)

``docs/protocol.md`` is the byte-by-byte specification with the reasons; this module is its
executable form. Limits are checked on the header alone, before any payload is read or any
buffer allocated for it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import struct
import uuid
from dataclasses import dataclass

__all__ = [
    "VERSION",
    "make_hello",
    "MAGIC",
    "HEADER",
    "HEADER_SIZE",
    "FrameType",
    "DataFlags",
    "ErrorCode",
    "Role",
    "Hello",
    "HELLO",
    "SESSION",
    "DESCRIPTOR",
    "PART_SIZE",
    "READONLY_BIT",
    "SEGMENT_BIT",
    "ARRAY_BIT",
    "PART_SIZE_MASK",
    "MAX_PARTS",
    "MAX_TEXT",
    "AUTH_SIZE",
    "CREDIT_PAYLOAD",
    "UNLIMITED_MESSAGES",
    "encode_header",
    "encode_hello",
    "decode_hello",
    "encode_session",
    "decode_session",
    "encode_descriptor",
    "sole_data_frame_head",
    "auth_digest",
    "max_payload",
    "WHOLE_MESSAGE",
    "whole_message_layout",
    "ONE_PART",
    "ONE_PART_DESCRIPTOR",
]

VERSION = 1
MAGIC = b"NETQ"

HEADER = struct.Struct("<BBHIQ")
HEADER_SIZE = HEADER.size  # 16

# HELLO: magic, version, role, flags, id, nonce, max_message, max_frame, recv_window,
# recv_messages. Fixed size: a HELLO of any other length is a protocol error.
HELLO = struct.Struct("<4sHBB16s16sQIQI")
HELLO_FLAG_AUTH = 0x01  # the sender holds an authkey and will send AUTH
# The sender takes message parts in shared-memory segments (descriptors passed with the
# frames, SCM_RIGHTS): set only over a carrier that passes descriptors (Unix sockets).
HELLO_FLAG_SHM = 0x02
# The sender reads ARRAY_BIT in part sizes. Peers that predate it ignore the flag, and are
# never sent the bit.
HELLO_FLAG_ARRAY_PARTS = 0x04

# SESSION: token, last sequence number received from the peer, flags (bit 0: resumed), then
# the bytes and messages of the peer's that the sender still holds (received, not released):
# the peer's credit on this link starts that much below the window it was granted.
SESSION = struct.Struct("<16sQB7xQQ")
SESSION_FLAG_RESUMED = 0x01

# DATA, first chunk: total body size, number of parts, reserved; then one u64 per part.
DESCRIPTOR = struct.Struct("<QII")
PART_SIZE = struct.Struct("<Q")
READONLY_BIT = 1 << 63  # set in a part size: the sender's buffer was read-only (bytes)
# Set in a part size: the part's bytes are not in the frame body but in a shared-memory segment
# whose descriptor came with the frames (the next one not claimed yet). Only between peers
# whose HELLOs both set HELLO_FLAG_SHM.
SEGMENT_BIT = 1 << 62
# Set in a writable part's size: the sender's buffer was not a bytearray (an array's memory),
# so the receiver may hold the part in any writable buffer (a memory map: no zero-filling
# pass before the bytes arrive) rather than a bytearray. Only to peers whose HELLO set
# HELLO_FLAG_ARRAY_PARTS.
ARRAY_BIT = 1 << 61
# A part's size in bytes without its READONLY and ARRAY bits. SEGMENT_BIT stays in: where
# segments are not expected, a part that claims one fails the descriptor's size check.
PART_SIZE_MASK = (1 << 64) - 1 - READONLY_BIT - ARRAY_BIT
MAX_PARTS = 1024  # pickle's out-of-band buffers per message; a descriptor is <= 8 KiB + 16
MAX_DESCRIPTOR = DESCRIPTOR.size + MAX_PARTS * PART_SIZE.size

CREDIT_PAYLOAD = struct.Struct("<I")  # messages granted; the byte grant is in the header value
UNLIMITED_MESSAGES = 0xFFFFFFFF  # in HELLO.recv_messages: no message-count limit

AUTH_SIZE = 32  # HMAC-SHA256
MAX_TEXT = 1024  # BYE reason, ERROR text: UTF-8 bytes

MAX_SEQ = (1 << 64) - 1


class FrameType(enum.IntEnum):
    HELLO = 1  # version, identity, limits, initial credit
    AUTH = 2  # authkey proof over the peer's nonce
    SESSION = 3  # resume token and the last message received
    DATA = 4  # one chunk of a message
    CREDIT = 5  # receiver grants bytes (value) and messages (payload)
    ACK = 6  # every message up to sequence number `value` has been received
    BYE = 7  # graceful close: the sender puts no more data
    PING = 8  # liveness probe, answered by PONG with the same value
    PONG = 9
    ERROR = 10  # the sender is about to close this connection, `value` says why


class DataFlags(enum.IntFlag):
    FIRST = 0x01  # payload starts with the message descriptor
    LAST = 0x02  # the message is complete after this chunk
    BATCH = 0x04  # (FIRST only) the message is a put_many batch
    # (FIRST only) another message is queued behind this one: its receiver may acknowledge
    # both with one ACK (docs/protocol.md, section 9)
    FOLLOWS = 0x08


class ErrorCode(enum.IntEnum):
    PROTOCOL = 1  # malformed frame or frame not allowed in this state
    VERSION = 2  # unsupported protocol version
    AUTHENTICATION = 3  # authkey missing or wrong
    LIMIT = 4  # a frame or message over the advertised limits, or flow control violated
    SHUTDOWN = 5  # the communicator is closing
    REPLACED = 6  # a newer connection took over this session


class Role(enum.IntEnum):
    SERVER = 0
    CLIENT = 1


@dataclass(frozen=True, slots=True)
class Hello:
    """A decoded HELLO payload."""

    version: int
    role: Role
    auth: bool
    id: uuid.UUID
    nonce: bytes
    max_message: int  # largest message body the sender accepts, bytes
    max_frame: int  # largest DATA payload the sender accepts (plus a descriptor), bytes
    recv_window: int  # initial byte credit granted to the receiver of this HELLO
    recv_messages: int  # initial message credit (UNLIMITED_MESSAGES: none)
    shm: bool = False  # takes parts in shared-memory segments (HELLO_FLAG_SHM)
    array_parts: bool = False  # reads ARRAY_BIT in part sizes (HELLO_FLAG_ARRAY_PARTS)


# Largest payload accepted per frame type, before looking at the payload. DATA is bounded by
# the receiver's own max_frame (see max_payload).
# Keyed by int: the parser looks the raw type byte up (FrameType members hash as their value).
_FIXED_LIMITS: dict[int, int] = {
    FrameType.HELLO: HELLO.size,
    FrameType.AUTH: AUTH_SIZE,
    FrameType.SESSION: SESSION.size,
    FrameType.CREDIT: CREDIT_PAYLOAD.size,
    FrameType.ACK: 0,
    FrameType.BYE: MAX_TEXT,
    FrameType.PING: 0,
    FrameType.PONG: 0,
    FrameType.ERROR: MAX_TEXT,
}
# Frames whose payload must have exactly the limit's length.
EXACT_LENGTH = frozenset(
    (FrameType.HELLO, FrameType.AUTH, FrameType.SESSION, FrameType.CREDIT)
)


def max_payload(frame_type: int, max_frame: int) -> int:
    """The largest payload a frame of this type may carry, given our advertised max_frame."""
    if frame_type == FrameType.DATA:
        return max_frame + MAX_DESCRIPTOR
    return _FIXED_LIMITS[frame_type]


def encode_header(frame_type: int, flags: int, length: int, value: int) -> bytes:
    return HEADER.pack(frame_type, flags, 0, length, value)


def encode_hello(hello: Hello) -> bytes:
    payload = HELLO.pack(
        MAGIC,
        hello.version,
        hello.role,
        (HELLO_FLAG_AUTH if hello.auth else 0) | (HELLO_FLAG_SHM if hello.shm else 0)
        | (HELLO_FLAG_ARRAY_PARTS if hello.array_parts else 0),
        hello.id.bytes,
        hello.nonce,
        hello.max_message,
        hello.max_frame,
        hello.recv_window,
        hello.recv_messages,
    )
    return encode_header(FrameType.HELLO, 0, len(payload), 0) + payload


def new_nonce() -> bytes:
    return os.urandom(16)


def make_hello(role: Role, peer_id: uuid.UUID, *, auth: bool, max_message: int, max_frame: int,
               recv_window: int, recv_messages: int, shm: bool = False) -> Hello:
    """Our HELLO, with a fresh nonce (it reads ARRAY_BIT: parts are allocated by kind)."""
    return Hello(
        version=VERSION,
        role=role,
        auth=auth,
        id=peer_id,
        nonce=new_nonce(),
        max_message=max_message,
        max_frame=max_frame,
        recv_window=recv_window,
        recv_messages=recv_messages,
        shm=shm,
        array_parts=True,
    )


def decode_hello(payload: bytes) -> Hello:
    """Decode a HELLO payload; raises ValueError on a wrong magic or role."""
    (magic, version, role, flags, peer_id, nonce, max_message, max_frame, window,
     messages) = HELLO.unpack(payload)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic!r}")
    return Hello(
        version=version,
        role=Role(role),
        auth=bool(flags & HELLO_FLAG_AUTH),
        id=uuid.UUID(bytes=peer_id),
        nonce=nonce,
        max_message=max_message,
        max_frame=max_frame,
        recv_window=window,
        recv_messages=messages,
        shm=bool(flags & HELLO_FLAG_SHM),
        array_parts=bool(flags & HELLO_FLAG_ARRAY_PARTS),
    )


def encode_session(token: bytes, last_received: int, resumed: bool, held_bytes: int = 0,
                   held_messages: int = 0) -> bytes:
    payload = SESSION.pack(token, last_received, SESSION_FLAG_RESUMED if resumed else 0,
                           held_bytes, held_messages)
    return encode_header(FrameType.SESSION, 0, len(payload), 0) + payload


def decode_session(payload: bytes) -> tuple[bytes, int, bool, int, int]:
    token, last_received, flags, held_bytes, held_messages = SESSION.unpack(payload)
    return token, last_received, bool(flags & SESSION_FLAG_RESUMED), held_bytes, held_messages


def encode_descriptor(total: int, sizes: list[int]) -> bytes:
    """The descriptor that starts a message's first chunk (sizes carry READONLY_BIT)."""
    return DESCRIPTOR.pack(total, len(sizes), 0) + struct.pack(f"<{len(sizes)}Q", *sizes)


_DATA = FrameType.DATA.value
_FIRST = DataFlags.FIRST.value


def sole_data_frame_head(view: memoryview) -> int:
    """The bytes before the body of the DATA frame that is all of ``view`` (its header, and
    for a first chunk its descriptor); 0 when ``view`` is not exactly one DATA frame or its
    descriptor cannot be read (the parser then says what is wrong with it)."""
    if len(view) < HEADER.size:
        return 0
    frame_type, flags, _, length, _ = HEADER.unpack_from(view)
    if frame_type != _DATA or HEADER.size + length != len(view):
        return 0
    if not flags & _FIRST:  # ints: an enum flag in `&` costs Python calls per packet
        return HEADER.size
    if len(view) < HEADER.size + DESCRIPTOR.size:
        return 0
    nparts = DESCRIPTOR.unpack_from(view, HEADER.size)[1]
    return HEADER.size + DESCRIPTOR.size + PART_SIZE.size * nparts if nparts <= MAX_PARTS else 0


# Header and descriptor of a whole (one-chunk) message, packed or unpacked in one call: the
# shape of almost every small message. By part count, filled as counts occur (at most
# MAX_PARTS of them).
WHOLE_MESSAGE: dict[int, struct.Struct] = {}


def whole_message_layout(nparts: int) -> struct.Struct:
    """The header and descriptor of a one-chunk message of ``nparts`` parts, as one layout."""
    layout = WHOLE_MESSAGE[nparts] = struct.Struct(f"<BBHIQQII{nparts}Q")
    return layout


ONE_PART = whole_message_layout(1)
ONE_PART_DESCRIPTOR = DESCRIPTOR.size + PART_SIZE.size  # a one-part message's descriptor


def auth_digest(key: bytes, role: int, sender_id: uuid.UUID, receiver_nonce: bytes,
                sender_nonce: bytes) -> bytes:
    """Proof that the sender of a HELLO holds ``key``.

    Binding the sender's role and id stops a reflected or relayed proof from being accepted
    for another identity; the receiver's fresh nonce stops replay.
    """
    message = b"netq-auth-v1" + bytes((role,)) + sender_id.bytes + receiver_nonce + sender_nonce
    return hmac.new(key, message, hashlib.sha256).digest()
