"""The fault-injecting relay of the network-fault tests: :class:`netq.lab.relay.Relay`.

``FaultProxy(upstream, path=None)`` is a Relay on a ``netq-proxy`` thread, started at once:
it listens on loopback (the family of ``upstream``: TCP over IPv4 or IPv6, or ``path`` for a
Unix upstream) and relays every accepted connection byte for byte, both ways, with the faults
the tests ask for, live: ``delay(seconds, jitter=0)``, ``blackhole()``, ``refuse()``,
``restore()``, ``reset()``, ``truncate(n)``, ``stats()`` and ``close()`` (see netq/lab/relay.py
for what each does, and for the shaping and recording the same relay offers).
"""

from __future__ import annotations

import os

from netq.lab.relay import CONTROL_TIMEOUT, Relay, RelayStats
from netq.lab.shaping import CHUNK

__all__ = ("FaultProxy", "ProxyStats", "CHUNK", "BUFFER_LIMIT", "CONTROL_TIMEOUT")

BUFFER_LIMIT = 1024 * 1024  # bytes held per direction before the proxy stops reading its source
ProxyStats = RelayStats


class FaultProxy(Relay):
    """A :class:`netq.lab.relay.Relay` named ``netq-proxy`` that holds at most
    :data:`BUFFER_LIMIT` per direction (the RSS bounds of the fault tests count on it)."""

    def __init__(self, upstream, path: str | os.PathLike | None = None) -> None:
        super().__init__(upstream, path=path, buffer=BUFFER_LIMIT, name="netq-proxy")

    def __repr__(self) -> str:
        return f"<FaultProxy {self.address} -> {self.upstream}>"
