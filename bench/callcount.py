#!/usr/bin/env python3
"""Python function calls (or bytecode instructions) per message, each side of a link, every
thread counted.

Used by ``bench/hotpath.py --calls`` / ``--opcodes`` and by ``tests/test_calls_per_message.py``
(which pins the counts): one measurement, one counter. Standard library only; netq is imported
by the side processes, never by this module's importers.

Two units. ``calls``: Python functions entered (a profile hook). ``opcodes``: bytecode
instructions executed (a trace hook with ``f_trace_opcodes`` on every frame): the Python work
of a message, which a call count only approximates (a call may run ten instructions or four
hundred). Neither depends on the machine's speed, so both hold on any machine; the code runs
several times slower while it is traced, so no time is ever taken under a hook.

Rows: netq's (``netq-tcp``, ``netq-unix``, ``netq-grpc``) and, for the kinds they implement,
the plain-Python floors of ``bench/run.py`` counted the same way: for the round trip
``py-lead`` (bench/workers/lead_floor.py: a queue whose waiting ``get()`` reads the socket
itself) and ``py-contract`` (bench/workers/contract_floor.py: the same with futures resolved by
ACKs, credit and checked headers), for the stream ``py-queue`` (bench/workers/pyqueue.py: a
writer thread, a reader thread, futures and cumulative ACKs). A netq count over its floor's
is what netq's design runs in Python beyond the least a queue of that kind runs.

Each side is its own process. Before the communicator exists (so before its I/O thread
starts), the side installs a profile hook on its own thread (``sys.setprofile``) and for every
thread started later (``threading.setprofile``); the hook counts "call" events: Python
functions entered, generators and coroutines resumed (C functions are not counted). The counts
are taken over a window that holds the measured messages and the idle time around them, so
every turn the I/O threads make meanwhile is in them. Calls made by this module's own code
(the measuring loop) are left out.

Kinds (64 B payload unless told):

``lone``    the sender waits ``IDLE`` s, ``put()``s one message and waits for its future (the
            receiver's ACK); the receiver ``get()``s it. The link is idle around each message.
``stream``  the sender ``put()``s the messages back to back and waits for the last future;
            the receiver ``get()``s them.
``rtt``     ping-pong: the client ``put()``s and ``get()``s the echo, the server ``get()``s
            and ``put()``s it back.

A count is deterministic up to the timers that fire during the window: netq's idle link has
none shorter than its heartbeat (5 s by default), so a slow machine stretches the window but
adds at most a turn or two in all, not per message. (Over gRPC, whether a held ACK's 250 µs
timer fires before the reply does depends on the machine's speed: its counts vary more.)

    python3 bench/callcount.py --kinds lone,stream,rtt --count 300
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from types import CodeType, FrameType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("lone", "stream", "rtt")
ROWS = ("netq-tcp", "netq-unix", "netq-grpc")
# The plain-Python floors, and the kinds each implements (their queues have no lone put).
FLOOR_ROWS = {"py-lead": ("rtt",), "py-contract": ("rtt",), "py-queue": ("stream",)}
UNITS = ("calls", "opcodes")
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
IDLE = 0.003  # seconds the link stays idle before and after each lone message
SETTLE = 0.05  # seconds after the warm-up before the window opens (its ACKs are in by then)
ROLES = {"lone": ("sender", "receiver"), "stream": ("sender", "receiver"),
         "rtt": ("client", "server")}


class CallCounter:
    """Counts the Python calls of every thread of this process, by code object.

    Each thread gets its own counter (installed by its first profile event), so counting needs
    no lock and loses nothing; :meth:`snapshot` merges them.
    """

    # The hook of the running thread, and of every thread started later (a profile hook here).
    _get_hook = staticmethod(sys.getprofile)
    _set_hook = staticmethod(sys.setprofile)
    _set_hook_of_new_threads = staticmethod(threading.setprofile)

    def __init__(self, ignored_files: tuple[str, ...] = ()) -> None:
        self._ignored = frozenset(ignored_files)
        self._counters: list[Counter[CodeType]] = []
        self._lock = threading.Lock()

    def install(self) -> None:
        """Count on this thread from now on, and on every thread started later."""
        self._set_hook_of_new_threads(self._first_event)
        self._set_hook(self._hook_for_this_thread())

    def uninstall(self) -> None:
        self._set_hook_of_new_threads(None)
        self._set_hook(None)

    def _new_counter(self) -> Counter[CodeType]:
        counter: Counter[CodeType] = Counter()
        with self._lock:
            self._counters.append(counter)
        return counter

    def _hook_for_this_thread(self):
        counter = self._new_counter()
        ignored = self._ignored

        def hook(frame: FrameType, event: str, arg: object) -> None:
            if event == "call":
                code = frame.f_code
                if code.co_filename not in ignored:
                    counter[code] += 1

        return hook

    def _first_event(self, frame: FrameType, event: str, arg: object):
        hook = self._hook_for_this_thread()
        self._set_hook(hook)  # this thread's own counter from now on
        return hook(frame, event, arg)  # a trace hook's answer: the frame's local hook

    def snapshot(self) -> Counter[CodeType]:
        """Counts so far, all threads (a copy). The merge runs unhooked: its own Python
        (``collections.Counter``'s) is not counted."""
        hook = self._get_hook()
        self._set_hook(None)
        try:
            with self._lock:
                counters = list(self._counters)
            total: Counter[CodeType] = Counter()
            for counter in counters:
                total.update(dict(counter))  # dict(): one C-level copy, safe beside its thread
        finally:
            self._set_hook(hook)
        return total


class OpcodeCounter(CallCounter):
    """Counts the bytecode instructions every thread of this process executes, by code object.

    A trace hook on each thread (``sys.settrace``, and ``threading.settrace`` for the threads
    started later) turns on ``f_trace_opcodes`` for every frame it enters, outside the ignored
    files, and counts the "opcode" events of that frame.
    """

    _get_hook = staticmethod(sys.gettrace)
    _set_hook = staticmethod(sys.settrace)
    _set_hook_of_new_threads = staticmethod(threading.settrace)

    def _hook_for_this_thread(self):
        counter = self._new_counter()
        ignored = self._ignored

        def count(frame: FrameType, event: str, arg: object):
            if event == "opcode":
                counter[frame.f_code] += 1
            return count

        def enter(frame: FrameType, event: str, arg: object):
            if frame.f_code.co_filename in ignored:
                return None
            frame.f_trace_lines = False
            frame.f_trace_opcodes = True
            return count

        return enter


def _label(code: CodeType) -> str:
    path = code.co_filename
    short = os.path.relpath(path, ROOT) if path.startswith(ROOT) else os.path.basename(path)
    return f"{code.co_qualname} ({short}:{code.co_firstlineno})"


# ----------------------------------------------------------------------------- one side


def netq_endpoint(row: str, address: str):
    """A bench row's (protocol, netloc): ``address`` is a Unix socket's path for netq-unix,
    else ``host:port`` (bench/hotpath.py uses it too)."""
    import netq

    if row == "netq-unix":
        return netq.Protocol.UNIX, netq.NetworkLocation(path=address)
    host, port = address.rsplit(":", 1)
    protocol = netq.Protocol.GRPC if row == "netq-grpc" else netq.Protocol.TCP
    return protocol, netq.NetworkLocation(host=host, port=int(port))


def _communicator(row: str, role: str, address: str):
    import netq

    protocol, netloc = netq_endpoint(row, address)
    purpose = netq.Purpose.SERVER if role == "server" else netq.Purpose.CLIENT
    return netq.new(protocol, purpose, netq.CommunicatorOptions(netloc=netloc))


def side(spec: dict) -> None:
    """One process: the server (receiver / echo) or the client (sender / pinger)."""
    kind, role, count = spec["kind"], spec["role"], spec["count"]
    payload = (bytes(range(256)) * (spec["size"] // 256 + 1))[: spec["size"]]
    ignored = (os.path.abspath(__file__), __file__)
    counter = (OpcodeCounter if spec["unit"] == "opcodes" else CallCounter)(ignored)
    counter.install()  # before the communicator (or the floor) starts its threads
    if spec["row"] in FLOOR_ROWS:
        _floor_side(spec, counter, payload)
        return
    comm = _communicator(spec["row"], role, spec["address"])
    timeout = spec["timeout"]
    if role == "server":
        _ready()
    # Warm-up: one round trip (the link is up, both sides' code paths have run once).
    if role == "client":
        comm.put(payload).result(timeout)
        comm.get(timeout=timeout)
    else:
        comm.get(timeout=timeout)
        comm.put(payload).result(timeout)
    time.sleep(SETTLE)
    put, get = comm.put, comm.get
    before = counter.snapshot()
    if kind == "lone":
        if role == "client":  # the sender
            for _ in range(count):
                time.sleep(IDLE)
                put(payload).result(timeout)
        else:
            for _ in range(count):
                get(timeout=timeout)
        time.sleep(IDLE)
    elif kind == "stream":
        if role == "client":
            future = None
            for _ in range(count):
                future = put(payload)
            future.result(timeout)  # type: ignore[union-attr]
        else:
            for _ in range(count):
                get(timeout=timeout)
        time.sleep(IDLE)
    else:
        if role == "client":
            for _ in range(count):
                put(payload)
                get(timeout=timeout)
        else:
            for _ in range(count):
                put(get(timeout=timeout).data)
        time.sleep(IDLE)
    _result(counter, before, spec)
    comm.close(timeout)


def _ready() -> None:
    sys.stdout.write("READY\n")
    sys.stdout.flush()


def _result(counter: CallCounter, before: Counter[CodeType], spec: dict) -> None:
    """Print this side's count since ``before``, then wait for the orchestrator's word: a
    closing peer's goodbye must not land in the other side's window."""
    after = counter.snapshot()
    counter.uninstall()
    counted = after - before
    top = [(n, _label(code)) for code, n in counted.most_common(spec["top"])]
    result = {"calls": sum(counted.values()), "count": spec["count"], "top": top}
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stdin.readline()


def _floor_side(spec: dict, counter: CallCounter, payload: bytes) -> None:
    """One side of a floor row: py-lead's or py-contract's round trip, or py-queue's stream
    (the queues of bench/run.py, driven like netq's rows above)."""
    sys.path.insert(0, WORKERS)
    import raw

    role, count = spec["role"], spec["count"]
    if role == "server":
        host, port = spec["address"].rsplit(":", 1)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(1)
        _ready()
        sock = raw.accept(listener)  # closes the listener
    else:
        sock = raw.connect(spec["address"])
    if spec["row"] in ("py-lead", "py-contract"):
        import contract_floor
        import lead_floor

        queue = (lead_floor.LeadQueue if spec["row"] == "py-lead"
                 else contract_floor.ContractQueue)(sock)
        put, get = queue.put, queue.get

        def round_trip() -> None:
            if role == "client":
                put(payload)
                get()
            else:
                put(get())

        round_trip()  # the warm-up
        time.sleep(SETTLE)
        before = counter.snapshot()
        for _ in range(count):
            round_trip()
        time.sleep(IDLE)
        _result(counter, before, spec)
        queue.close()
        return
    import pyqueue

    if role == "client":
        sender = pyqueue.Sender(sock)
        sender.put(payload)
        sender.wait_acked(1)
        time.sleep(SETTLE)
        before = counter.snapshot()
        for _ in range(count):
            sender.put(payload)
        sender.wait_acked(count + 1)
        time.sleep(IDLE)
        _result(counter, before, spec)
        sender.close()
        return
    receiver = pyqueue.Receiver(sock)
    receiver.get()
    time.sleep(SETTLE)
    before = counter.snapshot()
    for _ in range(count):
        receiver.get()
    time.sleep(IDLE)
    _result(counter, before, spec)
    receiver.reader.join(spec["timeout"])  # ends at the sender's shutdown
    sock.close()


# ----------------------------------------------------------------------------- orchestration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure(kind: str, count: int, row: str = "netq-tcp", size: int = 64, top: int = 0,
            python: str = sys.executable, timeout: float = 60.0,
            tmpdir: str | None = None, unit: str = "calls") -> dict[str, dict]:
    """Calls (``unit="opcodes"``: bytecode instructions) per message of each side: ``{role:
    {"per_message": float, "calls": int, "top": [(count, function), ...]}}`` ("calls" holds the
    count in either unit); roles are sender/receiver (lone, stream) or client/server (rtt).
    Raises RuntimeError when a side fails."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, not {unit!r}")
    if row in FLOOR_ROWS and kind not in FLOOR_ROWS[row]:
        raise ValueError(f"{row} implements {', '.join(FLOOR_ROWS[row])} only, not {kind}")
    if row == "netq-unix":
        if tmpdir is None:
            raise ValueError("netq-unix needs a tmpdir for its socket file")
        address = os.path.join(tmpdir, f"calls-{os.getpid()}.sock")
    else:
        address = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs: dict[str, subprocess.Popen] = {}
    results: dict[str, dict] = {}
    try:
        for role in ("server", "client"):
            spec = {"kind": kind, "role": role, "count": count, "size": size, "row": row,
                    "address": address, "top": top, "timeout": timeout, "unit": unit}
            procs[role] = subprocess.Popen(
                [python, os.path.abspath(__file__), "--side", json.dumps(spec)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            if role == "server":
                line = procs[role].stdout.readline()  # type: ignore[union-attr]
                if line.strip() != "READY":
                    raise RuntimeError(f"{row} server did not start: {line!r}")
        for role, proc in procs.items():
            while True:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    raise RuntimeError(f"{row} {kind} {role} ended before its result "
                                       f"(exit {proc.wait(timeout)})")
                if line.startswith("RESULT "):
                    results[role] = json.loads(line[len("RESULT "):])
                    break
        for proc in procs.values():
            proc.stdin.write("close\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        for role, proc in procs.items():
            if proc.wait(timeout):
                raise RuntimeError(f"{row} {kind} {role} exited {proc.returncode}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
    client_role, server_role = (("sender", "receiver") if kind != "rtt"
                                else ("client", "server"))
    named = {client_role: results["client"], server_role: results["server"]}
    return {role: {"per_message": r["calls"] / r["count"], "calls": r["calls"], "top": r["top"]}
            for role, r in named.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--rows", default="netq-tcp",
                        help=f"comma list of {', '.join(ROWS + tuple(FLOOR_ROWS))}")
    parser.add_argument("--unit", choices=UNITS, default="calls")
    parser.add_argument("--count", type=int, default=300, help="messages per kind")
    parser.add_argument("--top", type=int, default=0,
                        help="also list the N functions that count most, per side")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(json.loads(args.side))
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="netq-calls-") as tmpdir:
        report(args.rows.split(","), args.kinds.split(","), args.count, args.top, tmpdir,
               args.unit)


UNIT_TITLES = {"calls": ("Python calls", "calls"),
               "opcodes": ("Bytecode instructions", "instructions")}


def report(rows: list[str], kinds: list[str], count: int, top: int, tmpdir: str,
           unit: str = "calls") -> None:
    """Print the per-message table (and the top functions with ``top``); where a floor row
    was measured for a kind, each netq row's count over the floor's, side by side."""
    title, noun = UNIT_TITLES[unit]
    print(f"\n## {title} per message, each side, all threads ({count} messages, 64 B)\n")
    print(f"| row | kind | side | {noun} per message | side | {noun} per message |")
    print("|---|---|---|---:|---|---:|")
    tops = []
    measured: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        for kind in kinds:
            if row in FLOOR_ROWS and kind not in FLOOR_ROWS[row]:
                continue
            got = measure(kind, count, row=row, top=top, tmpdir=tmpdir, unit=unit)
            (a, fa), (b, fb) = got.items()
            print(f"| {row} | {kind} | {a} | {fa['per_message']:.1f} | {b} | "
                  f"{fb['per_message']:.1f} |")
            measured[(row, kind)] = [fa["per_message"], fb["per_message"]]
            for role, figures in got.items():
                tops.append((row, kind, role, figures["top"]))
    ratios = [(row, kind, floor) for (row, kind) in measured if row not in FLOOR_ROWS
              for floor in FLOOR_ROWS if (floor, kind) in measured]
    if ratios:
        print(f"\n{noun.capitalize()} per message over the floor's (same unit, same run)\n")
        print("| row | kind | floor | first side | second side |")
        print("|---|---|---|---:|---:|")
        for row, kind, floor in ratios:
            ours, base = measured[(row, kind)], measured[(floor, kind)]
            print(f"| {row} | {kind} | {floor} | ×{ours[0] / base[0]:.1f} | "
                  f"×{ours[1] / base[1]:.1f} |")
    for row, kind, role, functions in tops:
        if functions:
            print(f"\n{row} {kind}, {role}: the functions that count most, per message\n")
            for n, label in functions:
                print(f"{n / count:8.2f}  {label}")


if __name__ == "__main__":
    main()
