"""Raw paho-mqtt publish/subscribe through a private mosquitto: the MQTT floor.

mqtt-paho  publisher: ``publish(topic, payload, qos=1)`` per message as fast as paho takes
           them (``max_inflight_messages`` 1000, unbounded queue, TCP_NODELAY), then waits for
           every PUBACK;
           subscriber: QoS 1, counts what arrives. No flow control of its own, so a broker may
           drop messages (it still PUBACKs them): the receiver stops 1.5 s after the last
           arrival and reports ``lost``; the throughput is what arrived over the time it took.
           Round trip: ``ping`` publishes to one topic, ``echo`` republishes to another.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import mqtt_broker

IDLE_END = 1.5  # seconds without a message after which the receiver stops waiting


def _client(port: int, name: str, on_message=None):
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-{name}-{os.getpid()}",
                         protocol=paho.MQTTv5)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    if on_message is not None:
        client.on_message = on_message
    # As netq does: without TCP_NODELAY a PUBACK followed by a PUBLISH waits for a delayed
    # ACK (40 ms round trips).
    client.on_socket_open = lambda c, u, sock: sock.setsockopt(
        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    connected = threading.Event()
    client.on_connect = lambda c, u, f, rc, p: connected.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    if not connected.wait(10):
        raise SystemExit("no CONNACK")
    return client


def _subscribe(client, topic: str) -> None:
    done = threading.Event()
    client.on_subscribe = lambda *a: done.set()
    client.subscribe(topic, qos=1)
    if not done.wait(10):
        raise SystemExit("no SUBACK")


def recv(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    broker = mqtt_broker.Broker(spec.get("tmpdir"))
    arrivals: queue.SimpleQueue = queue.SimpleQueue()
    client = _client(broker.port, "sub", lambda c, u, m: arrivals.put(m.payload))
    _subscribe(client, "bench/data")
    rec = common.Recorder(count, size)
    common.ready(f"127.0.0.1:{broker.port}")
    receive_lossy(rec, arrivals, count, **broker.stats())
    client.disconnect()
    client.loop_stop()
    broker.stop()


def receive_lossy(rec: common.Recorder, arrivals: queue.SimpleQueue, count: int,
                  **extra) -> None:
    """Time the warm-up's followers as they arrive, until ``count`` came or none came for
    IDLE_END s (a lossy library never sends the rest), then report_lossy."""
    last = arrivals.get()  # the warm-up
    rec.start()
    nbytes, nmsgs = len(last), 1
    last_at = common.now()
    while nmsgs < count + 1:
        try:
            last = arrivals.get(timeout=IDLE_END)
        except queue.Empty:
            break
        nmsgs += 1
        nbytes += len(last)
        last_at = common.now()
    rec.stop()
    rec.t1 = last_at  # the idle wait is not transfer time
    report_lossy(rec, nmsgs, nbytes, last, **extra)


def report_lossy(rec: common.Recorder, nmsgs: int, nbytes: int, last, **extra) -> None:
    """Like Recorder.report, for a library that may lose messages: the rate is what arrived
    (warm-up excluded) over the time to the last arrival; ``lost`` says how many never came;
    ``ok`` means that what arrived is intact (the last message's CRC)."""
    delivered = nmsgs - 1
    el = rec.t1 - rec.t0
    crc_ok = common.crc_matches(last, rec.size)
    peer_cpu = None
    if rec.peers and None not in rec.pc0 and None not in rec.pc1:
        peer_cpu = sum(rec.pc1) - sum(rec.pc0)
    own_cpu = rec.c1 - rec.c0
    # Nothing but the warm-up arrived: there is no rate to report.
    common.result(role="recv", ok=crc_ok and delivered > 0, crc_ok=crc_ok, msgs=delivered,
                  bytes=nbytes - rec.size, expected_msgs=rec.count, lost=rec.count - delivered,
                  elapsed=el, msgs_per_s=delivered / el if el > 0 else None,
                  gb_per_s=delivered * rec.size / el / 1e9 if el > 0 else None,
                  recv_cpu_s=own_cpu, send_cpu_s=peer_cpu,
                  cpu_us_per_msg=((own_cpu + peer_cpu) / max(delivered, 1) * 1e6
                                  if peer_cpu is not None else None),
                  base_rss_kb=rec.base_rss, peak_rss_kb=rec.peak, **extra)


def send(spec: dict) -> None:
    size, count = spec["size"], spec["count"]
    port = int(spec["addr"].rsplit(":", 1)[1])
    payload = common.payload_of(size)
    client = _client(port, "pub")
    client.publish("bench/data", payload, qos=1).wait_for_publish(10)  # warm-up
    clock = common.SendClock()
    clock.start()
    publish = client.publish
    infos = [publish("bench/data", payload, qos=1) for _ in range(count)]
    clock.sent()
    for info in infos:
        info.wait_for_publish(60)
    clock.stop()
    clock.report(count, size)
    common.wait_released()
    client.disconnect()
    client.loop_stop()


def echo(spec: dict) -> None:
    broker = mqtt_broker.Broker(spec.get("tmpdir"))
    total = common.WARMUP_PINGS + spec["count"]
    done = threading.Event()
    seen = [0]

    def on_message(client, userdata, message):
        client.publish("bench/pong", message.payload, qos=1)
        seen[0] += 1
        if seen[0] == total:
            done.set()

    client = _client(broker.port, "echo", on_message)
    _subscribe(client, "bench/ping")
    common.ready(f"127.0.0.1:{broker.port}")
    done.wait(120)
    time.sleep(0.2)
    common.result(role="echo", peak_rss_kb=common.maxrss_kb(), **broker.stats())
    client.disconnect()
    client.loop_stop()
    broker.stop()


def ping(spec: dict) -> None:
    port = int(spec["addr"].rsplit(":", 1)[1])
    payload = common.payload_of(spec["size"])
    replies: queue.SimpleQueue = queue.SimpleQueue()
    client = _client(port, "ping", lambda c, u, m: replies.put(m.payload))
    _subscribe(client, "bench/pong")
    base = common.rss_kb()

    def roundtrip():
        client.publish("bench/ping", payload, qos=1)
        replies.get()

    samples = common.ping_loop(roundtrip, spec["count"])
    common.latency_report(samples, spec["size"], base)
    client.disconnect()
    client.loop_stop()


if __name__ == "__main__":
    common.main({"recv": recv, "send": send, "echo": echo, "ping": ping})
