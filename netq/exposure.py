"""Who can reach a server, and whether it may unpickle what they send: the exposure decision.

The default serializer, an unrestricted :class:`~netq.serializers.PickleSerializer`, runs whatever
code a received pickle names. That is fine between processes of one user on one host, and
remote code execution for everyone who can reach the port otherwise. This module is the one
place that decides, before a server binds, whether strangers can reach it and whether anything
stops them from running code in it:

* **reachable by others** (:func:`reachable_by_others`): a TCP, TLS or gRPC server whose
  listening address is not a loopback address (``0.0.0.0``, ``::``, ``""``, a LAN address, a
  name that resolves to one); a Unix socket server (``Protocol.UNIX``, or gRPC with
  ``netloc.path``) whose socket directory is group/world-writable without the sticky bit (other
  users can replace the socket). The socket file itself is made owner-only
  (:func:`owner_only`) before the server listens, whatever the umask, since connecting to a
  Unix socket needs only write permission on its file. An MQTT
  communicator is reached through its broker: a broker that is not on a loopback address
  (decided from the literal host, without a DNS lookup) is shared with other machines.
* **protected** (:func:`protection`): an ``authkey`` (peers prove they hold it before anything
  they send is deserialized), client certificates (mutual TLS: ``client_ca`` on a TLS server),
  or a ``load`` that runs no code a peer chooses: ``PickleSerializer(restrict=[...])``,
  ``BytesSerializer``, or a load function of the caller's own (netq cannot look inside it, so
  it is taken as the caller's decision).

:func:`check` applies the rule: a server reachable by others and unprotected raises
:class:`~netq.exceptions.UnprotectedServer` (naming why and the three ways forward) unless
``SecurityOptions(allow_untrusted_peers=True)`` opts out, which logs a WARNING at start. An
MQTT communicator (server or client) on a non-loopback broker with neither TLS nor broker
credentials and an unrestricted pickle logs one WARNING: any client of that broker can publish
on netq's topics. Loopback servers are never affected.

:func:`shared_authkey` is the one-call way to make a key and share it through a file.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
import stat
from pathlib import Path

from .exceptions import UnprotectedServer
from .options import CommunicatorOptions, Protocol, Purpose, SecurityOptions
from .serializers import BytesSerializer, PickleSerializer

__all__ = ("check", "reachable_by_others", "broker_exposure", "protection", "shared_authkey",
           "owner_only", "AUTHKEY_BYTES")

LOGGER = logging.getLogger("netq")
#: Random bytes in a key made by :func:`shared_authkey`: 256 bits, as HMAC-SHA256's.
AUTHKEY_BYTES = 32
_RUNS_CODE = ("it would unpickle whatever they send (an unrestricted PickleSerializer, the "
              "default), which lets any of them run code in this process")


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def owner_only(path: str) -> None:
    """Make a freshly bound Unix socket file readable and writable by its owner only.

    Called between ``bind`` and ``listen``, so no one else connects in between: connecting to
    a Unix socket needs write permission on its file, and the umask alone (``0002`` is common)
    would leave it to the group. Other users reach such a server only where netq is told to
    let them (an authkey, restrict) by the rule in :func:`check`.
    """
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)


def _unix_socket_exposure(path: str) -> str | None:
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return None  # the bind fails and says so
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return (f"its socket {path} is in {directory}, which other users may write to "
                f"(mode {stat.S_IMODE(mode):04o}, no sticky bit): they can reach it and replace it")
    return None


def _host_exposure(host: str, port: int) -> str | None:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return None  # the bind fails on the same lookup and says so
    addresses = sorted({str(info[4][0]) for info in infos})
    outside = [address for address in addresses if not _is_loopback(address)]
    if not outside:
        return None
    shown = host if host else "every address ('')"
    also = "" if outside == [host] else f" = {', '.join(outside)}"
    return (f"it listens on {shown}{also} (not loopback): other machines can reach it")


def reachable_by_others(protocol: Protocol, options: CommunicatorOptions) -> str | None:
    """Why a server with these options can be reached by other machines or users, or None
    when only this host's own user can reach it. Resolves the host name (as the bind will);
    never binds or sends anything."""
    netloc = options.netloc
    if protocol is Protocol.UNIX or (protocol is Protocol.GRPC and netloc.path is not None):
        return _unix_socket_exposure(netloc.unix_path())
    if protocol is Protocol.MQTT:
        return broker_exposure(options)
    return _host_exposure(netloc.host, netloc.port)


def broker_exposure(options: CommunicatorOptions) -> str | None:
    """Why the MQTT broker in ``options.netloc`` is shared with other machines, or None.
    Decided from the literal host (``localhost`` or a loopback address), without DNS, so the
    constructor never waits for a name server."""
    host = options.netloc.host
    if host == "localhost" or _is_loopback(host):
        return None
    return f"its broker {host}:{options.netloc.port} is not on a loopback address"


def _load_protection(options: CommunicatorOptions) -> str | None:
    load = options.serialization.load
    owner = getattr(load, "__self__", None)
    if isinstance(owner, PickleSerializer):
        return None if owner.restrict is None else "PickleSerializer(restrict=...)"
    if isinstance(owner, BytesSerializer):
        return "BytesSerializer"
    return "a load function of your own"


def protection(options: CommunicatorOptions, purpose: Purpose = Purpose.SERVER) -> str | None:
    """What stops an untrusted peer from running code in this communicator (a few words), or
    None when nothing does: an authkey, client certificates (server side), or a ``load`` that
    does not run pickled code."""
    security = options.security
    if security is not None:
        if security.authkey is not None:
            return "an authkey"
        if purpose is Purpose.SERVER and security.tls and security.client_ca is not None:
            return "client certificates (mutual TLS)"
    return _load_protection(options)


def _where(protocol: Protocol, options: CommunicatorOptions) -> str:
    netloc = options.netloc
    if protocol is Protocol.UNIX:
        return netloc.unix_path()
    return str(netloc)


def _refusal(protocol: Protocol, options: CommunicatorOptions, why: str) -> str:
    tls = options.security is not None and options.security.tls
    tls_note = (" (TLS without client_ca proves only the server's identity to clients, "
                "not the clients' to the server)") if tls else ""
    return (
        f"netq refuses to start this {protocol.value} server at {_where(protocol, options)}: "
        f"{why}, and {_RUNS_CODE}{tls_note}. Choose one:\n"
        f"  1. authenticate peers: SecurityOptions(authkey=netq.shared_authkey('netq.key')) "
        f"on the server and every client (copy the key file to the clients), or mutual TLS "
        f"(SecurityOptions(key=..., certificate=..., client_ca=...));\n"
        f"  2. load data, not code: SerializationOptions(load=PickleSerializer("
        f"restrict=[...]).load) or SerializationOptions(load=BytesSerializer().load, "
        f"dump=BytesSerializer().dump);\n"
        f"  3. accept that every peer that can reach it can run code here: "
        f"SecurityOptions(allow_untrusted_peers=True) (logs a WARNING at start).\n"
        f"(\"Running across machines\" in the README shows each.)")


def check(protocol: Protocol, purpose: Purpose, options: CommunicatorOptions) -> None:
    """Apply the exposure rule before a communicator binds or connects: raise
    :class:`UnprotectedServer` for an unprotected server reachable by others, log the opt-out's
    WARNING, or (MQTT) log that the broker's other clients can run code here."""
    protocol, purpose = Protocol(protocol), Purpose(purpose)
    if protocol is Protocol.MQTT:
        _check_broker(purpose, options)
        return
    if purpose is not Purpose.SERVER:
        return
    why = reachable_by_others(protocol, options)
    if why is None or protection(options, purpose) is not None:
        return
    security = options.security
    if security is not None and security.allow_untrusted_peers:
        LOGGER.warning(
            "netq %s server at %s accepts untrusted peers "
            "(SecurityOptions(allow_untrusted_peers=True)): %s, and %s",
            protocol.value, _where(protocol, options), why, _RUNS_CODE)
        return
    raise UnprotectedServer(_refusal(protocol, options, why))


def _check_broker(purpose: Purpose, options: CommunicatorOptions) -> None:
    why = broker_exposure(options)
    if why is None:
        return
    security = options.security
    if security is not None and security.tls:
        return
    if options.mqtt.username is not None:
        return
    if _load_protection(options) is not None:
        return
    LOGGER.warning(
        "netq MQTT %s of service %r: %s, the connection to it has neither TLS nor broker "
        "credentials, and this %s unpickles what arrives with an unrestricted "
        "PickleSerializer: any client of that broker can make this process run code. Use TLS "
        "and broker authentication with topic ACLs (SecurityOptions(certificate=...), "
        "MQTTOptions(username=..., password=...)), or PickleSerializer(restrict=[...]) / "
        "BytesSerializer.",
        purpose.value, options.netloc.path or "netq", why, purpose.value)


def shared_authkey(path: str | os.PathLike[str], *, create: bool = True) -> bytes:
    """The authkey kept in the file ``path``, made first if it does not exist.

    A new key is :data:`~netq.exposure.AUTHKEY_BYTES` random bytes from :mod:`secrets`, written
    as one line of hex text to a file only its owner can read (mode 0600, its missing parent
    directories 0700). Give the same file to every client (copy it, or put it on a shared
    filesystem) and pass ``SecurityOptions(authkey=shared_authkey(path))`` on both ends. Two
    processes that create it at once agree on one key (the file is created exclusively).
    ``create=False`` raises :class:`FileNotFoundError` instead of making a key (for clients). A
    key file that group or others can read, or that is not hex text, raises :class:`ValueError`.
    """
    path = Path(path).expanduser()
    if create and not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: use theirs
        else:
            with os.fdopen(fd, "w", encoding="ascii") as file:
                file.write(secrets.token_hex(AUTHKEY_BYTES) + "\n")
    mode = path.stat().st_mode
    if stat.S_IMODE(mode) & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"the authkey file {path} is readable by other users (mode "
                         f"{stat.S_IMODE(mode):04o}): chmod 600 {path}")
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"the authkey file {path} must hold the key as hex text "
                         f"(as shared_authkey() writes it)") from None
    SecurityOptions(authkey=key)  # the same validation as every authkey
    return key
