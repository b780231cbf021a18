"""``python -m netq demo``: a server and several clients on loopback, watched live.

Each client is a separate communicator (its own I/O thread and TCP connection) that puts a mix
of message sizes; the server echoes a small receipt for every 100th message, so traffic flows
both ways. Every ``--interval`` seconds the main thread prints the server's per-peer
statistics (state, queue depths, rates, memory, credit); at the end, a summary with the
totals, and a check that every message arrived in order.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import threading
import time
import uuid

from . import (
    CommunicatorOptions,
    ConnectionOptions,
    Empty,
    NetworkLocation,
    Protocol,
    Purpose,
    ResourceClosed,
    new,
)
from .display import text_table

SIZES = (64, 4096, 65536, 1 << 20)  # bytes; chosen per message with WEIGHTS
WEIGHTS = (60, 25, 10, 5)


def render(stats, names: dict[uuid.UUID, str]) -> str:
    """The per-peer table as text: the same fields as the Jupyter widget (netq.display)."""
    return text_table(stats, names)


def run(clients: int = 4, seconds: float = 5.0, interval: float = 0.5,
        protocol: str = "tcp", port: int = 0, out=sys.stdout) -> dict:
    """Run the demo; returns the summary (messages, bytes, seconds, losses).

    ``protocol="mqtt"`` starts a private mosquitto (netq.brokers.local_broker) for the run.
    """
    if protocol == "mqtt":
        from .brokers import local_broker

        with local_broker(port=port) as broker:
            return _run(clients, seconds, interval, protocol,
                        NetworkLocation(broker.host, broker.port, path="demo"), out)
    return _run(clients, seconds, interval, protocol,
                NetworkLocation(host="127.0.0.1", port=port), out)


def _run(clients: int, seconds: float, interval: float, protocol: str,
         netloc: NetworkLocation, out) -> dict:
    options = CommunicatorOptions(
        netloc=netloc,
        connection=ConnectionOptions(recv_budget=8 << 20, send_budget=8 << 20))
    server = new(Protocol(protocol), Purpose.SERVER, options)
    address = server.address
    if protocol in ("tcp", "grpc"):
        client_netloc = NetworkLocation(host="127.0.0.1", port=address[1])
    else:
        client_netloc = netloc
    stop = threading.Event()
    sent = [0] * clients
    receipts = [0] * clients
    names: dict[uuid.UUID, str] = {}
    problems: list[str] = []
    payloads = {size: bytes(random.getrandbits(8) for _ in range(64)) * (size // 64) for size in SIZES}

    def client_main(index: int) -> None:
        # Each client sends (index, sequence, payload); the server checks the sequence.
        client = new(Protocol(protocol), Purpose.CLIENT, CommunicatorOptions(
            netloc=client_netloc, connection=options.connection))
        names[client.id] = f"client-{index}"
        rng = random.Random(index)
        try:
            while not stop.is_set():
                size = rng.choices(SIZES, WEIGHTS)[0]
                client.put((index, sent[index], payloads[size]))
                sent[index] += 1
                try:
                    while True:
                        client.get_nowait()
                        receipts[index] += 1
                except Empty:
                    pass
                if index == 0:
                    time.sleep(0.0005)  # one gentle client, to see unequal rates
        finally:
            client.close()
            try:
                while True:
                    client.get_nowait()
                    receipts[index] += 1
            except (Empty, ResourceClosed):
                pass

    received = [0] * clients

    def server_main() -> None:
        while True:
            try:
                batch = server.get_many(max_messages=256, timeout=0.2)
            except Empty:
                if stop.is_set() and not server.peers:
                    return
                continue
            except ResourceClosed:
                return
            for message in batch:
                index, sequence, payload = message.data
                if sequence != received[index]:
                    problems.append(f"client-{index}: got #{sequence}, expected #{received[index]}")
                received[index] = sequence + 1
                if sequence % 100 == 0:
                    try:
                        server.put(("receipt", sequence), message.peer)
                    except ResourceClosed:
                        pass

    threads = [threading.Thread(target=client_main, args=(i,), name=f"demo-client-{i}")
               for i in range(clients)]
    consumer = threading.Thread(target=server_main, name="demo-server")
    consumer.start()
    for thread in threads:
        thread.start()
    interactive = out.isatty() if hasattr(out, "isatty") else False
    started = time.monotonic()
    shown = 0
    try:
        while time.monotonic() - started < seconds:
            time.sleep(interval)
            table = render(server.statistics(), names)
            if interactive and shown:
                out.write(f"\x1b[{shown}F\x1b[J")  # redraw in place
            out.write(table + "\n")
            out.flush()
            shown = table.count("\n") + 1
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        consumer.join()
        final = server.statistics()
        server.close()
    elapsed = time.monotonic() - started
    summary = {
        "clients": clients,
        "seconds": elapsed,
        "messages": final.messages_in,
        "bytes": final.bytes_in,
        "sent": sum(sent),
        "received": sum(received),
        "receipts": sum(receipts),
        "problems": problems,
    }
    lost = summary["sent"] - summary["received"]
    out.write(
        f"\nsummary: {summary['received']} messages ({summary['bytes'] / 2**20:.1f} MiB) from "
        f"{clients} clients in {elapsed:.1f} s = {summary['received'] / elapsed:,.0f} msg/s, "
        f"{summary['bytes'] / elapsed / 1e9:.2f} GB/s; {summary['receipts']} receipts back; "
        f"lost {lost}, out of order {len(problems)}\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m netq demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="client communicators (default 4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to run (default 5)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between tables")
    parser.add_argument("--protocol", choices=("tcp", "unix", "mqtt", "grpc"), default="tcp",
                        help="mqtt: through a private mosquitto started for the demo; "
                             "mqtt and grpc need the [mqtt] / [grpc] extras")
    parser.add_argument("--port", type=int, default=0,
                        help="TCP port, or the broker's for mqtt (default: any free one)")
    args = parser.parse_args(argv)
    width = shutil.get_terminal_size((100, 20)).columns
    if width < 110:
        print("(widen the terminal to 110 columns for the full table)")
    summary = run(args.clients, args.seconds, args.interval, args.protocol, args.port)
    return 0 if summary["sent"] == summary["received"] and not summary["problems"] else 1
