"""pyzmq endpoints.

zmq-push  PUSH -> PULL over tcp://127.0.0.1; ``copy=False`` for messages >= 64 KiB (zero-copy
          send, frame-backed receive), ``copy=True`` below (pyzmq copies small sends anyway).
          The receiver acknowledges over a second PUSH socket and the sender closes only
          after that ack: PUSH/PULL can lose tail messages at close (libzmq #4660).
zmq       (round trip) DEALER -> ROUTER echo, copy=True.
"""

from __future__ import annotations

import os
import sys

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

ZERO_COPY_FROM = 64 * 1024


def _bind(sock) -> str:
    return f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    copy = size < ZERO_COPY_FROM
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    ack = ctx.socket(zmq.PUSH)
    addr = _bind(pull) + "|" + _bind(ack)
    rec = common.Recorder(count, size)
    common.ready(addr)
    recv_ = pull.recv
    nbytes, last = rec.receive_all(lambda: recv_(copy=copy))
    rec.report(count + 1, nbytes, last if copy else last.buffer, copy=copy)
    ack.send(b"done")
    ack.close(linger=5000)
    pull.close(linger=0)
    ctx.term()


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    copy = size < ZERO_COPY_FROM
    payload = common.payload_of(size)
    data_addr, ack_addr = spec["addr"].split("|")
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    ack = ctx.socket(zmq.PULL)
    ack.connect(ack_addr)
    push.connect(data_addr)
    clock = common.SendClock()
    clock.start()
    send_ = push.send
    for _ in range(count + 1):
        send_(payload, copy=copy)
    clock.sent()
    if ack.recv() != b"done":
        raise RuntimeError("bad ack")
    push.close()
    ack.close()
    ctx.term()
    clock.stop()
    clock.report(count, size, copy=copy)
    common.wait_released()


def echo(spec: dict) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    common.ready(_bind(router))
    recv_, send_ = router.recv_multipart, router.send_multipart
    for _ in range(common.WARMUP_PINGS + spec["count"]):
        send_(recv_())
    common.result(role="echo", peak_rss_kb=common.maxrss_kb())
    router.close(linger=1000)
    ctx.term()


def ping(spec: dict) -> None:
    size = spec["size"]
    payload = common.payload_of(size)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(spec["addr"])
    base = common.rss_kb()
    send_, recv_ = dealer.send, dealer.recv

    def roundtrip():
        send_(payload)
        recv_()

    samples = common.ping_loop(roundtrip, spec["count"])
    dealer.close()
    ctx.term()
    common.latency_report(samples, size, base)


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping})
