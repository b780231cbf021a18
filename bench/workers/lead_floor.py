"""py-lead: the round-trip floor of a put()/get() queue in plain Python (64 B ping-pong).

The yardstick of issue 56, not a library: a queue whose waiting ``get()`` does the reading
itself, the cheapest design a Python queue has for a round trip, so that a queue's round trip
over ``py-lead`` (same rep) is what its design costs beyond Python's own floor.

``put()`` pickles the object (protocol 5), frames it behind a 12-byte header (length and a
sequence number) and writes header and body with one ``sendmsg`` from the caller's thread,
under the queue's lock. ``get()`` returns the oldest parsed message if there is one; otherwise
it waits on an epoll set for the socket, reads what is there into a 1 MiB buffer, cuts every
whole frame out of it into the inbox, and looks again. A second thread exists, as a queue
keeps one for when nobody leads, but it only parks (waking every few milliseconds, as an
I/O loop's timers would).

What it leaves out, all of which netq has: acknowledgements and futures, credit and any bound
on memory, sessions, heartbeats, several peers, typed errors. Round trips only.
"""

from __future__ import annotations

import collections
import os
import pickle
import select
import socket
import struct
import sys
import threading
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from raw import accept, connect, listen

FRAME = struct.Struct("<IQ")  # body length, sequence number
BUFFER = 1 << 20
PARK_S = 0.004  # the parked thread's wake-up period
WAIT_S = 60.0  # bound on every wait: a hang fails the measurement, not the run


class LeadQueue:
    """One connected socket; put() writes from the caller's thread, get() reads itself."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray(BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.sequence = 0
        self.inbox: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.poller = select.epoll()
        self.poller.register(sock.fileno(), select.EPOLLIN)
        self.stopping = threading.Event()
        self.parked = threading.Thread(target=self._park, name="py-lead-parked")
        self.parked.start()

    def _park(self) -> None:
        while not self.stopping.wait(PARK_S):
            pass

    def put(self, obj, dumps=pickle.dumps) -> None:
        body = dumps(obj, 5)
        with self.lock:
            self.sequence += 1
            self.sock.sendmsg([FRAME.pack(len(body), self.sequence), body])

    def get(self, loads=pickle.loads):
        inbox = self.inbox
        while True:
            with self.lock:
                if inbox:
                    return loads(inbox.popleft())
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
        while end - start >= FRAME.size:
            length, _ = FRAME.unpack_from(buffer, start)
            if end - start < FRAME.size + length:
                break
            self.inbox.append(bytes(view[start + FRAME.size:start + FRAME.size + length]))
            start += FRAME.size + length
        if start == end:
            start = end = 0
        elif start:  # a partial frame: to the front, so the buffer never runs out
            view[:end - start] = view[start:end]
            start, end = 0, end - start
        self.start, self.end = start, end

    def close(self) -> None:
        self.stopping.set()
        self.parked.join(WAIT_S)
        self.poller.close()
        self.sock.close()


def _echo_on(queue: LeadQueue, count: int) -> None:
    """Answer the warm-up and ``count`` pings, then close the queue."""
    try:
        for _ in range(common.WARMUP_PINGS + count):
            queue.put(queue.get())
    finally:
        queue.close()


def _ping_on(queue: LeadQueue, payload, count: int,
             check: Callable[[LeadQueue], None] | None = None) -> list[float]:
    """ping_loop() over ``queue`` (put, then get the echo), then close it; ``check`` looks at
    the queue after the last round trip."""
    put, get = queue.put, queue.get

    def roundtrip() -> None:
        put(payload)
        get()

    try:
        samples = common.ping_loop(roundtrip, count)
        if check is not None:
            check(queue)
        return samples
    finally:
        queue.close()


def echo(spec: dict, queue_class: type[LeadQueue] = LeadQueue) -> None:
    listener, addr = listen()
    common.ready(addr)
    _echo_on(queue_class(accept(listener)), spec["count"])
    common.result(role="echo", peak_rss_kb=common.maxrss_kb())


def ping(spec: dict, queue_class: type[LeadQueue] = LeadQueue,
         check: Callable[[LeadQueue], None] | None = None) -> None:
    """The pinging side; ``check`` looks at the queue after the last round trip."""
    base = common.rss_kb()
    payload = common.payload_of(spec["size"])
    samples = _ping_on(queue_class(connect(spec["addr"])), payload, spec["count"], check)
    common.latency_report(samples, spec["size"], base)


def ping_self(spec: dict) -> None:
    """Both ends in this one process, as a notebook kernel holds a server and its client: a
    thread echoes, the main thread pings (the floor of ``netq-tcp-1proc``)."""
    count = spec["count"]
    payload = common.payload_of(spec["size"])

    def serve_echo():
        listener, addr = listen()
        return addr, lambda: _echo_on(LeadQueue(accept(listener)), count)

    common.in_one_process(serve_echo, lambda addr: _ping_on(LeadQueue(connect(addr)), payload,
                                                            count), spec["size"])


if __name__ == "__main__":
    common.main({"echo": echo, "ping": ping, "ping-self": ping_self})
