"""Packet transports: carry each link's netq byte stream as a sequence of packets.

MQTT publishes and gRPC stream messages are packets: a carrier library (paho, grpcio) moves
them on threads of its own. This base turns that into the same engine loop as the socket
transports:

- Outgoing: the link's :class:`netq.protocol.Connection` output (an iovec list) is cut into
  packets of at most :meth:`PacketTransport._packet_limit` body bytes, each joined once with the
  subclass's header (:meth:`_packet_header`) and handed to :meth:`_send_packet` while
  :meth:`_can_send` allows: carrier-side buffering stays bounded, and the carrier calls
  :meth:`wake` when it has room again.
- Incoming: carrier threads only hand packets over (:meth:`packet_received`, thread-safe, an
  append to the inbox); the I/O thread feeds them, in arrival order, into the link's
  Connection (``receive_data``: one copy, straight into the final part buffer for large bodies).
- Links come and go through :meth:`channel_opened` / :meth:`channel_closed`; a client's failed
  attempt is :meth:`connect_failed` and the base retries with backoff
  (``reconnect_min``..``reconnect_max``).

Frames may span packets: a packet is a slice of the byte stream, so the carrier must deliver
a link's packets complete, once and in order (gRPC streams do; MQTT adds sequence numbers and
breaks the link on a gap, which session resume repairs). Only the I/O thread calls
``_send_packet`` (``direct_writes`` is False): carrier objects are not shared between the
user's threads.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Generic, TypeVar

from ..protocol.connection import Buffer, Connection
from .base import Link, Transport

__all__ = ("PacketTransport", "PacketLink", "PACKET_SIZE", "Link", "next_packet")

PACKET_SIZE = 1024 * 1024  # bytes: default body per packet (the sweet spot measured for MQTT)

# Inbox entry kinds (carrier threads -> I/O thread)
_OPENED, _PACKET, _CLOSED, _CONNECT_FAILED = range(4)


def next_packet(conn: Connection, limit: int) -> tuple[list[Buffer], int]:
    """The next packet's worth of ``conn``'s queued output, without copying: its buffers (the
    last one cut at ``limit`` bytes) and their total size. ``conn.sent(size)`` takes them off
    once the packet is out."""
    parts: list[Buffer] = []
    size = 0
    for buffer in conn.outgoing():
        length = len(buffer)
        if size + length > limit:
            parts.append(memoryview(buffer)[: limit - size])
            size = limit
            break
        parts.append(buffer)
        size += length
        if size == limit:
            break
    return parts, size


ChannelT = TypeVar("ChannelT")
"""The carrier's handle of one link: MQTT's topic pair (``mqtt.channels.Channel``), gRPC's
``grpc.streams.Stream``."""


class PacketLink(Link, Generic[ChannelT]):
    """A link of a packet transport: ``channel`` is its carrier's handle, typed per transport."""

    __slots__ = ("channel",)

    def __init__(self, channel: ChannelT, conn: Connection, address: object) -> None:
        super().__init__(conn, address)
        self.channel = channel


class PacketTransport(Transport, Generic[ChannelT]):
    """Base of MQTT and gRPC: subclasses implement the hooks marked "subclass"."""

    family_name = "packets"
    direct_writes = False

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self._inbox: collections.deque = collections.deque()  # appends are thread-safe
        self._signal = threading.Event()
        self._connecting = False  # client: an attempt is under way
        if self._server:
            try:
                self._listen()  # bind now so a taken port raises from netq.new()
            except BaseException:
                self._close_resources()
                raise

    # ----------------------------------------------------------------- subclass hooks

    def _listen(self) -> None:
        """Subclass, server: start the carrier now (constructor); set ``self.address``."""
        raise NotImplementedError

    def _start_connect(self) -> None:
        """Subclass, client: start one attempt; later call channel_opened or connect_failed."""
        raise NotImplementedError

    def _can_send(self, link: PacketLink[ChannelT]) -> bool:
        """Subclass: may another packet go to the carrier for this link now? (I/O thread)"""
        return True

    def _send_packet(self, link: PacketLink[ChannelT], payload: bytes) -> None:
        """Subclass: hand one packet (header + body) to the carrier. (I/O thread)"""
        raise NotImplementedError

    def _close_channel(self, link: PacketLink[ChannelT]) -> None:
        """Subclass: release the link's channel; idempotent, never blocks long. (I/O thread)"""

    def _stop_carrier(self) -> None:
        """Subclass: stop and join every carrier thread, close everything. Once, at the end."""

    def _packet_limit(self, link: PacketLink[ChannelT]) -> int:
        """Body bytes per packet."""
        return min(PACKET_SIZE, self._options.connection.max_size)

    def _packet_header(self, link: PacketLink[ChannelT], size: int) -> bytes:
        """Bytes put before each packet's body (MQTT: link sequence numbers)."""
        return b""

    # ----------------------------------------------------------------- carrier side (any thread)

    def channel_opened(self, channel: ChannelT, address: object) -> PacketLink[ChannelT]:
        """A new channel: returns its link, which the I/O thread registers (HELLO goes out)."""
        link = PacketLink(channel, self.engine.new_connection(), address)
        self._post(_OPENED, link, None)
        return link

    def packet_received(self, link: Link, payload) -> None:
        """One packet body for ``link`` (header already removed), in order."""
        self._post(_PACKET, link, payload)

    def channel_closed(self, link: Link, error: BaseException | None = None) -> None:
        """The link's channel ended (``error`` None: a clean end) or broke."""
        self._post(_CLOSED, link, error)

    def connect_failed(self, error: BaseException | None = None) -> None:
        """Client: the attempt failed; the base retries after a backoff."""
        self._post(_CONNECT_FAILED, None, error)

    def _post(self, kind: int, link: Link | None, value) -> None:
        self._inbox.append((kind, link, value))
        self.wake()

    def wake(self) -> None:
        self._signal.set()

    # ----------------------------------------------------------------- the I/O thread

    def _connect(self) -> None:
        if self._connecting or not self._wants_connection():
            return
        self._connecting = True
        self._start_connect()

    def _connect_pending(self) -> bool:
        return self._connecting

    def _abandon_connect(self) -> None:
        # An attempt under way ends in channel_opened/connect_failed; the opened link is then
        # refused (closing) and _stop_carrier releases the rest.
        pass

    def _wait(self, timeout: float) -> None:
        self._sleep(timeout)
        self._after_sleep()

    def _sleep(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for wake() (a carrier running its own event loop, like
        grpc.aio, overrides this and wake() to run that loop meanwhile)."""
        signal = self._signal
        if not self._inbox:
            signal.wait(timeout)
        # Cleared before the inbox is drained: anything posted from here on sets it again.
        signal.clear()

    def _after_sleep(self) -> None:
        """Feed what the carriers handed over, then write every link that has output."""
        self._drain_inbox()
        for link in self.links():
            if link.conn.has_output and not link.closing:
                with link.lock:
                    self.write_now(link)
                self._after_io(link)

    def _drain_inbox(self) -> None:
        inbox = self._inbox
        engine = self.engine
        for _ in range(len(inbox)):
            kind, link, value = inbox.popleft()
            if kind is _PACKET:
                if link.dropped:
                    continue
                link.last_received_at = time.monotonic()
                with link.lock:
                    conn = link.conn
                    if not self._received(link, conn.receive_data(value)):
                        continue
                    if conn.has_output:
                        self.write_now(link)
                self._after_io(link)
            elif kind is _OPENED:
                self._open(link)
            elif kind is _CLOSED:
                if link.dropped:
                    continue
                if value is not None and link.error is None:
                    link.error = value
                with link.lock:
                    events = link.conn.receive_eof()
                    if events:
                        engine.handle_events(link, events)
                self._drop(link)
            else:  # _CONNECT_FAILED
                self._connecting = False
                engine.connect_failed(str(self._options.netloc),
                                      str(value) if value is not None else "the attempt failed")
                self._schedule_reconnect()

    def _open(self, link: PacketLink[ChannelT]) -> None:
        if not self._server:
            self._connecting = False
        engine = self.engine
        refuse = engine.stopping or (self._server and engine.closing) or self._aborted
        if not refuse and not self._server:
            refuse = not self._wants_connection()
        if refuse:
            link.dropped = True  # never registered: release the channel only
            self._close_channel(link)
            return
        self._links.add(link)
        with link.lock:
            self.write_now(link)  # the HELLO

    def write_now(self, link: Link) -> None:
        """Cut the queued output into packets while the carrier has room (link lock held)."""
        if not isinstance(link, PacketLink):
            raise TypeError(f"a packet transport was given a link it does not own: {link!r}")
        if link.dropped:
            return
        conn = link.conn
        while conn.has_output and self._can_send(link):
            parts, size = next_packet(conn, self._packet_limit(link))
            header = self._packet_header(link, size)
            if header:
                payload = b"".join([header, *parts])
            elif len(parts) == 1 and type(parts[0]) is bytes:
                payload = parts[0]
            else:
                payload = b"".join(parts)
            self._send_packet(link, payload)
            conn.sent(size)
        link.write_blocked = conn.has_output

    def _release(self, link: Link) -> None:
        self._close_channel(self._packet_link(link))

    @staticmethod
    def _packet_link(link: Link) -> PacketLink[ChannelT]:
        """``link`` as this transport's link (the engine hands back only the links the
        transport gave it; anything else is a programming error)."""
        if not isinstance(link, PacketLink):
            raise TypeError(f"a packet transport was given a link it does not own: {link!r}")
        return link

    def _close_resources(self) -> None:
        self._stop_carrier()
        # What carriers posted after the last pass: links opened that nobody will use.
        while self._inbox:
            kind, link, _ = self._inbox.popleft()
            if kind is _OPENED and not link.dropped:
                link.dropped = True
                self._close_channel(link)
