#!/usr/bin/env python3
"""netq's MQTT transport on each broker it is tested with, measured in one run, side by side.

    python3 bench/mqtt_brokers.py                       # every broker found here
    python3 bench/mqtt_brokers.py --only mosquitto,rabbitmq --rounds 500 --mib 32

Per broker, with default ``MQTTOptions`` (netq picks MQTT 5 or 3.1.1 itself): the 64 B round
trip (client put -> server get -> server put -> client get; median and p99 of ``--rounds``)
and one-way throughput (``--mib`` MiB of 1 MiB messages from a client to the server, MB/s =
10^6 bytes per second, timed from the first put to the last get). Server and client live in
this process, each with its own I/O thread. Brokers: mosquitto (Debian), RabbitMQ 3.10 (a node
of its own; ``rabbitmq-cluster``: server on node 0, client on node 1 of a 2-node cluster) and
amqtt 0.12.1 (from ``$NETQ_AMQTT_VENV`` or ``~/.cache/netq/amqtt-0.12.1``, the venv that
:func:`netq.lab.brokers.ensure_amqtt` makes on first use). Run it on a quiet machine, or read
the figures as ratios between rows of the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import netq as nq
from netq.lab.brokers import AmqttBroker, ensure_amqtt, local_broker
from netq.lab.rabbitmq import RabbitMQCluster
from netq.transports.mqtt import link_statistics

BROKERS = ("mosquitto", "rabbitmq", "rabbitmq-cluster", "amqtt")
MiB = 1024 * 1024


def measure(server_at: nq.NetworkLocation, client_at: nq.NetworkLocation, rounds: int,
            mib: int) -> dict:
    service = f"bench-{uuid.uuid4().hex[:8]}"

    def options(where: nq.NetworkLocation) -> nq.CommunicatorOptions:
        return nq.CommunicatorOptions(netloc=nq.NetworkLocation(where.host, where.port,
                                                                path=service))

    with nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options(server_at)) as server, \
            nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT, options(client_at)) as client:
        client.put(b"warm-up").result(60)
        server.get(timeout=60)
        small = bytes(64)
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            client.put(small)
            message = server.get(timeout=60)
            server.put(small, message.peer)
            client.get(timeout=60)
            times.append(time.perf_counter() - started)
        times.sort()
        payload = bytes(MiB)
        started = time.perf_counter()
        futures = [client.put(payload) for _ in range(mib)]
        for _ in range(mib):
            server.get(timeout=120)
        elapsed = time.perf_counter() - started
        for future in futures:
            future.result(60)
        protocol = link_statistics(client)["protocol"]
    return {"protocol": protocol, "rtt_p50_ms": statistics.median(times) * 1e3,
            "rtt_p99_ms": times[int(len(times) * 0.99) - 1] * 1e3,
            "mb_per_s": mib * MiB / elapsed / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(BROKERS))
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--mib", type=int, default=32)
    arguments = parser.parse_args()
    chosen = [name for name in arguments.only.split(",") if name]
    print(f"# netq MQTT per broker: 64 B round trip over {arguments.rounds} rounds, one-way "
          f"{arguments.mib} x 1 MiB; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print("| broker | MQTT spoken | round trip p50 / p99 (ms) | one-way MB/s |")
    print("|---|---|---|---|")
    clusters: list[RabbitMQCluster] = []
    try:
        if "rabbitmq" in chosen:
            clusters.append(RabbitMQCluster(1).launch())
        if "rabbitmq-cluster" in chosen:
            clusters.append(RabbitMQCluster(2).launch())
        for cluster in clusters:
            cluster.wait_ready()
        for name in chosen:
            if name == "mosquitto":
                with local_broker() as broker:
                    row = measure(broker.netloc, broker.netloc, arguments.rounds, arguments.mib)
            elif name == "amqtt":
                with AmqttBroker(binary=ensure_amqtt()) as broker:
                    row = measure(broker.netloc, broker.netloc, arguments.rounds, arguments.mib)
            elif name == "rabbitmq":
                node = clusters[0].nodes[0]
                row = measure(node.netloc, node.netloc, arguments.rounds, arguments.mib)
            elif name == "rabbitmq-cluster":
                nodes = clusters[-1].nodes
                row = measure(nodes[0].netloc, nodes[1].netloc, arguments.rounds, arguments.mib)
            else:
                parser.error(f"unknown broker {name!r}; choose from {', '.join(BROKERS)}")
            print(f"| {name} | {row['protocol']} | {row['rtt_p50_ms']:.2f} / "
                  f"{row['rtt_p99_ms']:.2f} | {row['mb_per_s']:.0f} |", flush=True)
    finally:
        for cluster in clusters:
            cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
