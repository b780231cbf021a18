"""gRPC transport: one bidirectional stream of raw-bytes messages per link (``Protocol.GRPC``).

The service is ``netq.Link/Stream``, served through a generic method handler with no
(de)serializers: no protobuf, no generated code. Each gRPC message carries a slice of the
link's netq byte stream: a packet of 1 MiB of body plus its frame header (:data:`PACKET_LIMIT`),
or small packets joined up to :data:`MESSAGE_LIMIT` (1 MiB + 64 KiB), the message-size limit set
on both ends, so nothing ever meets gRPC's 4 MiB default.

Push, never poll: a client opens one long-lived stream and the server writes to it as soon as
netq has a packet for it. A new stream is a new link (netq resumes the session); a stream
that ends is a closed link: cleanly when the peer half-closes, as :class:`ConnectionLost` when
it is cancelled or its connection breaks (a killed client's TCP connection closes and the
server's handler is cancelled within milliseconds; gRPC keepalive and netq's heartbeat catch a
peer that goes silent without closing).

Threads: none of our own beyond the netq loop's I/O thread. ``grpc.aio`` runs on an asyncio
loop that whichever thread runs the netq loop drives while it waits (``_sleep`` runs it until
the carrier posts an event, a user thread wakes it, or the loop's timeout expires): the I/O
thread, or a ``get()`` that would block and leads the netq loop itself (leader/followers,
``any_thread_waits``), so the reply it waits for is read on its own thread with no hand-over.
Packets therefore go from the netq loop to ``call.write`` and from ``call.read`` to the netq
loop without a thread hand-off: a packet read is posted as a ``DATA`` event and stops the
asyncio loop after that turn (``packet_received``), so the netq loop feeds it to the link's
Connection at once. A put on an idle link is cut into packets on the caller's thread
(``user_threads_write``): when no thread runs the asyncio loop, that thread runs one pass of it,
in which the stream's writer hands the packet to gRPC; otherwise one loop callback asks the
thread that runs it (``kick``). One lock (``_run_lock``) lets one thread at a time run the
loop. A server holds any number of clients on its one thread (a synchronous grpc server would
pin one pool thread per open stream). gRPC's own C-core threads and its aio poller thread are
gRPC's, process-wide, and not ours to stop.

Flow control: the carrier's ``write`` cuts a packet and ``_send`` appends it to the stream's
outbound deque as one ``bytes`` (gRPC takes no other type: a packet of one ``bytes`` as it is,
any other joined; a large body ends its packet, so the peer keeps it as the packet's tail
without a copy); a writer task
awaits ``write()``, which waits for HTTP/2 flow control. A stream whose deque holds
:data:`OUTBOUND_LIMIT` bytes takes no more packets (``_can_send``); once it drains below half
it wakes the carrier, and the loop hears the link ``WRITABLE``. Each write waits for its
completion; packets that queue up meanwhile go out joined as one gRPC message, each below
:data:`JOIN_BELOW` (a packet is a byte-stream slice, so joining neighbours is lossless).
netq's credits bound what a peer may have in flight, so memory stays bounded on both ends.

Security: TLS and mutual TLS from :class:`netq.SecurityOptions` (server: ``certificate``/``key``,
``client_ca`` requires client certificates; client: trusts ``certificate``, presents
``client_certificate``/``key``, checks ``server_hostname``). A server certificate the client
does not trust is fatal (:class:`AuthenticationError`, as on TCP). The authkey handshake is the
protocol core's, inside the stream. ``NetworkLocation(path=...)`` listens/connects on a Unix
socket (``unix:`` target) instead of TCP.
Files::

    transport.py   GRPCCarrier: the server (bind, one handler per stream), the client (one
                   stream per connection attempt), the delayed-ACK setting, the packet-carrier
                   hooks, shutdown
    streams.py     one stream's outbound deque and its writer (CallStream), the message limits
    loop.py        the asyncio loop the netq loop's thread drives while it waits, and the
                   one pass a caller's write may run (LoopDrivenCarrier)
    config.py      channel and server options, TLS credentials, targets, connect errors
"""

from __future__ import annotations

import os

# gRPC's C core logs connection events (GOAWAY, ...) to stderr at INFO; keep it to errors unless
# the user asked for more. Only effective if grpc was not imported before this package.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

try:
    # Absolute imports: grpcio's package, never this one (its submodules import it the same way).
    import grpc
    import grpc.aio  # noqa: F401
except ImportError as missing:  # pragma: no cover - depends on the installation
    raise ImportError("Protocol.GRPC needs grpcio: pip install 'netq[grpc]' "
                      f"(grpcio==1.85.1): {missing}") from missing

from .streams import (
    JOIN_BELOW,
    MESSAGE_LIMIT,
    METHOD,
    OUTBOUND_LIMIT,
    PACKET_LIMIT,
    PATH,
    SERVICE,
)
from .transport import GRPCCarrier

__all__ = ("GRPCCarrier", "SERVICE", "METHOD", "PATH", "OUTBOUND_LIMIT", "MESSAGE_LIMIT",
           "PACKET_LIMIT", "JOIN_BELOW")
