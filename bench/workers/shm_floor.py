"""The floor of a shared-memory road that copies once: no netq, the copy and a hand-over only.

netq sends a large part that is not in shared memory already (a plain array, ``bytes``, a
read-only map) by copying it into a segment once; the receiver maps the segment. A raw Unix
socket copies twice (into the kernel and out). These rows measure what one copy per message
buys at most, beside ``raw-unix`` in the same rep:

shm-copy-floor       the sender passes four ``memfd`` maps to the receiver once (SCM_RIGHTS),
                     then per message copies the payload into a free one (``map[:] =
                     payload``: one memcpy) and sends its index (one byte) over the Unix
                     socket; the receiver answers with the index as it takes the message (its
                     netq would acknowledge it then) and hands out a view of the map, touching
                     nothing; a map is reused once answered (a stream of puts, four in flight).
                     The maps are faulted in before the clock, as netq's reused segments are.
shm-copy-floor-wait  the same through one map, the sender waiting for each answer before the
                     next copy ("put, wait for the future, put again").
"""

from __future__ import annotations

import mmap
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from raw import accept, connect, listen_unix

MAPS = 4  # maps a stream cycles through (messages in flight at most)


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    listener, addr = listen_unix(spec["tmpdir"])
    rec = common.Recorder(count, size)
    common.ready(addr)
    sock = accept(listener)
    _, fds, _, _ = socket.recv_fds(sock, 1, MAPS)
    views = []
    for fd in fds:
        views.append(memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ)))
        os.close(fd)
    index = bytearray(1)

    def read() -> memoryview:
        if not sock.recv_into(index, 1):
            raise EOFError("peer closed")
        sock.sendall(index)  # taken: the sender may fill this map again
        return views[index[0]]

    nbytes, last = rec.receive_all(read)
    rec.report(count + 1, nbytes, last)
    sock.close()


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    wait = spec["transport"].endswith("-wait")
    payload = common.payload_of(size)
    maps, fds = [], []
    for _ in range(1 if wait else MAPS):
        fd = os.memfd_create("netq-floor")
        os.ftruncate(fd, size)
        shared = mmap.mmap(fd, size, mmap.MAP_SHARED)
        shared[:] = payload  # faulted in before the clock
        maps.append(shared)
        fds.append(fd)
    sock = connect(spec["addr"])
    socket.send_fds(sock, [b"F"], fds)
    for fd in fds:
        os.close(fd)
    free = list(range(len(maps)))
    answer = bytearray(1)
    clock = common.SendClock()
    clock.start()
    for _ in range(count + 1):
        if not free:
            if not sock.recv_into(answer, 1):
                raise EOFError("peer closed")
            free.append(answer[0])
        slot = free.pop()
        maps[slot][:] = payload  # the one copy
        sock.sendall(bytes((slot,)))
    clock.sent()
    while len(free) < len(maps):  # every message taken
        if not sock.recv_into(answer, 1):
            raise EOFError("peer closed")
        free.append(answer[0])
    sock.close()
    clock.stop()
    clock.report(count, size)
    for shared in maps:
        shared.close()
    common.wait_released()


if __name__ == "__main__":
    common.main({"recv": recv, "send": send})
