"""Plumbing shared by every benchmark endpoint (stdlib only; runs on Python 3.11 and 3.13).

A worker is started by ``bench/run.py`` as ``python WORKER.py '<json spec>'``. The spec has at
least ``role`` and ``transport``; ``size``, ``count``, ``addr`` (connecting side), ``tmpdir``
(binding side, for Unix socket paths and certificates) and scenario-specific keys as needed.

Protocol with the orchestrator, one line each on stdout (``TAG <json>``):

* ``READY {"addr": ..., "base_rss_kb": ...}``  the binding side is listening
* ``CONNECTED {...}``                        a connecting side that waits for ``GO`` on stdin
* ``RESULT {...}``                           the measurement, printed exactly once, at the end

On stdin the orchestrator writes ``PEERS pid ...`` (the processes a receiver also charges CPU
time to), ``GO`` (start sending) and finally closes it: senders wait for that EOF before
they exit, so their CPU clock is still readable when the receiver stops its clock.
SIGUSR1 dumps every thread's stack to stderr and SIGUSR2 prints what a worker registered with
``on_diagnose`` (used to diagnose a hang before the kill).
"""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import signal
import socket
import sys
import threading
import time
import zlib

now = time.perf_counter
WARMUP_PINGS = 200
PROGRESS = {}        # loop counters, printed by the SIGUSR2 diagnosis

faulthandler.register(signal.SIGUSR1, all_threads=True)


def on_diagnose(describe) -> None:
    """On SIGUSR2 print describe() to stderr (e.g. a library's statistics) for a hung worker."""
    def handler(signum, frame):
        try:
            sys.stderr.write(f"DIAGNOSE progress={PROGRESS} {describe()}\n")
        except Exception as e:  # noqa: BLE001
            sys.stderr.write(f"DIAGNOSE failed: {e!r}\n")
        sys.stderr.flush()
    signal.signal(signal.SIGUSR2, handler)


on_diagnose(lambda: "")     # default: progress counters only (and SIGUSR2 never kills a worker)


# ----------------------------------------------------------------------------- payloads
def payload_of(size: int) -> bytes:
    """A deterministic, non-constant payload (so a CRC catches reordering or corruption)."""
    pattern = bytes(range(256))
    return (pattern * (size // 256 + 1))[:size]


def crc_matches(last, size: int) -> bool:
    return last is not None and zlib.crc32(last) == zlib.crc32(payload_of(size))


# ----------------------------------------------------------------------------- process metrics
def rss_kb() -> int:
    """Current resident set size of this process, KiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def maxrss_kb() -> int:
    """Peak resident set size of this process, KiB (ru_maxrss)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def page_faults() -> int:
    """Page faults of this process so far, all threads: minor (a page mapped in, as a fresh
    buffer's first touch) plus major (read from disk)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt + r.ru_majflt


def cpu_s() -> float:
    """user+sys CPU seconds of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_s(pid: int) -> float | None:
    """user+sys CPU seconds of another process, all threads, ns resolution (Linux CPU clock
    MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)); None once it is gone."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (bind to port 0, read it, close)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- orchestrator I/O
def emit(tag: str, **fields) -> None:
    sys.stdout.write(f"{tag} {json.dumps(fields)}\n")
    sys.stdout.flush()


def ready(addr, **extra) -> None:
    emit("READY", addr=addr, **extra)


def result(**fields) -> None:
    fields.setdefault("python", "{}.{}.{}".format(*sys.version_info[:3]))
    fields.setdefault("pid", os.getpid())
    emit("RESULT", **fields)


def read_command(expected: str) -> list[str]:
    """Block until the orchestrator writes a line starting with `expected`; its arguments."""
    while True:
        line = sys.stdin.readline()
        if not line:
            raise EOFError(f"stdin closed while waiting for {expected}")
        words = line.split()
        if words and words[0] == expected:
            return words[1:]


def wait_released() -> None:
    """Senders: stay alive (and measurable) until the orchestrator closes our stdin."""
    while sys.stdin.readline():
        pass


# ----------------------------------------------------------------------------- measurements
class Recorder:
    """Receiver-side clock: starts when the warm-up message has arrived, stops at the last one.

    CPU time covers this process and the peers the orchestrator named (``PEERS`` on stdin)
    over exactly that interval, so CPU per message = both ends' work / messages."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.base_rss = rss_kb()
        self.peers: list[int] = []

    def start(self) -> None:
        self.peers = [int(p) for p in read_command("PEERS")]
        self.pc0 = [proc_cpu_s(p) for p in self.peers]
        self.c0 = cpu_s()
        self.f0 = page_faults()
        self.t0 = now()

    def receive_all(self, read) -> tuple[int, object]:
        """Read the warm-up message, time ``count`` more ``read()`` calls, stop the clock.

        Returns the bytes received (warm-up included) and the last message, for report()."""
        last = read()
        self.start()
        nbytes = len(last)
        for _ in range(self.count):
            last = read()
            nbytes += len(last)
        self.stop()
        return nbytes, last

    def stop(self) -> None:
        self.t1 = now()
        self.c1 = cpu_s()
        self.f1 = page_faults()
        self.pc1 = [proc_cpu_s(p) for p in self.peers]
        self.peak = maxrss_kb()

    def report(self, nmsgs: int, nbytes: int, last, **extra) -> dict:
        """nmsgs/nbytes include the warm-up message."""
        el = self.t1 - self.t0
        crc_ok = crc_matches(last, self.size)
        ok = nmsgs == self.count + 1 and nbytes == (self.count + 1) * self.size and crc_ok
        peer_cpu = None
        if self.peers and None not in self.pc0 and None not in self.pc1:
            peer_cpu = sum(self.pc1) - sum(self.pc0)
        own_cpu = self.c1 - self.c0
        out = dict(role="recv", ok=ok, crc_ok=crc_ok, msgs=nmsgs - 1, bytes=nbytes - self.size,
                   expected_msgs=self.count, elapsed=el,
                   msgs_per_s=self.count / el if el > 0 else None,
                   gb_per_s=self.count * self.size / el / 1e9 if el > 0 else None,
                   recv_cpu_s=own_cpu, send_cpu_s=peer_cpu,
                   recv_faults_per_msg=(self.f1 - self.f0) / self.count if self.count else None,
                   cpu_us_per_msg=((own_cpu + peer_cpu) / self.count * 1e6
                                   if peer_cpu is not None else None),
                   base_rss_kb=self.base_rss, peak_rss_kb=self.peak, **extra)
        result(**out)
        return out


class SendClock:
    """Sender-side bookkeeping: baseline RSS after connect, CPU and wall time of the send."""

    def __init__(self) -> None:
        self.base_rss = rss_kb()

    def start(self) -> None:
        self.t0, self.c0 = now(), cpu_s()

    def sent(self) -> None:
        """The send loop returned (data may still be queued in the library)."""
        self.te = now()

    def stop(self) -> None:
        """Everything was delivered (acknowledged / drained)."""
        self.t1, self.c1 = now(), cpu_s()

    def report(self, count: int, size: int, **extra) -> None:
        result(role="send", msgs=count, bytes=count * size, elapsed=self.t1 - self.t0,
               enqueue_s=self.te - self.t0, cpu_s=self.c1 - self.c0,
               base_rss_kb=self.base_rss, peak_rss_kb=maxrss_kb(), **extra)


class PingCpu:
    """user+sys CPU of the pinging process and of the echo (its pid is the spec's
    ``echo_pid``, given by the orchestrator) over the timed round trips only, as the
    throughput Recorder charges both ends over its timed interval."""

    def __init__(self) -> None:
        self.echo_pid: int | None = None
        self.in_process = False  # both ends in this process: all CPU is the ping side's
        self.ping_cpu_s: float | None = None
        self.echo_cpu_s: float | None = None
        self._c0: float | None = None
        self._pc0: float | None = None

    def start(self) -> None:
        self._c0 = cpu_s()
        self._pc0 = proc_cpu_s(self.echo_pid) if self.echo_pid else None

    def stop(self) -> None:
        pc1 = proc_cpu_s(self.echo_pid) if self.echo_pid else None
        if self._c0 is not None:
            self.ping_cpu_s = cpu_s() - self._c0
        if pc1 is not None and self._pc0 is not None:
            self.echo_cpu_s = pc1 - self._pc0
        elif self.in_process:
            self.echo_cpu_s = 0.0


PING_CPU = PingCpu()     # one ping phase per worker process


def latency_report(samples: list[float], size: int, base_rss: int, **extra) -> None:
    """The round trip's percentiles; with ping_loop()'s CPU clock: ``ping_cpu_s`` and
    ``echo_cpu_s`` over the ``n`` timed round trips (None where a side was not measured)."""
    samples = sorted(samples)
    k = len(samples)
    result(role="ping", n=k, size=size,
           p50_us=samples[k // 2] * 1e6, p99_us=samples[min(k - 1, int(k * 0.99))] * 1e6,
           mean_us=sum(samples) / k * 1e6, min_us=samples[0] * 1e6, max_us=samples[-1] * 1e6,
           ping_cpu_s=PING_CPU.ping_cpu_s, echo_cpu_s=PING_CPU.echo_cpu_s,
           base_rss_kb=base_rss, peak_rss_kb=maxrss_kb(), **extra)


def ping_loop(roundtrip, count: int) -> list[float]:
    """WARMUP_PINGS untimed then `count` timed calls of roundtrip(); seconds each. Both
    sides' CPU over the timed calls goes to PING_CPU (reported by latency_report())."""
    samples = []
    for i in range(WARMUP_PINGS + count):
        PROGRESS["round_trip"] = i
        if i == WARMUP_PINGS:
            PING_CPU.start()
        t0 = now()
        roundtrip()
        t1 = now()
        if i >= WARMUP_PINGS:
            samples.append(t1 - t0)
    PING_CPU.stop()
    return samples


def in_one_process(serve_echo, ping, size: int) -> None:
    """A round trip with both ends in this process, as a notebook holds a server and its
    client: ``serve_echo()`` binds and returns ``(addr, answer)``, ``answer()`` echoes on a
    thread; ``ping(addr)`` runs ping_loop() on the main thread and returns its samples. The
    process's CPU over the timed round trips is both ends' (reported as the ping side's, the
    echo side's as 0)."""
    addr, answer = serve_echo()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            answer()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="echo")
    thread.start()
    PING_CPU.in_process = True
    base = rss_kb()
    samples = ping(addr)
    thread.join()
    if failure:
        raise failure[0]
    latency_report(samples, size, base, in_process=True)


def echo_messages(server, count: int) -> None:
    """A put()/get() queue server (netq, net-queue) answers WARMUP_PINGS + count messages."""
    get, put = server.get, server.put
    for i in range(WARMUP_PINGS + count):
        PROGRESS["echoed"] = i
        message = get()
        put(message.data, message.peer)


def queue_round_trips(client, payload, count: int) -> list[float]:
    """ping_loop() over a put()/get() queue client (netq, net-queue): put, then get the echo."""
    put, get = client.put, client.get

    def roundtrip():
        put(payload)
        get()

    return ping_loop(roundtrip, count)


# ----------------------------------------------------------------------------- entry point
def main(handlers: dict) -> None:
    """handlers: {(transport, role): fn(spec)} or {role: fn(spec)} (transport-agnostic)."""
    spec = json.loads(sys.argv[1])
    PING_CPU.echo_pid = spec.get("echo_pid")
    fn = handlers.get((spec["transport"], spec["role"])) or handlers.get(spec["role"])
    if fn is None:
        raise SystemExit(f"no handler for transport={spec['transport']} role={spec['role']}")
    fn(spec)
