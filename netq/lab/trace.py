"""Wire traces: a loopback TCP relay that records the netq frames passing through it.

::

    with nq.new(purpose=nq.Purpose.SERVER, options=...) as server, \\
            netq.lab.trace.Recorder(server.address) as recorder:
        client = nq.new(options=nq.CommunicatorOptions(netloc=recorder.netloc))
        ...
        for frame in recorder.frames():
            print(frame.link, frame.direction, frame.type.name, frame.fields)

The client connects to the recorder, which connects to the server (``upstream``) and relays bytes
both ways unchanged: a :class:`netq.lab.relay.Relay` (one ``netq-trace`` thread for all of it;
:attr:`Recorder.relay` shapes and faults the link too) with the recorder as its tap. Each direction
is cut into frames with the layout of :mod:`netq.protocol.frames` (header, then ``length`` payload
bytes) and every frame becomes a :class:`TracedFrame` row: when the relay saw its last byte, on
which connection, which way, its type, the decoded fields (:func:`describe`) and the raw bytes. It
is for teaching and debugging: the bytes must be netq frames in the clear (plain TCP; a TLS link's
records are encrypted and end the decoding of that direction), and each row keeps at most ``keep``
payload bytes.

:meth:`Recorder.stall` and :meth:`Recorder.cut` play a network failure: after ``stall()``
the client's bytes are still read and recorded but no longer delivered (lost in transit,
``delivered=False`` in their rows), and ``cut()`` breaks every relayed connection. A netq
client then reconnects through the recorder and resumes its session, which the trace shows.
"""

from __future__ import annotations

import html
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..options import NetworkLocation
from ..protocol import frames
from ..protocol.frames import HEADER, HEADER_SIZE, READONLY_BIT, DataFlags, ErrorCode, FrameType
from .relay import UP, Relay

__all__ = ("Recorder", "TracedFrame", "describe", "html_table", "sequence_svg", "CLIENT_TO_SERVER",
           "SERVER_TO_CLIENT")

CLIENT_TO_SERVER = "client->server"
SERVER_TO_CLIENT = "server->client"
KEEP = 16 * 1024  # payload bytes kept per frame by default (whole control frames, descriptors)
_KNOWN_TYPES = frozenset(int(t) for t in FrameType)


@dataclass(frozen=True, slots=True)
class TracedFrame:
    """One frame seen by a :class:`Recorder`."""

    index: int  # order in which the relay saw the frames complete, both directions
    time: float  # seconds since the recorder started, when the frame's last byte arrived
    link: int  # which relayed connection: 0 for the first, 1 after a reconnect, ...
    direction: str  # CLIENT_TO_SERVER or SERVER_TO_CLIENT
    type: FrameType
    flags: int
    value: int  # the header's type-specific value (DATA: sequence number, ...)
    length: int  # payload bytes
    fields: dict = field(repr=False)  # describe(): the decoded header and payload
    raw: bytes = field(repr=False)  # header + the first `keep` payload bytes
    end: int  # offset just past this frame in its direction's byte stream
    delivered: bool = True  # False: dropped by stall(), or its connection broke first

    @property
    def size(self) -> int:
        """Bytes on the wire: header + payload."""
        return HEADER_SIZE + self.length

    @property
    def summary(self) -> str:
        """The frame in a few words: ``DATA seq=3 FIRST|LAST 30042 B``."""
        f = self.fields
        kind = self.type
        if kind is FrameType.HELLO and f:
            return (f"HELLO {f['role']} auth={f['auth']} max_frame={f['max_frame']} "
                    f"recv_window={f['recv_window']}")
        if kind is FrameType.AUTH:
            return f"AUTH hmac={f.get('hmac', '')[:12]}..."
        if kind is FrameType.SESSION and f:
            return (f"SESSION token={f['token'][:8]}... last_received={f['last_received']}"
                    + (" RESUMED" if f["resumed"] else ""))
        if kind is FrameType.DATA:
            total = f" of {f['total']} B" if "total" in f else ""
            return f"DATA seq={f['seq']} {f['flags']} {f['body']} B{total}"
        if kind is FrameType.CREDIT and f:
            return f"CREDIT +{f['bytes']} B"
        if kind is FrameType.ACK:
            return f"ACK seq<={f['seq']}"
        if kind in (FrameType.BYE, FrameType.ERROR):
            return f"{kind.name} {f.get('code', '')} {f['text']!r}".replace("  ", " ")
        return f"{kind.name} {self.value}"


def describe(frame_type: int, flags: int, value: int, payload: bytes, length: int) -> dict:
    """The fields of one frame, decoded with :mod:`netq.protocol.frames`.

    ``payload`` may be a prefix of the ``length`` payload bytes; fields that need more than
    the prefix are left out.
    """
    kind = FrameType(frame_type)
    fields: dict[str, Any] = {}
    whole = len(payload) == length
    if kind is FrameType.HELLO and whole:
        hello = frames.decode_hello(payload)
        fields.update(version=hello.version, role=hello.role.name, id=str(hello.id),
                      auth=hello.auth, max_message=hello.max_message,
                      max_frame=hello.max_frame, recv_window=hello.recv_window,
                      recv_messages=None if hello.recv_messages == frames.UNLIMITED_MESSAGES
                      else hello.recv_messages)
    elif kind is FrameType.AUTH and whole:
        fields["hmac"] = payload.hex()
    elif kind is FrameType.SESSION and whole:
        token, last, resumed, held_bytes, held_messages = frames.decode_session(payload)
        fields.update(token=token.hex(), last_received=last, resumed=resumed,
                      held_bytes=held_bytes, held_messages=held_messages)
    elif kind is FrameType.DATA:
        fields["seq"] = value
        # Members of a Flag class all have names (only combinations may not).
        fields["flags"] = "|".join(f.name for f in DataFlags
                                   if flags & f and f.name is not None) or "0"
        body = length
        if flags & DataFlags.FIRST and len(payload) >= frames.DESCRIPTOR.size:
            total, nparts, _ = frames.DESCRIPTOR.unpack_from(payload)
            descriptor = frames.DESCRIPTOR.size + nparts * frames.PART_SIZE.size
            if len(payload) >= descriptor:
                sizes = [frames.PART_SIZE.unpack_from(payload, frames.DESCRIPTOR.size + 8 * i)[0]
                         for i in range(nparts)]
                fields["total"] = total
                fields["parts"] = [size & frames.PART_SIZE_MASK for size in sizes]
                fields["readonly"] = [bool(size & READONLY_BIT) for size in sizes]
                body = length - descriptor
        fields["body"] = body  # message bytes carried by this chunk
    elif kind is FrameType.CREDIT and whole:
        fields.update(bytes=value, messages=frames.CREDIT_PAYLOAD.unpack(payload)[0])
    elif kind is FrameType.ACK:
        fields["seq"] = value
    elif kind in (FrameType.PING, FrameType.PONG):
        fields["token"] = value
    elif kind in (FrameType.BYE, FrameType.ERROR):
        if kind is FrameType.ERROR:
            fields["code"] = ErrorCode(value).name if value in ErrorCode._value2member_map_ \
                else value
        fields["text"] = payload.decode(errors="replace")
    return fields


def html_table(rows: list[TracedFrame]) -> str:
    """An HTML table of frames: time, link, direction, type, size, summary, delivered."""
    head = "".join(f"<th>{h}</th>" for h in
                   ("#", "ms", "link", "direction", "type", "bytes", "fields", "delivered"))
    body = []
    for row in rows:
        arrow = "client &rarr; server" if row.direction == CLIENT_TO_SERVER \
            else "client &larr; server"
        style = "" if row.delivered else ' style="color:#b00"'
        body.append(
            f"<tr{style}><td>{row.index}</td><td>{row.time * 1e3:.2f}</td><td>{row.link}</td>"
            f"<td>{arrow}</td><td>{row.type.name}</td><td>{row.size}</td>"
            f"<td style='text-align:left'>{html.escape(row.summary)}</td>"
            f"<td>{'yes' if row.delivered else 'LOST'}</td></tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def sequence_svg(rows: list[TracedFrame], width: int = 760, step: int = 24) -> str:
    """A sequence diagram of frames as SVG: client on the left, server on the right.

    One arrow per frame, top to bottom in the order the relay saw them; a frame that never
    reached the other side stops halfway, in red. A dotted line marks each new connection.
    """
    left, right = 90, width - 90
    height = step * (len(rows) + 2)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           '<defs><marker id="netq-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
           'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
           '<path d="M0,0 L10,5 L0,10 z"/></marker></defs>',
           f'<text x="{left}" y="14" text-anchor="middle" font-weight="bold">client</text>',
           f'<text x="{right}" y="14" text-anchor="middle" font-weight="bold">server</text>',
           f'<line x1="{left}" y1="20" x2="{left}" y2="{height}" stroke="#888"/>',
           f'<line x1="{right}" y1="20" x2="{right}" y2="{height}" stroke="#888"/>']
    link = None
    for n, row in enumerate(rows):
        y = step * (n + 1) + 12
        if row.link != link:
            if link is not None:
                out.append(f'<line x1="0" y1="{y - step // 2}" x2="{width}" y2="{y - step // 2}" '
                           f'stroke="#999" stroke-dasharray="2,3"/>')
                out.append(f'<text x="{width - 4}" y="{y - step // 2 - 2}" text-anchor="end" '
                           f'fill="#666">connection {row.link}</text>')
            link = row.link
        start, end = (left, right) if row.direction == CLIENT_TO_SERVER else (right, left)
        colour = "#000" if row.delivered else "#b00"
        if not row.delivered:
            end = (start + end) // 2
        out.append(f'<line x1="{start}" y1="{y}" x2="{end}" y2="{y}" stroke="{colour}" '
                   f'marker-end="url(#netq-arrow)"/>')
        out.append(f'<text x="{(left + right) // 2}" y="{y - 3}" text-anchor="middle" '
                   f'fill="{colour}">{html.escape(row.summary)}</text>')
        out.append(f'<text x="4" y="{y + 4}" fill="#666">{row.time * 1e3:8.2f} ms</text>')
    out.append("</svg>")
    return "".join(out)


class _Splitter:
    """Cuts one direction's byte stream into frames (header first, then ``length`` bytes)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.frame = bytearray()  # header + kept payload of the frame being read
        self.header: tuple | None = None
        self.left = 0  # payload bytes of the current frame still to come
        self.offset = 0  # bytes fed so far
        self.broken = False  # not netq frames (TLS, garbage): decoding stopped

    def feed(self, data: memoryview) -> list[tuple[tuple, bytes, int]]:
        """Whole frames completed by ``data``: (header, header + kept payload, end offset)."""
        done = []
        position, size = 0, len(data)
        while position < size and not self.broken:
            if self.header is None:
                take = min(HEADER_SIZE - len(self.frame), size - position)
                self.frame += data[position : position + take]
                position += take
                if len(self.frame) < HEADER_SIZE:
                    break
                header = HEADER.unpack_from(self.frame)
                if header[0] not in _KNOWN_TYPES or header[2]:
                    self.broken = True
                    break
                self.header = header
                self.left = header[3]
            else:
                take = min(self.left, size - position)
                room = self.keep - (len(self.frame) - HEADER_SIZE)
                if room > 0:
                    self.frame += data[position : position + min(take, room)]
                position += take
                self.left -= take
            if self.header is not None and not self.left:
                done.append((self.header, bytes(self.frame), self.offset + position))
                self.header = None
                self.frame = bytearray()
        self.offset += size
        return done


class Recorder:
    """A loopback TCP relay in front of a netq server that records every frame.

    ``upstream`` is the server's address (``server.address``, or a NetworkLocation); clients
    connect to :attr:`netloc` instead. ``keep``: payload bytes kept per frame in ``raw``.
    ``relay``: more keyword arguments for the :class:`netq.lab.relay.Relay` underneath (its
    shape: ``delay``, ``rate``, ...), which is :attr:`relay` for faults and shaping.
    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, upstream, *, host: str = "127.0.0.1", keep: int = KEEP,
                 **relay) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._rows: list[TracedFrame] = []
        self._splitters: dict[tuple[int, str], _Splitter] = {}
        # (link, direction): bytes written to the other side, or waiting to be while the
        # connection lives; the frames ending beyond it were lost.
        self._reached: dict[tuple[int, str], int] = {}
        self._started = time.perf_counter()
        listener = socket.create_server((host, 0))
        relay.setdefault("name", "netq-trace")
        self.relay = Relay((upstream[0], upstream[1]), listener=listener, tap=self,
                           refuse_with_reset=False, start=False, **relay)
        self.upstream = self.relay.upstream

    # ------------------------------------------------------------------ user side

    @property
    def netloc(self) -> NetworkLocation:
        """Where clients connect (the recorder's own loopback port)."""
        return self.relay.netloc

    @property
    def links(self) -> int:
        """Connections relayed so far."""
        return self.relay.links

    def start(self) -> Recorder:
        self.relay.start()
        return self

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def frames(self) -> list[TracedFrame]:
        """Every frame seen so far, in the order the relay saw them complete."""
        with self._lock:
            reached = dict(self._reached)
            return [row if row.end <= reached[row.link, row.direction]
                    else replace(row, delivered=False) for row in self._rows]

    def wait_for(self, predicate: Callable[[list[TracedFrame]], Any], timeout: float = 10.0):
        """Poll :meth:`frames` until ``predicate(frames)`` is truthy; its value.

        Raises TimeoutError after ``timeout`` seconds (and RuntimeError if the relay failed).
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.relay.failure is not None:
                raise RuntimeError(f"the recorder's relay failed: {self.relay.failure!r}")
            value = predicate(self.frames())
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no trace matched within {timeout} s")
            time.sleep(0.005)

    def stall(self) -> None:
        """From now until :meth:`cut`, the client's bytes are recorded but not delivered."""
        self.relay.drop(UP)

    def cut(self, timeout: float = 5.0) -> None:
        """Break every relayed connection now, as a failing network would.

        Bytes not yet delivered are lost; their frames say ``delivered=False``. New
        connections (a reconnecting client) are relayed normally again.
        """
        relay = self.relay

        def cut():  # one step on the relay thread: no byte slips between the two
            relay._reset_all(rst=False)
            relay._dropping.clear()

        try:
            relay._control(cut)
        except TimeoutError:
            raise TimeoutError(f"the relay did not cut within {timeout} s") from None

    def close(self) -> None:
        """Stop relaying, close every socket and end the thread. Idempotent."""
        self.relay.close()

    # ------------------------------------------------------------------ the tap (relay thread)

    def read(self, link: int, direction: str, data: bytes, forwarded: bool) -> None:
        name = CLIENT_TO_SERVER if direction == UP else SERVER_TO_CLIENT
        key = (link, name)
        splitter = self._splitters.get(key)
        if splitter is None:
            splitter = self._splitters[key] = _Splitter(self.keep)
            with self._lock:
                self._reached[link, CLIENT_TO_SERVER] = self._reached.get(
                    (link, CLIENT_TO_SERVER), 0)
                self._reached[link, SERVER_TO_CLIENT] = self._reached.get(
                    (link, SERVER_TO_CLIENT), 0)
        now = time.perf_counter() - self._started
        if forwarded:  # on its way: delivered unless the connection breaks first
            with self._lock:
                self._reached[key] += len(data)
        rows = []
        for header, raw, end in splitter.feed(memoryview(data)):
            frame_type, flags, _, length, value = header
            rows.append(TracedFrame(
                index=0, time=now, link=link, direction=name,
                type=FrameType(frame_type), flags=flags, value=value, length=length,
                fields=describe(frame_type, flags, value, raw[HEADER_SIZE:], length),
                raw=raw, end=end))
        if rows:
            with self._lock:
                for row in rows:
                    self._rows.append(replace(row, index=len(self._rows)))

    def closed(self, link: int, direction: str, delivered: int) -> None:
        name = CLIENT_TO_SERVER if direction == UP else SERVER_TO_CLIENT
        with self._lock:
            self._reached[link, name] = delivered
        self._splitters.pop((link, name), None)
