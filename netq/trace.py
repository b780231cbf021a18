"""Wire traces: a loopback TCP relay that records the netq frames passing through it.

::

    with nq.new(purpose=nq.Purpose.SERVER, options=...) as server, \\
            netq.trace.Recorder(server.address) as recorder:
        client = nq.new(options=nq.CommunicatorOptions(netloc=recorder.netloc))
        ...
        for frame in recorder.frames():
            print(frame.link, frame.direction, frame.type.name, frame.fields)

The client connects to the recorder, which connects to the server (``upstream``) and relays
bytes both ways unchanged, one ``netq-trace`` thread for all of it. Each direction is cut
into frames with the layout of :mod:`netq.protocol.frames` (header, then ``length`` payload
bytes) and every frame becomes a :class:`TracedFrame` row: when the relay saw its last byte,
on which connection, which way, its type, the decoded fields (:func:`describe`) and the raw
bytes. It is for teaching and debugging: the bytes must be netq frames in the clear (plain
TCP; a TLS link's records are encrypted and end the decoding of that direction), and each
row keeps at most ``keep`` payload bytes.

:meth:`Recorder.stall` and :meth:`Recorder.cut` play a network failure: after ``stall()``
the client's bytes are still read and recorded but no longer delivered (lost in transit,
``delivered=False`` in their rows), and ``cut()`` breaks every relayed connection. A netq
client then reconnects through the recorder and resumes its session, which the trace shows.
"""

from __future__ import annotations

import html
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .options import NetworkLocation
from .protocol import frames
from .protocol.frames import HEADER, HEADER_SIZE, READONLY_BIT, DataFlags, ErrorCode, FrameType

__all__ = ("Recorder", "TracedFrame", "describe", "html_table", "sequence_svg", "CLIENT_TO_SERVER",
           "SERVER_TO_CLIENT")

CLIENT_TO_SERVER = "client->server"
SERVER_TO_CLIENT = "server->client"
KEEP = 16 * 1024  # payload bytes kept per frame by default (whole control frames, descriptors)
_RECV_SIZE = 256 * 1024
_BACKLOG_LIMIT = 4 * 1024 * 1024  # bytes waiting for a slow side before we stop reading the other
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
        fields["flags"] = "|".join(f.name for f in DataFlags if flags & f) or "0"
        body = length
        if flags & DataFlags.FIRST and len(payload) >= frames.DESCRIPTOR.size:
            total, nparts, _ = frames.DESCRIPTOR.unpack_from(payload)
            descriptor = frames.DESCRIPTOR.size + nparts * frames.PART_SIZE.size
            if len(payload) >= descriptor:
                sizes = [frames.PART_SIZE.unpack_from(payload, frames.DESCRIPTOR.size + 8 * i)[0]
                         for i in range(nparts)]
                fields["total"] = total
                fields["parts"] = [size & (READONLY_BIT - 1) for size in sizes]
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


class _Pipe:
    """One direction of one relayed connection."""

    def __init__(self, link: int, direction: str, source: socket.socket,
                 target: socket.socket, keep: int) -> None:
        self.link = link
        self.direction = direction
        self.source = source
        self.target = target
        self.splitter = _Splitter(keep)
        self.backlog = bytearray()  # read, not yet written to target
        self.delivered = 0  # bytes written to target
        self.eof = False  # source said EOF
        self.shut = False  # EOF passed on to target


class Recorder:
    """A loopback TCP relay in front of a netq server that records every frame.

    ``upstream`` is the server's address (``server.address``, or a NetworkLocation); clients
    connect to :attr:`netloc` instead. ``keep``: payload bytes kept per frame in ``raw``.
    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, upstream, *, host: str = "127.0.0.1", keep: int = KEEP) -> None:
        self.upstream = (upstream[0], upstream[1])
        self.keep = keep
        self._lock = threading.Lock()
        self._rows: list[TracedFrame] = []
        self._pipes: list[_Pipe] = []
        # (link, direction): bytes written to the other side, or waiting to be while the
        # connection lives; the frames ending beyond it were lost.
        self._reached: dict[tuple[int, str], int] = {}
        self._registered: set[socket.socket] = set()
        self._links = 0
        self._stalled = False
        self._cut_requested = threading.Event()
        self._cut_done = threading.Event()
        self._stopping = False
        self._started = time.perf_counter()
        self._selector = selectors.DefaultSelector()
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="netq-trace", daemon=True)
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ user side

    @property
    def netloc(self) -> NetworkLocation:
        """Where clients connect (the recorder's own loopback port)."""
        host, port = self._listener.getsockname()[:2]
        return NetworkLocation(host, port)

    @property
    def links(self) -> int:
        """Connections relayed so far."""
        return self._links

    def start(self) -> Recorder:
        self._thread.start()
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
            if self._failure is not None:
                raise RuntimeError(f"the recorder's relay failed: {self._failure!r}")
            value = predicate(self.frames())
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no trace matched within {timeout} s")
            time.sleep(0.005)

    def stall(self) -> None:
        """From now until :meth:`cut`, the client's bytes are recorded but not delivered."""
        self._stalled = True

    def cut(self, timeout: float = 5.0) -> None:
        """Break every relayed connection now, as a failing network would.

        Bytes not yet delivered are lost; their frames say ``delivered=False``. New
        connections (a reconnecting client) are relayed normally again.
        """
        self._cut_done.clear()
        self._cut_requested.set()
        self._wake()
        if not self._cut_done.wait(timeout):
            raise TimeoutError("the relay did not cut within the timeout")

    def close(self) -> None:
        """Stop relaying, close every socket and end the thread. Idempotent."""
        self._stopping = True
        if self._thread.is_alive():
            self._wake()
            self._thread.join()
        else:
            self._close_all()

    # ------------------------------------------------------------------ relay thread

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except OSError:
            pass  # already closed, or a wake-up already pending

    def _run(self) -> None:
        try:
            while not self._stopping:
                if self._cut_requested.is_set():
                    self._cut_requested.clear()
                    for pipe in list(self._pipes):
                        self._drop_link(pipe.link)
                    self._stalled = False
                    self._cut_done.set()
                for key, mask in self._selector.select(0.5):
                    sock = key.fileobj
                    if sock is self._wake_reader:
                        try:
                            self._wake_reader.recv(4096)
                        except BlockingIOError:
                            pass
                    elif sock is self._listener:
                        self._accept()
                    else:
                        self._service(sock, mask)
        except BaseException as error:  # noqa: BLE001 - recorded, seen by wait_for()
            self._failure = error
        finally:
            self._close_all()
            self._cut_done.set()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()  # no server: the client sees its connection refused, as without us
            return
        link = self._links
        self._links += 1
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._reached[link, CLIENT_TO_SERVER] = self._reached[link, SERVER_TO_CLIENT] = 0
        self._pipes.append(_Pipe(link, CLIENT_TO_SERVER, client, server, self.keep))
        self._pipes.append(_Pipe(link, SERVER_TO_CLIENT, server, client, self.keep))
        self._update_interest(link)

    def _service(self, sock: socket.socket, mask: int) -> None:
        reading = next((p for p in self._pipes if p.source is sock), None)
        writing = next((p for p in self._pipes if p.target is sock), None)
        if reading is None or writing is None:
            return
        link = reading.link
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(writing)
            if mask & selectors.EVENT_READ and not reading.eof:
                self._read(reading)
        except OSError:
            self._drop_link(link)  # reset by a side: the other side sees it closed too
            return
        if all(p.shut for p in self._pipes if p.link == link):
            self._drop_link(link)
            return
        self._update_interest(link)

    def _read(self, pipe: _Pipe) -> None:
        try:
            data = pipe.source.recv(_RECV_SIZE)
        except BlockingIOError:
            return
        now = time.perf_counter() - self._started
        if not data:
            pipe.eof = True
        elif self._stalled and pipe.direction == CLIENT_TO_SERVER:
            pass  # lost in transit: recorded below, never delivered
        else:
            pipe.backlog += data
            with self._lock:  # on its way: delivered unless the connection breaks first
                self._reached[pipe.link, pipe.direction] = pipe.delivered + len(pipe.backlog)
        rows = []
        for header, raw, end in pipe.splitter.feed(memoryview(data)):
            frame_type, flags, _, length, value = header
            rows.append(TracedFrame(
                index=0, time=now, link=pipe.link, direction=pipe.direction,
                type=FrameType(frame_type), flags=flags, value=value, length=length,
                fields=describe(frame_type, flags, value, raw[HEADER_SIZE:], length),
                raw=raw, end=end))
        if rows:
            with self._lock:
                for row in rows:
                    self._rows.append(replace(row, index=len(self._rows)))
        self._flush(pipe)

    def _flush(self, pipe: _Pipe) -> None:
        """Write what waits for the target; pass EOF on once everything is written."""
        if pipe.backlog:
            try:
                sent = pipe.target.send(pipe.backlog)
            except BlockingIOError:
                sent = 0
            del pipe.backlog[:sent]
            pipe.delivered += sent
        if pipe.eof and not pipe.backlog and not pipe.shut:
            pipe.shut = True
            try:
                pipe.target.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the target went first

    def _update_interest(self, link: int) -> None:
        """Read while a side has something to say and the other keeps up; write backlogs."""
        pipes = [p for p in self._pipes if p.link == link]
        for pipe in pipes:
            sock = pipe.source
            events = 0
            if not pipe.eof and len(pipe.backlog) < _BACKLOG_LIMIT:
                events |= selectors.EVENT_READ
            if any(p.target is sock and p.backlog for p in pipes):
                events |= selectors.EVENT_WRITE
            if not events:
                self._unregister(sock)
            elif sock in self._registered:
                self._selector.modify(sock, events)
            else:
                self._selector.register(sock, events)
                self._registered.add(sock)

    def _unregister(self, sock: socket.socket) -> None:
        if sock in self._registered:
            self._registered.discard(sock)
            self._selector.unregister(sock)

    def _drop_link(self, link: int) -> None:
        """Close both sockets of a connection: what was not delivered is lost."""
        for pipe in [p for p in self._pipes if p.link == link]:
            with self._lock:
                self._reached[link, pipe.direction] = pipe.delivered
            self._pipes.remove(pipe)
            self._unregister(pipe.source)
            pipe.source.close()

    def _close_all(self) -> None:
        for pipe in list(self._pipes):
            if pipe in self._pipes:
                self._drop_link(pipe.link)
        for sock in (self._listener, self._wake_reader, self._wake_writer):
            sock.close()
        self._selector.close()

