"""netq over MQTT: netq's client and server as clients of a private mosquitto.

netq-mqtt  put() per message -> get() per message through mosquitto (QoS 1, MQTT 5), with
           netq's link window and credit flow control on. ``recv_budget`` is 32 MiB (the
           default 4 MiB is sized for TCP: through a broker the credit round trip is ~10x
           longer, and a 4 MiB window caps 1 MiB messages at ~70/s here). The receiver (or
           echo) starts the broker, reports its peak RSS and CPU time, and stops it once the
           orchestrator says the other side is done (its close() included); the sender checks
           every future, so a loss would fail the run instead of passing silently.
"""

from __future__ import annotations

import os
import sys

import netq as nq
from netq.transports.mqtt import link_statistics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import mqtt_broker
import netq_peer

RECV_BUDGET = 32 * 1024 * 1024
FUTURE_TIMEOUT = 120.0


def _options(port: int) -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", port, path="bench"),
        connection=nq.ConnectionOptions(recv_budget=RECV_BUDGET))


def _serve(spec: dict):
    broker = mqtt_broker.Broker(spec.get("tmpdir"))
    server = nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, _options(broker.port))
    common.on_diagnose(lambda: f"{server.statistics()!r} {link_statistics(server)}")
    return broker, server, f"127.0.0.1:{broker.port}"


def _connect(spec: dict):
    port = int(spec["addr"].rsplit(":", 1)[1])
    return nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT, _options(port))


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    broker, server, addr = _serve(spec)
    rec = common.Recorder(count, size)
    common.ready(addr)
    get = server.get
    nbytes, last = rec.receive_all(lambda: get().data)
    links = link_statistics(server)
    rec.report(count + 1, nbytes, last, lost=0, gaps=links["gaps"], **broker.stats())
    server.close()
    # The broker outlives the sender's close(): stopped under it, it would leave the sender
    # reconnecting to finish its goodbye. The orchestrator releases us once the sender is done.
    common.wait_released()
    broker.stop()


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    payload = common.payload_of(size)
    client = _connect(spec)
    clock = common.SendClock()
    clock.start()
    client.put(payload).result(FUTURE_TIMEOUT)  # warm-up, received before the rest
    put = client.put
    futures = [put(payload) for _ in range(count)]
    clock.sent()
    failed = sum(1 for f in futures if f.exception(FUTURE_TIMEOUT) is not None)
    links = link_statistics(client)
    client.close()
    clock.stop()
    clock.report(count, size, failed=failed, gaps=links["gaps"])
    common.wait_released()


def echo(spec: dict) -> None:
    broker, server, addr = _serve(spec)
    try:
        netq_peer.echo(spec, serve=lambda _spec: (server, addr), report=broker.stats)
        common.wait_released()  # the pinging client has closed (see recv)
    finally:
        broker.stop()


def ping(spec: dict) -> None:
    netq_peer.ping(spec, connect=_connect)


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping})
