"""netq: put()/get() queues between one server and many clients.

    import netq as nq

    with nq.new(purpose=nq.Purpose.SERVER) as queue:        # server
        message = queue.get()                                 # -> Message(peer, data)
        queue.put("Hello, Client!", message.peer)

    with nq.new(purpose=nq.Purpose.CLIENT) as queue:        # client
        queue.put("Hello, Server!").result()                  # resolves on delivery
        message = queue.get()

Transports: ``Protocol.TCP`` (TLS with ``SecurityOptions``), ``Protocol.UNIX``; more are
registered in :mod:`netq.transports`. Errors: :mod:`netq.exceptions`.
"""

from __future__ import annotations

from . import stream, transports
from .communicator import Communicator, Message
from .exceptions import (
    AuthenticationError,
    BroadcastIncomplete,
    BrokerUnavailable,
    ConnectionLost,
    DeserializationError,
    Empty,
    Full,
    LocalProtocolError,
    MessageTooLarge,
    NetqError,
    ProtocolError,
    RemoteProtocolError,
    ResourceClosed,
    ResourceGone,
    UnknownPeer,
    UnprotectedServer,
    UnsupportedProtocol,
    UsedInForkedChild,
)
from .exposure import shared_authkey
from .futures import DeliveryFuture
from .loop import carrier_loop
from .options import (
    CommunicatorOptions,
    ConnectionOptions,
    GiB,
    KiB,
    MiB,
    MQTTOptions,
    NetworkLocation,
    Protocol,
    Purpose,
    SecurityOptions,
    SerializationOptions,
)
from .serializers import BytesSerializer, PickleSerializer
from .statistics import CommunicatorStatistics, PeerStatistics
from .stream import Stream

__version__ = "0.1.0"

# No handler of netq's own: the application decides where its log goes. Until it configures
# logging, Python's last-resort handler prints WARNINGs and above to stderr, so a put() or a
# close() that waits says why in a plain script too; INFO and DEBUG stay quiet.

__all__ = [
    "new",
    "Protocol",
    "Purpose",
    "CommunicatorOptions",
    "MQTTOptions",
    "NetworkLocation",
    "ConnectionOptions",
    "SerializationOptions",
    "SecurityOptions",
    "Communicator",
    "Message",
    "DeliveryFuture",
    "CommunicatorStatistics",
    "PeerStatistics",
    "Stream",
    "PickleSerializer",
    "BytesSerializer",
    "NetqError",
    "ResourceGone",
    "ResourceClosed",
    "ConnectionLost",
    "UsedInForkedChild",
    "BroadcastIncomplete",
    "Empty",
    "Full",
    "UnknownPeer",
    "MessageTooLarge",
    "DeserializationError",
    "UnsupportedProtocol",
    "AuthenticationError",
    "UnprotectedServer",
    "BrokerUnavailable",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "KiB",
    "MiB",
    "GiB",
    "shared_authkey",
    "stream",
    "transports",
]


def _protocol_named(protocol: Protocol | str) -> Protocol:
    """``protocol`` as a :class:`Protocol` (a name in any case); :class:`UnsupportedProtocol`
    naming the ones there are otherwise."""
    if isinstance(protocol, Protocol):
        return protocol
    name = protocol.strip().lower() if isinstance(protocol, str) else protocol
    try:
        return Protocol(name)
    except ValueError:
        hint = (" (TLS is Protocol.TCP with SecurityOptions(certificate=..., key=...))"
                if name in ("tls", "ssl") else "")
        raise UnsupportedProtocol(
            f"no transport named {protocol!r}{hint}; netq has: "
            f"{', '.join(member.value for member in Protocol)}") from None


def _purpose_named(purpose: Purpose | str) -> Purpose:
    """``purpose`` as a :class:`Purpose` (a name in any case); a ValueError otherwise."""
    if isinstance(purpose, Purpose):
        return purpose
    try:
        return Purpose(purpose.strip().lower() if isinstance(purpose, str) else purpose)
    except ValueError:
        raise ValueError(f"purpose must be Purpose.SERVER or Purpose.CLIENT ('server' or "
                         f"'client'), not {purpose!r}") from None


def new(protocol: Protocol | str = Protocol.TCP, purpose: Purpose | str = Purpose.CLIENT,
        options: CommunicatorOptions | None = None) -> Communicator:
    """Create a communicator. Never blocks on the network.

    A server binds at once (so a taken port raises ``OSError`` here); a client connects, and
    reconnects, on its I/O thread. Each call without ``options`` gets a fresh random id; a
    server knows a client by it, so a client whose options' id another live client of this
    process uses for the same server raises :class:`LocalProtocolError` (give each client its
    own :class:`CommunicatorOptions`).
    A server that other machines can reach and that would unpickle anything from
    unauthenticated peers raises :class:`UnprotectedServer` before it binds (see
    :mod:`netq.exposure` and ``SecurityOptions.allow_untrusted_peers``).
    """
    protocol = _protocol_named(protocol)
    purpose = _purpose_named(purpose)
    if options is None:
        options = CommunicatorOptions()
    carrier_class = transports.lookup(protocol.value)
    return Communicator(protocol, purpose, options, carrier_loop(carrier_class))
