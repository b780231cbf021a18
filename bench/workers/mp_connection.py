"""mp-connection: the standard library's ``multiprocessing.connection`` as a queue peer.

What a researcher may pick instead of netq between two Python processes: ``Listener`` and
``Client`` over TCP loopback with their defaults (no authentication key, Nagle's algorithm
left on, as the library leaves it), ``send()`` pickling each object and ``recv()``
unpickling it. One message per call: no futures, acknowledgements, credit or sessions.

One way: the sender ``send()``s the warm-up message and ``count`` more, then waits for the
receiver's one-word reply, sent once it has ``recv()``ed them all (so the sender's clock
covers delivery, as netq's futures do). Round trip: ``send()`` then ``recv()`` the echo.
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Client, Connection, Listener

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

DONE = b"done"


def _listen() -> Listener:
    return Listener(("127.0.0.1", 0), family="AF_INET")


def _address(listener: Listener) -> str:
    host, port = listener.address
    return f"{host}:{port}"


def _connect(addr: str) -> Connection:
    host, port = addr.rsplit(":", 1)
    return Client((host, int(port)), family="AF_INET")


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    listener = _listen()
    recorder = common.Recorder(count, size)
    common.ready(_address(listener))
    with listener, listener.accept() as conn:
        nbytes, last = recorder.receive_all(conn.recv)
        recorder.report(count + 1, nbytes, last)
        conn.send(DONE)


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    payload = common.payload_of(size)
    with _connect(spec["addr"]) as conn:
        clock = common.SendClock()
        clock.start()
        send_one = conn.send
        for _ in range(count + 1):  # the warm-up message and the measured ones
            send_one(payload)
        clock.sent()
        if conn.recv() != DONE:
            raise RuntimeError("the receiver's reply was not the end marker")
        clock.stop()
    clock.report(count, size)
    common.wait_released()


def echo(spec: dict) -> None:
    listener = _listen()
    common.ready(_address(listener))
    with listener, listener.accept() as conn:
        for _ in range(common.WARMUP_PINGS + spec["count"]):
            conn.send(conn.recv())
    common.result(role="echo", peak_rss_kb=common.maxrss_kb())


def ping(spec: dict) -> None:
    base = common.rss_kb()
    payload = common.payload_of(spec["size"])
    with _connect(spec["addr"]) as conn:
        send_one, recv_one = conn.send, conn.recv

        def roundtrip() -> None:
            send_one(payload)
            recv_one()

        samples = common.ping_loop(roundtrip, spec["count"])
    common.latency_report(samples, spec["size"], base)


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping})
