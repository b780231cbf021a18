"""One gRPC stream's outbound side: the deque the netq loop fills and the writer that drains it.

A link is one call of ``/netq.Link/Stream`` (:data:`PATH`), bidirectional, raw bytes. The
thread that leads the netq loop, or a caller's thread writing a lone put itself (link lock held
either way), pushes packets (:meth:`CallStream.push`) and a writer coroutine awaits ``write()`` for
each (:meth:`CallStream.drain`), which waits for HTTP/2 flow control. A push while the writer
sleeps wakes it through the carrier's ``kick`` (asyncio objects belong to the thread that runs
the loop); a busy writer needs no wake-up: it looks at the deque after each write. Packets
below :data:`JOIN_BELOW` bytes that queue up while a write is in flight go out joined as one
gRPC message of at most :data:`MESSAGE_LIMIT` bytes. The engine stops handing packets to a
stream whose deque holds :data:`OUTBOUND_LIMIT` bytes (:meth:`CallStream.has_room`) and is woken
when it drains below half. :data:`END` in the deque ends the stream once everything before it
is written.

The stream also carries the state the carrier keeps per link: the gRPC call and channel
(client) and the writer task. It is the carrier's channel (:mod:`netq.carrier`).
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

from ..packets import PACKET_SIZE

if TYPE_CHECKING:
    import grpc.aio

__all__ = ("CallStream", "END", "SERVICE", "METHOD", "PATH", "MESSAGE_LIMIT", "PACKET_LIMIT",
           "OUTBOUND_LIMIT", "JOIN_BELOW")

SERVICE = "netq.Link"
METHOD = "Stream"
PATH = f"/{SERVICE}/{METHOD}"
MESSAGE_LIMIT = PACKET_SIZE + 64 * 1024  # bytes per gRPC message, both ways, both ends
# A packet carries 1 MiB of message body plus the frame header and descriptor in front of it,
# so a 1 MiB message is one gRPC message rather than 1 MiB and a 40-byte tail.
PACKET_LIMIT = PACKET_SIZE + 4096
OUTBOUND_LIMIT = 4 * PACKET_SIZE  # bytes queued per stream before the engine holds back
# A buffer of at least this many bytes is a gRPC message of its own, never joined with its
# neighbours: a join copies it (gRPC copies each message once more when its write starts),
# and from this size on the copy costs more than the write it would save.
JOIN_BELOW = 256 * 1024
END = None  # outbound marker: no more packets, finish the stream


class CallStream:
    """One gRPC stream carrying one link, and its outbound deque."""

    __slots__ = ("transport", "packets", "queued", "drained", "wakeup", "waiting", "blocked",
                 "opened", "ended", "closing", "call", "grpc_channel", "writer",
                 "finished")

    def __init__(self, transport) -> None:
        self.transport = transport
        self.packets: collections.deque = collections.deque()
        self.queued = 0  # bytes pushed
        self.drained = 0  # bytes written to gRPC
        # The future the sleeping writer awaits (a bare future: an asyncio.Event costs a
        # future and its bookkeeping on every sleep and wake-up as well).
        self.wakeup: asyncio.Future[None] | None = None
        self.waiting = False  # the writer sleeps on ``wakeup``
        self.blocked = False  # the engine holds packets back until the backlog shrinks
        self.opened = False  # posted to the netq loop (channel_opened): it hears how it ends
        self.ended = False  # the link was reported closed, or released by the base
        self.closing = False  # _close_channel ran
        self.call: grpc.aio.StreamStreamCall | None = None  # client: the grpc.aio call
        self.grpc_channel: grpc.aio.Channel | None = None  # client: this stream's channel
        self.writer: asyncio.Task | None = None  # client: the writer task
        self.finished = False  # release() ran: the call is over, nothing more is queued

    def release(self) -> None:
        """The call is over: let go of its buffers at once (the netq loop's link may keep
        its channel for a while after the stream ended)."""
        self.finished = True
        self.packets.clear()

    def push(self, packet) -> None:
        """Queue a packet (link lock held): on the I/O thread, or on a caller's thread that
        writes a lone put itself (``direct_writes``). Nothing once the call is over: the
        session resends what a lost link did not deliver."""
        if self.finished:
            return
        self.packets.append(packet)
        if packet is not END:
            self.queued += len(packet)
        if self.waiting:
            # The writer sleeps: whoever runs the loop next (maybe this thread, now) wakes it.
            # A writer busy with a write needs nothing: it looks at the deque when done.
            self.transport.kick(self)

    def has_room(self) -> bool:
        if self.queued - self.drained < OUTBOUND_LIMIT:
            return True
        self.blocked = True
        return False

    async def drain(self, write) -> bool:
        """Write packets until the end marker (True); a failed write raises."""
        packets = self.packets
        create_future = asyncio.get_running_loop().create_future
        while True:
            if not packets:
                self.waiting = True
                if packets:  # queued by a caller's thread meanwhile (it saw waiting False)
                    self.waiting = False
                    continue
                # Set and awaited with nothing in between: the kick that ends the sleep runs
                # on the loop's thread, between the steps of this coroutine.
                wakeup = self.wakeup = create_future()
                await wakeup
                continue
            packet = packets.popleft()
            if packet is END:
                return True
            size = len(packet)
            if size < JOIN_BELOW and packets and packets[0] is not END \
                    and len(packets[0]) < JOIN_BELOW and size + len(packets[0]) <= MESSAGE_LIMIT:
                # Packets that queued up while the previous write was in flight (ACK and
                # CREDIT frames, small messages, the tail of one message and the head of the
                # next) go as one gRPC message: a packet is a slice of the byte stream, so
                # joining neighbours is lossless, and each write waits for its completion,
                # which costs far more than the join.
                parts = [packet]
                while packets and packets[0] is not END and len(packets[0]) < JOIN_BELOW \
                        and size + len(packets[0]) <= MESSAGE_LIMIT:
                    part = packets.popleft()
                    parts.append(part)
                    size += len(part)
                packet = b"".join(parts)
            await write(packet)
            self.drained += size
            self.transport.native_heap.moved(size)
            if self.blocked and self.queued - self.drained < OUTBOUND_LIMIT // 2:
                self.blocked = False
                self.transport.wake()
