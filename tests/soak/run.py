"""The soak runner: per transport, a server and clients in child processes, every client's link
through its own :class:`netq.lab.relay.Relay`, a seeded schedule of faults, and the invariants of
:mod:`tests.soak.check` judged while it runs and at the end.

The schedule is a pure function of ``(seed, transport, seconds, clients)``
(:func:`make_schedule`): the same seed replays the same faults at the same offsets, and the
peers draw their traffic from the same seed, so a failure is debugged with
``python -m tests.soak --seed S --transports T --minutes M --replay`` (which prints every fault
as it fires). Timing on a loaded machine still differs between runs: deterministic enough to
debug, not bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import netq as nq
from netq.lab.relay import Relay

from .check import Checker, Violation, journal_path

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:  # harness.py and netq_child.py import each other by top name
    sys.path.insert(0, str(TESTS))

from harness import Child, write_tls_files  # noqa: E402
from netq_child import encode_options  # noqa: E402

PEER_SCRIPT = Path(__file__).resolve().parent / "peer.py"
TRANSPORTS = ("tcp", "tls", "unix", "tcp6", "mqtt", "grpc", "grpc-tls")  # tests/conftest.py ids
# MQTT across two bridged mosquittos (tests/transports/mqtt_bridge_testing.py): the server on
# broker A, the clients on broker B; a broker restart hits either one.
EXTRA_TRANSPORTS = ("mqtt-bridge",)
MiB = nq.MiB

# Options every peer runs with: short heartbeats so that a silent link is noticed within the
# fault's length, a short stall_warning so that stalls are common enough to check, budgets
# small enough that a 16 MiB message presses on them.
HEARTBEAT = 0.5
STALL_WARNING = 2.0
RECV_BUDGET = 32 * MiB
SEND_BUDGET = 16 * MiB
MAX_MESSAGE = 16 * MiB  # the largest item
# message_size: the largest item and its numbering; a put_many() batch over it fails with
# MessageTooLarge, the documented error
MESSAGE_LIMIT = MAX_MESSAGE + 64 * 1024
# RSS growth a process may show: the budgets, two largest messages (one being made, one being
# taken apart), and the interpreter's and gRPC's own growth under churn.
RSS_BUDGET = SEND_BUDGET * 4 + RECV_BUDGET + 2 * MAX_MESSAGE + 96 * MiB

# Seconds a new process gets to say it is ready: Python with netq (and grpcio) starting on a
# shared 2-core machine took over 30 s at a load average of 300.
SPAWN_TIMEOUT = 120.0

# Fault kinds and their weights. Link faults act on one client's relay; the rest on processes.
LINK_FAULTS = {"delay": 6, "rate": 4, "blackhole": 4, "reset": 6, "truncate": 4, "refuse": 3}
PROCESS_FAULTS = {"kill_client": 1.5, "close_client": 1, "server_restart": 0.6,
                  "pause_reader": 2.5}
BROKER_FAULTS = {"broker_restart": 0.8}
FAULT_KINDS = (*LINK_FAULTS, *PROCESS_FAULTS, *BROKER_FAULTS)


@dataclasses.dataclass(frozen=True)
class Event:
    at: float  # seconds after the start of the transport's run
    kind: str  # a fault kind, or "undo_<kind>" (the end of a fault with a duration)
    target: int | None  # the client's index (None: the server / the broker)
    args: tuple = ()

    def __str__(self) -> str:
        who = "server" if self.target is None else f"c{self.target}"
        return f"{self.at:8.2f}s {self.kind:<16} {who:<6} {self.args}"


def make_schedule(seed: int, transport: str, seconds: float, clients: int,
                  interval: float) -> list[Event]:
    """The faults for one transport's run: one every ``interval`` s on average."""
    rng = random.Random(f"{seed}/{transport}")
    weights = dict(LINK_FAULTS, **PROCESS_FAULTS)
    if transport.startswith("mqtt"):
        weights.update(BROKER_FAULTS)
    kinds, kind_weights = list(weights), list(weights.values())
    events: list[Event] = []
    at = 2.0
    busy_until: dict[tuple, float] = {}  # one fault with a duration per (kind, target) at once
    while True:
        at += rng.expovariate(1 / interval)
        if at >= seconds:
            break
        kind = rng.choices(kinds, kind_weights)[0]
        target = rng.randrange(clients)
        if kind in ("server_restart", "broker_restart"):
            target = None
        if kind == "pause_reader" and rng.random() < 0.3:
            target = None
        if busy_until.get((kind, target), 0.0) > at:
            continue
        duration = 0.0
        if kind == "delay":
            duration = rng.uniform(0.5, 5)
            args: tuple = (round(rng.uniform(0.001, 0.2), 3), round(rng.uniform(0, 0.05), 3))
        elif kind == "rate":
            duration = rng.uniform(0.5, 5)
            args = (int(2 ** rng.uniform(16, 24)),)  # 64 KiB/s .. 16 MiB/s
        elif kind in ("blackhole", "refuse"):
            duration = rng.uniform(0.2, 4)
            args = ()
        elif kind == "reset":
            args = (rng.random() < 0.7,)  # RST, else a plain close
        elif kind == "truncate":
            args = (rng.randrange(1, 64 * 1024),)
        elif kind in ("kill_client", "server_restart"):
            args = (round(rng.uniform(0, 2), 2),)  # down this long before the restart
        elif kind == "broker_restart":  # down this long; the clients' broker (bridged pair)
            args = (round(rng.uniform(0, 2), 2), transport == "mqtt-bridge" and rng.random() < 0.5)
        elif kind == "close_client":
            args = (rng.choice((None, 0.5, 5.0)),)  # close(timeout=)
        elif kind == "pause_reader":
            args = (round(rng.uniform(0.5, 8), 2),)
        events.append(Event(round(at, 2), kind, target, args))
        if duration:
            end = round(at + duration, 2)
            busy_until[(kind, target)] = end
            events.append(Event(end, f"undo_{kind}", target))
    events.sort(key=lambda event: event.at)
    return events


class SoakFailure(AssertionError):
    pass


@dataclasses.dataclass
class Result:
    seed: int
    transport: str
    seconds: float
    faults: dict[str, int]
    counts: dict
    violations: list[Violation]
    schedule: list[Event]
    fired: list[str]  # what the runner did, with wall-clock offsets
    # what the peers logged at WARNING: (offset from the start of the run, "name.incarnation",
    # text), for the failure report
    warnings: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)


class Cell:
    """One transport's run: its server, clients, relays (and broker), and the checker."""

    def __init__(self, seed: int, transport: str, seconds: float, *, clients: int,
                 interval: float, directory: Path, log=print, verbose: bool = False) -> None:
        self.seed = seed
        self.transport = transport
        self.seconds = seconds
        self.clients = clients
        self.directory = directory
        self.log = log
        self.verbose = verbose
        self.schedule = make_schedule(seed, transport, seconds, clients, interval)
        self.journals = directory / "journals"
        self.journals.mkdir(parents=True)
        self.checker = Checker(self.journals, stall_warning=STALL_WARNING, rss_budget=RSS_BUDGET,
                               message_limit=MESSAGE_LIMIT)
        self.tls = write_tls_files(directory) if transport in ("tls", "grpc-tls") else None
        self.protocol = {"unix": nq.Protocol.UNIX, "mqtt": nq.Protocol.MQTT,
                         "mqtt-bridge": nq.Protocol.MQTT,
                         "grpc": nq.Protocol.GRPC, "grpc-tls": nq.Protocol.GRPC}.get(
                             transport, nq.Protocol.TCP)
        self.host = "::1" if transport == "tcp6" else "127.0.0.1"
        self.ids = {f"c{index}": uuid.UUID(int=random.Random(f"{seed}/{index}").getrandbits(128))
                    for index in range(clients)}
        self.incarnations: dict[str, int] = {}
        self.ended: dict[str, list[float]] = {}
        self.children: dict[str, Child | None] = {}
        self.spawned: list[Child] = []  # every process ever started, for the teardown
        self.closing: set[str] = set()  # clients whose close() runs on a background thread
        self.lock = threading.Lock()  # incarnations and children: the close threads spawn too
        self.relays: list[Relay] = []
        self.broker = None  # the server's broker (MQTT)
        self.client_broker = None  # the clients' broker: the same one, or the bridged one
        self.bridge = None
        self.server_netloc: nq.NetworkLocation | None = None
        self.faults = dict.fromkeys(FAULT_KINDS, 0)
        self.shm_bytes = 0  # through shared memory, as the processes closed at the end said
        self.fired: list[str] = []
        self.started = time.monotonic()
        self.violations: list[Violation] = []
        self.background: list[threading.Thread] = []

    # ------------------------------------------------------------------ processes

    def _options(self, purpose: nq.Purpose, name: str, netloc: nq.NetworkLocation
                 ) -> nq.CommunicatorOptions:
        security = None
        if self.tls is not None:
            security = (nq.SecurityOptions(key=self.tls.server_key,
                                           certificate=self.tls.server_cert)
                        if purpose is nq.Purpose.SERVER
                        else nq.SecurityOptions(certificate=self.tls.ca))
        connection = nq.ConnectionOptions(heartbeat=HEARTBEAT, stall_warning=STALL_WARNING,
                                          recv_budget=RECV_BUDGET, send_budget=SEND_BUDGET)
        return nq.CommunicatorOptions(
            id=self.ids.get(name, uuid.uuid4()), netloc=netloc, connection=connection,
            serialization=nq.SerializationOptions(message_size=MESSAGE_LIMIT),
            security=security)

    def _spawn(self, purpose: nq.Purpose, name: str, netloc: nq.NetworkLocation) -> Child:
        with self.lock:
            incarnation = self.incarnations.get(name, -1) + 1
            self.incarnations[name] = incarnation
        spec = encode_options(self.protocol, purpose, self._options(purpose, name, netloc))
        spec["soak"] = {
            "name": name, "incarnation": incarnation, "seed": self.seed,
            "journal": journal_path(self.journals, name, incarnation),
            "peers": {client: str(peer) for client, peer in self.ids.items()},
            "rate": 15.0 if purpose is nq.Purpose.SERVER else 8.0,
            "large_every": 60, "max_size": MAX_MESSAGE,
            # bounded traffic on a 2-core machine: ~1 MiB/s per process, small ones after
            "budget_bytes": int(max(20.0, self.seconds) * MiB),
        }
        child = Child(spec, self.directory / f"{name}.{incarnation}.log", netloc,
                      script=PEER_SCRIPT, ready_timeout=SPAWN_TIMEOUT)
        with self.lock:
            self.children[name] = child
            self.spawned.append(child)
        return child

    def _start_server(self) -> None:
        if self.server_netloc is None:
            if self.protocol is nq.Protocol.UNIX:
                netloc = nq.NetworkLocation(path=str(self.directory / "server.sock"))
            elif self.protocol is nq.Protocol.MQTT:
                netloc = nq.NetworkLocation(self.broker.host, self.broker.port,
                                            path=f"soak-{self.seed}")
            else:
                netloc = nq.NetworkLocation(self.host, 0)
            child = self._spawn(nq.Purpose.SERVER, "server", netloc)
            if self.protocol in (nq.Protocol.TCP, nq.Protocol.GRPC):
                netloc = nq.NetworkLocation(self.host, child.address[1])
            self.server_netloc = netloc
        else:
            self._spawn(nq.Purpose.SERVER, "server", self.server_netloc)

    def _upstream(self):
        netloc = self.server_netloc
        if self.protocol is nq.Protocol.UNIX:
            return netloc.path
        if self.client_broker is not None:
            return (self.client_broker.host, self.client_broker.port)
        return (netloc.host, netloc.port)

    def _client_netloc(self, relay: Relay) -> nq.NetworkLocation:
        if isinstance(relay.address, str):
            return nq.NetworkLocation(path=relay.address)
        return nq.NetworkLocation(relay.address[0], relay.address[1],
                                  path=self.server_netloc.path
                                  if self.protocol is nq.Protocol.MQTT else None)

    def _end(self, name: str, how: str) -> None:
        child = self.children.get(name)
        if child is None:
            return
        now = time.time()
        self.checker.process_ended(name, self.incarnations[name], how, now)
        self.ended.setdefault(name, []).append(now)
        self._record("ended", name, self.incarnations[name], how, now)
        if how == "kill":
            child.kill()
        child.close()
        self.children[name] = None

    # ------------------------------------------------------------------ faults

    def _record(self, *fields) -> None:
        """The runner's own journal (runner.log): what a later look at the journals needs."""
        with open(self.directory / "runner.log", "a") as log:
            log.write(json.dumps(fields) + "\n")

    def _note(self, text: str) -> None:
        line = f"{time.monotonic() - self.started:8.2f}s {text}"
        self.fired.append(line)
        if self.verbose:
            self.log(f"  [{self.transport}] {line}")

    def _fire(self, event: Event) -> None:
        kind, target = event.kind, event.target
        relay = self.relays[target] if target is not None else None
        name = "server" if target is None else f"c{target}"
        if name in self.closing and kind in ("kill_client", "close_client", "pause_reader"):
            self._note(f"{event} skipped: {name} is closing")
            return
        if not kind.startswith("undo_"):
            self.faults[kind] += 1
        self._note(str(event))
        self._record("fired", time.time(), str(event))
        if kind == "delay":
            relay.shape(delay=event.args[0], jitter=event.args[1])
        elif kind == "undo_delay":
            relay.shape(delay=0.0, jitter=0.0)
        elif kind == "rate":
            relay.shape(rate=float(event.args[0]))
        elif kind == "undo_rate":
            relay.shape(rate=None)
        elif kind == "blackhole":
            relay.blackhole()
        elif kind == "refuse":
            relay.refuse()
            relay.reset()
        elif kind in ("undo_blackhole", "undo_refuse"):
            relay.restore()
        elif kind == "reset":
            relay.reset(rst=event.args[0])
        elif kind == "truncate":
            relay.truncate(event.args[0])
        elif kind == "kill_client":
            self._end(name, "kill")
            time.sleep(event.args[0])
            self._spawn(nq.Purpose.CLIENT, name, self._client_netloc(relay))
        elif kind == "close_client":
            self._close_client(name, relay, event.args[0])
        elif kind == "server_restart":
            self._end("server", "kill")
            time.sleep(event.args[0])
            self._start_server()
        elif kind == "broker_restart":
            broker = self.client_broker if event.args[1] else self.broker
            broker.kill()
            time.sleep(event.args[0])
            broker.start()
        elif kind == "pause_reader":
            child = self.children.get(name)
            if child is not None:
                child.request("pause", seconds=event.args[0])
        else:
            raise ValueError(f"unknown event {kind!r}")

    def _close_client(self, name: str, relay: Relay, timeout: float | None) -> None:
        """close() while the client's traffic runs (on a thread: it may wait for its peer),
        then a new process with the same id."""
        child = self.children.get(name)
        if child is None:
            return
        self.children[name] = None
        self.closing.add(name)
        incarnation = self.incarnations[name]

        def close() -> None:
            how = "close"
            try:
                result = child.request("close", timeout=(timeout or 30) + 40, timeout_=timeout)
            except (RuntimeError, TimeoutError) as error:
                self.violations.append(Violation(time.time(), "close",
                                                 f"{name}.{incarnation}: close(): {error}"))
            else:
                self._note(f"{name}.{incarnation} closed: {result}")
                if result["gave_up"]:
                    how = "gave_up"
            finally:
                now = time.time()
                self.checker.process_ended(name, incarnation, how, now)
                self.ended.setdefault(name, []).append(now)
                self._record("ended", name, incarnation, how, now)
                child.close()
                try:
                    self._spawn(nq.Purpose.CLIENT, name, self._client_netloc(relay))
                except (RuntimeError, TimeoutError) as error:
                    self.violations.append(Violation(time.time(), "harness",
                                                     f"{name} did not restart: {error}"))
                finally:
                    self.closing.discard(name)

        thread = threading.Thread(target=close, name=f"soak-close-{name}", daemon=True)
        thread.start()
        self.background.append(thread)

    # ------------------------------------------------------------------ the run

    def run(self) -> Result:
        try:
            self._setup()
            self._run_schedule()
            self._finish()
        finally:
            self._teardown()
        self.checker.final(self.ended)
        violations = sorted(self.violations + self.checker.violations, key=lambda v: v.t)
        # journal times are wall-clock; the runner's offsets count from self.started
        start_wall = time.time() - (time.monotonic() - self.started)
        warnings = [(t - start_wall, f"{name}.{incarnation}", text)
                    for t, (name, incarnation), text in self.checker.warn_texts]
        return Result(self.seed, self.transport, time.monotonic() - self.started,
                      {kind: count for kind, count in self.faults.items() if count},
                      self.checker.counts() | {"shm_bytes": self.shm_bytes,
                                               "violations": len(violations)},
                      violations, self.schedule, self.fired, warnings)

    def _setup(self) -> None:
        if self.protocol is nq.Protocol.MQTT:
            from netq.lab.brokers import LocalBroker

            if self.transport == "mqtt-bridge":
                from transports.mqtt_bridge_testing import BridgedBrokers

                self.bridge = BridgedBrokers(self.directory / "bridge").start()
                self.broker, self.client_broker = self.bridge.a, self.bridge.b
            else:
                self.broker = LocalBroker(directory=self.directory / "broker").start()
                self.client_broker = self.broker
        self._start_server()
        upstream = self._upstream()
        for index in range(self.clients):
            path = self.directory / f"relay{index}.sock" if isinstance(upstream, str) else None
            # A Unix link's relay forwards descriptors too: shared memory (netq._shm) goes
            # through the faults with the bytes.
            relay = Relay(upstream, path=path, name=f"netq-relay-soak-c{index}",
                          pass_fds=path is not None)
            self.relays.append(relay)
            self._spawn(nq.Purpose.CLIENT, f"c{index}", self._client_netloc(relay))

    def _poll(self) -> None:
        new = self.checker.poll()
        for violation in new:
            self.log(f"  [{self.transport}] VIOLATION {violation} (seed {self.seed})")

    def _run_schedule(self) -> None:
        self.started = time.monotonic()
        next_poll = 0.0
        events = list(self.schedule)
        while True:
            now = time.monotonic() - self.started
            if now >= next_poll:
                self._poll()
                next_poll = now + 2.0
            if events and events[0].at <= now:
                self._fire(events.pop(0))
                continue
            if now >= self.seconds and not events:
                break
            wait = min(next_poll, events[0].at if events else self.seconds) - now
            time.sleep(max(0.0, min(wait, 0.5)))

    def _finish(self) -> None:
        """Faults off; every sender stops and waits for its futures; every receiver drains."""
        for relay in self.relays:
            relay.restore()
            relay.shape(delay=0.0, jitter=0.0, rate=None)
        for thread in self.background:
            thread.join(120)
        waiting = {}
        for name, child in list(self.children.items()):
            if child is not None:
                unresolved = child.request("quiesce", timeout=150, **{"timeout_": 120})
                if unresolved:
                    waiting[name] = unresolved
        for name, seqs in waiting.items():
            self.violations.append(Violation(time.time(), "future", f"{name}: futures "
                                             f"#{seqs[:10]} unresolved 120 s after the faults"))
        quiet, count = time.monotonic(), -1
        while time.monotonic() - quiet < 3 and time.monotonic() - quiet < 60:
            self._poll()
            if self.checker.received_items != count:
                count, quiet = self.checker.received_items, time.monotonic()
            time.sleep(0.5)
        # clients first: a server's close() waits for its clients' goodbyes
        for name, child in sorted(self.children.items(), key=lambda item: item[0] == "server"):
            if child is not None:
                how = "close"
                try:
                    result = child.request("close", timeout=60, timeout_=10)
                except (RuntimeError, TimeoutError) as error:
                    self.violations.append(Violation(time.time(), "close",
                                                     f"{name}: close(): {error}"))
                else:
                    self._note(f"{name} closed: {result}")
                    how = "gave_up" if result["gave_up"] else "close"
                    self.shm_bytes += result.get("shm_bytes", 0)
                self._end(name, how)
        if self.protocol is nq.Protocol.UNIX and not self.shm_bytes:
            self.violations.append(Violation(time.time(), "shm", "no byte went through shared "
                                             "memory over Unix sockets (netq._shm)"))
        self._poll()

    def _teardown(self) -> None:
        for name in list(self.children):
            self._end(name, "kill")
        for thread in self.background:
            thread.join(30)
        for child in self.spawned:
            child.close()
        for relay in self.relays:
            relay.close()
        if self.bridge is not None:
            self.bridge.close()
        elif self.broker is not None:
            self.broker.close()


def run_soak(seed: int, minutes: float, transports: tuple[str, ...], *, clients: int = 3,
             interval: float = 0.6, verbose: bool = False, log=print,
             keep: Path | None = None) -> list[Result]:
    """The soak over ``transports`` one after another, ``minutes`` in all."""
    seconds = minutes * 60 / len(transports)
    results = []
    log(f"soak: seed {seed}, {minutes} min over {', '.join(transports)} "
        f"(replay: python -m tests.soak --seed {seed} --minutes {minutes} "
        f"--transports {','.join(transports)} --replay)")
    root = Path(tempfile.mkdtemp(prefix="nq-soak-")) if keep is None else keep
    try:
        for transport in transports:
            cell = Cell(seed, transport, seconds, clients=clients, interval=interval,
                        directory=root / transport, log=log, verbose=verbose)
            try:
                result = cell.run()
            except Exception as error:  # noqa: BLE001 - reported as that transport's failure
                import traceback

                result = Result(seed, transport, time.monotonic() - cell.started, cell.faults,
                                cell.checker.counts(), [Violation(time.time(), "harness", "".join(
                                    traceback.format_exception(error)))], cell.schedule,
                                cell.fired)
            results.append(result)
            for violation in result.violations[:10]:
                log(f"  [{transport}] {violation}")
            log(f"soak [{transport}] {result.seconds:.0f} s: faults {sum(result.faults.values())}"
                f" {result.faults}; {json.dumps(result.counts)}")
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return results


def report(results: list[Result]) -> str:
    """The failure text: seed, violations, and the schedule up to the last violation."""
    lines = []
    for result in results:
        if not result.violations:
            continue
        lines.append(f"transport {result.transport}, seed {result.seed}: "
                     f"{len(result.violations)} violations")
        lines += [f"  {violation}" for violation in result.violations[:30]]
        # The peers a violation names: their WARNINGs and every fault aimed at them, so that
        # a CI log (which keeps no journals) tells what happened to them.
        peers = {"server"} | {f"c{event.target}" for event in result.schedule
                              if event.target is not None}
        named = {name for name in peers if any(re.search(rf"\b{name}\b", violation.text)
                                               for violation in result.violations)}
        warned = [entry for entry in result.warnings if entry[1].split(".")[0] in named]
        if warned:
            lines.append(f"  what {', '.join(sorted(named))} logged at WARNING:")
            lines += [f"    {t:8.2f}s {process}: {text}" for t, process, text in warned[:40]]
        lines.append("  what the runner did (offsets from the start of the run):")
        about = [line for line in result.fired[:-30]
                 if any(re.search(rf"\b{name}\b", line) for name in named)]
        lines += [f"    {line}" for line in about[-50:] + result.fired[-30:]]
    return "\n".join(lines)
