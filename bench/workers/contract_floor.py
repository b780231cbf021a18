"""py-contract: py-lead with the least of netq's contract a round trip needs (64 B ping-pong).

A yardstick for issue 56, not a library. ``py-lead`` (bench/workers/lead_floor.py) is the
cheapest Python queue a round trip can have; it keeps none of what netq promises per message.
This row adds, the plain way, what every netq message carries, so that ``py-contract`` over
``py-lead`` (same rep) is what the contract itself costs and netq over ``py-contract`` what its
design costs beyond it:

- **a future per put, resolved by the peer's acknowledgement.** Every frame carries the
  sender's cumulative ACK (the last sequence number it received in order); a frame that
  arrives resolves the futures it acknowledges.
- **credit: a bound on what may arrive.** Every frame carries the sender's window end (the
  bytes it has taken out of its inbox plus a fixed window). ``put()`` waits, reading, while
  a message would go past the peer's, and a message that goes past ours is refused.
- **every header checked before its body is touched**, with a typed error for the peer's
  bad bytes: known type, no flags or reserved bits, length within the limit, sequence number
  in order, an ACK of nothing unsent, a window that never shrinks.

The frame: ``type u8 | flags u8 | reserved u16 | length u32 | seq u64 | ack u64 |
window_end u64`` (32 bytes, little endian), then the pickled body.

Left out, all of which netq has: a lone put's own ACK (here every message gets a reply, which
carries it), sessions and resume, heartbeats, several peers, closing with a flush, statistics.
Round trips only.
"""

from __future__ import annotations

import collections
import os
import pickle
import socket
import struct
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from lead_floor import WAIT_S, LeadQueue, echo, ping

FRAME = struct.Struct("<BBHIQQQ")  # type, flags, reserved, length, seq, ack, window end
DATA = 1
MAX_MESSAGE = 64 * 1024 * 1024  # a frame's body may not be larger (checked before it is read)
WINDOW = 4 * 1024 * 1024  # bytes a peer may send beyond what we have taken out of the inbox


class PeerProtocolError(Exception):
    """The peer's bytes broke the framing or the contract (its fault, not the caller's)."""


class Future:
    """A put's outcome: done once the peer acknowledged the message."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


class ContractQueue(LeadQueue):
    """LeadQueue's put() and waiting get(), with acknowledgements, futures, credit and checks."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.inflight: collections.deque = collections.deque()  # (seq, future), oldest first
        self.expected = 1  # the next sequence number the peer must send
        self.sent_bytes = 0  # body bytes sent (what the peer's window end is compared with)
        self.peer_window_end = WINDOW  # we may send body bytes up to this
        self.taken_bytes = 0  # body bytes get() took out of the inbox (our window's start)
        self.received_bytes = 0  # body bytes received (what our window end bounds)

    def put(self, obj, dumps=pickle.dumps) -> Future:
        body = dumps(obj, 5)
        size = len(body)
        if size > MAX_MESSAGE:
            raise ValueError(f"a message of {size} bytes is over the limit of {MAX_MESSAGE}")
        future = Future()
        while True:
            with self.lock:
                if self.sent_bytes + size <= self.peer_window_end:
                    self.sequence = seq = self.sequence + 1
                    self.inflight.append((seq, future))
                    self.sent_bytes += size
                    self.sock.sendmsg([FRAME.pack(DATA, 0, 0, size, seq, self.expected - 1,
                                                  self.taken_bytes + WINDOW), body])
                    return future
            self._read()  # no credit: wait for the peer's window to move

    def get(self, loads=pickle.loads):
        inbox = self.inbox
        while True:
            with self.lock:
                if inbox:
                    body = inbox.popleft()
                    self.taken_bytes += len(body)  # credit returns as get() takes the message
                    return loads(body)
            self._read()

    def _read(self) -> None:
        if not self.poller.poll(WAIT_S):
            raise TimeoutError("no message")
        with self.lock:
            read = self.sock.recv_into(self.view[self.end:])
            if not read:
                raise EOFError("peer closed")
            self.end += read
            self._cut_frames()

    def _cut_frames(self) -> None:
        buffer, view, start, end = self.buffer, self.view, self.start, self.end
        inflight = self.inflight
        while end - start >= FRAME.size:
            kind, flags, reserved, length, seq, ack, window_end = FRAME.unpack_from(buffer, start)
            if kind != DATA or flags or reserved:
                raise PeerProtocolError(f"not a DATA frame: type {kind}, flags {flags}")
            if length > MAX_MESSAGE or self.received_bytes + length > self.taken_bytes + WINDOW:
                raise PeerProtocolError(f"a frame of {length} bytes over the limit or the credit")
            if seq != self.expected:
                raise PeerProtocolError(f"message {seq} out of order (expected {self.expected})")
            if ack > self.sequence or window_end < self.peer_window_end:
                raise PeerProtocolError("an ACK of a message not sent, or a shrinking window")
            if end - start < FRAME.size + length:
                break
            self.expected = seq + 1
            self.received_bytes += length
            self.peer_window_end = window_end
            self.inbox.append(bytes(view[start + FRAME.size:start + FRAME.size + length]))
            start += FRAME.size + length
            while inflight and inflight[0][0] <= ack:
                inflight.popleft()[1].done = True
        if start == end:
            start = end = 0
        elif start:  # a partial frame: to the front, so the buffer never runs out
            view[:end - start] = view[start:end]
            start, end = 0, end - start
        self.start, self.end = start, end


def _every_ping_acknowledged(queue: LeadQueue) -> None:
    """Every echo carries the ACK of the ping it answers: none may be left in flight."""
    assert isinstance(queue, ContractQueue)
    if queue.inflight:
        raise RuntimeError(f"{len(queue.inflight)} pings never acknowledged")


if __name__ == "__main__":
    common.main({"echo": partial(echo, queue_class=ContractQueue),
                 "ping": partial(ping, queue_class=ContractQueue,
                                 check=_every_ping_acknowledged)})
