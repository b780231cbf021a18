"""The carrier interface: what a transport is to the loop that drives it.

A carrier moves bytes and nothing else. It knows sockets, broker topics or gRPC streams; it
does not know links, sessions, credit, the engine or the queue API, and it never calls them.
The loop (:class:`netq.loop.IOLoop`, on the engine's side) calls the carrier; the carrier
answers with return values and with the events :meth:`Carrier.wait` hands back. Control runs
one way.

A carrier has eight members::

    info                    what the loop may do with it (fixed once constructed)
    admit(on)               client: start one attempt to reach the server (on) or give up the
                            one under way (off); server: stop taking newcomers (off)
    wait(timeout)           wait up to timeout s for something to happen; the events
    read_into(ch, buffer)   bytes read into buffer (0: the peer ended the stream); with fds:
                            the descriptors that came with them, too (info.passes_fds)
    write(ch, buffers)      bytes taken from the front of buffers (0: none now); with fds:
                            descriptors sent with the first byte (info.passes_fds)
    wake()                  any thread: end a wait() under way (or the next one) at once
    close(ch)               release one channel; close(None): everything, at the end
    explain()               client: what stands between us and the server now, if known

A *channel* is the carrier's handle of one link (a socket, an MQTT topic pair, a gRPC stream).
The loop treats it as opaque: it keeps the link that goes with it, and hands it back. A channel
that needs none of the carrier's code to move bytes (a plain socket) may come with its own
reader and writer (:attr:`Opened.read_into`, :attr:`Opened.write`: the socket's ``recv_into``
and ``sendmsg``, C functions), which the loop then calls instead of the carrier's, a Python
call fewer per read and per write. Such a writer raises BlockingIOError where the carrier's
``write`` would return 0; the loop then writes through the carrier's ``write`` once, which
arranges the ``WRITABLE`` event.

Events (``(kind, channel, value)`` tuples, read by the loop in order):

=========================  ===========  ===================================================
kind                       channel      value
=========================  ===========  ===================================================
``READABLE``               the channel  None: ``read_into`` until it raises BlockingIOError
``WRITABLE``               the channel  None: ``write`` may take bytes again
``READABLE | WRITABLE``    the channel  both at once (one readiness report of a socket)
``OPENED``                 a new one    :class:`Opened`: its address, whom it is bound to,
                                        its own reader and writer if it has them
``DATA``                   the channel  a packet's bytes, in order (packet carriers)
``CLOSED``                 the channel  why it ended (an exception), or None: a clean end
``FAILED``                 None         client: why the attempt failed (a sentence)
=========================  ===========  ===================================================

Errors: ``read_into`` and ``write`` raise :class:`BlockingIOError` when the channel has
nothing or no room now, and :class:`OSError` or a :class:`netq.exceptions.NetqError` when it
broke (an :class:`~netq.exceptions.AuthenticationError` when retrying cannot help: an
untrusted certificate). A carrier whose ``write`` took fewer bytes than offered reports
``WRITABLE`` once it has room again.

Threads: ``wait``, ``read_into``, ``admit`` and ``close`` are called by the thread that runs
the loop (with ``info.any_thread_waits``, a blocked ``get()`` may be that thread for a while:
one at a time). ``write`` too, and from user threads when ``info.user_threads_write``.
``wake`` from any thread.
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar

from .options import CommunicatorOptions, Purpose
from .protocol.sending import Buffer

__all__ = ("Address", "Carrier", "CarrierFactory", "CarrierInfo", "Event", "Opened",
           "READABLE", "WRITABLE", "OPENED", "DATA", "CLOSED", "FAILED", "cut")

Address: TypeAlias = "tuple[str, int] | tuple[str, int, int, int] | str | None"
"""Where a carrier listens or connects, in its own terms: ``(host, port)`` (TCP over IPv4,
gRPC), ``(host, port, flowinfo, scope_id)`` (TCP over IPv6), a path (Unix socket, gRPC over a
Unix socket), an ``mqtt://host:port/base`` URL (MQTT), or None (a client, which listens nowhere).
"""

READABLE = 1
WRITABLE = 2
OPENED = 4
DATA = 8
CLOSED = 16
FAILED = 32

ChannelT = TypeVar("ChannelT")
"""A carrier's handle of one link (a socket, an MQTT topic pair, a gRPC stream)."""

Event: TypeAlias = "tuple[int, object, object]"
"""``(kind, channel, value)``: see the table in this module's docstring."""


@dataclass(frozen=True, slots=True)
class Opened:
    """An ``OPENED`` event's value: where the channel leads, and whom it is bound to."""

    address: object  # the peer's address, in the carrier's terms (for messages)
    # The peer id (a UUID's text) this channel may carry, when the carrier ties channels to
    # peers (MQTT: a client's topics); the peer's HELLO must then name it. None: any peer.
    bound_to: str | None = None
    # ``read_into(buffer)`` of this channel, where it needs none of the carrier's
    # code (a plain socket's ``recv_into``, a C function: no Python call per read); used
    # while the link takes no descriptors. None: the carrier's read_into.
    read_into: Callable[[memoryview], int] | None = None
    # ``write(buffers)`` of this channel, where it needs none of the carrier's code
    # while there is room (a plain socket's ``sendmsg``); it raises BlockingIOError where the
    # carrier's write returns 0, and the link driver then writes through the carrier's
    # write, which arranges the WRITABLE event. None: the carrier's write.
    write: Callable[[list[Buffer]], int] | None = None


@dataclass(frozen=True, slots=True)
class CarrierInfo:
    """What the loop may do with a carrier. Fixed once the carrier is constructed."""

    address: Address  # where a server listens (the bound address: useful with port 0)
    target: str  # client: where attempts go, in words (for messages)
    any_thread_waits: bool = False  # a blocked get() may call wait() itself (one at a time)
    user_threads_write: bool = False  # write() may be called from a user's thread
    # Seconds an attempt may take before the loop gives it up (admit(False)) and retries;
    # None: the carrier bounds its own attempts and reports FAILED itself.
    attempt_limit: float | None = None
    # Delayed acknowledgement: seconds output of nothing but ACK frames may wait for a reply
    # to carry it. While a get() waits for what they acknowledge only, or (ack_hold_always,
    # for carriers where each write is a broker round of its own) always, CREDIT frames too.
    ack_hold: float = 0.0
    ack_hold_always: bool = False
    # Seconds the ACK of a message that said another follows (DATA's FOLLOWS flag) may wait
    # for the next to share it, where each ACK is a carrier write of its own (a gRPC message):
    # links then turn Connection.defers_acks on. 0: every ACK is queued at once.
    ack_defer: float = 0.0
    # A connected channel fails by itself once the peer's host stops answering (TCP keepalive
    # and user timeout; a Unix socket's peer process exits), so a client waits for a slow
    # handshake on it, as long as it takes, instead of giving it up after 3 silent
    # heartbeats: an overloaded server answers the connections it queued in turn, and one
    # given up goes to the back of that queue.
    watches_peer_host: bool = False
    # The carrier passes descriptors with the bytes (Unix sockets, SCM_RIGHTS): read_into and
    # write take the fds argument, and links may carry parts in shared memory (netq._shm).
    passes_fds: bool = False
    # A descriptor that is readable whenever wait(0) would report something (an epoll set),
    # so that one thread can watch many carriers (netq.shared_io); None: not pollable.
    poll_fd: int | None = None


class Carrier(Protocol[ChannelT]):
    """A transport's carrier: see the module docstring for the rules."""

    info: CarrierInfo

    def admit(self, on: bool) -> None:
        """Client: start one attempt (on; it ends in ``OPENED`` or ``FAILED``) or abandon
        the one under way (off). Server: stop taking newcomers (off). Idempotent."""

    def wait(self, timeout: float) -> Sequence[tuple[int, ChannelT | None, object]]:
        """Wait up to ``timeout`` seconds for events; what happened (maybe nothing)."""

    def read_into(self, channel: ChannelT, buffer: memoryview,
                  fds: MutableSequence[int] | None = None) -> int:
        """Bytes read into ``buffer``; 0 at the end of the stream; BlockingIOError: none now.
        With ``fds`` (only where ``info.passes_fds``): the descriptors that came with the
        bytes are appended to it, in order; without, the kernel closes any that came."""

    def write(self, channel: ChannelT, buffers: list[Buffer],
              fds: list[int] | None = None) -> int:
        """Bytes taken from the front of ``buffers`` (0: no room now; WRITABLE follows).
        ``fds`` (only where ``info.passes_fds``) go with the first byte written (duplicated
        for the peer; ours stay open); they are sent when the call took any byte."""

    def wake(self) -> None:
        """Any thread: end the wait() under way, or the next one, at once."""

    def close(self, channel: ChannelT | None) -> None:
        """Release ``channel`` (no event about it follows), or everything (None, once)."""

    def explain(self) -> str | None:
        """Client: what stands between us and the server, when the carrier knows more than
        the last failed attempt said (a broker in between, say); None otherwise."""


CarrierFactory = Callable[[CommunicatorOptions, Purpose], Carrier[object]]
"""A carrier class, called with the options and purpose (what :func:`netq.transports.lookup`
returns). A server's carrier binds in its constructor, so that a taken port raises there."""


def cut(buffers: list[Buffer], limit: int) -> tuple[list[Buffer], int]:
    """The front of ``buffers`` up to ``limit`` bytes, without copying: the buffers and their
    total size. For carriers that move bytes in packets.

    A packet ends before the first buffer that does not fit but would fit a packet of its own:
    a message body then travels whole, as the object it is (MQTT's carrier writes a packet's
    buffers with one ``sendmsg``, no copy). A buffer larger than ``limit`` is cut wherever the
    packet ends: it is cut anyway. A packet also ends after a buffer of half ``limit`` or
    more (a large body): the frame headers behind it go with the next body, so a packet with
    a large body ends with it and starts with its frame header, and the receiver can take
    the body as the packet's tail without copying it (two such bodies would not have shared
    a packet anyway)."""
    parts: list[Buffer] = []
    size = 0
    for buffer in buffers:
        length = len(buffer)
        if size + length > limit:
            if length > limit or not parts:
                parts.append(memoryview(buffer)[: limit - size])
                size = limit
            break
        parts.append(buffer)
        size += length
        if size == limit or length >= limit >> 1:
            break
    return parts, size
