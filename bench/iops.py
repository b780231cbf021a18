#!/usr/bin/env python3
"""net-queue's IOPS test (``net_queue/test/iops.py`` of net-queue 2.6.4), ported to netq.

The same logic runs against either library, so the two are measured by one yardstick:

    python3 bench/iops.py --lib netq server async --step-size 0 --max-size 21 --reps 1000 \
        --port 0
    python3 bench/iops.py --lib netq client async --step-size 0 --max-size 21 --reps 1000 \
        --port PORT
    /tmp/nq313/bin/python bench/iops.py --lib net_queue ...          # upstream, Python 3.13
    python3 bench/iops.py --lib raw ...       # the floor: one blocking socket, no library

Scenario (as upstream): messages are numpy uint8 views of one 2**max_size array; with
``--step-size S`` sizes 2**min_size, 2**(min_size+S), ... below 2**max_size are added,
round((2**max / 2**i) ** step_expo) of each, plus one full-size message, all repeated
``--reps`` times and shuffled (seed 0). After a handshake (client put(None), server get()
per client then put(None) broadcast, client get()), both sides send every message to the
other: ``sync`` = the client sends all, then the server sends all back; ``async`` = both
directions at once (a get thread and a put thread on each side). The clock runs from the
handshake to the end of ``close()``; statistics count both directions (ops = 2 x messages).

Differences from upstream: no per-message progress ``print`` (it measured terminal output
at small sizes), ``--port 0`` picks a free port and prints ``READY``, received messages are
counted and their bytes checked, and a ``RESULT <json>`` line reports time, Gbps, IOPS, CPU
time and peak RSS. Upstream TLS/merge/transport-size switches are not ported (defaults only).
"""

from __future__ import annotations

import argparse
import enum
import importlib
import math
import os
import random
import sys
import time
import uuid
from threading import Thread

import numpy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
import common


class Mode(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"


def generate(config) -> list:
    """Messages exactly as upstream's generate()."""
    messages = []
    b = numpy.arange(2 ** config.max_size, dtype=numpy.uint8)
    if config.step_size:
        for i in range(config.min_size, config.max_size, config.step_size):
            splits = round(((2 ** config.max_size) / (2 ** i)) ** config.step_expo)
            for _ in range(splits):
                messages.append(b[:2 ** i])
    messages.append(b)
    messages *= config.reps
    random.shuffle(messages)
    return messages


class Tally:
    """What the get side received (upstream discards it; we check it)."""

    def __init__(self) -> None:
        self.msgs = 0
        self.bytes = 0


def get(comm, n: int, tally: Tally) -> None:
    for _ in range(n):
        common.PROGRESS["got"] = tally.msgs
        data = comm.get().data
        tally.msgs += 1
        tally.bytes += data.nbytes if hasattr(data, "nbytes") else len(data)


def put(comm, msgs: list) -> None:
    for i, m in enumerate(msgs):
        common.PROGRESS["put"] = i
        comm.put(m)        # as upstream: close() at the end waits for the data to drain


def exchange(mode: Mode, comm, inbound: int, outbound: list, tally: Tally, put_first: bool,
             delay: float) -> None:
    get_thread = Thread(target=get, args=(comm, inbound, tally))
    put_thread = Thread(target=put, args=(comm, outbound))
    if mode is Mode.SYNC:
        first, second = (put_thread, get_thread) if put_first else (get_thread, put_thread)
        if not put_first:
            time.sleep(delay)
        first.run()
        if put_first:
            time.sleep(delay)
        second.run()
    else:
        get_thread.start()
        put_thread.start()
        get_thread.join()
        put_thread.join()


def convert_size(units: float, scale: int = 1000) -> str:
    names = ("", "K", "M", "G", "T", "P")
    if units <= 0:
        return "0"
    i = min(int(math.log(units, scale)), len(names) - 1)
    return f"{round(units / math.pow(scale, i), 2)}{names[i]}"


# --lib -> the module imported: the raw-socket floor lives beside the bench's workers.
MODULES = {"netq": "netq", "net_queue": "net_queue", "raw": "raw_iops"}


def run(config) -> None:
    nq = importlib.import_module(MODULES[config.lib])
    random.seed(0)
    messages = generate(config)
    sizes = [m.nbytes for m in messages]
    server_side = config.purpose == "server"
    port = common.free_port(config.host) if config.port == 0 else config.port
    opts = nq.CommunicatorOptions(id=uuid.uuid4(),
                                  netloc=nq.NetworkLocation(host=config.host, port=port))
    purpose = nq.Purpose.SERVER if server_side else nq.Purpose.CLIENT
    mode = Mode(config.mode)
    tally = Tally()
    c0 = common.cpu_s()
    comm = nq.new(nq.Protocol.TCP, purpose, opts)
    if hasattr(comm, "statistics"):                  # netq: show its state if the run hangs
        common.on_diagnose(lambda: repr(comm.statistics()))
    if server_side:
        common.ready(f"{config.host}:{port}")
    with comm:
        if server_side:
            for _ in range(config.clients):
                comm.get()
            comm.put(None)
            start = time.perf_counter()
            exchange(mode, comm, len(messages) * config.clients, messages, tally,
                     put_first=False, delay=config.delay)
        else:
            comm.put(None)
            comm.get()
            start = time.perf_counter()
            exchange(mode, comm, len(messages), messages, tally, put_first=True,
                     delay=config.delay)
    elapsed = time.perf_counter() - start
    cpu = common.cpu_s() - c0
    expected_in = len(messages) * (config.clients if server_side else 1)
    expected_bytes = sum(sizes) * (config.clients if server_side else 1)
    total_sizes = sizes * config.clients
    ops, nbytes = len(total_sizes) * 2, sum(total_sizes) * 2
    print(f"Time:       {elapsed:.1f}s\n"
          f"Data:       {convert_size(len(total_sizes))} @ "
          f"{convert_size(sum(total_sizes) / len(total_sizes))}B\n"
          f"Transfer:   {convert_size(nbytes)}B @ {convert_size(nbytes * 8 / elapsed)}bps\n"
          f"Operations: {convert_size(ops)} @ {convert_size(ops / elapsed)}IOPS",
          file=sys.stderr)
    common.result(role=config.purpose, lib=config.lib, mode=config.mode, elapsed=elapsed,
                  messages=len(messages), ops=ops, bytes=nbytes, gbps=nbytes * 8 / elapsed / 1e9,
                  iops=ops / elapsed, cpu_s=cpu, cpu_us_per_op=cpu / ops * 1e6,
                  received=tally.msgs, received_bytes=tally.bytes,
                  ok=tally.msgs == expected_in and tally.bytes == expected_bytes,
                  peak_rss_kb=common.maxrss_kb())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="iops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", choices=list(MODULES), default="netq",
                   help="raw: the raw-socket floor (bench/workers/raw_iops.py)")
    p.add_argument("purpose", choices=["server", "client"])
    p.add_argument("mode", choices=[m.value for m in Mode])
    p.add_argument("--delay", type=float, default=0.0,
                   help="seconds to wait before the get side starts (sync; causes buffering)")
    p.add_argument("--min-size", type=int, default=8, help="exponent of the smallest message")
    p.add_argument("--step-size", type=int, default=2,
                   help="exponent step between sizes (0: one size)")
    p.add_argument("--max-size", type=int, default=32, help="exponent of the largest message")
    p.add_argument("--step-expo", type=float, default=0.5,
                   help="exponent of the number of splits when stepping down a size")
    p.add_argument("--reps", type=int, default=1, help="repetitions of the message list")
    p.add_argument("--clients", type=int, default=1, help="clients the server waits for")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=51966, help="0: pick a free port (server)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
