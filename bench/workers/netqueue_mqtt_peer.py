"""Upstream net-queue 2.6.4's MQTT backend (Python 3.13 venv) through a private mosquitto.

net-queue-mqtt  server/client with default options (its MQTT backend publishes at QoS 0 and
                has no flow control). The receiver starts the broker and stops waiting 1.5 s
                after the last arrival: a broker may drop messages, and those are reported as
                ``lost`` (the rate is what arrived over the time it took).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import uuid

import net_queue as nq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import mqtt_broker
from paho_peer import receive_lossy


def _options(port: int) -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(id=uuid.uuid4(), netloc=nq.NetworkLocation("127.0.0.1", port))


def _server(spec: dict):
    broker = mqtt_broker.Broker(spec.get("tmpdir"))
    server = nq.new(protocol=nq.Protocol.MQTT, purpose=nq.Purpose.SERVER,
                    options=_options(broker.port))
    return broker, server, f"127.0.0.1:{broker.port}"


def _client(addr: str):
    port = int(addr.rsplit(":", 1)[1])
    return nq.new(protocol=nq.Protocol.MQTT, purpose=nq.Purpose.CLIENT, options=_options(port))


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    broker, server, addr = _server(spec)
    arrivals: queue.SimpleQueue = queue.SimpleQueue()

    def pump():  # net-queue's get() has no timeout: read on a thread, wait with one here
        while True:
            arrivals.put(server.get().data)

    threading.Thread(target=pump, daemon=True).start()
    rec = common.Recorder(count, size)
    common.ready(addr)
    receive_lossy(rec, arrivals, count, **broker.stats())
    broker.stop()
    os._exit(0)  # net-queue's close() waits for peers that a lossy run may never satisfy


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    payload = common.payload_of(size)
    client = _client(spec["addr"])
    clock = common.SendClock()
    clock.start()
    try:
        client.put(payload).result(3)  # the warm-up; net-queue may lose even that
    except Exception:  # noqa: BLE001 - the receiver reports what never arrived
        pass
    put = client.put
    for _ in range(count):
        fut = put(payload)
    clock.sent()
    try:
        fut.result(3)  # may never resolve when the broker dropped it (QoS 0, no resend)
        resolved = True
    except Exception:  # noqa: BLE001 - the receiver reports lost messages
        resolved = False
    clock.stop()
    clock.report(count, size, last_future_resolved=resolved)
    common.wait_released()
    os._exit(0)


def echo(spec: dict) -> None:
    broker, server, addr = _server(spec)
    common.ready(addr)
    common.echo_messages(server, spec["count"])
    common.result(role="echo", peak_rss_kb=common.maxrss_kb(), **broker.stats())
    broker.stop()
    os._exit(0)


def ping(spec: dict) -> None:
    size = spec["size"]
    payload = common.payload_of(size)
    client = _client(spec["addr"])
    base = common.rss_kb()
    samples = common.queue_round_trips(client, payload, spec["count"])
    common.latency_report(samples, size, base)
    os._exit(0)


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping})
