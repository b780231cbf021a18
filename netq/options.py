"""What a communicator is told: protocol, purpose and the option records (units in names/docs).

All records are frozen; build a new one with :func:`dataclasses.replace`. Every
``CommunicatorOptions()`` gets its own random ``id`` (a ``uuid4``): the default is a factory,
never one shared object.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .chunk_stream import Stream
from .serializers import DEFAULT_SERIALIZER

__all__ = (
    "Protocol",
    "Purpose",
    "NetworkLocation",
    "ConnectionOptions",
    "SerializationOptions",
    "SecurityOptions",
    "CommunicatorOptions",
    "MQTTOptions",
    "KiB",
    "MiB",
    "GiB",
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class Protocol(enum.StrEnum):
    """Which transport carries the frames."""

    TCP = "tcp"  # TCP, or TLS when SecurityOptions has a certificate
    UNIX = "unix"  # Unix domain stream socket, same host only
    MQTT = "mqtt"  # through an MQTT broker
    GRPC = "grpc"  # gRPC streams


class Purpose(enum.StrEnum):
    SERVER = "server"
    CLIENT = "client"


class NetworkLocation(NamedTuple):
    """Where the server listens (for MQTT: where the broker listens).

    ``path`` is the socket file for ``Protocol.UNIX``; when it is ``None`` a per-port path in
    the temporary directory is used, so server and client agree on it from the port alone.
    """

    host: str = "127.0.0.1"
    port: int = 51966
    path: str | None = None

    def unix_path(self) -> str:
        if self.path is not None:
            return os.fspath(self.path)
        return os.path.join(tempfile.gettempdir(), f"netq-{os.getuid()}-{self.port}.sock")

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """How bytes move. Sizes in bytes, times in seconds.

    max_size        largest chunk (DATA frame body) handed to the transport; messages above
                    it are cut into chunks and reassembled, never split into user messages.
    merge_size      largest buffer that small frames are coalesced into before a write.
    efficient_size  buffers below this are copied into the merge buffer; larger ones are
                    written straight from the caller's memory (scatter-gather, zero copy).
                    So is a ``bytes`` part (a pickle, or bytes sent as they are) of 4 KiB or
                    more: it cannot change while it waits.
    recv_budget     bytes this communicator holds for all its peers together: messages received
                    and not yet taken by ``get()``, plus credit granted and not yet used. When
                    it is full, peers get no more credit until ``get()`` frees some; each peer
                    may still hold 16 KiB (so one peer's backlog cannot starve another), and a
                    message may start on any positive credit: received memory stays under
                    recv_budget + per peer (16 KiB + one message). While a consumer takes
                    messages (a get() waits, or one returned within half a second), what a
                    peer has unread also counts against its window: a consumer that lags
                    queues about a window (two large messages), not the budget.
                    See docs/guarantees.md.
    send_budget     bytes queued for one peer and not yet on the wire above which ``put``
                    blocks (or raises ``Full``); a blocked ``put`` goes on once a quarter of
                    the budget is free again (it also looks every 0.1 s), so that a thread
                    putting large messages wakes once for several. Each queued message counts
                    its serialized size plus 512 bytes (``netq.session.QUEUED_MESSAGE_COST``:
                    the memory of its future and bookkeeping), so the budget bounds memory for
                    64-byte messages as well as for large ones (32 MiB: about 55 000 such
                    messages).
    send_messages   most messages held for one peer at once: queued, plus on the wire and not
                    yet acknowledged. ``put`` blocks past it (or raises ``Full``) as past
                    send_budget. It bounds what small messages cost, which their bytes do not
                    show: each held message is about 0.5 KiB of Python objects that the
                    garbage collector traverses again and again while it is held (4096: about
                    2 MiB). A producer faster than its link gains nothing from a longer queue.
    window_min      the credit a peer starts with (each link's HELLO grant, while the budget
                    has room; None: 256 KiB, or recv_budget if smaller); the window then
                    grows while the sender is starved for credit and the consumer keeps up,
                    like TCP receive autotuning, within the peer's share of recv_budget.
    window_max      the largest a peer's window grows to (None: recv_budget // 2).
    stall_warning   seconds a wait for something that is not coming lasts before netq logs a
                    WARNING on the ``netq`` logger saying what it waits for (a put() past
                    send_budget, close() waiting for acknowledgements, a client that cannot
                    connect, a full receive budget); repeated every 30 s while it lasts.
    session_timeout how long a disconnected peer's session (its queues, unacknowledged
                    messages) waits for a reconnect before its futures fail. Server: seconds
                    since the client's link broke. Client: seconds with no connection attempt
                    under way (waiting to retry after a failed one), summed since the link
                    broke. Time spent in an attempt (connecting, handshaking) does not count:
                    the server may be alive, busy with a storm of others, and holding the
                    session, so a storm fails nothing; a server that refuses every attempt
                    (nothing listens) fails the client's puts after about session_timeout.
                    The client keeps retrying afterwards; later puts wait again. The default
                    (30 s) outlasts a server restart under a storm of 2000 reconnecting
                    clients on 2 cores (docs/guarantees.md).
    heartbeat       idle time after which a PING is sent; a link silent for 3 heartbeats is
                    dropped (and the client reconnects).
    reconnect_min / reconnect_max
                    the client's reconnect backoff, doubling from min to max.
    spin            how long a blocking get() busy-polls (yielding the GIL) before it sleeps:
                    trades a little CPU for skipping a thread wake-up (tens of us) when the
                    next message is about to arrive. 0 (the default) disables it: on a busy
                    2-core machine spinning costs more than it saves.
    shared_memory   over Protocol.UNIX, message parts of shm_threshold bytes or more travel in
                    shared-memory segments (memfds whose descriptors cross the socket)
                    instead of through it, when both ends have it on (Linux). False: every
                    byte through the socket. See docs/transports.md.
    shm_threshold   the smallest part (bytes) sent through shared memory (1 MiB).
    io_thread       client only: "own" runs this communicator's I/O on a thread of its own
                    (a blocked get() may then run its loop itself: the fastest round trip);
                    "shared" on the one I/O thread the process's shared clients have in
                    common (a process that runs a thousand clients runs one such thread, not
                    a thousand: see netq.shared_io; a done-callback that blocks holds up all
                    of them); "auto" (the default) own for a process's first 8 clients open
                    at once, shared from then on. Servers always run their own. On platforms
                    without epoll every client runs its own.
    """

    max_size: int = 4 * MiB
    merge_size: int | None = None  # None: max_size
    efficient_size: int | None = None  # None: max_size // 64
    recv_budget: int = 64 * MiB
    send_budget: int = 32 * MiB
    send_messages: int = 4096
    window_min: int | None = None  # None: 256 KiB, or recv_budget if that is smaller
    window_max: int | None = None  # None: recv_budget // 2
    session_timeout: float = 30.0
    heartbeat: float = 5.0
    reconnect_min: float = 0.02
    reconnect_max: float = 1.0
    spin: float = 0.0
    stall_warning: float = 5.0
    shared_memory: bool = True
    shm_threshold: int = 1 * MiB
    io_thread: str = "auto"

    def __post_init__(self) -> None:
        if self.max_size < 1024:
            raise ValueError("max_size must be at least 1 KiB")
        if self.merge_size is None:
            object.__setattr__(self, "merge_size", self.max_size)
        if self.efficient_size is None:
            object.__setattr__(self, "efficient_size", self.max_size // 64)
        if self.recv_budget < 1 or self.send_budget < 1:
            raise ValueError("budgets must be positive")
        if self.send_messages < 1:
            raise ValueError("send_messages must be positive")
        if self.window_min is None:
            object.__setattr__(self, "window_min", min(256 * KiB, self.recv_budget))
        assert self.window_min is not None
        if self.window_min < 1:
            raise ValueError("window_min must be positive")
        if self.window_max is None:
            object.__setattr__(self, "window_max", max(self.window_min, self.recv_budget // 2))
        assert self.window_max is not None
        if self.window_max < self.window_min:
            raise ValueError("window_max must be >= window_min")
        if self.recv_budget < self.window_min:
            raise ValueError("recv_budget must be >= window_min")
        if self.stall_warning <= 0:
            raise ValueError("stall_warning must be > 0")
        if self.spin < 0:
            raise ValueError("spin must be >= 0")
        if self.io_thread not in ("auto", "own", "shared"):
            raise ValueError(f"io_thread must be 'auto', 'own' or 'shared', not {self.io_thread!r}")
        if self.shm_threshold < 4096:
            raise ValueError("shm_threshold must be at least 4 KiB")
        if self.session_timeout < 0 or self.heartbeat <= 0:
            raise ValueError("session_timeout must be >= 0 and heartbeat > 0")


DEFAULT_MESSAGE_LIMIT = 4 * GiB  # message_size=-1: no user limit, but no 1 TiB allocations


@dataclass(frozen=True, slots=True)
class SerializationOptions:
    """How objects become bytes, and how many the receive side holds.

    message_size    largest serialized message in bytes, both ways (-1: up to 4 GiB, the cap
                    that stops a peer from claiming an absurd size). put() raises
                    MessageTooLarge for a larger message, or one over the message_size of a
                    connected peer it goes to, before queueing anything; a peer's limit
                    learnt after the put (not connected yet) fails that peer's part of the
                    future instead. A message is never split into several.
    queue_size      most messages from one peer waiting in our receive queue (-1: bounded
                    only by recv_budget bytes). Enforced with message credits.
    load / dump     ``dump(obj) -> Stream`` and ``load(Stream) -> obj``; the default is
                    :class:`netq.serializers.PickleSerializer`.
    """

    message_size: int = -1
    queue_size: int = -1
    load: Callable[[Stream], Any] = DEFAULT_SERIALIZER.load
    dump: Callable[[Any], Stream] = DEFAULT_SERIALIZER.dump

    @property
    def message_limit(self) -> int:
        return DEFAULT_MESSAGE_LIMIT if self.message_size < 0 else self.message_size


@dataclass(frozen=True, slots=True)
class SecurityOptions:
    """TLS and peer authentication.

    key / certificate   server: its private key and certificate (PEM files). client: the
                        certificate (or CA) it trusts in ``certificate``; with ``key`` too, it
                        presents ``client_certificate`` for mutual TLS.
    client_certificate  client: its own certificate for mutual TLS.
    client_ca           server: require client certificates signed by this CA (mutual TLS).
    authkey             shared secret; both ends prove they hold it (HMAC-SHA256
                        challenge-response) before any payload is deserialized.
    server_hostname     name checked against the server certificate (default: netloc host).
    allow_untrusted_peers
                        server: start even though peers that can reach it are not
                        authenticated and may run code in it. Without it, a server reachable
                        from other machines (or, on a Unix socket, other users) refuses to
                        start unless it has an ``authkey``, client certificates, or a ``load``
                        that does not unpickle arbitrary globals (:mod:`netq.exposure`); with
                        it, the server starts and logs a WARNING saying so. No effect on
                        loopback servers.
    """

    key: Path | str | None = None
    certificate: Path | str | None = None
    client_certificate: Path | str | None = None
    client_ca: Path | str | None = None
    authkey: bytes | None = None
    server_hostname: str | None = None
    allow_untrusted_peers: bool = False

    def __post_init__(self) -> None:
        if self.authkey is not None:
            if isinstance(self.authkey, str):
                raise TypeError("authkey must be bytes, not str: pass key.encode() or "
                                "netq.shared_authkey(path)")
            if not isinstance(self.authkey, (bytes, bytearray)):
                raise TypeError(f"authkey must be bytes, got {type(self.authkey).__name__}")
            if not self.authkey:
                raise ValueError("authkey must not be empty: an empty key is one everybody has")
            object.__setattr__(self, "authkey", bytes(self.authkey))
        if not isinstance(self.allow_untrusted_peers, bool):
            raise TypeError("allow_untrusted_peers must be True or False, got "
                            f"{self.allow_untrusted_peers!r}")

    @property
    def tls(self) -> bool:
        return self.certificate is not None


@dataclass(frozen=True, slots=True)
class MQTTOptions:
    """Protocol.MQTT only: how netq uses the broker. Sizes in bytes, times in seconds.

    The broker is ``CommunicatorOptions.netloc`` (host, port); ``netloc.path`` names the
    *service* (default ``"netq"``): a server and its clients share ``<prefix>/<service>/`` topics,
    so a client finds its server by the service name alone, never by the server's id. One
    server per service.

    prefix            first topic level (``<prefix>/<service>/c2s/<client-id>`` etc.).
    qos               MQTT QoS of every publish (1: the broker acknowledges; netq's own link
                      sequence numbers and acks catch what a broker drops anyway).
    keepalive         MQTT keepalive; the broker publishes our Last Will 1.5x this after it
                      loses us without a DISCONNECT.
    protocol_version  None (default: MQTT 5 first; MQTT 3.1.1 when the broker refuses it, closes
                      the connection or does not answer CONNECT within 3 s, said at INFO), 5
                      (MQTT 5 only: the broker's Maximum Packet Size is read from CONNACK) or
                      4 (MQTT 3.1.1 only).
    max_packet_size   a cap on each MQTT packet we publish (None: the broker's CONNACK limit
                      on MQTT 5; on 3.1.1 unlimited until the broker drops the connection with
                      a large publish unacknowledged: then packets are cut to half that size,
                      with a WARNING); chunks are cut to fit under it.
    window_packets    link packets a sender may have unacknowledged in the broker at once, to
                      start with (it adapts: +1 per clean window, halved when the broker
                      drops one), between 2 and ``window_packets_max``.
    window_bytes      bytes a sender may have unacknowledged in the broker at once (per link).
    connect_timeout   how long a server's ``netq.new`` waits for the broker before raising
                      :class:`netq.BrokerUnavailable` (clients wait and retry forever).
    username/password broker credentials, if the broker wants them.
    """

    prefix: str = "netq"
    qos: int = 1
    keepalive: int = 10
    protocol_version: int | None = None
    max_packet_size: int | None = None
    window_packets: int = 64
    window_packets_max: int = 512
    window_bytes: int = 16 * MiB
    connect_timeout: float = 10.0
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.qos not in (0, 1, 2):
            raise ValueError("qos must be 0, 1 or 2")
        if self.protocol_version not in (None, 4, 5):
            raise ValueError("protocol_version must be None (try 5, then 3.1.1), "
                             "4 (MQTT 3.1.1) or 5")
        if not self.prefix or any(c in self.prefix for c in "#+"):
            raise ValueError("prefix must be a non-empty topic without wildcards")
        if self.max_packet_size is not None and self.max_packet_size < 4096:
            raise ValueError("max_packet_size must be at least 4 KiB")
        if not 2 <= self.window_packets <= self.window_packets_max:
            raise ValueError("need 2 <= window_packets <= window_packets_max")
        if self.window_bytes < 64 * KiB:
            raise ValueError("window_bytes must be at least 64 KiB")
        if self.keepalive < 1 or self.connect_timeout <= 0:
            raise ValueError("keepalive >= 1 and connect_timeout > 0")


def _network_location(netloc: Any) -> NetworkLocation:
    """``netloc`` as a :class:`NetworkLocation`: from one, or from a ``(host, port)`` or
    ``(host, port, path)`` tuple; a TypeError or ValueError naming what is wrong otherwise."""
    if not isinstance(netloc, tuple) or not 2 <= len(netloc) <= 3:
        raise TypeError("netloc must be a NetworkLocation or a (host, port) or "
                        f"(host, port, path) tuple, not {netloc!r}")
    host, port, *path = netloc
    if not isinstance(host, str):
        raise TypeError(f"netloc host must be a str, not {host!r}")
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"netloc port must be an int, not {port!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"netloc port must be 0-65535, not {port}")
    if path and path[0] is not None and not isinstance(path[0], str):
        raise TypeError(f"netloc path must be a str or None, not {path[0]!r}")
    if type(netloc) is NetworkLocation:
        return netloc
    return NetworkLocation(host, port, *path)


@dataclass(frozen=True, slots=True)
class CommunicatorOptions:
    """Everything a communicator needs; each instance gets a fresh random id.

    ``netloc`` also takes a plain ``(host, port)`` or ``(host, port, path)`` tuple, kept as a
    :class:`NetworkLocation`; anything else raises TypeError (ValueError for a port outside
    0-65535) here, not later in the transport.
    """

    id: uuid.UUID = field(default_factory=uuid.uuid4)
    netloc: NetworkLocation = NetworkLocation()
    workers: int = 1  # kept for API compatibility: one I/O thread serves all peers
    connection: ConnectionOptions = ConnectionOptions()
    serialization: SerializationOptions = SerializationOptions()
    security: SecurityOptions | None = None
    mqtt: MQTTOptions = MQTTOptions()  # Protocol.MQTT only
    # A name people read, e.g. "client-03": the messages (WARNINGs, Full, statistics()'s
    # `blocked`) of every communicator in this process say it where they would print this
    # communicator's id. Never sent: a peer in another process is named by its id.
    name: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"name must be a non-empty string or None, not {self.name!r}")
        netloc = _network_location(self.netloc)
        if netloc is not self.netloc:
            # A plain (host, port) tuple is what most people write first.
            object.__setattr__(self, "netloc", netloc)

    def replace(self, **changes: Any) -> CommunicatorOptions:
        return dataclasses.replace(self, **changes)
