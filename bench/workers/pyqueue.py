"""py-queue: the plain-Python floor of a per-message put()/get() queue over TCP.

The yardstick of netq's design on the machine at hand, not a library: it keeps only what a
put()/get() queue cannot do without, in the cheapest plain Python we know, so that
``netq-tcp`` over ``py-queue`` (same rep) is what netq's guarantees cost, and ``py-queue``
over ``raw-tcp`` is what Python costs before any design choice.

Sender: ``put()`` pickles the object (protocol 5), makes a future (one slot) and appends both
to a deque, waking the writer thread only when the deque was empty. The writer takes whatever
is queued (up to 64 KiB or 500 messages) and writes it with one scatter-gather ``sendmsg``
behind 8-byte length headers (no payload copy); a second thread reads cumulative ACKs and
resolves the futures.
Receiver: one thread reads into a 1 MiB staging buffer, cuts every whole frame out of each
read as owned ``bytes``, appends them to the inbox with one notify per read and ACKs every
256 messages (and at the end of a read that leaves no partial frame). ``get()`` pops without a
lock when the inbox is not empty, waits on the condition when it is, and unpickles.

What it leaves out, all of which netq has: credit and any bound on memory, sessions and
resume, heartbeats, several peers, several putting threads, closing with a flush, typed
errors, statistics. Messages up to 64 KiB only (the row's sizes).
"""

from __future__ import annotations

import collections
import os
import pickle
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from raw import accept, connect, listen, recv_exact, sendmsg_all

HEADER = struct.Struct("!Q")
ACK = struct.Struct("!Q")
STAGING = 1 << 20
LARGEST = 64 * 1024          # the largest message this row carries
BATCH_BYTES = 64 * 1024      # one sendmsg carries up to this many payload bytes...
BATCH_MESSAGES = 500         # ...or this many messages (2 iovecs each, under IOV_MAX)
ACK_EVERY = 256
WAIT_S = 60.0                # bound on every wait: a hang fails the measurement, not the run


class Future:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


class Sender:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queue: collections.deque = collections.deque()
        self.inflight: collections.deque = collections.deque()
        self.wake = threading.Event()
        self.stopping = False
        self.acked = 0
        self.progress = threading.Condition()
        self.writer = threading.Thread(target=self._write, name="py-queue-writer")
        self.acks = threading.Thread(target=self._read_acks, name="py-queue-acks")
        self.writer.start()
        self.acks.start()

    def put(self, obj, dumps=pickle.dumps) -> Future:
        future = Future()
        queue = self.queue
        queue.append((dumps(obj, 5), future))
        if len(queue) == 1:  # the writer may be asleep: it only sleeps on an empty deque
            self.wake.set()
        return future

    def _write(self) -> None:
        queue, inflight, pack = self.queue, self.inflight, HEADER.pack
        while True:
            if not queue:
                if self.stopping:
                    return
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            iov: list = []
            total = 0
            while queue and total < BATCH_BYTES and len(iov) < 2 * BATCH_MESSAGES:
                data, future = queue.popleft()
                iov.append(pack(len(data)))
                iov.append(data)
                total += 8 + len(data)
                inflight.append(future)
            sendmsg_all(self.sock, iov, total)

    def _read_acks(self) -> None:
        header = bytearray(ACK.size)
        view = memoryview(header)
        inflight = self.inflight
        while True:
            try:
                recv_exact(self.sock, view, ACK.size)
            except (EOFError, OSError):
                return
            (upto,) = ACK.unpack(header)
            for _ in range(upto - self.acked):
                inflight.popleft().done = True
            with self.progress:
                self.acked = upto
                self.progress.notify_all()

    def wait_acked(self, count: int) -> None:
        with self.progress:
            if not self.progress.wait_for(lambda: self.acked >= count, WAIT_S):
                raise TimeoutError(f"{self.acked} of {count} messages acknowledged")

    def close(self) -> None:
        self.stopping = True
        self.wake.set()
        self.writer.join(WAIT_S)
        self.sock.shutdown(socket.SHUT_WR)
        self.acks.join(WAIT_S)   # the receiver closes after the last message: EOF here
        self.sock.close()


class Receiver:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox: collections.deque = collections.deque()
        self.arrived = threading.Condition()
        self.reader = threading.Thread(target=self._read, name="py-queue-reader")
        self.reader.start()

    def get(self, loads=pickle.loads):
        inbox = self.inbox
        try:
            data = inbox.popleft()
        except IndexError:
            with self.arrived:
                if not self.arrived.wait_for(lambda: inbox, WAIT_S):
                    raise TimeoutError("no message") from None
                data = inbox.popleft()
        return loads(data)

    def _read(self) -> None:
        sock, inbox, arrived = self.sock, self.inbox, self.arrived
        buffer = bytearray(STAGING)
        view = memoryview(buffer)
        unpack_from, ack = HEADER.unpack_from, ACK.pack
        start = end = received = acked = 0
        while True:
            try:
                n = sock.recv_into(view[end:])
            except OSError:
                return
            if not n:
                return
            end += n
            messages = []
            while end - start >= 8:
                (length,) = unpack_from(buffer, start)
                if end - start - 8 < length:
                    break
                messages.append(bytes(view[start + 8:start + 8 + length]))
                start += 8 + length
            if messages:
                with arrived:
                    inbox.extend(messages)
                    arrived.notify()
                received += len(messages)
            if start == end:
                start = end = 0
            elif STAGING - end < LARGEST + 8:
                view[:end - start] = view[start:end]
                start, end = 0, end - start
            if received - acked >= ACK_EVERY or (start == end and received > acked):
                sock.sendall(ack(received))
                acked = received


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    if size > LARGEST:
        raise SystemExit(f"py-queue carries messages up to {LARGEST} bytes")
    listener, addr = listen()
    recorder = common.Recorder(count, size)
    common.ready(addr)
    receiver = Receiver(accept(listener))
    nbytes, last = recorder.receive_all(receiver.get)
    recorder.report(count + 1, nbytes, last)
    receiver.reader.join(WAIT_S)   # ends at the sender's shutdown, after its last ACK
    receiver.sock.close()          # the sender's ACK reader sees EOF


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    payload = common.payload_of(size)
    sender = Sender(connect(spec["addr"]))
    clock = common.SendClock()
    clock.start()
    sender.put(payload)
    sender.wait_acked(1)        # warm-up, received before the rest (as netq-tcp's)
    put = sender.put
    for _ in range(count):
        put(payload)
    clock.sent()
    sender.wait_acked(count + 1)
    sender.close()
    clock.stop()
    clock.report(count, size)
    common.wait_released()


if __name__ == "__main__":
    common.main({"recv": recv, "send": send})
