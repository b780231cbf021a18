"""The MQTT link layer, sans I/O: epochs, packet sequence numbers, acks, gaps and the window.

A broker may drop a QoS 1 publish after acknowledging it to the publisher (mosquitto does, past
``max_inflight_messages`` + ``max_queued_messages`` for a slow subscriber), so netq cannot trust
the broker for delivery. Each client<->server pairing is a *link*, named by a random 64-bit
*epoch* the client picks per connection attempt; every publish carries a small header::

    version u8 | kind u8 | flags u16 | epoch u64 | seq u64 | ack u64    (28 bytes, little endian)

kind   OPEN (the client's first packet of an epoch: seq 1), DATA (netq bytes), ACK (no body, no
       seq of its own: a cumulative ack, or a probe), CLOSE (this epoch is over; body: why)
seq    1, 2, 3 ... per link and direction for OPEN/DATA; 0 for ACK/CLOSE
ack    the highest seq received in order from the other direction (cumulative)
flags  ACK_REQUEST: answer with an ACK now; GAP (CLOSE): the close is a drop we detected

The receiver accepts seq == last + 1, drops seq <= last (a broker redelivery) and treats seq >
last + 1 as a *gap*: a packet the broker dropped. A gap ends the link (never skipped, never
reordered): the transport reports it as ``ConnectionLost`` naming the missing range, the client
reconnects with a new epoch, and netq's session resume resends every unacknowledged message
from the peer's ``last_received``. A broker drop costs a resend, never a message.

The sender keeps at most :attr:`Window.packets` packets and :attr:`Window.bytes` bytes
unacknowledged per link (so the broker never holds more than that for us: bounded broker
memory, and drops become rare). The packet window adapts like TCP's AIMD: +1 after each full
window acknowledged without loss, halved when the peer reports a gap. It belongs to the peer,
not to one link, so what was learned survives a reconnect.

A sender asks for an ack (ACK_REQUEST) on packets sent while at least half its window is
outstanding; the receiver answers at once. Acks also ride on every packet going the other way.
Tail losses (the last packets of a burst, or an ack) are caught by a probe: an ACK with
ACK_REQUEST whose ``seq`` is the last seq sent; a receiver that has not seen it reports a gap.
"""

from __future__ import annotations

import collections
import enum
import struct
import threading

__all__ = ("HEADER", "HEADER_SIZE", "VERSION", "Kind", "ACK_REQUEST", "GAP", "Window",
           "LinkState", "Verdict", "parse_header", "encode")

HEADER = struct.Struct("<BBHQQQ")
HEADER_SIZE = HEADER.size
VERSION = 1
ACK_REQUEST = 0x1
GAP = 0x2
_pack = HEADER.pack
_unpack_from = HEADER.unpack_from


class Kind(enum.IntEnum):
    OPEN = 1
    DATA = 2
    ACK = 3
    CLOSE = 4


_OPEN, _DATA, _ACK, _CLOSE = int(Kind.OPEN), int(Kind.DATA), int(Kind.ACK), int(Kind.CLOSE)


class Verdict(enum.Enum):
    DELIVER = "deliver"  # in order: feed the body to the link's connection
    DUPLICATE = "duplicate"  # seen before (broker redelivery): drop
    GAP = "gap"  # packets missing: end the link
    CONTROL = "control"  # ACK: nothing to deliver
    CLOSED = "closed"  # the peer ended this epoch
    INVALID = "invalid"  # malformed, or acks packets never sent: end the link


def parse_header(payload) -> tuple[int, int, int, int, int] | None:
    """``(kind, flags, epoch, seq, ack)``, or None if this is not a netq link packet."""
    if len(payload) < HEADER_SIZE:
        return None
    version, kind, flags, epoch, seq, ack = _unpack_from(payload)
    if version != VERSION or not _OPEN <= kind <= _CLOSE:
        return None
    return kind, flags, epoch, seq, ack


def encode(kind: int, flags: int, epoch: int, seq: int, ack: int) -> bytes:
    return _pack(VERSION, kind, flags, epoch, seq, ack)


class Window:
    """The send window toward one peer (AIMD in packets, fixed in bytes). Thread-safe enough:
    plain integer updates under the owning link's lock."""

    __slots__ = ("packets", "packets_min", "packets_max", "bytes", "_acked", "gaps")

    def __init__(self, packets: int, packets_max: int, nbytes: int, packets_min: int = 2) -> None:
        self.packets = packets
        self.packets_min = packets_min
        self.packets_max = packets_max
        self.bytes = nbytes
        self._acked = 0
        self.gaps = 0

    def acked(self, count: int) -> None:
        """``count`` packets acknowledged without loss: additive increase per full window."""
        self._acked += count
        while self._acked >= self.packets:
            self._acked -= self.packets
            if self.packets < self.packets_max:
                self.packets += 1

    def lost(self) -> None:
        """The peer saw a gap: multiplicative decrease."""
        self.gaps += 1
        self.packets = max(self.packets_min, self.packets // 2)
        self._acked = 0


class LinkState:
    """Sequence numbers, acks and window accounting of one link (one epoch), both directions.

    The sending half (:meth:`header`, :meth:`can_send`) runs on the I/O thread; the receiving
    half (:meth:`receive`, :meth:`ack_header`) on the carrier thread. ``lock`` guards what both
    touch (the unacknowledged packets).
    """

    __slots__ = ("epoch", "window", "next_seq", "peer_acked", "_unacked", "unacked_bytes",
                 "received", "ack_sent", "lock", "last_progress", "gap_range", "duplicates")

    def __init__(self, epoch: int, window: Window) -> None:
        self.epoch = epoch
        self.window = window
        self.next_seq = 1  # our next OPEN/DATA seq
        self.peer_acked = 0  # highest of our seqs the peer acknowledged
        self._unacked: collections.deque = collections.deque()  # (seq, size) past peer_acked
        self.unacked_bytes = 0
        self.received = 0  # highest seq received in order from the peer
        self.ack_sent = 0  # highest ack we have told the peer
        self.lock = threading.Lock()
        self.last_progress = 0.0  # clock time of the last ack that freed window space
        self.gap_range: tuple[int, int] | None = None
        self.duplicates = 0

    # ------------------------------------------------------------------ sending

    @property
    def outstanding(self) -> int:
        return len(self._unacked)

    def can_send(self) -> bool:
        window = self.window
        return len(self._unacked) < window.packets and self.unacked_bytes < window.bytes

    def header(self, kind: int, size: int) -> bytes:
        """The header of our next OPEN/DATA packet with a ``size``-byte body; counts it."""
        with self.lock:
            seq = self.next_seq
            self.next_seq = seq + 1
            self._unacked.append((seq, size))
            self.unacked_bytes += size
            window = self.window
            flags = 0
            if 2 * len(self._unacked) >= window.packets or 2 * self.unacked_bytes >= window.bytes:
                flags = ACK_REQUEST
            ack = self.received
            self.ack_sent = ack
        return _pack(VERSION, kind, flags, self.epoch, seq, ack)

    def probe_header(self) -> bytes:
        """An ACK asking for an ack, naming our last seq: reveals a lost tail."""
        ack = self.received
        self.ack_sent = ack
        return _pack(VERSION, _ACK, ACK_REQUEST, self.epoch, self.next_seq - 1, ack)

    def ack_header(self) -> bytes:
        """A pure cumulative ACK of what we received."""
        ack = self.received
        self.ack_sent = ack
        return _pack(VERSION, _ACK, 0, self.epoch, 0, ack)

    def close_header(self, gap: bool) -> bytes:
        return _pack(VERSION, _CLOSE, GAP if gap else 0, self.epoch, 0, self.received)

    # ------------------------------------------------------------------ receiving

    def _take_ack(self, ack: int, now: float) -> bool:
        """Apply a cumulative ack; False if it acknowledges packets we never sent."""
        if ack <= self.peer_acked:
            return True
        with self.lock:
            if ack >= self.next_seq:
                return False
            unacked = self._unacked
            count = 0
            freed = 0
            while unacked and unacked[0][0] <= ack:
                freed += unacked.popleft()[1]
                count += 1
            self.unacked_bytes -= freed
            self.peer_acked = ack
            self.last_progress = now
            self.window.acked(count)
        return True

    def receive(self, kind: int, flags: int, seq: int, ack: int, now: float
                ) -> tuple[Verdict, bool]:
        """Judge one packet of this epoch; returns the verdict and whether to ack at once."""
        if not self._take_ack(ack, now):
            return Verdict.INVALID, False
        if kind == _DATA or kind == _OPEN:
            expected = self.received + 1
            if seq == expected:
                self.received = seq
                return Verdict.DELIVER, bool(flags & ACK_REQUEST)
            if seq < expected:
                self.duplicates += 1
                return Verdict.DUPLICATE, bool(flags & ACK_REQUEST)
            self.gap_range = (expected, seq - 1)
            return Verdict.GAP, False
        if kind == _ACK:
            if flags & ACK_REQUEST:
                if seq > self.received:  # a probe naming packets we never got
                    self.gap_range = (self.received + 1, seq)
                    return Verdict.GAP, False
                return Verdict.CONTROL, True
            return Verdict.CONTROL, False
        return Verdict.CLOSED, False
