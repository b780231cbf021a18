"""Transports, registered by name. Each module carries netq frames over one kind of link.

A transport class is constructed with its engine (:class:`netq.contract.EngineAPI`, the only
thing it calls back) and provides::

    start()                 start the I/O thread (the constructor must not block on the network)
    wake()                  any thread: make the I/O loop call engine.service() soon
    write_now(link)         write the link's queued output as far as possible (link lock held)
    close_link(link, flush) drop a link, after flushing its output when flush is true
    links()                 the live links (I/O thread)
    abort() / join()        stop at once / wait for the I/O thread
    address                 where a server listens
    direct_writes           True when a user thread may write on an idle link itself

Register a new one with :func:`register`; :func:`netq.new` looks protocols up here.
"""

from __future__ import annotations

import importlib

from ..exceptions import UnsupportedProtocol

__all__ = ("register", "lookup", "available")

# protocol name -> "module:Class", imported on first use so optional dependencies stay optional
_REGISTRY: dict[str, str] = {
    "tcp": "netq.transports.sockets:TCPTransport",
    "unix": "netq.transports.sockets:UnixTransport",
    "grpc": "netq.transports.grpc:GRPCTransport",  # needs grpcio (extra "grpc")
    "mqtt": "netq.transports.mqtt:MQTTTransport",
}


def register(name: str, target: str) -> None:
    """Register ``"package.module:Class"`` as the transport for protocol ``name``."""
    _REGISTRY[name] = target


def available() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def lookup(name: str) -> type:
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise UnsupportedProtocol(
            f"no transport registered for {name!r}; this netq has: {', '.join(available())}"
        ) from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
