#!/usr/bin/env python3
"""Per-message cost of each side of a link: CPU, wake-ups, syscalls, and where the time goes.

    python3 bench/hotpath.py                              # netq-tcp and raw-tcp, 64 B, both kinds
    python3 bench/hotpath.py --rows netq-tcp --kinds oneway --size 1M --count 2000
    python3 bench/hotpath.py --rows netq-tcp --kinds rtt --cprofile 12
    python3 bench/hotpath.py --calls                      # Python calls per message, each side
    python3 bench/hotpath.py --calls --calls-top 15       # and the functions called most
    python3 bench/hotpath.py --opcodes                    # bytecode per message, beside floors

Kinds: ``oneway`` (the sender calls ``put()`` per message, the receiver ``get()`` per message)
and ``rtt`` (ping-pong: the client puts and waits for the echo). Rows: ``netq-tcp``,
``netq-tcp-numpy`` (the same, one numpy ``uint8`` array per ``put()``), ``netq-unix``,
``netq-tls``, ``netq-grpc`` and ``raw-tcp`` (blocking socket, one ``sendmsg`` per message, the
floor of bench/run.py). Each side is its own process; per side the table gives, per message:

* CPU µs, user and system (``getrusage`` over the timed interval, all threads);
* voluntary context switches: a thread that blocked and was woken, i.e. wake-ups;
* involuntary context switches: preemptions (two busy threads, one core each side);
* page faults (minor: memory touched for the first time since the C allocator got it from
  the system, or since it gave it back);
* system calls (``perf stat -e raw_syscalls:sys_enter`` on the whole process, the fixed cost
  removed by running a second, smaller count and taking the difference; blank without perf);
* the CPU of the thread that calls ``put()`` and ``get()`` (user + system,
  ``time.thread_time``); the rest of the side's CPU is its other threads (netq's I/O thread).

``--awake`` keeps every CPU from going idle while it measures: one spinning process per CPU at
``SCHED_IDLE`` priority, which runs only when nothing else wants the CPU and gives it up to a
measured process that wakes (the "preempted" column shows what that costs). On a VM whose idle
vCPUs halt, a wake-up then costs no VM exit, so the difference to a run without it is what
idling between messages costs (raw sockets' round trip gains most from it); what stays is the
code's own cost.

``--calls`` counts instead the Python function calls per message of each side, every thread
(a profile hook installed before the communicator starts; bench/callcount.py, whose counts
tests/test_calls_per_message.py pins) for a lone 64 B put with the link idle around it (through
its ACK and resolved future), a stream of 64 B puts and a 64 B round trip. Counts do not
depend on the machine's speed or load, so they show a change in the code that timing hides.
``--opcodes`` counts the bytecode instructions the same way (a trace hook on every frame), and
beside netq's rows the plain-Python floors of bench/run.py where they implement the kind
(``py-lead`` and ``py-contract`` for the round trip, ``py-queue`` for the stream), with netq's
count over theirs: the Python work of a message, which a call count only approximates.

``--cprofile N`` profiles every thread of each side (cProfile per thread, merged) and prints
the N functions with the most own time per message. Profiling slows Python code several times,
so read its figures as proportions; the table above it comes from a run without it.
Performance claims come from bench/run.py; this tool says where a message's microseconds go.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HDR = struct.Struct("!Q")
ROWS = ("netq-tcp", "netq-tcp-numpy", "netq-unix", "netq-tls", "netq-grpc", "raw-tcp")
KINDS = ("oneway", "rtt")


def _size(text: str) -> int:
    units = {"K": 1024, "M": 1024 * 1024}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _usage() -> tuple[float, float, int, int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw, r.ru_minflt


# ----------------------------------------------------------------------------- one side


class _ThreadProfiles:
    """cProfile in every thread of this process (the I/O thread included), merged at the end."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _start_in_thread(self, *_: object) -> None:
        profile = cProfile.Profile()
        with self._lock:
            self.profiles.append(profile)
        profile.enable()  # replaces this hook for the thread: called once per thread

    def start(self) -> None:
        threading.setprofile(self._start_in_thread)
        self._start_in_thread()

    def stop(self, top: int, count: int) -> tuple[str, dict[str, float]]:
        """The top functions as text, and own time per message by stage (µs, profiled)."""
        threading.setprofile(None)
        for profile in self.profiles:
            profile.disable()
        # A thread that ran no Python code while profiled (gRPC's own) has nothing to add.
        for profile in self.profiles:
            profile.create_stats()
        measured = [profile for profile in self.profiles if profile.stats]  # type: ignore[attr-defined]
        stats = pstats.Stats(measured[0])
        for profile in measured[1:]:
            stats.add(profile)
        stages: dict[str, float] = {}
        for (path, _, name), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
            stage = stage_of(os.path.basename(path), name)
            stages[stage] = stages.get(stage, 0.0) + own * 1e6 / count
        rows = []
        table = stats.stats  # type: ignore[attr-defined]
        for (path, line, name), (_, calls, own, total, _) in table.items():
            short = os.path.relpath(path, ROOT) if path.startswith(ROOT) else os.path.basename(path)
            where = f"{short}:{line}"
            rows.append((own, total, calls, f"{name} ({where})"))
        rows.sort(reverse=True)
        out = io.StringIO()
        out.write(f"{'own µs/msg':>11} {'cum µs/msg':>11} {'calls/msg':>10}  function\n")
        for own, total, calls, label in rows[:top]:
            out.write(f"{own * 1e6 / count:11.2f} {total * 1e6 / count:11.2f} "
                      f"{calls / count:10.2f}  {label}\n")
        return out.getvalue(), stages


WAIT = "(blocked: epoll, locks)"
STAGES = (
    "put(): future, queue, autocork",
    "serialize (pickle)",
    "send: pump, framing, write",
    "socket calls (kernel)",
    "loop turn: service, timers, select, dispatch",
    "receive: read, parse frames",
    "engine: events, ACK, credit",
    "get(): inbox, hand-over",
    "other (builtins)",
)
_BY_FILE = {"futures.py": 0, "stream.py": 1, "serializers.py": 1, "numpy_arrays.py": 1,
            "restricted_pickle.py": 1, "flow.py": 6, "session.py": 6, "loop.py": 4,
            "selectors.py": 4, "threading.py": 7, "communicator.py": 7, "credit.py": 6,
            "inbox.py": 7, "_interrupts.py": 4}
_BY_NAME = {
    "put": 0, "_put": 0, "put_many": 0, "submit": 0,
    "_pump": 2, "write_now": 2, "_write": 2, "write": 2, "send_message": 2, "_emit": 2,
    "_emit_view": 2, "_seal": 2,
    "outgoing": 2, "sent": 2, "write_to": 2, "pump": 2, "has_output": 2, "can_send_data": 2,
    "service": 4, "serve_io": 4, "_timers": 4, "_wait": 4, "wait": 4, "_service": 4,
    "_release_holds": 4,
    "_write_or_hold": 4, "_hold": 4, "release_holds": 4, "_drain_notices": 6, "links": 4,
    "_read": 5, "read_into": 5, "_data": 5, "receive_buffer": 5, "receive_done": 5, "_parse": 5,
    "_control": 5,
    "settle_lent": 7, "take": 7,
    "<method 'poll' of 'select.epoll' objects>": -1,
    "<method 'acquire' of '_thread.lock' objects>": -1,
    "<method 'acquire' of '_thread.RLock' objects>": -1,
    "<built-in method _pickle.dumps>": 1, "<built-in method _pickle.loads>": 1,
}


def stage_of(filename: str, name: str) -> str:
    """The stage of one profiled function (see STAGES): by name first, then by module."""
    index = _BY_NAME.get(name)
    if index is None:
        if "_socket.socket" in name:
            index = 3
        elif filename in _BY_FILE:
            index = _BY_FILE[filename]
        elif filename in ("engine.py",):
            index = 6
        elif filename == "connection.py":
            index = 5 if name.startswith(("receive", "_parse", "_on", "_control")) else 2
        elif filename in ("sockets.py", "tls_stream.py", "fd_passing.py",
                          "connection_failures.py"):
            index = 4
        else:
            index = 8
    return WAIT if index < 0 else STAGES[index]


def _netq_pair(row: str, purpose: str, address: str, tmpdir: str):
    sys.path.insert(0, ROOT)
    import netq
    from callcount import netq_endpoint

    options: dict = {}
    protocol, netloc = netq_endpoint(row, address)
    if row == "netq-tls":
        cert, key = os.path.join(tmpdir, "cert.pem"), os.path.join(tmpdir, "key.pem")
        options["security"] = netq.SecurityOptions(certificate=cert, key=key,
                                                   server_hostname="localhost")
    role = netq.Purpose.SERVER if purpose == "server" else netq.Purpose.CLIENT
    return netq.new(protocol, role, netq.CommunicatorOptions(netloc=netloc, **options))


def side(spec: dict) -> None:
    """One process: the server (receiver / echo) or the client (sender / pinger)."""
    row, kind, role, size, count = (spec["row"], spec["kind"], spec["role"], spec["size"],
                                    spec["count"])
    payload = bytes(range(256)) * (size // 256 + 1)
    payload = payload[:size]
    if row.endswith("-numpy"):  # one uint8 ndarray per put(): netq's array path, no pickle
        import numpy

        payload = numpy.frombuffer(payload, dtype=numpy.uint8).copy()
    profiles = _ThreadProfiles() if spec["cprofile"] else None
    if profiles is not None:
        profiles.start()  # before the communicator starts its I/O thread (set-up included)
    if row == "raw-tcp":
        comm = None
        if role == "server":
            listener = socket.create_server(("127.0.0.1", spec["port"]))
            sys.stdout.write("READY\n")
            sys.stdout.flush()
            sock, _ = listener.accept()
            listener.close()
        else:
            sock = socket.create_connection(("127.0.0.1", spec["port"]))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = bytearray(8)
        body = bytearray(max(size, 1))

        def put(data: bytes) -> None:
            sock.sendmsg([HDR.pack(len(data)), data])

        def get() -> bytes:
            sock.recv_into(header, 8, socket.MSG_WAITALL)
            (length,) = HDR.unpack(header)
            view = memoryview(body)[:length]
            if length:
                sock.recv_into(view, length, socket.MSG_WAITALL)
            return bytes(view)

        def finish() -> None:
            sock.close()
    else:
        comm = _netq_pair(row, role, spec["address"], spec["tmpdir"])
        if role == "server":
            sys.stdout.write("READY\n")
            sys.stdout.flush()

        def put(data: bytes) -> None:
            comm.put(data)

        def get() -> bytes:
            return comm.get().data

        def finish() -> None:
            comm.close()

    # warm-up and a barrier: one round trip before the clock starts
    if role == "client":
        put(payload)
        get()
    else:
        get()
        put(payload)
    start_usage, start_thread, start = _usage(), time.thread_time(), time.perf_counter()
    if kind == "oneway":
        if role == "client":
            for _ in range(count):
                put(payload)
            get()  # the receiver's "all arrived"
        else:
            for _ in range(count):
                get()
            put(b"done")
    else:
        if role == "client":
            for _ in range(count):
                put(payload)
                get()
        else:
            for _ in range(count):
                put(get())
    wall = time.perf_counter() - start
    caller = time.thread_time() - start_thread
    end_usage = _usage()
    report: dict[str, object] = {"wall": wall, "caller": caller,
              "user": end_usage[0] - start_usage[0], "sys": end_usage[1] - start_usage[1],
              "vcsw": end_usage[2] - start_usage[2], "ivcsw": end_usage[3] - start_usage[3],
              "minflt": end_usage[4] - start_usage[4]}
    if profiles is not None:
        report["profile"], report["stages"] = profiles.stop(spec["cprofile"], count)
    finish()
    sys.stdout.write("RESULT " + json.dumps(report) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- orchestration


def _certificate(tmpdir: str) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", os.path.join(tmpdir, "key.pem"),
                    "-out", os.path.join(tmpdir, "cert.pem")],
                   check=True, capture_output=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_pair(row: str, kind: str, size: int, count: int, cprofile: int, perf: bool,
              tmpdir: str) -> dict:
    port = _free_port()
    address = os.path.join(tmpdir, "netq.sock") if row == "netq-unix" else f"127.0.0.1:{port}"
    results: dict = {}
    procs = {}
    for role in ("server", "client"):
        spec = {"row": row, "kind": kind, "role": role, "size": size, "count": count,
                "cprofile": cprofile, "port": port, "address": address, "tmpdir": tmpdir}
        command = [sys.executable, os.path.abspath(__file__), "--side", json.dumps(spec)]
        counters = os.path.join(tmpdir, f"{role}.perf")
        if perf:
            command = ["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter",
                       "-o", counters, "--"] + command
        procs[role] = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        if role == "server":
            line = procs[role].stdout.readline()  # type: ignore[union-attr]
            if line.strip() != "READY":
                raise RuntimeError(f"{row} server did not start: {line!r}")
    for role, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{row} {kind} {role} failed (exit {proc.returncode})")
        result = json.loads(lines[-1][len("RESULT "):])
        if perf:
            with open(os.path.join(tmpdir, f"{role}.perf")) as f:
                for line in f:
                    fields = line.strip().split(",")
                    if len(fields) > 2 and fields[2] == "raw_syscalls:sys_enter":
                        result["syscalls"] = int(fields[0])
        results[role] = result
    return results


def measure(row: str, kind: str, size: int, count: int, perf: bool, tmpdir: str) -> dict:
    """Per-message figures of each side; syscalls from the difference of two counts."""
    full = _run_pair(row, kind, size, count, 0, perf, tmpdir)
    small = _run_pair(row, kind, size, max(1, count // 5), 0, perf, tmpdir) if perf else None
    figures = {}
    for role, result in full.items():
        per = {"µs user": result["user"] * 1e6 / count, "µs sys": result["sys"] * 1e6 / count,
               "wake-ups": result["vcsw"] / count, "preempted": result["ivcsw"] / count,
               "page faults": result["minflt"] / count, "wall µs": result["wall"] * 1e6 / count,
               "µs caller": result["caller"] * 1e6 / count}
        if small is not None and "syscalls" in result and "syscalls" in small[role]:
            per["syscalls"] = ((result["syscalls"] - small[role]["syscalls"])
                               / (count - max(1, count // 5)))
        figures[role] = per
    return figures


_SPINNER = """\
import os
parent = os.getppid()
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while os.getppid() == parent:  # ends with the tool, however it ends
    for _ in range(100_000):
        pass
"""


@contextlib.contextmanager
def _cpus_kept_awake(enabled: bool):
    """``--awake``: one SCHED_IDLE spinner per CPU for the duration (see the module doc)."""
    if not enabled:
        yield
        return
    if not hasattr(os, "SCHED_IDLE"):
        raise SystemExit("--awake needs SCHED_IDLE (Linux)")
    spinners = [subprocess.Popen([sys.executable, "-c", _SPINNER])
                for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def _count_calls(args: argparse.Namespace, unit: str) -> None:
    """``--calls`` / ``--opcodes``: bench/callcount.py's table for the rows it knows (with
    ``--opcodes``, the floors too)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import callcount

    rows = [row for row in args.rows.split(",") if row in callcount.ROWS]
    if not rows:
        raise SystemExit(f"--{unit} counts the rows {', '.join(callcount.ROWS)}")
    if unit == "opcodes":
        rows += list(callcount.FLOOR_ROWS)
    with tempfile.TemporaryDirectory(prefix="netq-calls-") as tmpdir:
        callcount.report(rows, list(callcount.KINDS), args.count or 300, args.calls_top, tmpdir,
                         unit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="netq-tcp,raw-tcp")
    parser.add_argument("--kinds", default="oneway,rtt")
    parser.add_argument("--size", default="64", help="bytes per message (64, 4K, 1M)")
    parser.add_argument("--count", type=int, default=0,
                        help="messages (default: 200000 one-way, 20000 round trips)")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also print the N functions with the most own time per message")
    parser.add_argument("--awake", action="store_true",
                        help="keep every CPU from idling (SCHED_IDLE spinners) while measuring")
    parser.add_argument("--calls", action="store_true",
                        help="count Python calls per message instead (lone put, stream of "
                             "puts, round trip; rows netq-tcp, netq-unix, netq-grpc; "
                             "--count default 300)")
    parser.add_argument("--opcodes", action="store_true",
                        help="count bytecode instructions per message instead, netq's rows "
                             "beside the floors py-lead and py-contract (round trip) and "
                             "py-queue (stream)")
    parser.add_argument("--calls-top", type=int, default=0, metavar="N",
                        help="with --calls or --opcodes: also list the N functions that count "
                             "most, per side")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(json.loads(args.side))
        return
    unknown = [row for row in args.rows.split(",") if row not in ROWS]
    if unknown:  # a name it does not know would otherwise be measured as netq over TCP
        parser.error(f"unknown row(s) {', '.join(unknown)}: --rows takes {', '.join(ROWS)}")
    if args.calls or args.opcodes:
        _count_calls(args, "opcodes" if args.opcodes else "calls")
        return
    size = _size(args.size)
    perf = shutil.which("perf") is not None
    with tempfile.TemporaryDirectory(prefix="netq-profile-") as tmpdir, \
            _cpus_kept_awake(args.awake):
        rows = args.rows.split(",")
        if "netq-tls" in rows:
            _certificate(tmpdir)
        for kind in args.kinds.split(","):
            count = args.count or (200_000 if kind == "oneway" else 20_000)
            if size >= 1 << 20 and not args.count:
                count = 2000
            what = ("client sends, server receives" if kind == "oneway"
                    else "client pings, server echoes")
            print(f"\n## {kind}, {size} B, {count} messages ({what})\n")
            print("| row | side | wall µs/msg | CPU µs user | CPU µs sys | of which the caller's "
                  "thread | wake-ups | preempted | page faults | syscalls |")
            print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            last = {}
            for row in rows:
                figures = last[row] = measure(row, kind, size, count, perf, tmpdir)
                for role in ("client", "server"):
                    f = figures[role]
                    calls = f"{f['syscalls']:.2f}" if "syscalls" in f else ""
                    print(f"| {row} | {role} | {f['wall µs']:.2f} | {f['µs user']:.2f} | "
                          f"{f['µs sys']:.2f} | {f['µs caller']:.2f} | {f['wake-ups']:.3f} | "
                          f"{f['preempted']:.3f} | "
                          f"{f['page faults']:.2f} | {calls} |")
            if args.cprofile:
                for row in rows:
                    if row == "raw-tcp":
                        continue
                    profiled = _run_pair(row, kind, size, count, args.cprofile, False, tmpdir)
                    print(f"\n{row} {kind}: CPU µs per message by stage. The measured CPU "
                          f"(user+sys, unprofiled run above) split in the proportions of "
                          f"each stage's own time under cProfile:\n")
                    print("| stage | client | server |")
                    print("|---|---:|---:|")
                    split = {}
                    for role in ("client", "server"):
                        stages = profiled[role]["stages"]
                        busy = sum(v for k, v in stages.items() if k != WAIT)
                        cpu = last[row][role]["µs user"] + last[row][role]["µs sys"]
                        split[role] = {k: v * cpu / busy for k, v in stages.items() if k != WAIT}
                    for stage in STAGES:
                        print(f"| {stage} | {split['client'].get(stage, 0.0):.1f} | "
                              f"{split['server'].get(stage, 0.0):.1f} |")
                    print(f"| **total (measured CPU)** | {sum(split['client'].values()):.1f} | "
                          f"{sum(split['server'].values()):.1f} |")
                    for role in ("client", "server"):
                        print(f"\n{row} {kind} {role}, cProfile (all threads):\n")
                        print(profiled[role]["profile"])


if __name__ == "__main__":
    main()
