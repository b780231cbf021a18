"""The MQTT transport's topic names (a leaf: imports nothing of the subpackage).

Every topic lives under ``<prefix>/<service>`` (the *base*)::

    <base>/c2s/<client-id>             client -> server link packets (server subscribes c2s/+)
    <base>/s2c/<client-id>             server -> client link packets
    <base>/status/<who>/<inst>         presence (see presence.py); <who> is a client id or SERVER
    <base>/who                         a client asks for the live server (QUERY)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("Topics", "SERVER", "QUERY")

SERVER = "server"  # the server's name on the status topic (clients use their id)
QUERY = "who"  # the topic (under <base>/) on which clients ask for the live server


@dataclass(frozen=True, slots=True)
class Topics:
    """The topic names of one service; immutable, so every thread reads them freely."""

    base: str  # <prefix>/<service>
    c2s: str  # <base>/c2s/ (a client id follows)
    s2c: str  # <base>/s2c/ (a client id follows)
    status: str  # <base>/status/ (<who>/<inst> follows)
    query: str  # <base>/who

    @classmethod
    def of(cls, prefix: str, service: str) -> Topics:
        """The topics of ``service`` (``netloc.path``, default ``netq``) under ``prefix``;
        ValueError for a service that is no plain topic (wildcards, nothing but slashes)."""
        if any(c in service for c in "#+") or not service.strip("/"):
            raise ValueError(f"MQTT service name {service!r}: a topic without wildcards")
        base = f"{prefix}/{service.strip('/')}"
        return cls(base=base, c2s=f"{base}/c2s/", s2c=f"{base}/s2c/", status=f"{base}/status/",
                   query=f"{base}/{QUERY}")
