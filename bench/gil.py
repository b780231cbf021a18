#!/usr/bin/env python3
"""A consumer that runs Python between ``get()`` calls: what a put's future waits for.

netq reads, parses and acknowledges on an I/O thread of the receiving process. That thread
runs Python, so it needs the GIL; while another thread of the process runs Python without
pause (a loop in a notebook cell, a pure-Python model step), CPython hands the GIL over only
when the running thread blocks or every ``sys.getswitchinterval()`` seconds (5 ms unless the
program changes it). Each system call releases the GIL, so one message costs the I/O thread
a wait of up to one interval for every call it makes before the acknowledgement leaves.

The sender puts one message and waits for its future (resolved by the receiver's ACK); the
receiver, after each ``get()``, works ``--work-ms`` milliseconds, one of three ways:

sleep          ``time.sleep``: work that releases the GIL (numpy on large arrays, I/O). The
               floor: nothing competes for the GIL.
python         a pure-Python loop, the switch interval left as it is.
python-0.5ms   the same loop after ``sys.setswitchinterval(0.0005)`` in the receiver.

    python3 bench/gil.py                              # tcp and unix, 1 KiB and 64 KiB
    python3 bench/gil.py --protocols tcp --sizes 1K --work-ms 5 --count 200

Prints a Markdown table: put -> result p50 / p90 / max in ms over ``--count`` puts (after 3
warm-up puts). Loopback and a temporary Unix socket only; each endpoint is its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 3
KINDS = ("sleep", "python", "python-0.5ms")
TIMEOUT = 120.0  # seconds one measurement may take before its processes are killed


def _options(protocol: str, where: str):
    import netq
    if protocol == "unix":
        netloc = netq.NetworkLocation(path=where)
    else:
        netloc = netq.NetworkLocation(host="127.0.0.1", port=int(where))
    return netq.CommunicatorOptions(netloc=netloc)


def receiver(protocol: str, where: str, count: int, work: float, kind: str) -> None:
    import netq
    if kind == "python-0.5ms":
        sys.setswitchinterval(0.0005)
    server = netq.new(protocol, "server", _options(protocol, where))
    print("READY", flush=True)
    clock = time.perf_counter
    for _ in range(WARMUP + count):
        server.get()
        if kind == "sleep":
            time.sleep(work)
        else:
            end = clock() + work
            while clock() < end:  # holds the GIL but for the interpreter's hand-overs
                pass
    server.close()


def sender(protocol: str, where: str, count: int, size: int, gap: float) -> None:
    import netq
    client = netq.new(protocol, "client", _options(protocol, where))
    data = os.urandom(size)
    clock = time.perf_counter
    latencies = []
    for _ in range(WARMUP + count):
        if gap:
            time.sleep(gap)
        start = clock()
        client.put(data).result()
        latencies.append(clock() - start)
    client.close()
    timed = sorted(latencies[WARMUP:])
    print("RESULT " + json.dumps({
        "p50": statistics.median(timed), "p90": timed[int(len(timed) * 0.9)],
        "max": timed[-1]}), flush=True)


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(protocol: str, size: int, count: int, work: float, kind: str, gap: float) -> dict:
    """One row: a receiver and a sender process; the sender's RESULT."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        where = os.path.join(tmp, "gil.sock") if protocol == "unix" else str(_free_port())
        me = [sys.executable, os.path.abspath(__file__)]
        rx = subprocess.Popen(me + ["--role", "receiver", "--protocols", protocol, "--where",
                                    where, "--count", str(count), "--work-ms", str(work * 1e3),
                                    "--kind", kind],
                              stdout=subprocess.PIPE, text=True, env=env)
        tx = None
        try:
            assert rx.stdout is not None
            if rx.stdout.readline().strip() != "READY":
                raise RuntimeError("the receiver did not start")
            tx = subprocess.Popen(me + ["--role", "sender", "--protocols", protocol, "--where",
                                        where, "--count", str(count), "--sizes", str(size),
                                        "--gap-ms", str(gap * 1e3)],
                                  stdout=subprocess.PIPE, text=True, env=env)
            out, _ = tx.communicate(timeout=TIMEOUT)
            rx.wait(timeout=TIMEOUT)
        finally:
            for proc in (rx, tx):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            if rx.stdout is not None:
                rx.stdout.close()
        for line in out.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"no RESULT from the sender ({protocol}, {size} B, {kind})")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def size_name(size: int) -> str:
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocols", default="tcp,unix")
    parser.add_argument("--sizes", default="1K,64K")
    parser.add_argument("--work-ms", type=float, default=20.0,
                        help="milliseconds the receiver works after each get() (default 20)")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="milliseconds the sender sleeps before each put (default 0: it "
                             "puts as soon as the last future resolved, while the receiver "
                             "works; longer than --work-ms: the receiver waits in get() when "
                             "each message comes)")
    parser.add_argument("--count", type=int, default=60, help="timed puts per row (default 60)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--role", choices=("receiver", "sender"), help=argparse.SUPPRESS)
    parser.add_argument("--where", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = args.work_ms / 1e3
    if args.role == "receiver":
        receiver(args.protocols, args.where, args.count, work, args.kind)
        return
    if args.role == "sender":
        sender(args.protocols, args.where, args.count, parse_size(args.sizes), args.gap_ms / 1e3)
        return
    kinds = args.kinds.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(sorted(unknown))}: --kinds takes "
                     f"{', '.join(KINDS)}")
    gap = f", the sender sleeping {args.gap_ms:g} ms before each put" if args.gap_ms else ""
    print(f"## put -> result with a receiver that works {args.work_ms:g} ms after each get()"
          f"{gap} ({args.count} puts per row, ms)\n")
    print("| protocol | size | receiver's work | p50 | p90 | max |")
    print("|---|---|---|---:|---:|---:|")
    for protocol in args.protocols.split(","):
        for size in (parse_size(s) for s in args.sizes.split(",")):
            for kind in kinds:
                result = measure(protocol, size, args.count, work, kind, args.gap_ms / 1e3)
                print(f"| {protocol} | {size_name(size)} | {kind} | {result['p50'] * 1e3:.2f} | "
                      f"{result['p90'] * 1e3:.2f} | {result['max'] * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
