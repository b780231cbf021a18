"""``python -m netq demo``: a server and several clients on loopback, watched live.

Each client is a separate communicator (its own I/O thread and connection) that puts
``(client index, sequence number, payload)`` tuples of mixed sizes and counts its delivery
futures as they resolve; the server gets them, checks each client's order, and puts a short
reply back for every 100th message, so traffic flows both ways. On a terminal the server's
per-peer table (the same fields as the Jupyter widget, :mod:`netq.display.tables`) is redrawn in
place; written to a file or a pipe, one plain line per interval instead. At the end: the
final table, a legend, and a summary with a delivery check.

``--host`` (TCP and gRPC) makes the server listen elsewhere than loopback, for example
``0.0.0.0`` to watch it from another machine's point of view. The security rules of every netq
server apply (:mod:`netq.exposure`): a server that other machines can reach must authenticate
its peers, so the demo then gives the server and its clients a random ``authkey`` made for the
run (its clients are in this process; a stranger who connects is refused before anything it
sends is unpickled).

The command line itself (``python -m netq``, its subcommands and their help) is built in
:mod:`netq.__main__` from :func:`add_arguments` and :data:`SUMMARY` / :data:`DESCRIPTION`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import ipaddress
import random
import secrets
import shutil
import sys
import threading
import time
import uuid
from typing import Any

from .. import (
    CommunicatorOptions,
    ConnectionOptions,
    Empty,
    NetworkLocation,
    Protocol,
    Purpose,
    ResourceClosed,
    ResourceGone,
    SecurityOptions,
    new,
    transports,
)
from ..display.formatting import format_bytes, format_count, format_rate
from ..display.tables import text_table
from ..exposure import reachable_by_others

SIZES = (64, 4096, 65536, 1 << 20)  # bytes; chosen per message with WEIGHTS
WEIGHTS = (60, 25, 10, 5)
REPLY_EVERY = 100  # the server replies to every 100th message of each client

# What `python -m netq --help` and `python -m netq demo --help` say (plain text, no markup).
SUMMARY = "a server and N clients on loopback, with live per-client statistics"
DESCRIPTION = ("Start a netq server and N client communicators in this process, on loopback. "
               "Each client puts messages of 64 B to 1 MiB as fast as the server takes them; "
               "the server checks that every client's messages arrive in order and replies "
               f"to every {REPLY_EVERY}th. On a terminal a per-client table is redrawn in "
               "place; redirected to a file, one plain line per interval. Exits 0 when every "
               "message arrived exactly once and in order.")

# Which protocols need what beyond the standard library: (importable module, pip package, extra).
_EXTRAS = {"mqtt": ("paho", "paho-mqtt", "mqtt"), "grpc": ("grpc", "grpcio", "grpc")}

_WHERE = {"tcp": "over TCP on loopback", "unix": "over a Unix domain socket",
          "mqtt": "over MQTT through a private broker on loopback",
          "grpc": "over gRPC on loopback"}

LEGEND = (
    "columns (one row per client, as the server sees it):\n"
    "  queue in    messages received, waiting for the server's get()\n"
    "  queue out   replies put() by the server, not yet sent\n"
    "  in / out    messages and MiB per second received from / sent to the client\n"
    "  memory      bytes netq holds for the client (queued in + unsent + unacknowledged)\n"
    "  credit in   bytes the client may still send before the server grants more\n"
    "  credit out  bytes the client still lets the server send\n"
    "  Credit may go below zero by up to one message: a message may start on any positive\n"
    "  credit, so a 1 MiB message started with 200 KiB left shows as about -824 KiB.\n"
    "  A line starting with ! names a client whose traffic waits, for how long and why.")


class Unavailable(RuntimeError):
    """The chosen protocol cannot run in this installation (the message says what is missing)."""


def protocols() -> list[str]:
    """The demo's ``--protocol`` choices: the registered transports, in Protocol order."""
    registered = transports.available()
    return [p.value for p in Protocol if p.value in registered]


def missing(protocol: str) -> str | None:
    """What this installation lacks to run ``protocol`` (a plain sentence), or None."""
    if protocol in _EXTRAS:
        module, package, extra = _EXTRAS[protocol]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # ValueError: blocked by sys.modules[module] = None
            found = False
        if not found:
            return f"{package} is not installed: pip install 'netq[{extra}]'"
    return None


def _protocol_help() -> str:
    names = protocols()
    lacking = {name: why for name in names if (why := missing(name)) is not None}
    text = ("transport (default tcp). tcp and unix need nothing more; mqtt runs through a "
            "private mosquitto started for the demo (needs the [mqtt] extra; where mosquitto "
            "is not installed, amqtt, which pip installs into a venv of its own on first "
            "use); grpc needs the [grpc] extra.")
    if lacking:
        return text + " Not usable here: " + "; ".join(f"{n}: {w}" for n, w in lacking.items())
    return text + f" Usable here: {', '.join(names)}."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, added to the ``demo`` subcommand's parser (netq.__main__)."""
    parser.add_argument("--clients", type=int, default=4, metavar="N",
                        help="client communicators (default 4)")
    parser.add_argument("--seconds", type=float, default=5.0, metavar="S",
                        help="how long the clients send (default 5)")
    parser.add_argument("--interval", type=float, default=None, metavar="S",
                        help="seconds between updates (default 0.5 on a terminal, 1 otherwise)")
    parser.add_argument("--protocol", choices=protocols(), default="tcp",
                        help=_protocol_help())
    parser.add_argument("--port", type=int, default=0,
                        help="TCP port, or the broker's for mqtt (default: any free one)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="tcp and grpc: the address the server listens on (default "
                             "127.0.0.1). Beyond loopback (e.g. 0.0.0.0) the server and its "
                             "clients share a random authkey made for the run, so nobody "
                             "else can get a message unpickled by it")


def render(stats, names: dict[uuid.UUID, str]) -> str:
    """The per-peer table as text: the same fields as the Jupyter widget (netq.display.tables)."""
    return text_table(stats, names)


def intro(clients: int, seconds: float, protocol: str, host: str = "127.0.0.1") -> str:
    """The one line that says what the demo does."""
    where = _WHERE.get(protocol, f"over {protocol}")
    if host != "127.0.0.1":
        where = where.replace("on loopback", f"listening on {host or 'every address'}")
    return (f"netq demo: a server and {clients} clients in this process {where} for "
            f"{seconds:g} s. Each client puts messages of "
            f"64 B to 1 MiB (client-0 slowly); the server gets them, checks their order and "
            f"replies to every {REPLY_EVERY}th.")


def progress_line(elapsed: float, stats, clients: int, acknowledged: int) -> str:
    """One plain line of progress (for a file or a pipe: no escape codes, no fixed width)."""
    connected = sum(1 for row in stats.peers if row.state == "connected")
    return (f"{elapsed:5.1f} s  {connected} of {clients} clients connected  "
            f"received {format_count(stats.messages_in_per_s)} msg/s "
            f"{format_rate(stats.bytes_in_per_s / 2**20)} MiB/s  "
            f"replied {format_count(stats.messages_out_per_s)} msg/s  "
            f"queued for get() {sum(row.queue_in for row in stats.peers)}  "
            f"server memory {format_bytes(stats.memory)}  "
            f"acknowledged deliveries so far {acknowledged}")


class _Tally:
    """A counter that the client's thread and its I/O thread (future callbacks) both bump."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, _future=None) -> None:
        with self._lock:
            self.value += 1


def run(clients: int = 4, seconds: float = 5.0, interval: float | None = None,
        protocol: str = "tcp", port: int = 0, out=sys.stdout, host: str = "127.0.0.1") -> dict:
    """Run the demo; returns the summary (messages, bytes, seconds, losses).

    ``protocol="mqtt"`` starts a private broker for the run (:func:`netq.lab.brokers.broker`:
    mosquitto, or amqtt where mosquitto is not installed), and says which.
    ``host`` (tcp and grpc) is where the server listens; beyond loopback the run uses an
    authkey of its own. Raises :class:`Unavailable` naming what is missing when the protocol
    cannot run here, and :class:`ValueError` for a ``host`` with unix or mqtt.
    """
    why = missing(protocol)
    if why is not None:
        raise Unavailable(f"--protocol {protocol} cannot run here: {why}")
    if protocol not in ("tcp", "grpc") and host != "127.0.0.1":
        raise ValueError(f"--host applies to tcp and grpc, not to {protocol}")
    if protocol == "mqtt":
        from ..exceptions import BrokerUnavailable
        from .brokers import broker

        said: list[str] = []
        with contextlib.ExitStack() as stack:
            try:
                where = stack.enter_context(broker(port=port, report=said.append))
            except BrokerUnavailable as error:
                raise Unavailable(f"--protocol mqtt cannot run here: {error}") from None
            return _run(clients, seconds, interval, protocol,
                        NetworkLocation(where.host, where.port, path="demo"), out, said)
    return _run(clients, seconds, interval, protocol, NetworkLocation(host=host, port=port), out)


def _reach(host: str) -> str:
    """Where the in-process clients connect to a server listening on ``host``: loopback of
    the same family for a wildcard (every address), else that address itself."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_unspecified:
            return "::1"
    except ValueError:
        pass  # a host name: connect to it as given
    return host


def _rows(text: str, width: int) -> int:
    """Terminal rows that ``text`` takes when lines wrap at ``width`` columns."""
    return sum(max(1, -(-len(line) // width)) for line in text.split("\n"))


def _run(clients: int, seconds: float, interval: float | None, protocol: str,
         netloc: NetworkLocation, out, notes: list[str] | None = None) -> dict:
    interactive = out.isatty() if hasattr(out, "isatty") else False
    if interval is None:
        interval = 0.5 if interactive else 1.0
    out.write(intro(clients, seconds, protocol, netloc.host) + "\n")
    for note in notes or ():
        out.write(note + "\n")
    if interactive:
        out.write(LEGEND + "\n")
    options = CommunicatorOptions(
        netloc=netloc,
        connection=ConnectionOptions(recv_budget=8 << 20, send_budget=8 << 20))
    exposed = reachable_by_others(Protocol(protocol), options)
    if exposed is not None:
        # The rule every netq server follows: peers that can reach it must authenticate.
        options = options.replace(security=SecurityOptions(authkey=secrets.token_bytes(32)))
        out.write(f"The server is reachable beyond this host ({exposed}); it and its "
                  f"clients share a random authkey made for this run, so a stranger who "
                  f"connects is refused before anything it sends is unpickled.\n")
    out.flush()
    server = new(Protocol(protocol), Purpose.SERVER, options)
    address = server.address
    if protocol in ("tcp", "grpc"):
        client_netloc = NetworkLocation(host=_reach(netloc.host), port=address[1])
    else:
        client_netloc = netloc
    stop = threading.Event()
    sent = [0] * clients
    acknowledged = [_Tally() for _ in range(clients)]
    failed = [_Tally() for _ in range(clients)]
    replies = [0] * clients
    names: dict[uuid.UUID, str] = {}
    problems: list[str] = []
    payloads = {size: bytes(random.getrandbits(8) for _ in range(64)) * (size // 64)
                for size in SIZES}

    def client_main(index: int) -> None:
        # Each client sends (index, sequence, payload); the server checks the sequence.
        client = new(Protocol(protocol), Purpose.CLIENT, CommunicatorOptions(
            netloc=client_netloc, connection=options.connection, security=options.security))
        names[client.id] = f"client-{index}"
        rng = random.Random(index)

        def settled(future) -> None:
            (failed if future.exception() is not None else acknowledged)[index].add()

        try:
            while not stop.is_set():
                size = rng.choices(SIZES, WEIGHTS)[0]
                client.put((index, sent[index], payloads[size])).add_done_callback(settled)
                sent[index] += 1
                try:
                    while True:
                        client.get_nowait()
                        replies[index] += 1
                except Empty:
                    pass
                if index == 0:
                    time.sleep(0.0005)  # one gentle client, to see unequal rates
        finally:
            client.close()
            try:
                while True:
                    client.get_nowait()
                    replies[index] += 1
            except (Empty, ResourceGone):
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
                if sequence % REPLY_EVERY == 0:
                    try:
                        server.put(("reply", sequence), message.peer)
                    except ResourceGone:  # the client left, or we are closing
                        pass

    threads = [threading.Thread(target=client_main, args=(i,), name=f"demo-client-{i}")
               for i in range(clients)]
    consumer = threading.Thread(target=server_main, name="demo-server")
    consumer.start()
    for thread in threads:
        thread.start()
    server.statistics()  # the first snapshot: rates are measured from here
    started = time.monotonic()
    shown = 0  # terminal rows of the table drawn last, to redraw it in place
    told_width = False
    try:
        while (elapsed := time.monotonic() - started) < seconds:
            time.sleep(min(interval, max(0.0, seconds - elapsed)))
            stats = server.statistics()
            if not interactive:
                out.write(progress_line(time.monotonic() - started, stats, clients,
                                        sum(t.value for t in acknowledged)) + "\n")
                out.flush()
                continue
            table = render(stats, names)
            width = shutil.get_terminal_size((120, 20)).columns
            widest = max(len(line) for line in table.split("\n"))
            if widest > width and not told_width:
                out.write(f"(the table is {widest} columns wide; a wider terminal shows it "
                          f"unwrapped)\n")
                told_width = True
                shown = 0
            if shown:
                out.write(f"\x1b[{shown}F\x1b[J")  # back to the table's first row, clear below
            out.write(table + "\n")
            out.flush()
            shown = _rows(table, width)
    except KeyboardInterrupt:
        out.write("\n(interrupted: stopping the clients)\n")
    finally:
        sending = server.statistics()  # while the clients still send, for the final table
        stop.set()
        for thread in threads:
            thread.join()
        consumer.join()
        final = server.statistics()
        server.close()
    elapsed = time.monotonic() - started
    summary: dict[str, Any] = {
        "clients": clients,
        "seconds": elapsed,
        "messages": final.messages_in,
        "bytes": final.bytes_in,
        "sent": sum(sent),
        "received": sum(received),
        "acknowledged": sum(t.value for t in acknowledged),
        "failed": sum(t.value for t in failed),
        "replies": sum(replies),
        "problems": problems,
    }
    if not interactive:
        out.write("\nthe server's view of each client just before they stopped:\n"
                  + render(sending, names) + "\n" + LEGEND + "\n")
    lost = summary["sent"] - summary["received"]
    out.write(
        f"\nsummary: the server received {summary['received']} messages "
        f"({summary['bytes'] / 2**20:.1f} MiB) from {clients} clients in {elapsed:.1f} s: "
        f"{summary['received'] / elapsed:,.0f} msg/s, {summary['bytes'] / elapsed / 1e9:.2f} GB/s\n"
        f"  {summary['acknowledged']} of the {summary['sent']} puts became acknowledged "
        f"deliveries (the server's netq confirmed receipt); {summary['replies']} replies came "
        f"back\n"
        f"  lost {lost}, out of order {len(problems)}, failed deliveries {summary['failed']}\n")
    for problem in problems[:10]:
        out.write(f"  {problem}\n")
    out.flush()
    return summary


def command(args: argparse.Namespace) -> int:
    """The ``demo`` subcommand: exit 0 when every message arrived once and in order."""
    try:
        summary = run(args.clients, args.seconds, args.interval, args.protocol, args.port,
                      host=args.host)
    except (Unavailable, ValueError) as error:
        print(f"netq demo: {error}", file=sys.stderr)
        return 2
    ok = (summary["sent"] == summary["received"] and not summary["problems"]
          and not summary["failed"])
    return 0 if ok else 1
