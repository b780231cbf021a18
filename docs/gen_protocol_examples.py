#!/usr/bin/env python3
"""Print annotated hex dumps of real netq frames, produced by netq.protocol.Connection.

    python3 docs/gen_protocol_examples.py

The output is pasted into docs/protocol.md ("Annotated example"). Ids, nonces and the session
token are fixed so that the dump is reproducible; real connections draw nonces from
os.urandom and session tokens at random.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from netq.protocol import frames
from netq.protocol.connection import Connection
from netq.protocol.frames import (
    HEADER,
    HEADER_SIZE,
    READONLY_BIT,
    FrameType,
    Hello,
    Role,
)

KEY = b"secret"
TOKEN = bytes.fromhex("7031c2a4b5e60718293a4b5c6d7e8f90")


def hello(role: Role) -> Hello:
    client = role == Role.CLIENT
    return Hello(
        version=frames.VERSION,
        role=role,
        auth=True,
        id=uuid.UUID("11111111-2222-4333-8444-555555555555" if client
                     else "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"),
        nonce=bytes(range(0x10, 0x20)) if client else bytes(range(0x80, 0x90)),
        max_message=64 * 1024 * 1024,
        max_frame=1024 * 1024,
        recv_window=8 * 1024 * 1024,
        recv_messages=frames.UNLIMITED_MESSAGES if client else 1000,
        array_parts=True,
    )


def hexs(data: bytes) -> str:
    return " ".join(f"{b:02x}" for b in data)


class Dump:
    def __init__(self) -> None:
        self.offset = 0

    def row(self, data: bytes, field: str, meaning: str = "") -> None:
        # Long fields wrap at 16 bytes per line; the annotation goes on the first line.
        for i in range(0, max(len(data), 1), 16):
            piece = data[i : i + 16]
            label = f"{field:<14}{meaning}" if i == 0 else ""
            print(f"  {self.offset + i:04x}  {hexs(piece):<47}  {label}".rstrip())
        self.offset += len(data)


def u(data: bytes) -> int:
    return int.from_bytes(data, "little")


def annotate(direction: str, raw: bytes) -> None:
    frame_type, flags, reserved, length, value = HEADER.unpack_from(raw)
    name = FrameType(frame_type).name
    payload = raw[HEADER_SIZE:]
    print(f"{direction}  {name}  ({len(raw)} bytes)")
    d = Dump()
    d.row(raw[0:1], "type", f"{frame_type} = {name}")
    flag_names = []
    if frame_type == FrameType.DATA:
        flag_names = [f.name for f in frames.DataFlags if flags & f]
    d.row(raw[1:2], "flags", "|".join(flag_names) if flag_names else "0")
    d.row(raw[2:4], "reserved", "0")
    d.row(raw[4:8], "length", f"{length} payload bytes")
    meaning = {
        FrameType.DATA: f"sequence number {value}",
        FrameType.CREDIT: f"{value} more bytes",
        FrameType.ACK: f"received everything up to {value}",
        FrameType.PING: f"token {value:#x}",
        FrameType.PONG: f"token {value:#x}",
        FrameType.ERROR: f"code {value}",
    }.get(frame_type, "0 (unused)")
    d.row(raw[8:16], "value", meaning)
    p = payload
    if frame_type == FrameType.HELLO:
        h = frames.decode_hello(p)
        d.row(p[0:4], "magic", '"NETQ"')
        d.row(p[4:6], "version", str(h.version))
        d.row(p[6:7], "role", h.role.name)
        names = [name for name, on in (("AUTH (an AUTH frame follows)", h.auth), ("SHM", h.shm),
                                       ("ARRAY_PARTS", h.array_parts)) if on]
        d.row(p[7:8], "flags", " | ".join(names) or "0")
        d.row(p[8:24], "id", str(h.id))
        d.row(p[24:40], "nonce", "fresh per connection")
        d.row(p[40:48], "max_message", f"{h.max_message} bytes")
        d.row(p[48:52], "max_frame", f"{h.max_frame} bytes")
        d.row(p[52:60], "recv_window", f"{h.recv_window} bytes of initial credit")
        d.row(p[60:64], "recv_messages",
              "unlimited" if h.recv_messages == frames.UNLIMITED_MESSAGES
              else f"{h.recv_messages} messages of initial credit")
    elif frame_type == FrameType.AUTH:
        d.row(p, "hmac", "HMAC-SHA256(authkey, ...)")
    elif frame_type == FrameType.SESSION:
        token, last, resumed, held_bytes, held_messages = frames.decode_session(p)
        d.row(p[0:16], "token", "session token")
        d.row(p[16:24], "last_received", str(last))
        d.row(p[24:25], "flags", "RESUMED" if resumed else "0 (new session)")
        d.row(p[25:32], "reserved", "0")
        d.row(p[32:40], "held_bytes", f"{held_bytes} bytes of the peer's still held")
        d.row(p[40:48], "held_messages", str(held_messages))
    elif frame_type == FrameType.DATA and flags & frames.DataFlags.FIRST:
        total, nparts, _ = frames.DESCRIPTOR.unpack_from(p)
        d.row(p[0:8], "total", f"{total} body bytes")
        d.row(p[8:12], "nparts", str(nparts))
        d.row(p[12:16], "reserved", "0")
        position = 16
        sizes = []
        for i in range(nparts):
            raw_size = u(p[position : position + 8])
            size = raw_size & (READONLY_BIT - 1)
            kind = "READONLY (bytes)" if raw_size & READONLY_BIT else "writable (bytearray)"
            d.row(p[position : position + 8], f"part[{i}]", f"{size} bytes, {kind}")
            sizes.append(size)
            position += 8
        body = p[position:]
        for i, size in enumerate(sizes):
            piece, body = body[:size], body[size:]
            if piece:
                d.row(piece, f"body[{i}]", repr(bytes(piece)))
        if body:
            d.row(body, "body", repr(bytes(body)))
    elif frame_type == FrameType.DATA:
        d.row(p, "body", repr(bytes(p)))
    elif frame_type == FrameType.CREDIT:
        d.row(p, "messages", f"{u(p)} more messages")
    elif frame_type in (FrameType.BYE, FrameType.ERROR) and p:
        d.row(p, "text", repr(p.decode()))
    print()


def mac_input(sender: Hello, receiver: Hello, digest: bytes) -> None:
    """The bytes the AUTH frame's HMAC-SHA256 covers, checked against the real digest."""
    message = (b"netq-auth-v1" + bytes((sender.role,)) + sender.id.bytes + receiver.nonce
               + sender.nonce)
    assert hmac.new(KEY, message, hashlib.sha256).digest() == digest
    print(f"HMAC-SHA256 input of that AUTH (key {KEY!r}), {len(message)} bytes:")
    d = Dump()
    d.row(message[0:12], "label", '"netq-auth-v1"')
    d.row(message[12:13], "role", f"sender's role, {sender.role.name}")
    d.row(message[13:29], "sender id", str(sender.id))
    d.row(message[29:45], "recv nonce", "the receiver's HELLO nonce (fresh: no replay)")
    d.row(message[45:61], "sender nonce", "the sender's own HELLO nonce")
    print()


def send(direction: str, data: bytes) -> None:
    position = 0
    while position < len(data):
        length = HEADER.unpack_from(data, position)[3]
        annotate(direction, data[position : position + HEADER_SIZE + length])
        position += HEADER_SIZE + length


def main() -> None:
    client = Connection(hello(Role.CLIENT), KEY, max_size=8)
    server = Connection(hello(Role.SERVER), KEY)
    c2s, s2c = "client -> server", "server -> client"

    print("== Handshake (both sides hold the authkey b'secret') ==\n")
    c_hello, s_hello = client.data_to_send(), server.data_to_send()
    send(c2s, c_hello)
    send(s2c, s_hello)
    server.receive_data(c_hello)
    s_auth = server.data_to_send()
    send(s2c, s_auth)
    mac_input(server.local, client.local, s_auth[HEADER_SIZE:])
    client.receive_data(s_hello + s_auth)
    c_auth = client.data_to_send()
    send(c2s, c_auth)
    mac_input(client.local, server.local, c_auth[HEADER_SIZE:])
    server.receive_data(c_auth)
    client.send_session(TOKEN, 0, False)
    data = client.data_to_send()
    send(c2s, data)
    server.receive_data(data)
    server.send_session(TOKEN, 0, False)
    data = server.data_to_send()
    send(s2c, data)
    client.receive_data(data)

    print("== A message of two parts: b'hello' (bytes) and bytearray(b'netq!') ==\n")
    server.send_message(1, [memoryview(b"hello"), memoryview(bytearray(b"netq!"))], 10, False)
    data = server.data_to_send()
    send(s2c, data)
    client.receive_data(data)
    client.send_ack(1)
    client.send_credit(10, 0)
    data = client.data_to_send()
    send(c2s, data)
    server.receive_data(data)

    print("== The same message from the client, whose max_size is 8: two chunks ==\n")
    client.send_message(1, [memoryview(b"hello"), memoryview(bytearray(b"netq!"))], 10, True)
    data = client.data_to_send()
    send(c2s, data)
    server.receive_data(data)
    server.send_ack(1)
    server.send_credit(10, 1)
    server.send_ping(0x1234)
    data = server.data_to_send()
    send(s2c, data)
    client.receive_data(data)
    data = client.data_to_send()
    send(c2s, data)

    print("== Goodbye ==\n")
    client.send_bye("done")
    send(c2s, client.data_to_send())

    print("== A refused AUTH: what a side sends when the peer's proof is wrong ==\n")
    bad = Connection(hello(Role.SERVER), b"wrong")
    other = Connection(hello(Role.CLIENT), KEY)
    bad.receive_data(other.data_to_send())
    other.receive_data(bad.data_to_send())
    bad.data_to_send()
    bad.receive_data(other.data_to_send())
    send(s2c, bad.data_to_send())
    assert struct.calcsize("<BBHIQ") == HEADER_SIZE


if __name__ == "__main__":
    main()
