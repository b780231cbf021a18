#!/usr/bin/env python3
"""netq benchmark harness: one command, every comparison side by side, on loopback.

    python3 bench/run.py --quick                 # 1 rep, 0.15 s per measurement (<= 6 min)
    python3 bench/run.py                         # 5 reps, 0.3 s per measurement (<= 25 min)
    python3 bench/run.py --only raw-tcp,zmq-push --sizes 64,1M --reps 2
    python3 bench/run.py --render bench/results/latest.json     # re-print the tables
    python3 bench/run.py --busy 2 --only throughput,latency --json /tmp/busy.json
    python3 bench/run.py --busy-results /tmp/busy.json --readme  # a quiet run, the busy beside

Sections, interleaved per rep (rep -> section -> size -> transport) so that machine noise
spreads evenly: one-way throughput, 64 B round trip, stalled receiver, many clients,
net-queue's iops scenarios, the distance row (bench/distance.py), the connection storm
(bench/storm.py: 2000 clients created at once) and idle links (bench/idle.py: the server's
memory per idle client, 10 000 clients). Every endpoint is its own process
(bench/workers/*.py); timing is done on the receiving side. See bench/README.md for what
each row means.

The orchestrator is stdlib only. Workers run under this interpreter (override with
NETQ_BENCH_PY) with the repository root on PYTHONPATH, and the net-queue rows under the
Python 3.13 venv of bench/netqueue_env.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKERS = os.path.join(HERE, "workers")
IOPS = os.path.join(HERE, "iops.py")
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True      # keep bench/ free of __pycache__ (workers: env below)
import distance  # noqa: E402
import idle  # noqa: E402
import netqueue_env  # noqa: E402
import storm  # noqa: E402
from busy import BusyLoops  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SIZES = [64, 4 * KiB, 64 * KiB, MiB, 16 * MiB]
PING_SIZE, PING_COUNT = 64, 3000
STALL_SIZE, STALL_SECONDS = MiB, 2.0
MANY_PROCS, MANY_COMMS, MANY_COUNT, MANY_SIZE = 4, 50, 1000, KiB
SECTIONS = ("throughput", "latency", "stall", "many-clients", "iops", "distance", "storm",
            "idle")
MAX_TIMEOUTS = 2        # a measurement that timed out this often is skipped in later reps


# ============================================================================= rows
@dataclass(frozen=True)
class Row:
    name: str
    worker: str                 # file in bench/workers/
    transport: str              # spec["transport"] for the worker
    needs: str | None = None    # capability: zmq | netq | tls (netq + certificate) |
    #                             ssl (certificate) | net-queue | grpc | mqtt
    sizes: tuple | None = None  # throughput sizes it runs at (None: all)
    in_process: bool = False    # round trip: both ends in one process (role ping-self)

    @property
    def interp(self) -> str:
        return "net-queue" if self.needs == "net-queue" else "main"


GRPC_SIZES = (64 * KiB, MiB, 16 * MiB)   # the gRPC rows (issue 4): large messages only
MQTT_SIZES = (4 * KiB, MiB, 16 * MiB)
PY_QUEUE_SIZES = (64, 4 * KiB, 64 * KiB)
MP_CONNECTION_SIZES = (64, 4 * KiB)

THROUGHPUT = [
    Row("raw-tcp", "raw.py", "raw-tcp"),
    Row("raw-tcp-batch", "raw.py", "raw-tcp-batch"),
    # The plain-Python floor of a put()/get() queue (bench/workers/pyqueue.py): netq-tcp over
    # it is what netq's guarantees cost, it over raw-tcp what Python costs before any design.
    Row("py-queue", "pyqueue.py", "py-queue", sizes=PY_QUEUE_SIZES),
    # The standard library's multiprocessing.connection (send/recv with pickle): the peer a
    # researcher would use instead at small sizes (bench/workers/mp_connection.py).
    Row("mp-connection", "mp_connection.py", "mp-connection", sizes=MP_CONNECTION_SIZES),
    Row("zmq-push", "zmq_peer.py", "zmq-push", "zmq"),
    Row("netq-tcp", "netq_peer.py", "netq-tcp", "netq"),
    Row("netq-tcp-batch", "netq_peer.py", "netq-tcp-batch", "netq", (64, 4 * KiB)),
    # One numpy array (uint8, the same bytes) per put(): what researchers send.
    Row("netq-tcp-numpy", "netq_peer.py", "netq-tcp-numpy", "netq"),
    Row("netq-unix", "netq_peer.py", "netq-unix", "netq"),
    # Same host (issue 38): raw Unix socket; numpy arrays over netq Unix with default options
    # (large parts through shared memory), with shared memory off (every byte through the
    # socket), and from a buffer netq handed out (comm.shared_array: no copy at all).
    Row("raw-unix", "raw.py", "raw-unix"),
    Row("netq-unix-numpy", "netq_peer.py", "netq-unix-numpy", "netq"),
    Row("netq-unix-noshm-numpy", "netq_peer.py", "netq-unix-noshm-numpy", "netq"),
    Row("netq-unix-handout", "netq_peer.py", "netq-unix-handout", "netq"),
    Row("netq-tls", "netq_peer.py", "netq-tls", "tls"),
    Row("raw-ssl", "raw.py", "raw-ssl", "ssl"),
    Row("net-queue", "netqueue_peer.py", "net-queue", "net-queue"),
    Row("raw-grpc", "grpc_peer.py", "raw-grpc", "grpc", GRPC_SIZES),
    Row("netq-grpc", "grpc_peer.py", "netq-grpc", "netq", GRPC_SIZES),
    Row("net-queue-grpc", "netqueue_grpc_peer.py", "net-queue-grpc", "net-queue", GRPC_SIZES),
    # MQTT: each through its own private mosquitto (bench/workers/mqtt_broker.py)
    Row("mqtt-paho", "paho_peer.py", "mqtt-paho", "mqtt", MQTT_SIZES),
    Row("netq-mqtt", "netq_mqtt_peer.py", "netq-mqtt", "mqtt", MQTT_SIZES),
    Row("net-queue-mqtt", "netqueue_mqtt_peer.py", "net-queue-mqtt", "net-queue", MQTT_SIZES),
]
# Every kind of large part over Unix (issue 54): read-only arrays (np.frombuffer over bytes),
# np.memmap opened "r", writable arrays and bytes, through shared memory and (-noshm) through
# the socket, each as a stream of puts and (-wait) as put, wait for the future, put again.
KIND_SIZES = (MiB, 16 * MiB, 256 * MiB)
KIND_ROWS = [Row(f"netq-unix{road}-{kind}{wait}", "netq_peer.py", f"netq-unix{road}-{kind}{wait}",
                 "netq", KIND_SIZES)
             for road in ("", "-noshm") for kind in ("ro", "memmap", "writable", "bytes")
             for wait in ("", "-wait")]
THROUGHPUT.extend(KIND_ROWS)
# The floor of those rows' shared-memory road without netq: one memcpy per message into a
# memfd map the receiver already has, and a byte each way (bench/workers/shm_floor.py). What
# copying once instead of a socket's twice buys at most, beside raw-unix in the same rep.
SHM_FLOOR_ROWS = [Row(f"shm-copy-floor{wait}", "shm_floor.py", f"shm-copy-floor{wait}",
                      sizes=KIND_SIZES) for wait in ("", "-wait")]
THROUGHPUT.extend(SHM_FLOOR_ROWS)

# Rows compared with a floor of their own (same rep) besides raw-tcp: the same carrier driven
# directly, without netq (netq-tcp: the plain-Python queue, where raw-tcp is not a queue).
FLOORS = {"netq-tcp": "py-queue", "netq-tls": "raw-ssl", "netq-grpc": "raw-grpc",
          "netq-unix-numpy": "raw-unix", "netq-unix-noshm-numpy": "raw-unix",
          "netq-unix-handout": "raw-unix",
          "net-queue-grpc": "raw-grpc", "netq-mqtt": "mqtt-paho", "net-queue-mqtt": "mqtt-paho"}
FLOORS.update({row.name: "raw-unix" for row in KIND_ROWS + SHM_FLOOR_ROWS})
LATENCY = [
    Row("raw-tcp", "raw.py", "raw-tcp"),
    # The round-trip floor of a Python queue (a waiting get() reads the socket itself:
    # bench/workers/lead_floor.py) and multiprocessing.connection, a peer a user would pick.
    Row("py-lead", "lead_floor.py", "py-lead"),
    # py-lead with the least of netq's contract (futures resolved by ACKs, credit, checked
    # headers: bench/workers/contract_floor.py): what the contract costs, and netq beyond it.
    Row("py-contract", "contract_floor.py", "py-contract"),
    Row("mp-connection", "mp_connection.py", "mp-connection"),
    Row("zmq", "zmq_peer.py", "zmq-dealer", "zmq"),
    Row("netq-tcp", "netq_peer.py", "netq-tcp", "netq"),
    Row("netq-unix", "netq_peer.py", "netq-unix", "netq"),
    Row("net-queue", "netqueue_peer.py", "net-queue", "net-queue"),
    Row("raw-grpc", "grpc_peer.py", "raw-grpc", "grpc"),
    Row("netq-grpc", "grpc_peer.py", "netq-grpc", "netq"),
    Row("net-queue-grpc", "netqueue_grpc_peer.py", "net-queue-grpc", "net-queue"),
    Row("mqtt-paho", "paho_peer.py", "mqtt-paho", "mqtt"),
    Row("netq-mqtt", "netq_mqtt_peer.py", "netq-mqtt", "mqtt"),
    Row("net-queue-mqtt", "netqueue_mqtt_peer.py", "net-queue-mqtt", "net-queue"),
    # Server and client in one process (a thread echoes, the main thread pings), as a
    # notebook kernel holds them; compared with raw-tcp-1proc, raw sockets driven the same way.
    Row("raw-tcp-1proc", "raw.py", "raw-tcp", in_process=True),
    # The py-lead floor driven the same way: what a Python queue's round trip costs when both
    # ends share one interpreter (and its GIL).
    Row("py-lead-1proc", "lead_floor.py", "py-lead", in_process=True),
    Row("netq-tcp-1proc", "netq_peer.py", "netq-tcp", "netq", in_process=True),
]


def latency_base(row: str) -> str:
    """The raw row a round-trip row is compared with: raw TCP driven the same way."""
    return "raw-tcp-1proc" if row.endswith("-1proc") else "raw-tcp"


SCENARIO_ROW = Row("netq-tcp", "netq_peer.py", "netq-tcp", "netq")   # stall + many clients
# transport = --lib. raw-tcp is the floor: the same scenario over one blocking socket per side
# (bench/workers/raw_iops.py), so a library's Gbps over it says how close it comes to the machine.
IOPS_ROWS = [Row("raw-tcp", "../iops.py", "raw"),
             Row("netq-tcp", "../iops.py", "netq", "netq"),
             Row("net-queue", "../iops.py", "net_queue", "net-queue")]
SECTION_ROWS = {"throughput": THROUGHPUT, "latency": LATENCY, "stall": [SCENARIO_ROW],
                "many-clients": [SCENARIO_ROW], "iops": IOPS_ROWS,
                "distance": distance.rows(Row), "storm": storm.rows(Row),
                "idle": idle.rows(Row)}
IOPS_SCENARIOS = [
    ("2 MiB x 1000 async", ["async", "--step-size", "0", "--max-size", "21", "--reps", "1000"]),
    ("2 MiB x 1000 sync", ["sync", "--step-size", "0", "--max-size", "21", "--reps", "1000"]),
    ("mix --max-size 28", ["async", "--min-size", "8", "--step-size", "2", "--step-expo", "0.5",
                           "--max-size", "28"]),
    ("1 KiB x 20000 async", ["async", "--step-size", "0", "--max-size", "10", "--reps", "20000"]),
]


def calib_count(size: int) -> int:
    return max(4, min(5000, 64 * MiB // size))


def clamp_count(size: int, n: float) -> int:
    lo = max(4, min(2000, 32 * MiB // size))
    hi = max(8, min(3_000_000, 2 * GiB // size))
    return int(max(lo, min(hi, n)))


# ============================================================================= helpers
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def human(n: int) -> str:
    for unit, k in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": KiB, "M": MiB, "G": GiB}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec: str = ".2f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def _machine_busy() -> tuple[float, float, float]:
    """(machine busy CPU s, our reaped children's CPU s, wall) for the other-load estimate."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, ru.ru_utime + ru.ru_stime, time.monotonic()


def other_load(a, b) -> float | None:
    """Cores used by other processes between two samples (our children excluded)."""
    wall = b[2] - a[2]
    return None if wall <= 0 else round(max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / wall), 3)


# ============================================================================= processes
class WorkerError(RuntimeError):
    pass


class Worker:
    """One child process; tagged JSON lines on stdout, stderr kept in a temp file."""

    def __init__(self, name: str, argv: list[str], env: dict) -> None:
        self.name = name
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env, start_new_session=True)
        self.pid = self.proc.pid
        self._buf = b""
        self._lines: list[str] = []
        self._eof = False

    def expect(self, tag: str, deadline: float) -> dict:
        """The JSON of the next line starting with TAG (other lines are skipped)."""
        prefix = tag + " "
        while True:
            while self._lines:
                line = self._lines.pop(0)
                if line.startswith(prefix):
                    return json.loads(line[len(prefix):])
            if self._eof:
                try:
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
                raise WorkerError(f"{self.name} exited ({self.proc.returncode}) before {tag}: "
                                  f"{self.stderr_tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out waiting for {tag} from {self.name}")
            fd = self.proc.stdout.fileno()
            if not select.select([fd], [], [], min(left, 1.0))[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self._eof = True
                chunk = b"\n"
            self._buf += chunk
            *done, self._buf = self._buf.split(b"\n")
            self._lines += [d.decode(errors="replace") for d in done if d]

    def tell(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def release(self) -> None:
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass

    def finish(self, deadline: float) -> None:
        """Wait for a clean exit."""
        try:
            rc = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} did not exit") from None
        if rc != 0:
            raise WorkerError(f"{self.name} exited {rc}: {self.stderr_tail()}")

    def stderr_tail(self, limit: int = 1500) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return text[-limit:]

    def stacks(self) -> str:
        """For a hung worker: what it registered with on_diagnose (SIGUSR2) and every thread's
        stack (faulthandler, SIGUSR1), identical stacks folded into one."""
        if self.proc.poll() is not None:
            return f"{self.name} had exited ({self.proc.returncode}): {self.stderr_tail(600)}"
        try:
            os.kill(self.pid, signal.SIGUSR2)
            time.sleep(0.3)
            os.kill(self.pid, signal.SIGUSR1)
            time.sleep(0.5)
        except ProcessLookupError:
            pass
        text = self.stderr_tail(1 << 20)
        start = text.rfind("DIAGNOSE")
        if start < 0:
            return f"{self.name}:\n{text[-3000:]}"
        diagnosis, _, dump = text[start:].partition("\n")
        folded: dict[str, int] = {}
        for block in dump.strip().split("\n\n"):
            head, _, body = block.partition("\n")
            key = ("main thread" if head.startswith("Current") else "thread") + ":\n" + body
            folded[key] = folded.get(key, 0) + 1
        threads = "\n".join(f"{n} x {key}" if n > 1 else key for key, n in folded.items())
        return f"{self.name}: {diagnosis[:3000]}\n{threads[-4000:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass


class Session:
    """The processes of one measurement: a shared deadline, a temp dir, kill-all on exit.
    On a timeout, the stacks of every still-running worker are attached to the exception."""

    def __init__(self, ctx: Context, timeout: float) -> None:
        self.ctx = ctx
        self.deadline = time.monotonic() + timeout
        self.tmpdir = tempfile.mkdtemp(prefix="netqbench-", dir="/tmp")
        self.workers: list[Worker] = []

    def __enter__(self) -> Session:
        return self

    def __exit__(self, et, ev, tb) -> None:
        try:
            if et is not None and issubclass(et, TimeoutError):
                ev.detail = "\n".join(w.stacks() for w in self.workers)
        finally:
            for w in self.workers:
                w.kill()
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def spawn(self, name: str, row: Row, **spec) -> Worker:
        spec.setdefault("tmpdir", self.tmpdir)
        spec.setdefault("tls", self.ctx.tls)
        spec["transport"] = row.transport
        argv = [self.ctx.python[row.interp], os.path.join(WORKERS, row.worker), json.dumps(spec)]
        return self.run(name, argv, row.interp)

    def run(self, name: str, argv: list[str], interp: str = "main") -> Worker:
        w = Worker(name, argv, self.ctx.env[interp])
        self.workers.append(w)
        return w

    def collect(self, *workers: Worker) -> None:
        for w in workers:
            w.finish(self.deadline)


# ============================================================================= context
PROBE = """
import json, sys, importlib.metadata as md
out = {"python": sys.version.split()[0]}
for module, dist in (("zmq", "pyzmq"), ("numpy", "numpy"), ("psutil", "psutil"),
                     ("grpc", "grpcio"), ("paho.mqtt", "paho-mqtt")):
    try:
        __import__(module)
        out[dist] = md.version(dist)
    except Exception:
        out[dist] = None
try:
    import netq
    netq.new, netq.Protocol.UNIX, netq.Full
    out["netq"] = getattr(netq, "__version__", None) or "importable"
except Exception as e:
    out["netq"], out["netq_error"] = None, repr(e)[:300]
print(json.dumps(out))
"""


class Context:
    """Configuration, interpreters, capabilities and the growing list of records."""

    def __init__(self, args) -> None:
        self.args = args
        self.quick = args.quick
        self.reps = args.reps or (1 if args.quick else 5)
        self.target_s = args.target or (0.15 if args.quick else 0.3)
        self.timeout = args.timeout
        self.sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else SIZES
        self.only = set(filter(None, args.only.split(","))) if args.only else None
        self.records: list[dict] = []
        self.notes: list[str] = []
        self.counts: dict = {}                 # (row, size) -> calibrated N
        self.timeouts: dict = {}               # measurement key -> how often it timed out
        self.tls = None
        self.tmp = tempfile.mkdtemp(prefix="netqbench-run-", dir="/tmp")
        main_py = os.environ.get("NETQ_BENCH_PY", sys.executable)
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("PYTHONWARNINGS", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        nq_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        self.python = {"main": main_py, "net-queue": None}
        self.env = {"main": env, "net-queue": nq_env}
        self.missing: dict[str, str] = {}      # capability -> reason it is unavailable

    def selected(self, section: str, row: str) -> bool:
        """--only: section names and row names; each kind given must match (AND)."""
        if self.only is None:
            return True
        sections = self.only & set(SECTIONS)
        rows = self.only - sections
        return (not sections or section in sections) and (not rows or row in rows)

    def usable(self, section: str, row: Row) -> bool:
        return (self.selected(section, row.name)
                and (row.needs is None or row.needs not in self.missing))

    def wants(self, capability: str) -> bool:
        """Does any selected row need this capability?"""
        return any(r.needs == capability and self.selected(section, r.name)
                   for section, rows in SECTION_ROWS.items() for r in rows)

    # ------------------------------------------------------------------ probing
    def probe(self) -> dict:
        p = subprocess.run([self.python["main"], "-c", PROBE], capture_output=True, text=True,
                           timeout=120, env=self.env["main"])
        info = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-500:]}
        if not info.get("pyzmq"):
            self.missing["zmq"] = "pyzmq is not importable"
        if not info.get("netq"):
            self.missing["netq"] = f"netq is not importable yet ({info.get('netq_error')})"
            self.missing["tls"] = self.missing["netq"]
        if not info.get("grpcio"):
            self.missing["grpc"] = "grpcio is not importable (pip install 'netq[grpc]')"
        if not info.get("numpy"):
            self.missing["numpy"] = "numpy is not importable (the netq iops rows need it)"
        if not info.get("paho-mqtt"):
            self.missing["mqtt"] = "paho-mqtt is not importable"
        elif not (shutil.which("mosquitto") or os.access("/usr/sbin/mosquitto", os.X_OK)):
            self.missing["mqtt"] = "mosquitto not found (sudo apt-get install -y mosquitto)"
        if self.wants("tls") or self.wants("ssl"):
            self.tls = make_certificate(self.tmp)
            if self.tls is None:
                reason = "could not make a self-signed certificate (openssl missing?)"
                self.missing["ssl"] = reason
                self.missing.setdefault("tls", reason)
        if self.wants("net-queue"):
            py, reason = netqueue_env.ensure(log=log)
            if py:
                self.python["net-queue"] = py
                info["net-queue"] = netqueue_env.probe()
            else:
                self.missing["net-queue"] = reason
        for cap, reason in self.missing.items():
            if self.wants(cap) and not (cap == "tls" and "netq" in self.missing):
                self.notes.append(f"skipped every `{cap}` row: {reason}")
        return info


def make_certificate(tmp: str) -> dict | None:
    """Self-signed certificate for 127.0.0.1/localhost (server key+cert; client trusts cert)."""
    key, cert = os.path.join(tmp, "key.pem"), os.path.join(tmp, "cert.pem")
    cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
           "-out", cert, "-days", "2", "-subj", "/CN=localhost",
           "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    try:
        subprocess.run(cmd, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"key": key, "cert": cert}


# ============================================================================= measurement
def measure(ctx: Context, section: str, row: str, rep, fn, size=None, extra=None) -> dict | None:
    """Run fn() -> record; a failure becomes a failed record with the reason (never raises)."""
    label = f"{section:<12} {row:<15} {human(size) if size else '':>7} rep {rep}"
    base = {"section": section, "row": row, "size": size, "rep": rep, **(extra or {})}
    key = (section, row, size, base.get("scenario"))
    if ctx.timeouts.get(key, 0) >= MAX_TIMEOUTS:
        rec = {**base, "failed": True, "ok": False, "skipped": True,
               "error": f"not run: timed out in {MAX_TIMEOUTS} earlier reps"}
        ctx.records.append(rec)
        return rec
    a = _machine_busy()
    t0 = time.monotonic()
    try:
        rec = {**base, **fn()}
    except Exception as e:  # noqa: BLE001 - every failure is recorded, none stops the run
        reason = f"{type(e).__name__}: {e}"
        rec = {**base, "failed": True, "ok": False, "error": reason[:2000],
               "detail": getattr(e, "detail", "")[-30000:]}
        if isinstance(e, TimeoutError):
            ctx.timeouts[key] = ctx.timeouts.get(key, 0) + 1
        log(f"{label}  FAILED: {reason[:300]}")
    rec["wall_s"] = round(time.monotonic() - t0, 3)
    rec["other_load_cores"] = other_load(a, _machine_busy())
    ctx.records.append(rec)
    return rec


def one_way(ctx: Context, row: Row, size: int, count: int) -> dict:
    with Session(ctx, max(10.0, ctx.timeout / 2)) as s:     # ~0.3 s of data + start-up
        rx = s.spawn("receiver", row, role="recv", size=size, count=count)
        addr = rx.expect("READY", s.deadline)["addr"]
        tx = s.spawn("sender", row, role="send", size=size, count=count, addr=addr)
        rx.tell(f"PEERS {tx.pid}")
        recv = rx.expect("RESULT", s.deadline)
        send = tx.expect("RESULT", s.deadline)
        tx.release()
        rx.release()  # a receiver that hosts a broker keeps it until the sender is done
        s.collect(rx, tx)
    return {"ok": recv["ok"], "count": count, "recv": recv, "send": send}


def round_trip(ctx: Context, row: Row) -> dict:
    if row.in_process:
        with Session(ctx, ctx.timeout) as s:
            both = s.spawn("ping-self", row, role="ping-self", size=PING_SIZE, count=PING_COUNT)
            res = both.expect("RESULT", s.deadline)
            s.collect(both)
        return {"ok": True, "ping": res}
    with Session(ctx, ctx.timeout) as s:
        echo = s.spawn("echo", row, role="echo", size=PING_SIZE, count=PING_COUNT)
        addr = echo.expect("READY", s.deadline)["addr"]
        ping = s.spawn("ping", row, role="ping", size=PING_SIZE, count=PING_COUNT, addr=addr,
                       echo_pid=echo.pid)
        res = ping.expect("RESULT", s.deadline)
        echo.expect("RESULT", s.deadline)
        echo.release()  # an echo that hosts a broker keeps it until the ping side is done
        s.collect(ping, echo)
    return {"ok": True, "ping": res}


def stalled_receiver(ctx: Context) -> dict:
    row = SCENARIO_ROW
    with Session(ctx, ctx.timeout) as s:
        rx = s.spawn("receiver", row, role="stall-recv", size=STALL_SIZE)
        addr = rx.expect("READY", s.deadline)["addr"]
        tx = s.spawn("sender", row, role="stall-send", size=STALL_SIZE, seconds=STALL_SECONDS,
                     addr=addr)
        stalled = tx.expect("STALLED", s.deadline)
        rx.tell(f"DRAIN {stalled['accepted']}")
        tx.tell("GO")
        recv = rx.expect("RESULT", s.deadline)
        send = tx.expect("RESULT", s.deadline)
        tx.release()
        s.collect(rx, tx)
    mib = 1 / 1024
    return {"ok": bool(recv["ok"] and send["last_future_ok"]), "recv": recv, "send": send,
            "send_over_base_mib": (send["stalled_high_rss_kb"] - send["base_rss_kb"]) * mib,
            "recv_over_base_mib": (recv["stalled_rss_kb"] - recv["base_rss_kb"]) * mib}


def many_clients(ctx: Context) -> dict:
    row = SCENARIO_ROW
    with Session(ctx, 2 * ctx.timeout) as s:
        rx = s.spawn("server", row, role="many-recv", size=MANY_SIZE, count=MANY_COUNT,
                     clients=MANY_PROCS * MANY_COMMS)
        addr = rx.expect("READY", s.deadline)["addr"]
        txs = [s.spawn(f"client{i}", row, role="many-send", size=MANY_SIZE, count=MANY_COUNT,
                       comms=MANY_COMMS, addr=addr) for i in range(MANY_PROCS)]
        for tx in txs:
            tx.expect("CONNECTED", s.deadline)
        rx.tell("PEERS " + " ".join(str(tx.pid) for tx in txs))
        for tx in txs:
            tx.tell("GO")
        recv = rx.expect("RESULT", s.deadline)
        sends = [tx.expect("RESULT", s.deadline) for tx in txs]
        for tx in txs:
            tx.release()
        s.collect(rx, *txs)
    cpu = (recv["recv_cpu_s"] + recv["send_cpu_s"]) if recv["send_cpu_s"] is not None else None
    ok = recv["ok"] and all(t["pending"] == 0 and t["failed"] == 0 for t in sends)
    return {"ok": ok, "recv": recv, "send": sends,
            "cpu_us_per_msg": cpu / recv["msgs"] * 1e6 if cpu is not None else None}


def iops_pair(ctx: Context, row: Row, args: list[str]) -> dict:
    with Session(ctx, 2 * ctx.timeout) as s:
        base = [ctx.python[row.interp], IOPS, "--lib", row.transport]
        srv = s.run("iops-server", base + ["server"] + args + ["--port", "0"], row.interp)
        port = srv.expect("READY", s.deadline)["addr"].rsplit(":", 1)[1]
        cli = s.run("iops-client", base + ["client"] + args + ["--port", port], row.interp)
        client = cli.expect("RESULT", s.deadline)
        server = srv.expect("RESULT", s.deadline)
        s.collect(cli, srv)
    return {"ok": client["ok"] and server["ok"], "client": client, "server": server}


# ============================================================================= suites
def throughput_rep(ctx: Context, rep: int) -> None:
    rows = [r for r in THROUGHPUT if ctx.usable("throughput", r)]
    for size in ctx.sizes:
        for row in rows:
            if row.sizes is not None and size not in row.sizes:
                continue
            key = (row.name, size)
            if key not in ctx.counts:
                if rep > 0:
                    continue                                # calibration failed in rep 0
                n0 = calib_count(size)
                cal = measure(ctx, "throughput", row.name, rep,
                              partial(one_way, ctx, row, size, n0), size, {"calibration": True})
                if cal.get("failed") or not cal["recv"].get("msgs_per_s"):
                    continue
                ctx.counts[key] = clamp_count(size, cal["recv"]["msgs_per_s"] * ctx.target_s)
                log(f"calibration  {row.name:<15} {human(size):>7}  "
                    f"{cal['recv']['msgs_per_s']:>11,.0f} msg/s -> N={ctx.counts[key]:,}")
            n = ctx.counts[key]
            rec = measure(ctx, "throughput", row.name, rep, partial(one_way, ctx, row, size, n),
                          size)
            if not rec.get("failed"):
                r = rec["recv"]
                log(f"throughput   {row.name:<15} {human(size):>7} rep {rep}  "
                    f"{r['msgs_per_s']:>11,.0f} msg/s {r['gb_per_s']:7.3f} GB/s  ok={r['ok']}  "
                    f"cpu {fmt(r['cpu_us_per_msg'], '.2f')} us/msg  "
                    f"rss s/r {rec['send']['peak_rss_kb'] / KiB:.0f}"
                    f"/{r['peak_rss_kb'] / KiB:.0f} MiB")


def latency_rep(ctx: Context, rep: int) -> None:
    for row in LATENCY:
        if ctx.usable("latency", row):
            rec = measure(ctx, "latency", row.name, rep, partial(round_trip, ctx, row), PING_SIZE)
            if not rec.get("failed"):
                cpu = _round_trip_cpu_us(rec)
                log(f"latency      {row.name:<15} rep {rep}  p50 {rec['ping']['p50_us']:8.1f} us"
                    f"  p99 {rec['ping']['p99_us']:8.1f} us"
                    + (f"  cpu ping/echo {cpu[0]:.1f}/{cpu[1]:.1f} us per round trip"
                       if cpu else ""))


def scenarios_rep(ctx: Context, rep: int) -> None:
    if ctx.usable("stall", SCENARIO_ROW):
        rec = measure(ctx, "stall", SCENARIO_ROW.name, rep, partial(stalled_receiver, ctx),
                      STALL_SIZE)
        if not rec.get("failed"):
            log(f"stall        accepted {rec['send']['accepted']} puts, RSS over base: sender "
                f"{rec['send_over_base_mib']:.0f} MiB, receiver "
                f"{rec['recv_over_base_mib']:.0f} MiB, drained ok={rec['recv']['ok']}")
    if ctx.usable("many-clients", SCENARIO_ROW):
        rec = measure(ctx, "many-clients", SCENARIO_ROW.name, rep, partial(many_clients, ctx),
                      MANY_SIZE)
        if not rec.get("failed"):
            log(f"many-clients {rec['recv']['msgs_per_s']:,.0f} msg/s from {rec['recv']['peers']} "
                f"peers, server peak {rec['recv']['peak_rss_kb'] / KiB:.0f} MiB, ok={rec['ok']}")


def iops_rep(ctx: Context, rep: int) -> None:
    for scenario, args in IOPS_SCENARIOS:
        for row in IOPS_ROWS:
            if not ctx.usable("iops", row) or (row.interp == "main" and "numpy" in ctx.missing):
                continue
            rec = measure(ctx, "iops", row.name, rep, partial(iops_pair, ctx, row, args),
                          extra={"scenario": scenario})
            if not rec.get("failed"):
                c = rec["client"]
                log(f"iops         {row.name:<15} {scenario:<20} rep {rep}  {c['gbps']:6.2f} Gbps "
                    f"{c['iops']:10,.0f} IOPS  {c['elapsed']:6.2f} s  ok={rec['ok']}")


# ============================================================================= summary
def _over_base_mib(side: dict) -> float:
    return (side["peak_rss_kb"] - side["base_rss_kb"]) / KiB


def _tracked_mib(side: dict) -> float:
    return (side.get("netq_memory_bytes") or 0) / MiB


def _side_cpu_us(record: dict, side: str) -> float | None:
    """CPU µs per message of one side (``send`` or ``recv``): that side's share of the
    measured sender + receiver CPU, over the same message count as ``cpu_us_per_msg``."""
    recv = record["recv"]
    both, own = recv.get("cpu_us_per_msg"), recv.get(f"{side}_cpu_s")
    total = (recv.get("send_cpu_s") or 0) + (recv.get("recv_cpu_s") or 0)
    if both is None or own is None or total <= 0:
        return None
    return both * own / total


def _round_trip_cpu_us(record: dict) -> tuple[float, float] | None:
    """CPU µs per round trip (ping side, echo side): each process's user+sys over the timed
    round trips; None for a record without it (older results, rows whose ping loop is not
    common.ping_loop)."""
    ping = record.get("ping") or {}
    mine, echo, n = ping.get("ping_cpu_s"), ping.get("echo_cpu_s"), ping.get("n")
    if mine is None or echo is None or not n:
        return None
    return mine / n * 1e6, echo / n * 1e6


def summarize(records: list[dict]) -> dict:
    good = [r for r in records if not r.get("failed") and not r.get("calibration")]
    by = {}
    for r in good:
        by.setdefault((r["section"], r["row"], r.get("size"), r.get("scenario")), []).append(r)
    gbps = {(r["row"], r["size"], r["rep"]): r["recv"]["gb_per_s"] for r in good
            if r["section"] == "throughput" and r["ok"]}
    raw_gbps = {(size, rep): v for (row, size, rep), v in gbps.items() if row == "raw-tcp"}
    raw_cpu = {(r["size"], r["rep"]): r["recv"]["cpu_us_per_msg"] for r in good
               if r["section"] == "throughput" and r["row"] == "raw-tcp" and r["ok"]
               and r["recv"].get("cpu_us_per_msg")}
    raw_p50 = {(r["row"], r["rep"]): r["ping"]["p50_us"] for r in good
               if r["section"] == "latency" and r["row"] in ("raw-tcp", "raw-tcp-1proc")}
    raw_rt_cpu = {(r["row"], r["rep"]): sum(cpu) for r in good
                  if r["section"] == "latency" and r["row"] in ("raw-tcp", "raw-tcp-1proc")
                  and (cpu := _round_trip_cpu_us(r))}
    nq_iops = {(r["scenario"], r["rep"]): r["client"]["gbps"] for r in good
               if r["section"] == "iops" and r["row"] == "net-queue" and r["ok"]}
    raw_iops = {(r["scenario"], r["rep"]): r["client"]["gbps"] for r in good
                if r["section"] == "iops" and r["row"] == "raw-tcp" and r["ok"]}
    out = {"throughput": {}, "latency": {}, "stall": {}, "many-clients": {}, "iops": {}}
    for (section, row, size, scenario), rs in by.items():
        if section == "throughput":
            gb = [r["recv"]["gb_per_s"] for r in rs]
            out[section][f"{row}|{size}"] = {
                "row": row, "size": size, "reps": len(rs), "ok": all(r["ok"] for r in rs),
                "msgs_per_s": median([r["recv"]["msgs_per_s"] for r in rs]),
                "gb_per_s": median(gb), "gb_per_s_min": min(gb), "gb_per_s_max": max(gb),
                "ratio_to_raw_tcp": median([r["recv"]["gb_per_s"] / raw_gbps[(size, r["rep"])]
                                            for r in rs if (size, r["rep"]) in raw_gbps]),
                "ratio_to_floor": median([
                    r["recv"]["gb_per_s"] / gbps[(FLOORS[row], size, r["rep"])]
                    for r in rs if (FLOORS.get(row), size, r["rep"]) in gbps]),
                "cpu_us_per_msg": median([r["recv"]["cpu_us_per_msg"] for r in rs]),
                "cpu_ratio_to_raw_tcp": median([
                    r["recv"]["cpu_us_per_msg"] / raw_cpu[(size, r["rep"])] for r in rs
                    if (size, r["rep"]) in raw_cpu and r["recv"].get("cpu_us_per_msg")
                    is not None]),
                "send_cpu_us_per_msg": median([_side_cpu_us(r, "send") for r in rs]),
                "recv_cpu_us_per_msg": median([_side_cpu_us(r, "recv") for r in rs]),
                "recv_faults_per_msg": median([r["recv"].get("recv_faults_per_msg")
                                               for r in rs]),
                "send_peak_mib": median([r["send"]["peak_rss_kb"] / KiB for r in rs]),
                "recv_peak_mib": median([r["recv"]["peak_rss_kb"] / KiB for r in rs]),
                "send_over_base_mib": median([_over_base_mib(r["send"]) for r in rs]),
                "recv_over_base_mib": median([_over_base_mib(r["recv"]) for r in rs]),
                "messages": median([r["count"] for r in rs]),
                "lost": sum(r["recv"].get("lost") or 0 for r in rs),
                "broker_peak_mib": median([(r["recv"].get("broker_peak_rss_kb") or 0) / KiB
                                           for r in rs if r["recv"].get("broker_peak_rss_kb")]),
                "other_load_cores": median([r["other_load_cores"] for r in rs])}
        elif section == "latency":
            p50 = [r["ping"]["p50_us"] for r in rs]
            base = latency_base(row)
            out[section][row] = {
                "row": row, "reps": len(rs), "p50_us": median(p50),
                "p99_us": median([r["ping"]["p99_us"] for r in rs]),
                "p50_min": min(p50), "p50_max": max(p50),
                "ratio_to_raw_tcp": median([r["ping"]["p50_us"] / raw_p50[base, r["rep"]]
                                            for r in rs if (base, r["rep"]) in raw_p50]),
                "ping_cpu_us": median([(_round_trip_cpu_us(r) or (None,))[0] for r in rs]),
                "echo_cpu_us": median([(_round_trip_cpu_us(r) or (None, None))[1] for r in rs]),
                "cpu_ratio_to_raw_tcp": median([
                    sum(cpu) / raw_rt_cpu[base, r["rep"]] for r in rs
                    if (cpu := _round_trip_cpu_us(r)) and raw_rt_cpu.get((base, r["rep"]))])}
        elif section == "stall":
            out[section][row] = {
                "row": row, "reps": len(rs), "ok": all(r["ok"] for r in rs),
                "accepted": median([r["send"]["accepted"] for r in rs]),
                "first_full_s": median([r["send"]["first_full_s"] for r in rs]),
                "send_over_base_mib": median([r["send_over_base_mib"] for r in rs]),
                "recv_over_base_mib": median([r["recv_over_base_mib"] for r in rs]),
                "send_budget_mib": rs[0]["send"]["send_budget"] / MiB,
                "recv_budget_mib": rs[0]["send"]["recv_budget"] / MiB,
                "in_order": all(r["recv"]["in_order"] for r in rs),
                "send_tracked_mib": median([_tracked_mib(r["send"]) for r in rs]),
                "recv_tracked_mib": median([_tracked_mib(r["recv"]) for r in rs]),
                "send_peak_mib": median([r["send"]["peak_rss_kb"] / KiB for r in rs]),
                "recv_peak_mib": median([r["recv"]["peak_rss_kb"] / KiB for r in rs]),
                "drain_s": median([r["recv"]["drain_s"] for r in rs])}
        elif section == "many-clients":
            mps = [r["recv"]["msgs_per_s"] for r in rs]
            out[section][row] = {
                "row": row, "reps": len(rs), "ok": all(r["ok"] for r in rs),
                "peers": median([r["recv"]["peers"] for r in rs]),
                "msgs_per_s": median(mps), "msgs_per_s_min": min(mps), "msgs_per_s_max": max(mps),
                "cpu_us_per_msg": median([r["cpu_us_per_msg"] for r in rs]),
                "server_peak_mib": median([r["recv"]["peak_rss_kb"] / KiB for r in rs]),
                "server_over_base_mib": median([_over_base_mib(r["recv"]) for r in rs]),
                "client_peak_mib": median([max(t["peak_rss_kb"] for t in r["send"]) / KiB
                                           for r in rs])}
        elif section == "iops":
            gb = [r["client"]["gbps"] for r in rs]
            out[section][f"{scenario}|{row}"] = {
                "scenario": scenario, "row": row, "reps": len(rs), "ok": all(r["ok"] for r in rs),
                "gbps": median(gb), "gbps_min": min(gb), "gbps_max": max(gb),
                "iops": median([r["client"]["iops"] for r in rs]),
                "elapsed_s": median([r["client"]["elapsed"] for r in rs]),
                "cpu_us_per_op": median([(r["client"]["cpu_s"] + r["server"]["cpu_s"])
                                         / r["client"]["ops"] * 1e6 for r in rs]),
                "server_peak_mib": median([r["server"]["peak_rss_kb"] / KiB for r in rs]),
                "client_peak_mib": median([r["client"]["peak_rss_kb"] / KiB for r in rs]),
                "ratio_to_net_queue": median([r["client"]["gbps"] / nq_iops[(scenario, r["rep"])]
                                              for r in rs if (scenario, r["rep"]) in nq_iops]),
                "ratio_to_raw": median([r["client"]["gbps"] / raw_iops[(scenario, r["rep"])]
                                        for r in rs if (scenario, r["rep"]) in raw_iops])}
    return out


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


ROUND_TRIP_CPU_HEADER = "CPU µs per round trip: ping / echo"
IN_PROCESS_NOTE = ("The `-1proc` rows hold both ends in one process (a thread echoes, the main"
                   " thread pings, as in a notebook kernel); their ratios are × raw-tcp-1proc,"
                   " raw sockets driven the same way.")


def _round_trip_cpu_cells(summary_row: dict | None) -> list[str]:
    """Both sides' CPU per round trip and its ratio to raw-tcp's (both sides), from a latency
    summary row; blank where the records carry no CPU (results from before it was measured)."""
    if not summary_row or summary_row.get("ping_cpu_us") is None:
        return ["", ""]
    ratio = summary_row.get("cpu_ratio_to_raw_tcp")
    if summary_row["row"].endswith("-1proc"):
        return [f"{_cpu_text(summary_row['ping_cpu_us'])} (both, one process)",
                f"×{ratio:.2f}" if ratio is not None else ""]
    return [f"{_cpu_text(summary_row['ping_cpu_us'])} / {_cpu_text(summary_row['echo_cpu_us'])}",
            f"×{ratio:.2f}" if ratio is not None else ""]


def throughput_tables(thr: dict, sizes: list[int], failed_keys: set,
                      busy: dict | None = None) -> list[str]:
    """The one-way throughput tables of one run (``thr``: summarize()'s ``throughput``); for
    a ``--busy`` run attached with --busy-results (``busy``: :func:`busy_run`), its ratios,
    messages/s and CPU per message, headed as a busy machine's."""
    names = [r.name for r in THROUGHPUT
             if any(f"{r.name}|{s}" in thr or ("throughput", r.name, s, None) in failed_keys
                    for s in sizes)]
    if not names:
        return []
    out: list[str] = []

    def table(title: str, fn) -> None:
        rows = []
        for name in names:
            cells = []
            for size in sizes:
                v = thr.get(f"{name}|{size}")
                txt = fn(v) if v else ""
                if v and not v["ok"]:
                    txt += " **FAILED VERIFY**"
                if not txt:
                    txt = "FAILED" if ("throughput", name, size, None) in failed_keys else "—"
                cells.append(txt)
            rows.append([name] + cells)
        out.extend([f"{'###' if busy else '##'} {title}", ""]
                   + md_table(["row"] + [human(s) for s in sizes], rows))

    if busy:
        out.extend([f"## One-way throughput on a busy machine: {busy['busy']} busy-loop"
                    f" processes (`--busy {busy['busy']}` run of {busy['date']},"
                    f" {busy['reps']} rep(s))", ""])
    table(("GB/s" if busy else "One-way throughput: GB/s")
          + " (× raw-tcp of the same rep, median over reps; "
          "netq TCP also × the plain-Python queue, TLS, gRPC and MQTT rows × their own raw peer: "
          + ", ".join(sorted(set(FLOORS.values()))) + "; MQTT rows: messages lost, if any)",
          lambda v: f"{fmt(v['gb_per_s'], '.3f')} (×{fmt(v['ratio_to_raw_tcp'], '.2f')}"
          + (f", ×{v['ratio_to_floor']:.2f} {FLOORS[v['row']]}"
             if v.get("ratio_to_floor") is not None else "") + ")"
          + (f" **lost {v['lost']}**" if v.get("lost") else ""))
    table("Messages/s" if busy else "One-way throughput: messages/s",
          lambda v: f"{v['msgs_per_s']:,.0f}")
    if not busy:
        table("Spread of GB/s over reps (min – max) and messages per measurement",
              lambda v: (f"{v['gb_per_s_min']:.3f} – {v['gb_per_s_max']:.3f}" if v["reps"] > 1
                         else "1 rep") + f", N={v['messages']:,.0f}")
        table("CPU per message, µs (user+sys of sender + receiver over the timed interval"
              " / messages)",
              lambda v: fmt(v["cpu_us_per_msg"], ".3g"))
    table("CPU per message, µs: sender / receiver (each side's user+sys over the same"
          " interval / messages) and both sides × raw-tcp's of the same rep",
          lambda v: f"{fmt(v.get('send_cpu_us_per_msg'), '.3g')} / "
          f"{fmt(v.get('recv_cpu_us_per_msg'), '.3g')}"
          + (f" (×{v['cpu_ratio_to_raw_tcp']:.2f})"
             if v.get("cpu_ratio_to_raw_tcp") is not None else ""))
    table("Receiver page faults per message (minor + major, all threads, over the timed "
          "interval: a fresh buffer costs one per 4 KiB page it touches)",
          lambda v: fmt(v.get("recv_faults_per_msg"), ".3g"))
    if not busy:
        table("Peak RSS, MiB: sender / receiver (MQTT: / broker)",
              lambda v: f"{v['send_peak_mib']:.0f} / {v['recv_peak_mib']:.0f}"
              + (f" / {v['broker_peak_mib']:.0f}" if v.get("broker_peak_mib") else ""))
        table("Peak RSS over baseline (after imports + connect/bind), MiB: sender / receiver",
              lambda v: f"{round(v['send_over_base_mib'])} / {round(v['recv_over_base_mib'])}")
    return out


def markdown(results: dict) -> str:
    meta, summary = results["meta"], results["summary"]
    records = results["records"]
    failed = [r for r in records if r.get("failed") or not r.get("ok", True)]
    failed_keys = {(r["section"], r["row"], r.get("size"), r.get("scenario")) for r in failed}
    m = meta["machine"]
    L = [f"# netq benchmark — {meta['date']}", "",
         f"{m['cpu_model']}, {m['cores']} cores, kernel {m['kernel']}; "
         f"Python {meta['python']['main']} "
         f"(net-queue rows: {meta['python'].get('net-queue') or 'n/a'}); mode {meta['mode']}, "
         f"{meta['reps']} rep(s), ~{meta['target_s']} s per throughput measurement; "
         f"wall time {meta.get('wall_s', 0):.0f} s."
         + (f" **Busy machine: {meta['busy']} pure-Python busy-loop process(es) ran for the"
            f" whole run** (`--busy {meta['busy']}`)." if meta.get("busy") else ""), ""]
    for note in results.get("notes", []):
        L.append(f"> **Note:** {note}")
    if results.get("notes"):
        L.append("")

    L.extend(throughput_tables(summary["throughput"], meta["sizes"], failed_keys))
    busy = busy_run(results)
    if busy and any(r["section"] == "throughput" for r in busy["records"]):
        busy_records = busy["records"]
        busy_failed = {(r["section"], r["row"], r.get("size"), r.get("scenario"))
                       for r in busy_records if r.get("failed") or not r.get("ok", True)}
        L.extend(throughput_tables(summarize(busy_records)["throughput"], busy["sizes"],
                                   busy_failed, busy=busy))
    lat = summary["latency"]
    lat_rows = [r.name for r in LATENCY
                if r.name in lat or ("latency", r.name, PING_SIZE, None) in failed_keys]
    if lat_rows:
        rows = []
        for name in lat_rows:
            v = lat.get(name)
            if not v:
                rows.append([name, "FAILED", "", "", "", "", ""])
                continue
            spread = f"{v['p50_min']:.0f} – {v['p50_max']:.0f}" if v["reps"] > 1 else "1 rep"
            rows.append([name, f"{v['p50_us']:.1f}", f"{v['p99_us']:.1f}",
                         f"×{fmt(v['ratio_to_raw_tcp'], '.2f')}", spread,
                         *_round_trip_cpu_cells(v)])
        L.extend([f"## Round trip, {PING_SIZE} B ping-pong (200 warm-up + {PING_COUNT} timed),"
                  " µs", ""]
                 + md_table(["row", "p50", "p99", "p50 × raw-tcp", "p50 spread",
                             ROUND_TRIP_CPU_HEADER, "CPU × raw-tcp"], rows)
                 + ([IN_PROCESS_NOTE, ""] if any(n.endswith("-1proc") for n in lat_rows)
                    else []))
    if busy and any(r["section"] == "latency" for r in busy["records"]):
        busy_lat = summarize(busy["records"])["latency"]
        rows = [[r.name, *cells, *_round_trip_cpu_cells(busy_lat.get(r.name))] for r in LATENCY
                if (cells := _latency_cells(busy["records"], r.name, busy["reps"]))]
        L.extend([f"## Round trip on a busy machine: {busy['busy']} busy-loop processes"
                  f" (`--busy {busy['busy']}` run of {busy['date']}, {busy['reps']} rep(s)), µs",
                  ""] + md_table(["row", "p50 (min – max)", "p99", "p50 × raw-tcp",
                                  ROUND_TRIP_CPU_HEADER, "CPU × raw-tcp"], rows))
    st = summary["stall"]
    if st or any(k[0] == "stall" for k in failed_keys):
        rows = [[v["row"], f"{v['accepted']:.0f}", fmt(v["first_full_s"], ".2f", "never"),
                 f"{v['send_over_base_mib']:.0f} (netq holds {v['send_tracked_mib']:.0f}, "
                 f"budget {v['send_budget_mib']:.0f})",
                 f"{v['recv_over_base_mib']:.0f} (netq holds {v['recv_tracked_mib']:.0f}, "
                 f"budget {v['recv_budget_mib']:.0f})",
                 f"{v['send_peak_mib']:.0f} / {v['recv_peak_mib']:.0f}",
                 f"{'yes' if v['ok'] else '**NO**'}, "
                 f"{'in order' if v['in_order'] else '**out of order**'} ({v['drain_s']:.2f} s)"]
                for v in st.values()]
        rows += [[k[1], "FAILED", "", "", "", "", ""]
                 for k in failed_keys if k[0] == "stall" and k[1] not in st]
        L.extend([f"## Stalled receiver: {human(STALL_SIZE)} puts for {STALL_SECONDS:.0f} s to a "
                  "server that never calls get()", ""]
                 + md_table(["row", "puts accepted", "first Full after (s)",
                             "sender RSS over base (MiB)", "receiver RSS over base (MiB)",
                             "peak RSS s / r (MiB)",
                             "all drained afterwards"], rows))
    mc = summary["many-clients"]
    if mc or any(k[0] == "many-clients" for k in failed_keys):
        rows = [[v["row"], f"{v['peers']:.0f}", f"{v['msgs_per_s']:,.0f}",
                 (f"{v['msgs_per_s_min']:,.0f} – {v['msgs_per_s_max']:,.0f}"
                  if v["reps"] > 1 else "1 rep"),
                 fmt(v["cpu_us_per_msg"], ".3g"), f"{v['server_peak_mib']:.0f}",
                 f"{v['server_over_base_mib']:.0f}", f"{v['client_peak_mib']:.0f}",
                 "yes" if v["ok"] else "**NO**"] for v in mc.values()]
        rows += [[k[1], "FAILED"] + [""] * 7
                 for k in failed_keys if k[0] == "many-clients" and k[1] not in mc]
        L.extend([f"## Many clients: {MANY_PROCS * MANY_COMMS} client communicators in "
                  f"{MANY_PROCS} processes, {MANY_COUNT} x {human(MANY_SIZE)} each, one server", ""]
                 + md_table(["row", "peers", "msg/s (aggregate)", "spread",
                             "CPU µs/msg (all processes)", "server peak RSS (MiB)",
                             "server over base (MiB)", "client process peak (MiB)",
                             "counts verified"], rows))
    io = summary["iops"]
    iops_keys = [(sc, r.name) for sc, _ in IOPS_SCENARIOS for r in IOPS_ROWS]
    if io or any(k[0] == "iops" for k in failed_keys):
        rows = []
        for sc, name in iops_keys:
            v = io.get(f"{sc}|{name}")
            if v:
                rows.append([sc, name, f"{v['gbps']:.2f}", f"{v['iops']:,.0f}",
                             f"{v['elapsed_s']:.2f}", f"×{fmt(v['ratio_to_net_queue'], '.2f')}",
                             f"×{fmt(v.get('ratio_to_raw'), '.2f')}",
                             fmt(v["cpu_us_per_op"], ",.0f" if (v["cpu_us_per_op"] or 0) >= 100
                                 else ".3g"),
                             f"{v['server_peak_mib']:.0f} / {v['client_peak_mib']:.0f}",
                             "yes" if v["ok"] else "**NO**"])
            elif ("iops", name, None, sc) in failed_keys:
                rows.append([sc, name, "FAILED"] + [""] * 7)
        L.extend(["## net-queue's iops scenarios (bench/iops.py; both directions counted, "
                  "client side; raw-tcp: the same scenario over one blocking socket per side)",
                  ""]
                 + md_table(["scenario", "library", "Gbps", "IOPS", "time (s)", "× net-queue",
                             "× raw-tcp", "CPU µs/op (both processes)",
                             "peak RSS server / client (MiB)",
                             "counts verified"], rows))
    L.extend(distance.markdown(sys.modules[__name__], summary.get("distance"), failed_keys))
    L.extend(storm.markdown(sys.modules[__name__], summary.get("storm"), failed_keys))
    L.extend(idle.markdown(sys.modules[__name__], summary.get("idle"), failed_keys))
    if failed:
        L.extend(["## Failures", "", "(on a timeout, the JSON record's `detail` holds every "
                  "thread's stack of the processes still running and, for netq, their "
                  "`statistics()`)", ""])
        grouped: dict = {}
        for r in failed:
            parts = (r["section"], r["row"], human(r["size"]) if r.get("size") else "",
                     r.get("scenario") or "", "(calibration)" if r.get("calibration") else "")
            what = " ".join(str(x) for x in parts if x)
            reason = r.get("error") or "verification failed: " + json.dumps(
                {k: v for k, v in (r.get("recv") or r.get("client") or {}).items()
                 if k in ("msgs", "bytes", "expected_msgs", "crc_ok", "received", "drained",
                          "peers", "in_order")})
            grouped.setdefault((what, reason.splitlines()[0][:400]), []).append(str(r["rep"]))
        for (what, reason), reps in grouped.items():
            L.append(f"- {what}: {reason} (rep {', '.join(reps)})")
        L.append("")
    return "\n".join(L)


# ============================================================================= README block
README_START = ("<!-- bench:start (generated by `python3 bench/run.py --readme`; "
                "do not edit by hand) -->")
README_END = "<!-- bench:end -->"
# Headline rows of the README, each compared with its own baseline of the same rep.
README_THROUGHPUT = [  # (row, label, baseline row or None)
    ("raw-tcp", "raw TCP, one `sendmsg` per message", None),
    ("zmq-push", "pyzmq PUSH/PULL", "raw-tcp"),
    ("py-queue", "plain-Python queue (the least a `put()`/`get()` queue does:"
     " [bench/workers/pyqueue.py](bench/workers/pyqueue.py))", "raw-tcp"),
    ("netq-tcp", "**netq TCP**", "raw-tcp"),
    ("netq-tcp", "**netq TCP ÷ plain-Python queue**", "py-queue"),
    ("netq-tcp-numpy", "**netq TCP, numpy arrays** (one `ndarray` per `put()`)", "raw-tcp"),
    ("netq-unix", "netq Unix", "raw-tcp"),
    ("raw-unix", "raw Unix socket, one `sendmsg` per message", None),
    ("netq-unix-numpy", "**netq Unix, numpy arrays** (shared memory, default options)",
     "raw-unix"),
    ("netq-unix-noshm-numpy", "netq Unix, numpy arrays, `shared_memory=False`", "raw-unix"),
    ("netq-unix-handout", "**netq Unix, `comm.shared_array`** (no copy)", "raw-unix"),
    ("raw-ssl", "raw `ssl` socket, `sendall` per message", None),
    ("netq-tls", "**netq TLS**", "raw-ssl"),
    ("netq-tcp-batch", "netq `put_many`/`get_many`", "raw-tcp"),
    ("net-queue", "net-queue TCP", "raw-tcp"),
    ("netq-tcp", "**netq TCP ÷ net-queue TCP**", "net-queue"),
    ("raw-grpc", "raw grpcio bidirectional stream", None),
    ("netq-grpc", "**netq gRPC**", "raw-grpc"),
    ("net-queue-grpc", "net-queue gRPC", "raw-grpc"),
    ("mqtt-paho", "raw paho `publish(qos=1)` → subscriber", None),
    ("netq-mqtt", "**netq MQTT** (0 lost unless marked)", "mqtt-paho"),
    ("net-queue-mqtt", "net-queue MQTT", "mqtt-paho"),
]
# The README's CPU table: sender / receiver µs per message, each row next to its peers.
README_CPU = [("raw-tcp", "raw TCP"), ("zmq-push", "pyzmq"),
              ("py-queue", "plain-Python queue"), ("netq-tcp", "**netq TCP**"),
              ("netq-tcp-numpy", "**netq TCP, numpy arrays**"),
              ("raw-ssl", "raw `ssl`"), ("netq-tls", "**netq TLS**"),
              ("net-queue", "net-queue TCP"), ("raw-grpc", "raw grpcio"),
              ("netq-grpc", "**netq gRPC**"), ("mqtt-paho", "raw paho"),
              ("netq-mqtt", "**netq MQTT**")]
README_LATENCY = [("raw-tcp", "raw TCP"), ("zmq", "pyzmq"), ("netq-tcp", "**netq TCP**"),
                  ("netq-unix", "netq Unix"), ("net-queue", "net-queue TCP"),
                  ("raw-grpc", "raw grpcio"), ("netq-grpc", "**netq gRPC**"),
                  ("net-queue-grpc", "net-queue gRPC"), ("mqtt-paho", "raw paho"),
                  ("netq-mqtt", "**netq MQTT**"), ("net-queue-mqtt", "net-queue MQTT"),
                  ("raw-tcp-1proc", "raw TCP, one process"),
                  ("netq-tcp-1proc", "**netq TCP, one process** (× raw TCP, one process)")]


def _per_rep(records: list[dict], section: str, row: str, size=None) -> dict[int, dict]:
    return {r["rep"]: r for r in records
            if r["section"] == section and r["row"] == row and r.get("size") == size
            and not r.get("failed") and not r.get("calibration") and r.get("ok", True)}


def readme_block(results: dict) -> str:
    """The README's benchmark section: medians, spread (min–max over reps) and same-rep ratios."""
    meta, records = results["meta"], results["records"]
    m = meta["machine"]
    sizes = meta["sizes"]
    failures: dict = {}  # (section, row, size) -> reps that failed (timed out or wrong)
    for r in records:
        if (r.get("failed") or not r.get("ok", True)) and not r.get("calibration"):
            failures.setdefault((r["section"], r["row"], r.get("size")), set()).add(r["rep"])
    failed = set(failures) | {(r["section"], r["row"], r.get("size")) for r in records
                              if r.get("failed") or not r.get("ok", True)}
    date = meta["date"][:10]
    lines = [README_START, "",
             f"Measured {date} by `python3 bench/run.py --reps {meta['reps']}"
             + (f" --busy {meta['busy']}`, **with {meta['busy']} busy-loop processes running"
                f" throughout**" if meta.get("busy") else "`") +
             f" ({meta['mode']} mode, median of {meta['reps']} interleaved reps, min–max in"
             f" brackets; {m['cpu_model']},"
             f" {m['cores']} cores, {m['mem_gib']} GiB, kernel {m['kernel']}; Python"
             f" {meta['python']['main']}, net-queue on Python"
             f" {meta['python'].get('net-queue') or 'n/a'};"
             f" loopback; one private mosquitto per MQTT measurement). A ratio compares two rows"
             f" of the same rep (median of the per-rep ratios): × raw TCP, except netq TLS × raw"
             f" `ssl` and the gRPC and MQTT rows × their raw library, the row above them; a"
             f" **÷** row divides netq TCP by the row it names."
             f" Every table (CPU per message, RSS, stalled receiver, many clients, iops):"
             f" [bench/results/latest.md](bench/results/latest.md).",
             "",
             "One-way throughput, one sender process to one receiver process, GB/s"
             " (64 B: messages/s):",
             ""]

    def value(record: dict, size: int) -> float:
        return record["recv"]["msgs_per_s"] if size <= 64 else record["recv"]["gb_per_s"]

    def show(x: float, size: int) -> str:
        return f"{x / 1000:.0f} k" if size <= 64 else f"{x:.2f}"

    rows = []
    for row, label, baseline in README_THROUGHPUT:
        cells = []
        for size in sizes:
            ours = _per_rep(records, "throughput", row, size)
            if not ours:
                cells.append("failed" if ("throughput", row, size) in failed else "")
                continue
            values = [value(r, size) for r in ours.values()]
            lost = sum(r["recv"].get("lost") or 0 for r in ours.values())
            base = _per_rep(records, "throughput", baseline, size) if baseline else {}
            ratios = [value(r, size) / value(base[rep], size) for rep, r in ours.items()
                      if rep in base and value(base[rep], size)]
            if label.startswith("**netq TCP ÷"):
                ratio = median(ratios) if ratios else None
                cells.append("" if ratio is None else f"**×{ratio:.1f}**" if ratio >= 1
                             else f"**×{ratio:.2f}**")
                continue
            text = show(median(values), size)
            if len(values) > 1:
                text += f" ({show(min(values), size)}–{show(max(values), size)})"
            if ratios:
                text += f" ×{median(ratios):.2f}"
            if lost:
                text += f" **{lost} lost**"
            if failures.get(("throughput", row, size)):
                nfailed = len(failures[("throughput", row, size)])
                text += f" (**failed in {nfailed} of {meta['reps']} reps**)"
            cells.append(text)
        if any(cells):
            rows.append([label] + cells)
    lines += md_table(["", *(human(size) for size in sizes)], rows)
    lines += ["CPU per message, µs (sender / receiver; user+sys of each process over the"
              " receiver's timed interval, median over reps; MQTT: without the broker's):", ""]
    rows = []
    for row, label in README_CPU:
        cells = []
        for size in sizes:
            ours = _per_rep(records, "throughput", row, size)
            send = median([_side_cpu_us(r, "send") for r in ours.values()])
            recv = median([_side_cpu_us(r, "recv") for r in ours.values()])
            if send is not None and recv is not None:
                cells.append(f"{_cpu_text(send)} / {_cpu_text(recv)}")
            else:
                cells.append("failed" if ("throughput", row, size) in failed else "")
        if any(cells):
            rows.append([label] + cells)
    lines += md_table(["", *(human(size) for size in sizes)], rows)
    busy = busy_run(results)
    lines += ["64 B round trip, µs: p50 (min–max of the p50s), p99, and p50 × raw TCP of the"
              " same rep" + (f"; on a quiet machine (this run) and on a busy one ({busy['busy']}"
                             f" pure-Python busy-loop processes running, `--busy"
                             f" {busy['busy']}`, {busy['reps']} reps, {busy['date'][:10]})"
                             if busy else "") + ":", ""]
    rows = []
    for row, label in README_LATENCY:
        cells = _latency_cells(records, row, meta["reps"])
        busy_cells = _latency_cells(busy["records"], row, busy["reps"]) if busy else None
        if cells is None and busy_cells is None:
            continue
        if busy:
            rows.append([label, *(cells or ["", "", ""]), *(busy_cells or ["", "", ""])])
        else:
            rows.append([label, *(cells or ["", "", ""])])
    headers = ["", "p50", "p99", "p50 × raw TCP"]
    if busy:
        headers += ["busy: p50", "busy: p99", "busy: p50 × raw TCP"]
    lines += md_table(headers, rows)
    lines += targets_block(results)
    lines.append(README_END)
    return "\n".join(lines)


def _latency_cells(records: list[dict], row: str, reps: int) -> list[str] | None:
    """p50 (min–max), p99 and p50 × raw TCP of the same rep for one round-trip row; None when
    the row was not measured."""
    ours = _per_rep(records, "latency", row, PING_SIZE)
    failed = sum(1 for r in records if r["section"] == "latency" and r["row"] == row
                 and (r.get("failed") or not r.get("ok", True)))
    if not ours:
        return ["failed", "", ""] if failed else None
    raw = _per_rep(records, "latency", latency_base(row), PING_SIZE)
    p50 = [r["ping"]["p50_us"] for r in ours.values()]
    ratios = [r["ping"]["p50_us"] / raw[rep]["ping"]["p50_us"]
              for rep, r in ours.items() if rep in raw]
    text = f"{median(p50):.0f} ({min(p50):.0f}–{max(p50):.0f})"
    if failed:
        text += f" (**failed in {failed} of {reps} reps**)"
    return [text, f"{median([r['ping']['p99_us'] for r in ours.values()]):.0f}",
            f"×{median(ratios):.2f}" if ratios else ""]


BUSY_SECTIONS = ("throughput", "latency")   # what --busy-results attaches of a --busy run


def attach_busy_run(results: dict, busy_results: dict) -> None:
    """Copy the throughput and round-trip records of a ``--busy`` run into ``results``
    (``results["busy"]``: busy, date, reps, sizes, records), so that the Markdown and the
    README show them next to this run's (quiet) ones from one results file."""
    meta = busy_results["meta"]
    if not meta.get("busy"):
        raise SystemExit("--busy-results: that run was not made with --busy N")
    results.pop("busy_latency", None)       # the older form of the same attachment
    results["busy"] = {
        "busy": meta["busy"], "date": meta["date"], "reps": meta["reps"],
        "sizes": meta.get("sizes", SIZES),
        "records": [r for r in busy_results["records"] if r["section"] in BUSY_SECTIONS]}


def busy_run(results: dict) -> dict | None:
    """The attached ``--busy`` run (:func:`attach_busy_run`), or None. Results files written
    before throughput was attached carry only its round trips, as ``busy_latency``."""
    busy = results.get("busy") or results.get("busy_latency")
    if busy is None:
        return None
    return {"sizes": [], **busy}


# ============================================================================= targets
# The per-message path's targets (issue 19), each a ratio of two rows of the same rep.
TCP_THROUGHPUT_BOUNDS = {64: 1.0, 4 * KiB: 1.0, 64 * KiB: 0.9, MiB: 0.9, 16 * MiB: 0.9}
ZMQ_FROM = 64 * KiB         # netq TCP >= pyzmq PUSH/PULL from this size up
CPU_BOUND = 2.0             # CPU per message / per round trip, both sides, x raw TCP's
ROUND_TRIP_BOUND = 1.5      # 64 B round trip p50 x raw TCP, and netq gRPC x raw grpcio
IN_PROCESS_ROUND_TRIP_BOUND = 2.0   # both ends in one process, x raw TCP in one process
TLS_SIZE, TLS_BOUND = MiB, 0.8
BUSY_TOLERANCE = 0.20       # a busy run's throughput and CPU ratios stay this close to quiet


@dataclass(frozen=True)
class Target:
    """One target: ``row`` ÷ ``base`` (same section, size and rep) on ``metric``, within
    ``bound`` (at most for CPU and latency, at least for rates)."""

    label: str
    section: str
    row: str
    base: str
    size: int | None
    # "rate" (GB/s), "cpu" (µs per message), "p50", "rt-cpu" (per round trip), "recv-peak" (the
    # receiver's peak RSS ÷ RSS_ALLOWANCE of the size: ``base`` is "", the ratio the value)
    metric: str
    bound: float
    at_most: bool       # the ratio must be <= bound (CPU, latency), else >= bound (rates)

    @property
    def busy_checked(self) -> bool:
        """Throughput and CPU ratios must also hold, within BUSY_TOLERANCE, on a busy run."""
        return self.metric != "p50"

    def ratio(self, records: list[dict]) -> float | None:
        """Median over reps of this row's value ÷ the base row's, in the same rep."""
        ours = _per_rep(records, self.section, self.row, self.size)
        if not self.base:
            return median([_target_value(record, self.metric) for record in ours.values()])
        base = _per_rep(records, self.section, self.base, self.size)
        ratios = []
        for rep, record in ours.items():
            if rep in base:
                a, b = _target_value(record, self.metric), _target_value(base[rep], self.metric)
                if a is not None and b:
                    ratios.append(a / b)
        return median(ratios)

    def tried(self, records: list[dict]) -> bool:
        """Was the row under test measured (or did it fail) in these records?"""
        return any(r["section"] == self.section and r["row"] == self.row
                   and r.get("size") == self.size for r in records)

    def failed(self, records: list[dict]) -> bool:
        """Did a measurement of either row fail in these records?"""
        return any(r["section"] == self.section and r["row"] in (self.row, self.base)
                   and r.get("size") == self.size and (r.get("failed") or not r.get("ok", True))
                   for r in records)

    def met(self, ratio: float) -> bool:
        return ratio <= self.bound if self.at_most else ratio >= self.bound


def _target_value(record: dict, metric: str) -> float | None:
    if metric == "rate":
        return record["recv"].get("gb_per_s")
    if metric == "recv-peak":
        peak = record["recv"].get("peak_rss_kb")
        return peak * KiB / rss_allowance(record["size"]) if peak else None
    if metric == "cpu":
        return record["recv"].get("cpu_us_per_msg")
    if metric == "p50":
        return record["ping"].get("p50_us")
    if metric == "rt-cpu":
        cpu = _round_trip_cpu_us(record)
        return sum(cpu) if cpu else None
    raise ValueError(f"unknown target metric {metric!r}")


SHM_SIZES = (16 * MiB, 256 * MiB)  # where the same-host targets apply
SHM_BOUND = 2.0  # numpy arrays over netq Unix (shared memory) ≥ 2 × a raw Unix socket
SHM_HANDOUT_BOUND = 4.0  # and from comm.shared_array ≥ 4 ×
# Every kind of large part over Unix (issue 54): through shared memory ≥ 2 × a raw Unix socket
# (KIND_SHM_BOUND, as SHM_BOUND), with shared_memory=False ≥ 0.9 × at 256 MiB, and netq's
# receiver within RSS_ALLOWANCE on either road.
KIND_SHM_BOUND = 2.0
KIND_SOCKET_SIZE, KIND_SOCKET_BOUND = 256 * MiB, 0.9
# Unix without shared memory ≥ netq TCP, numpy arrays, at these sizes.
UNIX_OVER_TCP_SIZES = (64 * KiB, MiB, 16 * MiB)


def rss_allowance(size: int) -> float:
    """Bytes a receiver of ``size``-byte messages may peak at: 60 MiB + 1.5 messages."""
    return 60 * MiB + 1.5 * size


def targets(sizes: list[int]) -> list[Target]:
    """Every target of the per-message path that bench/run.py measures, at the run's sizes."""
    out = [Target(f"netq TCP one-way × raw TCP, {human(size)}", "throughput", "netq-tcp",
                  "raw-tcp", size, "rate", TCP_THROUGHPUT_BOUNDS[size], False)
           for size in sizes if size in TCP_THROUGHPUT_BOUNDS]
    out += [Target(f"netq TCP one-way × pyzmq PUSH/PULL, {human(size)}", "throughput",
                   "netq-tcp", "zmq-push", size, "rate", 1.0, False)
            for size in sizes if size >= ZMQ_FROM]
    out += [Target(f"CPU per message (sender + receiver), netq TCP × raw TCP, {human(size)}",
                   "throughput", "netq-tcp", "raw-tcp", size, "cpu", CPU_BOUND, True)
            for size in sizes]
    out += [Target(f"{PING_SIZE} B round trip p50, netq TCP × raw TCP", "latency", "netq-tcp",
                   "raw-tcp", PING_SIZE, "p50", ROUND_TRIP_BOUND, True),
            Target(f"CPU per {PING_SIZE} B round trip (ping + echo), netq TCP × raw TCP",
                   "latency", "netq-tcp", "raw-tcp", PING_SIZE, "rt-cpu", CPU_BOUND, True),
            Target(f"{PING_SIZE} B round trip p50, netq gRPC × raw grpcio", "latency",
                   "netq-grpc", "raw-grpc", PING_SIZE, "p50", ROUND_TRIP_BOUND, True),
            Target(f"{PING_SIZE} B round trip p50, server and client in one process, netq TCP"
                   " × raw TCP in one process", "latency", "netq-tcp-1proc", "raw-tcp-1proc",
                   PING_SIZE, "p50", IN_PROCESS_ROUND_TRIP_BOUND, True),
            Target(f"CPU per {PING_SIZE} B round trip in one process, netq TCP × raw TCP in one"
                   " process",
                   "latency", "netq-tcp-1proc", "raw-tcp-1proc", PING_SIZE, "rt-cpu", CPU_BOUND,
                   True)]
    if TLS_SIZE in sizes:
        out.append(Target(f"netq TLS one-way × raw `ssl`, {human(TLS_SIZE)}", "throughput",
                          "netq-tls", "raw-ssl", TLS_SIZE, "rate", TLS_BOUND, False))
    # Same host (issue 38): numpy arrays over netq Unix with default options (shared memory),
    # and from a buffer netq handed out, × a raw Unix socket.
    out += [Target(f"netq Unix numpy arrays one-way × raw Unix socket, {human(size)}",
                   "throughput", "netq-unix-numpy", "raw-unix", size, "rate", SHM_BOUND, False)
            for size in sizes if size in SHM_SIZES]
    out += [Target(f"netq Unix `comm.shared_array` one-way × raw Unix socket, {human(size)}",
                   "throughput", "netq-unix-handout", "raw-unix", size, "rate",
                   SHM_HANDOUT_BOUND, False)
            for size in sizes if size in SHM_SIZES]
    for row in KIND_ROWS:
        shm = "-noshm" not in row.name
        out += [Target(f"{row.name} one-way × raw Unix socket, {human(size)}", "throughput",
                       row.name, "raw-unix", size, "rate",
                       KIND_SHM_BOUND if shm else KIND_SOCKET_BOUND, False)
                for size in sizes if size in SHM_SIZES and (shm or size == KIND_SOCKET_SIZE)]
        out += [Target(f"{row.name} receiver peak RSS ÷ (60 MiB + 1.5 × {human(size)})",
                       "throughput", row.name, "", size, "recv-peak", 1.0, True)
                for size in sizes if size in SHM_SIZES]
    out += [Target(f"netq Unix (shared_memory=False) numpy arrays one-way × netq TCP, "
                   f"{human(size)}", "throughput", "netq-unix-noshm-numpy", "netq-tcp-numpy",
                   size, "rate", 1.0, False)
            for size in sizes if size in UNIX_OVER_TCP_SIZES]
    return out


def within_busy_tolerance(quiet: float, busy: float) -> bool:
    """Is the busy run's ratio within BUSY_TOLERANCE (relative) of the quiet run's?"""
    return abs(busy / quiet - 1) <= BUSY_TOLERANCE


def targets_block(results: dict) -> list[str]:
    """The README's targets table: each target's ratio in this run and whether it is met;
    with an attached --busy run, its ratio too, whether it is met, and for throughput and
    CPU whether it stays within BUSY_TOLERANCE of this run's."""
    meta, records = results["meta"], results["records"]
    busy = busy_run(results)
    busy_records = busy["records"] if busy else []
    sizes = sorted(set(meta["sizes"]) | set(busy["sizes"] if busy else []))
    rows = []
    for target in targets(sizes):
        if not (target.tried(records) or target.tried(busy_records)):
            continue
        quiet = target.ratio(records)
        cells = [target.label, f"{'≤' if target.at_most else '≥'} ×{target.bound:.1f}",
                 *_ratio_met(target, quiet, target.failed(records))]
        if busy:
            loaded = target.ratio(busy_records)
            cells += _ratio_met(target, loaded, target.failed(busy_records))
            if not target.busy_checked:
                cells.append("")
            elif quiet is None or loaded is None:
                cells.append("—")
            else:
                change = f"{(loaded / quiet - 1) * 100:+.1f} %"
                cells.append(f"yes ({change})" if within_busy_tolerance(quiet, loaded)
                             else f"**no** ({change})")
        rows.append(cells)
    if not rows:
        return []
    this_run = "this run" + (f" (`--busy {meta['busy']}`)" if meta.get("busy") else "")
    headers = ["target", "bound", this_run, "met"]
    text = ("Targets of the per-message path, each a ratio of two rows of the same rep, or of a"
            " receiver's peak RSS to what it may hold (median"
            " over reps; — where a run did not measure it); CPU is user+sys of both processes"
            " over the timed interval (sender + receiver per message, ping + echo per round"
            " trip)")
    if busy:
        headers += [f"`--busy {busy['busy']}`", "met",
                    f"within {BUSY_TOLERANCE * 100:.0f} % of {this_run}"]
        text += (f"; a busy machine ({busy['busy']} busy-loop processes, `--busy"
                 f" {busy['busy']}`, {busy['reps']} reps, {busy['date'][:10]}) must meet the"
                 f" same bounds, and its throughput and CPU ratios must stay within"
                 f" {BUSY_TOLERANCE * 100:.0f} % of this run's")
    return [text + ":", ""] + md_table(headers, rows)


def _ratio_met(target: Target, ratio: float | None, failed: bool) -> list[str]:
    """The ratio and whether it meets the target; "failed" or "—" (not measured) without one."""
    if ratio is None:
        return ["failed" if failed else "—", ""]
    return [f"×{ratio:.2f}", "yes" if target.met(ratio) else "**no**"]


def _cpu_text(us: float) -> str:
    """Three significant digits, without exponents: 1.6 / 14.2 / 535 / 8920."""
    return f"{us:.3g}" if us < 1000 else f"{us:.0f}"


def update_readme(path: str, results: dict) -> None:
    """Replace the block between the bench markers in ``path`` (a README) with
    :func:`readme_block`."""
    with open(path) as f:
        text = f.read()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no benchmark markers ({README_START!r} ... {README_END!r})")
    text = text[:start] + readme_block(results) + text[end + len(README_END):]
    with open(path, "w") as f:
        f.write(text)


# ============================================================================= main
def machine_info() -> dict:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"cpu_model": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "machine": platform.machine(), "mem_gib": round(mem_kb / MiB, 1),
            "loadavg": os.getloadavg()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 rep, 0.15 s per measurement")
    p.add_argument("--reps", type=int, help="repetitions (default 5, --quick 1)")
    p.add_argument("--only", help="comma list of row names (raw-tcp, netq-tcp, net-queue, zmq, "
                                  "...) and/or sections (" + ", ".join(SECTIONS) + "); when both "
                                  "kinds are given a measurement must match both")
    p.add_argument("--sizes", help="comma list of throughput sizes, e.g. 64,4K,1M "
                                   "(default 64,4K,64K,1M,16M)")
    p.add_argument("--target", type=float, help="seconds per throughput measurement")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds per measurement before its processes are killed (default 30; "
                        "throughput gets half, many-clients and iops twice as long). A "
                        f"measurement that timed out in {MAX_TIMEOUTS} reps is not tried again.")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="run with N pure-Python busy-loop processes for the whole run (a busy "
                        "machine: e.g. --busy 2 --only throughput,latency); recorded in the "
                        "results")
    p.add_argument("--busy-results", metavar="JSON",
                   help="results of a --busy run: its throughput and round-trip records are "
                        "attached to this run's results (with --render: that file is rewritten) "
                        "and shown next to the quiet ones in the Markdown and the README, whose "
                        "targets table then checks them too")
    p.add_argument("--json", default=os.path.join(HERE, "results", "latest.json"),
                   help="results file (the Markdown goes next to it, .md)")
    p.add_argument("--render", metavar="JSON",
                   help="only print the tables of an earlier results file")
    p.add_argument("--readme", nargs="?", const=os.path.join(os.path.dirname(HERE), "README.md"),
                   metavar="README", help="also rewrite the benchmark block of the README (default "
                                          "the repository's) from these results (with --render: "
                                          "from that file)")
    return p


def write_results(path: str, results: dict, md: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(md + "\n")


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        if args.busy_results:
            with open(args.busy_results) as f:
                attach_busy_run(results, json.load(f))
            write_results(args.render, results, markdown(results))
        print(markdown(results))
        if args.readme:
            update_readme(args.readme, results)
        return 0
    if args.busy < 0:
        raise SystemExit("--busy: a number of processes, >= 0")
    ctx = Context(args)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)     # so every `finally` below runs
    busy = BusyLoops(args.busy)
    try:
        busy.start()
        info = ctx.probe()
        now = datetime.datetime.now().astimezone()
        results = {"meta": {"date": now.isoformat(timespec="seconds"),
                            "mode": "quick" if ctx.quick else "full", "reps": ctx.reps,
                            "target_s": ctx.target_s, "sizes": ctx.sizes,
                            "only": sorted(ctx.only or []), "busy": args.busy,
                            "argv": sys.argv, "machine": machine_info(),
                            "python": {"orchestrator": sys.version.split()[0],
                                       "main": info.get("python"),
                                       "net-queue": (info.get("net-queue") or {})
                                       .get("python_version")},
                            "packages": info, "missing": ctx.missing},
                   "notes": ctx.notes, "records": ctx.records}
        for note in ctx.notes:
            log("NOTE: " + note)
        for rep in range(ctx.reps):
            throughput_rep(ctx, rep)
            latency_rep(ctx, rep)
            scenarios_rep(ctx, rep)
            iops_rep(ctx, rep)
            distance.rep(sys.modules[__name__], ctx, rep)
            storm.rep(sys.modules[__name__], ctx, rep)
            idle.rep(sys.modules[__name__], ctx, rep)
            log(f"--- rep {rep} done, {time.monotonic() - started:.0f} s elapsed")
    finally:
        busy.stop()
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    results["meta"]["wall_s"] = time.monotonic() - started
    results["summary"] = summarize(ctx.records)
    results["summary"]["distance"] = distance.summarize(sys.modules[__name__], ctx.records)
    results["summary"]["storm"] = storm.summarize(sys.modules[__name__], ctx.records)
    results["summary"]["idle"] = idle.summarize(sys.modules[__name__], ctx.records)
    if args.busy_results:
        with open(args.busy_results) as f:
            attach_busy_run(results, json.load(f))
    md = markdown(results)
    write_results(args.json, results, md)
    if args.readme:
        update_readme(args.readme, results)
    print(md)
    log(f"wrote {args.json} and {os.path.splitext(args.json)[0]}.md "
        f"in {results['meta']['wall_s']:.0f} s")
    bad = [r for r in ctx.records if r.get("failed") or not r.get("ok", True)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
