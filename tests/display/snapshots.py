"""Statistics snapshots for the display tests: one peer row and a server's snapshot, every
number fixed (rates in messages/s and bytes/s, memory and credit in bytes)."""

from __future__ import annotations

import uuid

from netq.statistics import CommunicatorStatistics, PeerStatistics

PEER = uuid.UUID("12345678-0000-0000-0000-000000000000")


def row(**fields) -> PeerStatistics:
    values = dict(peer=PEER, state="connected", queue_in=3, queue_in_bytes=30, queue_out=1200,
                  queue_out_bytes=10, inflight=0, inflight_bytes=0, messages_in=5, bytes_in=50,
                  messages_out=1, bytes_out=10, credit_out=4 << 20, credit_in=65536,
                  memory=1536, reconnects=0, connected_for=1.0, messages_in_per_s=12345.0,
                  bytes_in_per_s=2.5 * (1 << 20), messages_out_per_s=0.0, bytes_out_per_s=0.0)
    values.update(fields)
    return PeerStatistics(**values)


def stats(*rows) -> CommunicatorStatistics:
    return CommunicatorStatistics(
        id=uuid.uuid4(), purpose="server", protocol="tcp", address="127.0.0.1:1",
        state="open", uptime=2.0, time=2.0, peers=rows, messages_in=5, bytes_in=50,
        messages_out=1, bytes_out=10, messages_in_per_s=12345.0, bytes_in_per_s=2.5 * (1 << 20),
        messages_out_per_s=0.0, bytes_out_per_s=0.0, memory=1536)


def waiting_snapshot(why: str) -> CommunicatorStatistics:
    """A snapshot whose one peer has waited 6.2 s (``why``) and whose last connect failed."""
    waiting = row(blocked=why, blocked_for=6.2)
    return CommunicatorStatistics(**{**{f: getattr(stats(waiting), f) for f in (
        "id", "purpose", "protocol", "address", "state", "uptime", "time", "peers",
        "messages_in", "bytes_in", "messages_out", "bytes_out", "messages_in_per_s",
        "bytes_in_per_s", "messages_out_per_s", "bytes_out_per_s", "memory")},
        "connect_error": "connection refused"})
