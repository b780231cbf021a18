"""Upstream net-queue 2.6.4 endpoints (run under the Python 3.13 venv, see netqueue_env.py).

net-queue  TCP server/client with default options (pickle serializer, put/get merging).
           Every communicator gets ``id=uuid.uuid4()`` explicitly: net-queue's ``new()`` has a
           shared default ``CommunicatorOptions()`` (one UUID for everybody).
"""

from __future__ import annotations

import os
import sys
import uuid

import net_queue as nq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


def _options(host: str, port: int) -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(id=uuid.uuid4(), netloc=nq.NetworkLocation(host, port))


def _server() -> tuple[object, str]:
    port = common.free_port()
    server = nq.new(protocol=nq.Protocol.TCP, purpose=nq.Purpose.SERVER,
                    options=_options("127.0.0.1", port))
    return server, f"127.0.0.1:{port}"


def _client(addr: str):
    host, port = addr.rsplit(":", 1)
    return nq.new(protocol=nq.Protocol.TCP, purpose=nq.Purpose.CLIENT,
                  options=_options(host, int(port)))


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    server, addr = _server()
    rec = common.Recorder(count, size)
    common.ready(addr)
    get = server.get
    nbytes, last = rec.receive_all(lambda: get().data)
    rec.report(count + 1, nbytes, last)
    server.close()


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    payload = common.payload_of(size)
    client = _client(spec["addr"])
    clock = common.SendClock()
    clock.start()
    put = client.put
    for _ in range(count + 1):
        fut = put(payload)
    clock.sent()
    fut.result()
    client.close()
    clock.stop()
    clock.report(count, size)
    common.wait_released()


def echo(spec: dict) -> None:
    server, addr = _server()
    common.ready(addr)
    common.echo_messages(server, spec["count"])
    common.result(role="echo", peak_rss_kb=common.maxrss_kb())
    server.close()


def ping(spec: dict) -> None:
    size = spec["size"]
    payload = common.payload_of(size)
    client = _client(spec["addr"])
    base = common.rss_kb()
    samples = common.queue_round_trips(client, payload, spec["count"])
    client.close()
    common.latency_report(samples, size, base)


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping})
