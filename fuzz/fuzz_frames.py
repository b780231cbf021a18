#!/usr/bin/env python3
"""Fuzz the netq frame parser: random bytes into a server-side sans-I/O ``Connection``.

    python3 fuzz/fuzz_frames.py --smoke 2000 [--seed 1]      # plain Python, no atheris
    python3 fuzz/fuzz_frames.py --write-corpus DIR [--seed 1] # valid streams to start from
    python3 fuzz/fuzz_frames.py DIR -max_total_time=120       # atheris / libFuzzer

One input is ``mode byte, step byte, stream``. The mode picks the receiver: a server that has
completed the handshake (bit 0) or a fresh one that parses HELLO/AUTH/SESSION first, with or
without an authkey (bit 1), with a small credit window or unlimited credit (bit 2). The stream
is fed twice to two identical receivers: whole, and in pieces of ``step`` bytes through
``receive_buffer``/``receive_done`` (step 0: byte by byte for short inputs). Checked:

* nothing escapes ``receive_data``/``receive_done``/``receive_eof`` (a crash is a finding);
* both feeds produce the same events (parsing does not depend on how bytes are cut);
* ``ConnectionFailed``/``ErrorReceived`` appear at most once, and only as the last event; after
  ``ConnectionFailed`` the connection is CLOSED and exactly one ERROR frame ends its output;
  the error is a ``RemoteProtocolError`` or ``AuthenticationError``, never anything else;
* once closed, more bytes and EOF yield no event;
* every ``_buffers.allocate_*`` size is <= the advertised ``max_message``, and all bytes ever
  allocated or delivered stay within ``recv_window + max_message`` (credit bound: a message may
  only start while credit is positive);
* messages have consecutive sequence numbers from 1, ``size == sum(len(parts))``, parts are
  ``bytes``/``bytearray``.

The smoke mode builds inputs from valid client streams (handshake, messages, CREDIT/ACK/PING,
BYE) with random mutations, plus plain random bytes, so it reaches deep states without
coverage guidance.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Filled by setup(): imported inside atheris.instrument_imports() when fuzzing for coverage.
connection = protocol_events = sending = frames = _buffers = exceptions = None

KEY = b"fuzz key"
CLIENT_ID = uuid.UUID(int=0xC1)
SERVER_ID = uuid.UUID(int=0x5E)
CLIENT_NONCE = bytes(range(16))
SERVER_NONCE = bytes(range(16, 32))
TOKEN = b"T" * 16

MAX_MESSAGE = 512 * 1024
MAX_FRAME = 16 * 1024
SMALL_WINDOW = 96 * 1024
SMALL_MESSAGES = 6
BYTEWISE_LIMIT = 4096  # step 0 feeds byte by byte only below this many bytes
STREAM_BUDGET = 200_000  # message bytes per generated stream

MODE_OPEN = 0x01
MODE_KEY = 0x02
MODE_LIMITED = 0x04
MODES = 8


def setup(instrument: bool = False) -> None:
    global connection, protocol_events, sending, frames, _buffers, exceptions
    if connection is not None:
        return
    if instrument:
        import atheris

        with atheris.instrument_imports(include=["netq"]):
            import netq._buffers
            import netq.exceptions
            import netq.protocol.connection
            import netq.protocol.events
            import netq.protocol.frames
            import netq.protocol.sending
    else:
        import netq._buffers
        import netq.exceptions
        import netq.protocol.connection
        import netq.protocol.events
        import netq.protocol.frames
        import netq.protocol.sending
    connection = netq.protocol.connection
    protocol_events = netq.protocol.events
    sending = netq.protocol.sending
    frames = netq.protocol.frames
    _buffers = netq._buffers
    exceptions = netq.exceptions


# ----------------------------------------------------------------------------- receivers


def _hello(role, mode: int):
    limited = mode & MODE_LIMITED
    client = role == frames.Role.CLIENT
    return frames.Hello(
        version=frames.VERSION,
        role=role,
        auth=bool(mode & MODE_KEY),
        id=CLIENT_ID if client else SERVER_ID,
        nonce=CLIENT_NONCE if client else SERVER_NONCE,
        max_message=MAX_MESSAGE,
        max_frame=MAX_FRAME,
        recv_window=SMALL_WINDOW if limited else 1 << 40,
        recv_messages=SMALL_MESSAGES if limited else frames.UNLIMITED_MESSAGES,
    )


def _pair(mode: int, max_size: int = 4 * 1024 * 1024):
    """A deterministic (client, server); opened through SESSION when MODE_OPEN is set."""
    key = KEY if mode & MODE_KEY else None
    client = connection.Connection(_hello(frames.Role.CLIENT, mode), key, max_size=max_size)
    server = connection.Connection(_hello(frames.Role.SERVER, mode), key)
    if mode & MODE_OPEN:
        _shuttle(client, server)
        client.send_session(TOKEN, 0, False)
        _shuttle(client, server)
        server.send_session(TOKEN, 0, False)
        _shuttle(client, server)
        assert client.state is server.state is protocol_events.ConnectionState.OPEN
    return client, server


def _shuttle(a, b) -> None:
    for _ in range(10):
        data_a, data_b = a.data_to_send(), b.data_to_send()
        if not data_a and not data_b:
            return
        b.receive_data(data_a)
        a.receive_data(data_b)


def new_receiver(mode: int):
    server = _pair(mode)[1]
    server.data_to_send()
    return server


# ----------------------------------------------------------------------------- checking


class _Allocations:
    """Records _buffers.allocate_* sizes while active (restored afterwards)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    @contextlib.contextmanager
    def active(self):
        module = connection._buffers
        real_readonly = module.allocate_readonly
        real_writable = module.allocate_writable

        def readonly(size):
            self.sizes.append(size)
            if size > MAX_MESSAGE:  # refuse before touching memory
                raise AssertionError(f"allocate_readonly({size}) over max_message")
            return real_readonly(size)

        def writable(size):
            self.sizes.append(size)
            if size > MAX_MESSAGE:
                raise AssertionError(f"allocate_writable({size}) over max_message")
            return real_writable(size)

        module.allocate_readonly = readonly
        module.allocate_writable = writable
        try:
            yield self
        finally:
            module.allocate_readonly = real_readonly
            module.allocate_writable = real_writable


def _normalize(events) -> list:
    out = []
    for event in events:
        if isinstance(event, protocol_events.MessageReceived):
            out.append(("message", event.seq, event.batch,
                        tuple((type(p).__name__, bytes(p)) for p in event.parts), event.size))
        elif isinstance(event, protocol_events.ConnectionFailed):
            out.append(("failed", type(event.error).__name__, str(event.error)))
        else:
            out.append(repr(event))
    return out


def _output_frames(data: bytes) -> list[tuple[int, int]]:
    """(type, value) of each frame in our own output (which must be well formed)."""
    out = []
    position = 0
    while position < len(data):
        frame_type, _, reserved, length, value = frames.HEADER.unpack_from(data, position)
        assert reserved == 0
        out.append((frame_type, value))
        position += frames.HEADER_SIZE + length
    assert position == len(data), "our own output is not a whole number of frames"
    return out


def _check(conn, events, allocations, window: int, messages: int) -> None:
    terminal = (protocol_events.ConnectionFailed, protocol_events.ErrorReceived)
    for index, event in enumerate(events):
        if isinstance(event, terminal):
            assert index == len(events) - 1, f"terminal event not last: {events!r}"
    expected_seq = 1
    delivered = 0
    for event in events:
        if isinstance(event, protocol_events.MessageReceived):
            assert event.seq == expected_seq, (event.seq, expected_seq)
            expected_seq += 1
            # netq._buffers: bytearray (writable), bytes (read-only, < LARGE), a read-only
            # memoryview (read-only, >= LARGE).
            assert all(type(p) is bytearray
                       or (type(p) is bytes and len(p) < _buffers.LARGE)
                       or (type(p) is memoryview and p.readonly and len(p) >= _buffers.LARGE)
                       for p in event.parts)
            assert sum(len(p) for p in event.parts) == event.size <= MAX_MESSAGE
            delivered += event.size
    # Credit: message k may start only while the bytes of messages 1..k-1 are under the window
    # and fewer than `messages` have started. So everything allocated (and everything delivered
    # from the staging buffer) fits in window + one message.
    in_progress = conn._incoming.size if conn._incoming is not None else 0
    started = [e.size for e in events if isinstance(e, protocol_events.MessageReceived)]
    if conn._incoming is not None:
        started.append(in_progress)
    assert len(started) <= messages, f"{len(started)} messages started, credit for {messages}"
    running = 0
    for size in started:
        assert running < window, f"a message started with {window - running} bytes of credit"
        running += size
    assert all(size <= MAX_MESSAGE for size in allocations.sizes)
    assert sum(allocations.sizes) <= window + MAX_MESSAGE
    assert delivered + in_progress <= window + MAX_MESSAGE
    output = _output_frames(conn.data_to_send())
    errors = [value for frame_type, value in output if frame_type == frames.FrameType.ERROR]
    last = events[-1] if events else None
    if isinstance(last, protocol_events.ConnectionFailed):
        assert type(last.error) in (exceptions.RemoteProtocolError,
                                    exceptions.AuthenticationError), repr(last.error)
        assert conn.state is protocol_events.ConnectionState.CLOSED
        assert len(errors) == 1 and output[-1][0] == frames.FrameType.ERROR, output
        assert errors[0] in set(frames.ErrorCode)
    else:
        assert not errors, output
        if isinstance(last, protocol_events.ErrorReceived):
            assert conn.state is protocol_events.ConnectionState.CLOSED
        else:
            assert conn.state is not protocol_events.ConnectionState.CLOSED
    assert len(conn.outgoing()) <= sending.IOV_MAX


def _feed_steps(conn, data: bytes, step: int) -> list:
    if step == 0:
        step = 1 if len(data) <= BYTEWISE_LIMIT else len(data)
    # At most ~BYTEWISE_LIMIT calls per input, however long: keeps executions fast.
    step = max(step, len(data) // BYTEWISE_LIMIT)
    events = []
    position = 0
    while position < len(data) and conn.state is not protocol_events.ConnectionState.CLOSED:
        target = conn.receive_buffer()
        assert len(target) > 0, "receive_buffer() returned an empty buffer"
        count = min(len(target), step, len(data) - position)
        target[:count] = data[position : position + count]
        position += count
        events += conn.receive_done(count)
    return events


def TestOneInput(data: bytes) -> None:
    if len(data) < 2:
        return
    mode = data[0] % MODES
    step = data[1]
    stream = bytes(data[2:])
    window = SMALL_WINDOW if mode & MODE_LIMITED else 1 << 40
    messages = SMALL_MESSAGES if mode & MODE_LIMITED else 1 << 64
    results = []
    for feed in ("whole", "steps"):
        allocations = _Allocations()
        conn = new_receiver(mode)
        with allocations.active():
            if feed == "whole":
                events = conn.receive_data(stream)
            else:
                events = _feed_steps(conn, stream, step)
            _check(conn, events, allocations, window, messages)
            closed = conn.state is protocol_events.ConnectionState.CLOSED
            eof = conn.receive_eof()
            if closed:
                assert eof == [] and conn.receive_data(b"\x01" * 32) == []
            else:
                # EOF is clean exactly when nothing is half received.
                assert eof in ([], ) or (
                    len(eof) == 1 and isinstance(eof[0], protocol_events.ConnectionFailed)
                    and isinstance(eof[0].error, exceptions.RemoteProtocolError)), eof
            assert conn.receive_eof() == []
        results.append(_normalize(events) + _normalize(eof))
    assert results[0] == results[1], "events depend on how the bytes were cut"


# ----------------------------------------------------------------------------- inputs


def valid_stream(rng: random.Random, mode: int, hostile: bool = False) -> bytes:
    """What a correct client sends to a server in ``mode`` (from HELLO unless MODE_OPEN).

    With ``hostile``, the client may also ignore its credit or start a message whose (self
    consistent) descriptor claims more than ``max_message``.
    """
    max_size = rng.choice([1, 7, 100, 1000, MAX_FRAME, 4 * 1024 * 1024])
    client, server = _pair(mode, max_size)
    if mode & MODE_OPEN:
        client.data_to_send()
        stream = b""
    else:
        stream = client.data_to_send()
        server.receive_data(stream)
        client.receive_data(server.data_to_send())
        client.send_session(TOKEN, rng.choice([0, 1, 5]), rng.random() < 0.5)
        stream += client.data_to_send()
        client = _open_twin(mode, max_size)
    seq = 0
    budget = min(STREAM_BUDGET, max_size * 500)  # at most ~500 chunks of body per stream
    if hostile and rng.random() < 0.3:
        # A sender that ignores the credit it was given: the receiver must refuse the first
        # message started without credit (ERROR LIMIT).
        client.send_credit_bytes = client.send_credit_messages = 1 << 40
    for _ in range(rng.randint(0, 8)):
        kind = rng.random()
        if kind < 0.6 and client.can_send_data:
            nparts = rng.choice([0, 1, 1, 2, 3, rng.randint(0, 40)])
            parts = []
            for _ in range(nparts):
                size = rng.choice([0, 1, 5, 64, rng.randint(0, 3000), rng.randint(0, 80_000)])
                size = min(size, budget)
                budget -= size
                data = rng.randbytes(size)
                parts.append(memoryview(data if rng.random() < 0.5 else bytearray(data)))
            total = sum(len(p) for p in parts)
            if total > MAX_MESSAGE:
                continue
            seq += 1
            client.send_message(seq, parts, total, rng.random() < 0.2)
        elif kind < 0.65 and hostile:
            # A first chunk whose consistent descriptor claims more than max_message (or up to
            # it): refused before anything is allocated, or accepted and then cut short.
            total = rng.choice([MAX_MESSAGE, MAX_MESSAGE + 1, 2 * MAX_MESSAGE, 1 << 40,
                                rng.randint(MAX_MESSAGE, 1 << 63)])
            nparts = rng.randint(1, 3)
            sizes = [total // nparts] * (nparts - 1)
            sizes.append(total - sum(sizes))
            body = rng.randbytes(rng.randint(1, 64))
            payload = frames.encode_descriptor(total, sizes) + body
            seq += 1
            client._emit(frames.encode_header(frames.FrameType.DATA, frames.DataFlags.FIRST,
                                              len(payload), seq) + payload)
        elif kind < 0.7:
            client.send_credit(rng.randint(0, 1 << 20), rng.randint(0, 10))
        elif kind < 0.8:
            client.send_ack(rng.randint(0, seq + 1))
        elif kind < 0.9:
            client.send_ping(rng.getrandbits(64))
        elif kind < 0.95:
            client.send_bye(rng.choice(["", "bye", "\u00e9t\u00e9"]))
        else:
            client.send_error(rng.choice(list(frames.ErrorCode)), "x")
    return stream + client.data_to_send()


def _open_twin(mode: int, max_size: int):
    client, _ = _pair(mode | MODE_OPEN, max_size)
    client.data_to_send()
    return client


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice([0, 1, 1, 2, 3, 5])):
        op = rng.randrange(8)
        position = rng.randint(0, len(buf))
        if op == 0 and buf:  # flip a bit
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:  # interesting byte
            buf[rng.randrange(len(buf))] = rng.choice([0, 1, 2, 3, 4, 0x7F, 0x80, 0xFE, 0xFF])
        elif op == 2:  # insert random bytes
            buf[position:position] = rng.randbytes(rng.randint(1, 24))
        elif op == 3 and buf:  # delete a range
            del buf[position : position + rng.randint(1, 64)]
        elif op == 4:  # truncate
            del buf[position:]
        elif op == 5 and buf:  # duplicate a range (replays frames)
            end = min(len(buf), position + rng.randint(1, 200))
            buf[position:position] = buf[position:end]
        elif op == 6:  # a random header, often with an absurd length
            header = frames.HEADER.pack(rng.randint(0, 12), rng.getrandbits(8),
                                        rng.choice([0, 0, 0, 1]),
                                        rng.choice([0, 4, 16, 32, 0xFFFFFFFF,
                                                    rng.getrandbits(32)]),
                                        rng.getrandbits(64))
            buf[position:position] = header
        elif op == 7 and len(buf) >= 8:  # overwrite 8 bytes with an interesting u64
            i = rng.randrange(len(buf) - 7)
            value = rng.choice([0, 1, (1 << 40), (1 << 63), (1 << 64) - 1, MAX_MESSAGE,
                                MAX_MESSAGE + 1, rng.getrandbits(64)])
            buf[i : i + 8] = value.to_bytes(8, "little")
    return bytes(buf)


def random_input(rng: random.Random) -> bytes:
    mode = rng.randrange(MODES)
    step = rng.choice([0, 1, 2, 3, 7, 16, 255, rng.randrange(256)])
    if rng.random() < 0.2:
        stream = rng.randbytes(rng.randint(0, 2000))
    else:
        stream = valid_stream(rng, mode, hostile=rng.random() < 0.3)
        if rng.random() < 0.8:
            stream = mutate(rng, stream)
    return bytes((mode, step)) + stream


def smoke(count: int, seed: int = 0, verbose: bool = False) -> dict:
    """Run ``count`` generated inputs through TestOneInput; returns outcome counts."""
    setup(instrument=False)
    rng = random.Random(seed)
    stats = {"inputs": 0, "failed": 0, "messages": 0, "clean": 0, "error_received": 0}
    for _ in range(count):
        data = random_input(rng)
        try:
            TestOneInput(data)
        except BaseException:
            sys.stderr.write(f"failing input (hex): {data.hex()}\n")
            raise
        stats["inputs"] += 1
        conn = new_receiver(data[0] % MODES)
        events = conn.receive_data(data[2:])
        if events and isinstance(events[-1], protocol_events.ConnectionFailed):
            stats["failed"] += 1
        elif events and isinstance(events[-1], protocol_events.ErrorReceived):
            stats["error_received"] += 1
        else:
            stats["clean"] += 1
        stats["messages"] += sum(isinstance(e, protocol_events.MessageReceived) for e in events)
    if verbose:
        print(stats)
    return stats


def write_corpus(directory: str, seed: int = 0, count: int = 64) -> None:
    setup(instrument=False)
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    for index in range(count):
        mode = index % MODES
        data = bytes((mode, rng.choice([0, 1, 7, 255]))) + valid_stream(rng, mode, index % 3 == 0)
        with open(os.path.join(directory, f"seed-{index:03d}"), "wb") as f:
            f.write(data)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--smoke", type=int)
    parser.add_argument("--write-corpus")
    parser.add_argument("--seed", type=int, default=0)
    known, rest = parser.parse_known_args(argv[1:])
    if known.smoke is not None:
        started = time.perf_counter()
        stats = smoke(known.smoke, known.seed)
        print(f"smoke: {stats} in {time.perf_counter() - started:.1f} s")
        return
    if known.write_corpus:
        write_corpus(known.write_corpus, known.seed)
        return
    import atheris

    setup(instrument=True)
    atheris.Setup([argv[0], *rest], TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
