#!/usr/bin/env python3
"""Loss under a small broker: raw paho vs netq, same mosquitto limits, same slow consumer.

    python3 bench/mqtt_loss.py [--count 1000] [--size 65536] [--delay 0.02]

A mosquitto with ``max_inflight_messages 2`` and ``max_queued_messages 10``; a producer
publishing ``count`` messages of ``size`` bytes as fast as it can and a consumer that sleeps
``delay`` seconds per message (a tenth of the producer's speed or less). Each side is its own
process. Printed per library: messages that arrived, in order or not, lost, seconds, and the
peak RSS (MiB) of producer, consumer and broker. Raw paho (QoS 1) loses what the broker drops
although every publish was PUBACKed; netq must deliver everything, in order (it detects the
broker's drops as gaps and resends; ``gaps`` is how many it saw).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import psutil  # noqa: E402

from netq.lab.brokers import local_broker  # noqa: E402

LIMITS = {"max_inflight_messages": 2, "max_queued_messages": 10}
IDLE_END = 3.0  # seconds without a message after which the raw consumer stops waiting


def _peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def paho_role(role: str, port: int, count: int, size: int, delay: float) -> None:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"loss-{role}",
                         protocol=paho.MQTTv5)
    client.max_inflight_messages_set(1000)
    if role == "consumer":
        arrivals: queue.SimpleQueue = queue.SimpleQueue()
        subscribed = threading.Event()
        client.on_message = lambda c, u, m: (arrivals.put(bytes(m.payload[:8])), time.sleep(delay))
        client.on_subscribe = lambda *a: subscribed.set()
        client.connect("127.0.0.1", port)
        client.loop_start()
        client.subscribe("loss/data", qos=1)
        subscribed.wait(10)
        print(json.dumps({"ready": True}), flush=True)
        seen, in_order, started = 0, True, None
        while True:
            try:
                stamp = arrivals.get(timeout=IDLE_END if started else 60)
            except queue.Empty:
                break
            started = started or time.monotonic()
            index = int.from_bytes(stamp, "little")
            in_order = in_order and index >= seen
            seen += 1
        print(json.dumps({"received": seen, "in_order": in_order, "rss_mib": _peak()}), flush=True)
        client.loop_stop()
    else:
        client.connect("127.0.0.1", port)
        client.loop_start()
        body = bytes(size - 8)
        infos = [client.publish("loss/data", index.to_bytes(8, "little") + body, qos=1)
                 for index in range(count)]
        for info in infos:
            info.wait_for_publish(120)
        print(json.dumps({"published_and_pubacked": count, "rss_mib": _peak()}), flush=True)
        client.loop_stop()


def run_paho(broker, args) -> dict:
    common = [str(broker.port), str(args.count), str(args.size), str(args.delay)]
    consumer = subprocess.Popen([sys.executable, __file__, "--role", "paho-consumer", *common],
                                stdout=subprocess.PIPE, text=True)
    consumer.stdout.readline()
    started = time.monotonic()
    producer = subprocess.Popen([sys.executable, __file__, "--role", "paho-producer", *common],
                                stdout=subprocess.PIPE, text=True)
    broker_peak = _watch_broker(broker, consumer)
    received = json.loads(consumer.stdout.readline())
    produced = json.loads(producer.stdout.readline())
    producer.wait(60)
    consumer.wait(60)
    return {"library": "raw paho (QoS 1)", "sent": args.count, **received,
            "lost": args.count - received["received"], "seconds": time.monotonic() - started,
            "producer_rss_mib": produced["rss_mib"], "consumer_rss_mib": received["rss_mib"],
            "broker_rss_mib": broker_peak}


def _watch_broker(broker, consumer) -> float:
    """Peak RSS (MiB) of the broker while the consumer runs."""
    peak = 0
    process = psutil.Process(broker.pid)
    while consumer.poll() is None:
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.05)
    return peak / 2**20


def run_netq(broker, args) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
    script = os.path.join(REPO, "tests", "transports", "mqtt_loss_peer.py")
    spec = {"host": broker.host, "port": broker.port, "service": "loss", "count": args.count,
            "size": args.size, "delay": args.delay, "recv_budget": 32 * 2**20, "timeout": 120}
    consumer = subprocess.Popen([sys.executable, script, json.dumps({**spec, "role": "consumer"})],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    consumer.stdout.readline()
    started = time.monotonic()
    producer = subprocess.Popen([sys.executable, script, json.dumps({**spec, "role": "producer"})],
                                stdout=subprocess.PIPE, text=True, env=env)
    result: list = []
    reader = threading.Thread(target=lambda: result.append(consumer.stdout.readline()))
    reader.start()
    peak = 0
    process = psutil.Process(broker.pid)
    while reader.is_alive():
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.05)
    consumed = json.loads(result[0])
    produced = json.loads(producer.stdout.readline())
    consumer.stdin.close()
    producer.wait(60)
    consumer.wait(60)
    return {"library": "netq", "sent": args.count, "received": consumed["received"],
            "in_order": not consumed["bad"], "lost": args.count - consumed["received"],
            "futures_failed": produced["failed"], "gaps": consumed["links"]["gaps"],
            "seconds": time.monotonic() - started,
            "producer_rss_mib": produced["rss_peak"] / 2**20,
            "consumer_rss_mib": consumed["rss_peak"] / 2**20, "broker_rss_mib": peak / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--role")
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    if args.role:
        port, count, size, delay = args.rest
        paho_role(args.role.split("-")[1], int(port), int(count), int(size), float(delay))
        return 0
    rows = []
    for runner in (run_paho, run_netq):
        with local_broker(**LIMITS) as broker:
            rows.append(runner(broker, args))
            print(json.dumps(rows[-1]), flush=True)
    return 0 if rows[-1]["lost"] == 0 and rows[-1]["in_order"] else 1


if __name__ == "__main__":
    sys.exit(main())
