"""Frozen snapshots of a communicator and its peers: what monitors and widgets read.

``Communicator.statistics()`` returns a :class:`CommunicatorStatistics`; nothing in it changes
afterwards. Units: bytes, messages, seconds; rates are per second, measured between this
snapshot and the previous one taken at least :data:`RATE_INTERVAL` seconds earlier (so two
monitors sampling the same communicator do not make each other's rates noisy).

Direction: "in" is received from the peer, "out" is sent to it and acknowledged.
``queue_in`` waits for ``get()``; ``queue_out`` waits for the wire (credit or a link);
``inflight`` is on the wire and not yet acknowledged. ``memory`` is the payload bytes this
communicator holds for the peer: received and unconsumed + unsent + unacknowledged.
``credit_out`` is what the peer still lets us send, ``credit_in`` what we still let it send
(both may dip below zero by up to one message: a message may start on any positive credit);
``window`` is the receive credit we aim to keep outstanding with the peer (it grows with the
path's bandwidth-delay product, see :mod:`netq.flow`).

Waiting: ``blocked`` is empty while traffic with the peer flows; otherwise it says, in a
sentence, what it waits for and what would change it (the same text as the WARNING netq logs),
and ``blocked_for`` for how many seconds. On the communicator, ``recv_held`` is what all peers'
messages occupy of ``recv_budget`` (received, not yet taken by ``get()``; a message the last
``get()`` returned is not counted here, though its credit returns only on the next ``get()``),
``recv_outstanding`` the credit granted and not yet used, ``connect_error`` (clients) what the
last failed connection attempt ran into ("" once connected), and ``get_waiting`` what a
``get()`` that has waited ``stall_warning`` seconds or more waits for ("" otherwise).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import PeerSession

__all__ = ("PeerStatistics", "CommunicatorStatistics", "RateMeter", "RATE_INTERVAL")

RATE_INTERVAL = 0.25  # seconds: rates are not recomputed from snapshots closer than this


@dataclass(frozen=True, slots=True)
class PeerStatistics:
    peer: uuid.UUID
    state: str
    queue_in: int
    queue_in_bytes: int
    queue_out: int
    queue_out_bytes: int
    inflight: int
    inflight_bytes: int
    messages_in: int
    bytes_in: int
    messages_out: int
    bytes_out: int
    credit_out: int
    credit_in: int
    memory: int
    reconnects: int
    connected_for: float
    messages_in_per_s: float
    bytes_in_per_s: float
    messages_out_per_s: float
    bytes_out_per_s: float
    window: int = 0
    blocked: str = ""
    blocked_for: float = 0.0


@dataclass(frozen=True, slots=True)
class CommunicatorStatistics:
    id: uuid.UUID
    purpose: str
    protocol: str
    address: str  # where a server is bound, where a client connects (as its repr says)
    state: str
    uptime: float
    time: float  # time.monotonic() of the snapshot
    peers: tuple[PeerStatistics, ...]
    messages_in: int  # totals, including peers that have left
    bytes_in: int
    messages_out: int
    bytes_out: int
    messages_in_per_s: float
    bytes_in_per_s: float
    messages_out_per_s: float
    bytes_out_per_s: float
    memory: int
    recv_budget: int = 0
    recv_held: int = 0
    recv_outstanding: int = 0
    send_budget: int = 0
    connect_error: str = ""
    get_waiting: str = ""
    # Shared memory (Protocol.UNIX, netq._shm): message parts that travelled in segments
    # instead of through the socket (their bytes are in bytes_in/out too), the segments in the
    # senders' pools, of those the ones the peers held at the last send, and parts sent in a
    # one-shot segment because every pooled one was held.
    shm_bytes_in: int = 0
    shm_bytes_out: int = 0
    shm_messages_in: int = 0
    shm_messages_out: int = 0
    shm_segments: int = 0
    shm_held: int = 0
    shm_one_shot: int = 0

    def peer(self, peer: uuid.UUID) -> PeerStatistics:
        for row in self.peers:
            if row.peer == peer:
                return row
        raise KeyError(peer)

    @property
    def blocked(self) -> tuple[PeerStatistics, ...]:
        """The peers whose traffic is waiting (``blocked`` says why)."""
        return tuple(row for row in self.peers if row.blocked)

    def summary(self) -> str:
        """One line, for terminals and logs."""
        line = (f"{self.purpose} {self.protocol} {self.address} {self.state}: "
                f"{len(self.peers)} peers, in {self.messages_in} msg "
                f"({self.bytes_in_per_s / 2**20:.1f} MiB/s), out {self.messages_out} msg "
                f"({self.bytes_out_per_s / 2**20:.1f} MiB/s), memory {self.memory / 2**20:.1f} MiB")
        if self.shm_bytes_in or self.shm_bytes_out:
            line += (f", shared memory in {self.shm_bytes_in / 2**20:.1f} MiB, "
                     f"out {self.shm_bytes_out / 2**20:.1f} MiB")
        if self.connect_error:
            line += f"; cannot connect: {self.connect_error}"
        if self.get_waiting:
            line += f"; {self.get_waiting}"
        return line


_COUNTERS = ("messages_in", "bytes_in", "messages_out", "bytes_out")


class RateMeter:
    """Turns cumulative counters into rates between snapshots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._previous: dict = {}  # key -> (time, counters)
        self._rates: dict = {}  # key -> rates last computed

    def _rate(self, key, now: float, counters: tuple) -> tuple:
        previous = self._previous.get(key)
        if previous is None:
            self._previous[key] = (now, counters)
            self._rates[key] = (0.0,) * len(counters)
        elif now - previous[0] >= RATE_INTERVAL:
            elapsed = now - previous[0]
            self._rates[key] = tuple(max(0.0, (c - p) / elapsed)
                                     for c, p in zip(counters, previous[1], strict=True))
            self._previous[key] = (now, counters)
        return self._rates[key]

    def snapshot(self, *, now: float, peers: list[PeerStatistics], closed_totals: tuple,
                 **fields) -> CommunicatorStatistics:
        with self._lock:
            rows = []
            totals = list(closed_totals)
            since = self._previous.get("total")
            for row in peers:
                counters = tuple(getattr(row, name) for name in _COUNTERS)
                for index, value in enumerate(counters):
                    totals[index] += value
                if since is not None and row.peer not in self._previous \
                        and row.connected_for <= now - since[0]:
                    # Connected since the last snapshot: everything it counts came after it, as
                    # the totals' rate sees it, so its own rate is measured from there too
                    # (from its first sample it would read 0 while the totals count it).
                    self._previous[row.peer] = (since[0], (0,) * len(counters))
                    self._rates[row.peer] = (0.0,) * len(counters)  # as the totals: none yet
                rates = self._rate(row.peer, now, counters)
                rows.append(dataclasses.replace(
                    row, messages_in_per_s=rates[0], bytes_in_per_s=rates[1],
                    messages_out_per_s=rates[2], bytes_out_per_s=rates[3]))
            live = {row.peer for row in rows}
            for key in [k for k in self._previous if k not in live and k != "total"]:
                del self._previous[key]
                del self._rates[key]
            rates = self._rate("total", now, tuple(totals))
        return CommunicatorStatistics(
            time=now,
            peers=tuple(rows),
            messages_in=totals[0], bytes_in=totals[1],
            messages_out=totals[2], bytes_out=totals[3],
            messages_in_per_s=rates[0], bytes_in_per_s=rates[1],
            messages_out_per_s=rates[2], bytes_out_per_s=rates[3],
            memory=sum(row.memory for row in rows),
            **fields,
        )


def peer_row(session: PeerSession, *, now: float, lent: int,
             blocked: tuple[str, float]) -> PeerStatistics:
    """One peer's row, from its session. ``lent``: bytes of its messages the caller of the
    last get() still holds (their credit is still out, so they are not queued here any more).
    ``blocked``: why traffic with the peer waits and for how long (netq.diagnostics)."""
    link = session.link
    conn = link.conn if link is not None else None
    inflight_bytes = session.inflight_bytes()
    queued_in = session.held_bytes - lent
    return PeerStatistics(
        peer=session.id,
        state=session.state.value,
        queue_in=len(session.inbox),
        queue_in_bytes=queued_in,
        queue_out=len(session.outbox),
        queue_out_bytes=session.unsent_bytes,
        inflight=len(session.inflight),
        inflight_bytes=inflight_bytes,
        messages_in=session.received_messages,
        bytes_in=session.received_bytes,
        messages_out=session.acked_messages,
        bytes_out=session.acked_bytes,
        credit_out=conn.send_credit_bytes if conn is not None else 0,
        credit_in=conn.recv_allowance_bytes if conn is not None else 0,
        window=session.window,
        memory=queued_in + session.unsent_bytes + inflight_bytes,
        reconnects=session.reconnects,
        connected_for=(now - session.connected_at)
        if session.connected_at is not None and session.connected else 0.0,
        blocked=blocked[0],
        blocked_for=blocked[1],
        messages_in_per_s=0.0, bytes_in_per_s=0.0,
        messages_out_per_s=0.0, bytes_out_per_s=0.0,
    )
