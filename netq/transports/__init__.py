"""Transports, registered by name: one carrier module per kind of link.

Each registered class is a :class:`netq.carrier.Carrier`, constructed with the options and the
purpose; the loop (:class:`netq.loop.IOLoop`) drives it, and it never calls back. Register a
new one with :func:`register`; :func:`netq.new` looks protocols up here.
"""

from __future__ import annotations

import importlib

from ..exceptions import UnsupportedProtocol

__all__ = ("register", "lookup", "available")

# protocol name -> "module:Class", imported on first use so optional dependencies stay optional
_REGISTRY: dict[str, str] = {
    "tcp": "netq.transports.sockets:TCPCarrier",
    "unix": "netq.transports.sockets:UnixCarrier",
    "grpc": "netq.transports.grpc:GRPCCarrier",  # needs grpcio (extra "grpc")
    "mqtt": "netq.transports.mqtt:MQTTCarrier",
}


def register(name: str, target: str) -> None:
    """Register ``"package.module:Class"`` (a :class:`netq.carrier.Carrier`) as the transport
    for protocol ``name``."""
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
