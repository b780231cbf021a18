"""Connection storm: many clients created at once against one default TCP server (issue 25).

    python3 bench/storm.py                       # 2000 clients, 8 processes of 250, one run
    python3 bench/storm.py --runs 10 --restart   # the acceptance: 10 runs in a row, each
                                                 # also killing and restarting the server
    python3 bench/storm.py --clients 300 --processes 4 --restart --json out.json
    nice -n 10 python3 bench/storm.py --clients 10000 --processes 8    # issue 39's storm
    python3 bench/storm.py --tls --profile /tmp/server.prof            # TLS; cProfile of
                                                                       # the server's loop
    python3 bench/storm.py --clients 10000 --tls --busy 2              # beside 2 busy loops

One run: a server with default options in a child process; ``--processes`` child processes
each create their share of the clients in one loop (default options, nothing staggered) and
put one message each; the run waits until the server has every one of them, then broadcasts
one message and waits until every client has it. With ``--restart`` the server is then killed
(SIGKILL) and a new one started on the same port; every client puts a second message at
once (it waits in the client until the new server is reachable), the run waits until the new
server has all of them and broadcasts again.

Per run it reports: seconds from the start of the client processes until the server had every
client's first message ("all connected") and what that makes in handshakes per second; the
server's CPU time (user + system) from listening until it had every first message, per client;
each client's connect time, from the creation of its communicator until its first put was
acknowledged (p50, p99, max); how long the broadcast took to reach everyone; after a restart,
seconds from the new server's start until it had every client's second message; messages lost
(put and never received, or broadcast and never received); the server's resident memory (RSS)
when it listens, once every client is connected and after the broadcast (bench/idle.py reports
it per client); and the WARNINGs the clients logged (in all, and the most one process logged),
with how many of them claimed "0 attempts" or "refused" (every connection refusal a client saw
is counted by errno, so a "refused" in a WARNING can be checked against what the kernel said).

Children speak one JSON line per answer on stdout; their stderr goes to a log file kept
(and named in the output) when a run fails. ``NETQ_STORM_DEBUG=1`` logs netq's DEBUG lines there
too: every link a side dropped and why, every failed connection attempt.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BENCH_CLIENTS, BENCH_PROCESSES = 2000, 8  # bench/run.py's storm row


def _reply(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # about 4 descriptors per communicator (socket, selector, wake pair)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ============================================================================ children

def _log_to_stderr() -> None:
    """netq's WARNINGs (and INFO) into this child's log file, with the time."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("netq")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if os.environ.get("NETQ_STORM_DEBUG") else logging.INFO)


def _cpu_seconds() -> float:
    """This process's CPU time so far (user + system, all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _security(tls_dir: str | None, server: bool):
    """TLS options from the certificates in ``tls_dir`` (made by the parent), or None."""
    import netq as nq

    if not tls_dir:
        return None
    folder = Path(tls_dir)
    if server:
        return nq.SecurityOptions(key=folder / "server.key", certificate=folder / "server.pem")
    return nq.SecurityOptions(certificate=folder / "ca.pem")


def _profile_loop() -> Callable[[str], None]:
    """Profile the server's loop on whichever thread runs it (the I/O thread, or a get()
    leading it), one profiler per thread; returns what writes them to files PATH.<n>."""
    import cProfile

    from netq import loop

    profilers: dict[int, cProfile.Profile] = {}

    def profiled(method):
        def run(*args, **kwargs):
            profiler = profilers.setdefault(threading.get_ident(), cProfile.Profile())
            profiler.enable()
            try:
                return method(*args, **kwargs)
            finally:
                profiler.disable()
        return run

    loop.IOLoop._run = profiled(loop.IOLoop._run)  # type: ignore[method-assign]
    loop.IOLoop.lead = profiled(loop.IOLoop.lead)  # type: ignore[method-assign]

    def dump(path: str) -> None:
        for index, profiler in enumerate(list(profilers.values())):
            profiler.dump_stats(f"{path}.{index}")

    return dump


def server_main(port: int, tls_dir: str | None = None) -> None:
    """A default TCP server: counts the (client, tag) messages it gets, broadcasts on demand."""
    import netq as nq

    _raise_fd_limit()
    _log_to_stderr()
    profile = os.environ.get("NETQ_STORM_PROFILE")
    dump_profile = _profile_loop() if profile else None
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation("127.0.0.1", port),
                                     security=_security(tls_dir, server=True))
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, options)
    received: set[tuple] = set()
    duplicates = 0
    lock = threading.Lock()

    def receive() -> None:
        nonlocal duplicates
        while True:
            try:
                message = server.get(timeout=0.5)
            except nq.Empty:
                continue
            except nq.ResourceClosed:
                return
            with lock:
                if message.data in received:
                    duplicates += 1
                received.add(message.data)

    reader = threading.Thread(target=receive, name="storm-server-get", daemon=True)
    reader.start()
    _reply(port=server.address[1], cpu=_cpu_seconds())
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "count":
            tag = command["tag"]
            with lock:
                count = sum(1 for data in received if data[1] == tag)
            _reply(count=count, duplicates=duplicates, peers=len(server.statistics().peers),
                   cpu=_cpu_seconds())
        elif op == "broadcast":
            started = time.monotonic()
            future = server.put(("broadcast", command["tag"]))
            try:
                future.result(command["timeout"])
                _reply(ok=True, seconds=time.monotonic() - started)
            except Exception as error:  # noqa: BLE001 - reported to the parent
                _reply(ok=False, error=repr(error), seconds=time.monotonic() - started)
        elif op == "close":
            server.close(timeout=5)
            reader.join(10)
            if dump_profile is not None and profile:
                dump_profile(profile)
            _reply(closed=True)
            return


class _WarningCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.zero_attempts = 0
        self.refused = 0
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.count += 1
        if "(0 attempts" in text:
            self.zero_attempts += 1
        if "refused" in text:
            self.refused += 1
        if len(self.samples) < 5:
            self.samples.append(text)


def clients_main(port: int, first: int, count: int, timeout: float,
                 tls_dir: str | None = None) -> None:
    """``count`` default clients created at once; each puts (index, "hello") and waits."""
    import netq as nq

    _raise_fd_limit()
    warnings = _WarningCounter()
    logging.getLogger("netq").addHandler(warnings)
    _log_to_stderr()
    netloc = nq.NetworkLocation("127.0.0.1", port)
    security = _security(tls_dir, server=False)
    created: list[float] = []
    acked: list[float | None] = [None] * count
    cpu_at_start = _cpu_seconds()
    clients = []
    for _ in range(count):
        created.append(time.monotonic())
        clients.append(nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT,
                              nq.CommunicatorOptions(netloc=netloc, security=security)))
    futures = []
    for index, client in enumerate(clients):
        future = client.put((first + index, "hello"))

        def done(_future, index=index) -> None:
            acked[index] = time.monotonic()

        future.add_done_callback(done)
        futures.append(future)
    failed = _wait_all(futures, timeout)
    # A future's done-callbacks run just after result() returns in a waiter: give the last
    # ones a moment (bounded) before reading the times they record.
    settle = time.monotonic() + 10
    while any(a is None and f.done() for a, f in zip(acked, futures, strict=True)) \
            and time.monotonic() < settle:
        time.sleep(0.01)
    connect = sorted(acked[i] - created[i] for i in range(count) if acked[i] is not None)
    _reply(connected=len(connect), failures=len(failed), failed=failed[:5], connect=connect,
           first_created=created[0], last_acked=max(filter(None, acked), default=None),
           cpu=_cpu_seconds() - cpu_at_start)

    def warned() -> dict:
        return {"warnings": warnings.count, "zero_attempts": warnings.zero_attempts,
                "refused_warnings": warnings.refused, "samples": warnings.samples}

    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "get":
            expected = ("broadcast", command["tag"])
            got = 0
            wrong: list[str] = []
            deadline = time.monotonic() + command["timeout"]
            for client in clients:
                try:
                    message = client.get(timeout=max(0.0, deadline - time.monotonic()))
                except nq.Empty:
                    continue
                if message.data == expected:
                    got += 1
                else:
                    wrong.append(repr(message.data)[:100])
            reconnects = sum(peer.reconnects for client in clients
                             for peer in client.statistics().peers)
            _reply(got=got, wrong=len(wrong), wrong_samples=wrong[:3], reconnects=reconnects,
                   **warned())
        elif op == "put":
            tag = command["tag"]
            futures = [client.put((first + index, tag)) for index, client in enumerate(clients)]
            _reply(queued=len(futures))
            failed = _wait_all(futures, command["timeout"])
            _reply(failures=len(failed), failed=failed[:5], last_done=time.monotonic())
        elif op == "close":
            for client in clients:
                client.close(timeout=5)
            _reply(closed=True, **warned())
            return


def _wait_all(futures: list, timeout: float) -> list[str]:
    """Wait for every future until ``timeout`` s from now; the failures, as text."""
    failed = []
    deadline = time.monotonic() + timeout
    for future in futures:
        try:
            future.result(max(0.0, deadline - time.monotonic()))
        except Exception as error:  # noqa: BLE001 - reported to the parent
            failed.append(repr(error))
    return failed


# ============================================================================ the parent

class Child:
    """A child process of this script, answering one JSON line per command."""

    def __init__(self, name: str, args: list[str], log_dir: Path, nice: int = 0) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, bufsize=1, env=env,
                                     preexec_fn=(lambda: os.nice(nice)) if nice else None)
        self._lines: list[str] = []
        self._ready = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"storm-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._ready:
                self._lines.append(line)
                self._ready.notify_all()
        with self._ready:
            self._lines.append("")  # end of output
            self._ready.notify_all()

    def expect(self, timeout: float) -> dict:
        """The next answer; RuntimeError if none comes within ``timeout`` s or the child ends."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._lines, timeout):
                raise RuntimeError(f"{self.name}: no answer within {timeout:.0f} s "
                                   f"(log: {self.log_path})")
            line = self._lines.pop(0)
        if not line:
            raise RuntimeError(f"{self.name} ended (exit {self.proc.wait(5)}; "
                               f"log: {self.log_path})")
        return json.loads(line)

    def tell(self, **command) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def ask(self, wait: float, **command) -> dict:
        """Send a command; its answer within ``wait`` s."""
        self.tell(**command)
        return self.expect(wait)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.finish()

    def finish(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._reader.join(30)
        self._log.close()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _wait_for_count(server: Child, tag: str, expected: int, timeout: float) -> dict:
    """Poll the server (bounded, every 0.2 s) until it has ``expected`` messages tagged so."""
    deadline = time.monotonic() + timeout
    while True:
        answer = server.ask(timeout, op="count", tag=tag)
        if answer["count"] >= expected or time.monotonic() >= deadline:
            return answer
        time.sleep(0.2)


def server_rss(pid: int) -> int | None:
    """A process's resident set size in bytes (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _tls_dir(log_dir: Path) -> str:
    """A throwaway CA and server certificate for 127.0.0.1 (tests/harness.py makes them)."""
    sys.path.insert(0, str(REPO / "tests"))
    from harness import write_tls_files

    folder = log_dir / "tls"
    folder.mkdir(exist_ok=True)
    write_tls_files(folder)
    return str(folder)


class SyscallCounter:
    """``perf stat -e raw_syscalls:sys_enter`` on one process, from construction to
    :meth:`stop` (the system calls it made meanwhile, all threads); ``count`` stays None
    where perf is missing or may not count (no root, a kernel without the tracepoint)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.count: int | None = None
        self.proc: subprocess.Popen | None = None
        if shutil.which("perf") is not None:
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "-p", str(pid),
                 "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(10)
            for line in self.out.read_text().splitlines():
                fields = line.split(",")
                if "raw_syscalls:sys_enter" in line and fields[0].strip().isdigit():
                    self.count = int(fields[0])
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.proc = None
        return self.count


def run_storm(clients: int = 2000, processes: int = 8, restart: bool = False,
              timeout: float = 300.0, log_dir: Path | None = None,
              stagger: bool = False, client_nice: int = 0, tls: bool = False) -> dict:
    """One storm; a dict of what it measured (``ok`` when nothing was lost or failed).

    ``stagger``: start each client process once the previous one's clients are all connected
    (one process's share at once instead of all of them: bench/idle.py's way).
    ``client_nice``: the client processes' niceness (they stand for other machines; on one
    small machine, many idle clients' timers would otherwise take the server's CPU)."""
    log_dir = Path(tempfile.mkdtemp(prefix="netq-storm-")) if log_dir is None else log_dir
    share = [clients // processes + (1 if i < clients % processes else 0)
             for i in range(processes)]
    result: dict = {"clients": clients, "processes": processes, "restart": restart,
                    "tls": tls, "logs": str(log_dir)}
    tls_args = ["--tls-dir", _tls_dir(log_dir)] if tls else []
    server = Child("server", ["--role", "server", "--port", "0", *tls_args], log_dir)
    children: list[Child] = []
    try:
        listening = server.expect(60)
        port = listening["port"]
        result["server_rss_start"] = server_rss(server.proc.pid)
        syscalls = SyscallCounter(server.proc.pid, log_dir / "server-syscalls.perf")
        started = time.monotonic()
        first = 0
        hellos = []
        for index, count in enumerate(share):
            children.append(Child(f"clients{index}", [
                "--role", "clients", "--port", str(port), "--first", str(first),
                "--count", str(count), "--timeout", str(timeout), *tls_args], log_dir,
                nice=client_nice))
            first += count
            if stagger:
                hellos.append(children[-1].expect(timeout + 60))
        if not stagger:
            hellos = [child.expect(timeout + 60) for child in children]
        connect = [t for hello in hellos for t in hello["connect"]]
        result["connected"] = len(connect)
        result["put_failures"] = sum(hello["failures"] for hello in hellos)
        result["failure_samples"] = [f for hello in hellos for f in hello["failed"]][:5]
        lasts = [hello["last_acked"] for hello in hellos if hello["last_acked"] is not None]
        firsts = [hello["first_created"] for hello in hellos]
        result["all_connected_s"] = max(lasts) - min(firsts) if lasts else None
        result["processes_started_to_all_connected_s"] = max(lasts) - started if lasts else None
        if connect:
            result["connect_p50_s"] = _percentile(connect, 0.50)
            result["connect_p99_s"] = _percentile(connect, 0.99)
            result["connect_max_s"] = max(connect)
        counted = _wait_for_count(server, "hello", clients, 30)
        lost = result["lost_hello"] = clients - counted["count"]
        if lasts:
            result["handshakes_per_s"] = clients / result["all_connected_s"]
        # The server's CPU from listening until it had every first message (and a little idle
        # after, until the count came back): the handshakes and the first puts.
        result["server_cpu_s"] = counted["cpu"] - listening["cpu"]
        result["server_cpu_us_per_client"] = 1e6 * result["server_cpu_s"] / clients
        # The client processes' CPU from their first communicator's creation until all their
        # clients were connected (the handshakes, and whatever else their threads did meanwhile).
        result["client_cpu_us_per_client"] = 1e6 * sum(hello["cpu"] for hello in hellos) / clients
        counted_syscalls = syscalls.stop()  # the same span, a little later (the count's reply)
        result["server_syscalls_per_client"] = (None if counted_syscalls is None
                                                else counted_syscalls / clients)
        duplicates = counted["duplicates"]
        result["server_rss_connected"] = server_rss(server.proc.pid)  # every client idle now
        broadcast = server.ask(timeout, op="broadcast", tag="first", timeout=timeout)
        result["broadcast_ok"] = broadcast["ok"]
        result["broadcast_s"] = broadcast.get("seconds")
        result["broadcast_error"] = broadcast.get("error")
        result["server_rss_broadcast"] = server_rss(server.proc.pid)
        # A failed broadcast reached some clients at most: look, without waiting for long.
        get_timeout = timeout if broadcast["ok"] else min(timeout, 10.0)
        gets = [child.ask(timeout + 60, op="get", tag="first", timeout=get_timeout)
                for child in children]
        result["lost_broadcast"] = clients - sum(get["got"] for get in gets)
        lost += result["lost_broadcast"]
        result["unexpected"] = [w for get in gets for w in get["wrong_samples"]][:5]
        result["reconnects_before_restart"] = sum(get["reconnects"] for get in gets)
        result["warnings_before_restart"] = sum(get["warnings"] for get in gets)
        result["warnings_per_process_max"] = max(get["warnings"] for get in gets)
        result["false_zero_attempts"] = sum(get["zero_attempts"] for get in gets)
        # The server listened the whole time: any "refused" so far is false.
        result["false_refused"] = sum(get["refused_warnings"] for get in gets)
        result["warning_samples"] = [s for get in gets for s in get["samples"]][:3]
        if restart:
            killed = time.monotonic()
            server.kill()
            for child in children:
                child.tell(op="put", tag="again", timeout=timeout)
            for child in children:
                child.expect(60)  # queued while no server runs
            restarted = time.monotonic()
            server = Child("server-restarted", ["--role", "server", "--port", str(port)],
                           log_dir)
            server.expect(60)
            result["server_down_s"] = time.monotonic() - killed  # until it listens again
            agains = [child.expect(timeout + 60) for child in children]
            result["restart_put_failures"] = sum(again["failures"] for again in agains)
            result["failure_samples"] += [f for again in agains for f in again["failed"]][:5]
            result["restart_to_all_resumed_s"] = max(a["last_done"] for a in agains) - restarted
            result["kill_to_all_resumed_s"] = max(a["last_done"] for a in agains) - killed
            counted = _wait_for_count(server, "again", clients, 30)
            result["lost_again"] = clients - counted["count"]
            lost += result["lost_again"]
            duplicates += counted["duplicates"]
            broadcast = server.ask(timeout, op="broadcast", tag="second", timeout=timeout)
            result["broadcast_ok"] = result["broadcast_ok"] and broadcast["ok"]
            result["broadcast_after_restart_s"] = broadcast.get("seconds")
            gets = [child.ask(timeout + 60, op="get", tag="second", timeout=timeout)
                    for child in children]
            result["lost_broadcast_after_restart"] = clients - sum(get["got"] for get in gets)
            lost += result["lost_broadcast_after_restart"]
            result["unexpected"] += [w for get in gets for w in get["wrong_samples"]][:5]
            result["reconnects"] = sum(get["reconnects"] for get in gets)
        result["lost"] = lost
        result["duplicates"] = duplicates
        closes = [child.ask(120, op="close") for child in children]
        result["warnings"] = sum(close["warnings"] for close in closes)
        server.ask(60, op="close")
    finally:
        for child in children:
            child.finish()
        server.finish()
    result["ok"] = (result.get("connected") == clients and not result.get("put_failures")
                    and not result.get("restart_put_failures") and result.get("lost") == 0
                    and bool(result.get("broadcast_ok")) and not result.get("false_zero_attempts")
                    and not result.get("false_refused"))
    return result


def _summary(result: dict) -> str:
    def s(key: str) -> str:
        value = result.get(key)
        return "-" if value is None else f"{value:.2f}"

    failed = "" if result.get("broadcast_ok") else f" FAILED: {result.get('broadcast_error')}"

    text = (f"{result.get('connected', 0)}/{result['clients']} connected, all in "
            f"{s('all_connected_s')} s (p50 {s('connect_p50_s')}, p99 {s('connect_p99_s')}, "
            f"max {s('connect_max_s')} s; {s('handshakes_per_s')} handshakes/s; server CPU "
            f"{s('server_cpu_us_per_client')} us and {s('server_syscalls_per_client')} system "
            f"calls per client; client CPU {s('client_cpu_us_per_client')} us per client); "
            f"broadcast {s('broadcast_s')} s"
            f"{failed}"
            f"; lost {result.get('lost')}; warnings {result.get('warnings')} (at most "
            f"{result.get('warnings_per_process_max')} in one process; false '0 attempts' "
            f"{result.get('false_zero_attempts')}, false 'refused' {result.get('false_refused')})")
    if result["restart"]:
        text += (f"; after the restart all resumed in {s('restart_to_all_resumed_s')} s, "
                 f"broadcast {s('broadcast_after_restart_s')} s")
    return text + ("" if result["ok"] else f"; FAILED (logs: {result['logs']})")


# ============================================================================ bench/run.py row

def rows(Row):
    """bench/run.py's "storm" section: one row, netq over TCP with default options."""
    return [Row("netq-tcp", "", "netq-tcp", "netq")]


def rep(run, ctx, rep_index: int) -> None:
    for row in rows(run.Row):
        if not ctx.usable("storm", row):
            continue
        record = run.measure(ctx, "storm", row.name, rep_index, lambda: run_storm(
            BENCH_CLIENTS, BENCH_PROCESSES, restart=False, timeout=max(120.0, ctx.timeout)))
        if not record.get("failed"):
            run.log(f"storm        {row.name:<15} rep {rep_index}  {_summary(record)}")


def summarize(run, records: list[dict]) -> dict:
    good = [r for r in records if r["section"] == "storm" and not r.get("failed")]
    out = {}
    for name in dict.fromkeys(r["row"] for r in good):
        rs = [r for r in good if r["row"] == name]
        out[name] = {
            "row": name, "reps": len(rs), "ok": all(r["ok"] for r in rs),
            "clients": rs[0]["clients"], "processes": rs[0]["processes"],
            "connected": min(r["connected"] for r in rs),
            "all_connected_s": run.median([r["all_connected_s"] for r in rs]),
            "all_connected_s_max": max(r["all_connected_s"] for r in rs),
            "connect_p99_s": run.median([r["connect_p99_s"] for r in rs]),
            "broadcast_s": run.median([r["broadcast_s"] for r in rs]),
            "lost": sum(r["lost"] for r in rs),
            "warnings": sum(r["warnings"] for r in rs)}
    return out


def markdown(run, summary: dict | None, failed_keys: set) -> list[str]:
    failed = [k[1] for k in failed_keys if k[0] == "storm"]
    if not summary and not failed:
        return []
    table = []
    for name, v in (summary or {}).items():
        table.append([name, f"{v['connected']} / {v['clients']}",
                      f"{v['all_connected_s']:.2f} (max {v['all_connected_s_max']:.2f})",
                      f"{v['connect_p99_s']:.2f}", f"{v['broadcast_s']:.2f}", str(v["lost"]),
                      str(v["warnings"]), "yes" if v["ok"] else "**NO**"])
    table += [[name, "FAILED"] + [""] * 6 for name in failed if name not in (summary or {})]
    return ([f"## Connection storm: {BENCH_CLIENTS} clients created at once in "
             f"{BENCH_PROCESSES} processes against one default TCP server (bench/storm.py)", ""]
            + run.md_table(["row", "connected", "all connected after (s)",
                            "p99 connect (s)", "broadcast to all (s)", "messages lost",
                            "WARNINGs", "verified"], table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--restart", action="store_true",
                        help="kill and restart the server once all are connected")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds each wait of a run may take before the run fails")
    parser.add_argument("--json", help="write every run's results to this file")
    parser.add_argument("--tls", action="store_true", help="TLS (a throwaway CA) instead of TCP")
    parser.add_argument("--busy", type=int, default=0,
                        help="run N pure-Python busy loops beside the storm (a machine with "
                             "other work)")
    parser.add_argument("--nice", type=int, default=0,
                        help="the client processes' niceness (they stand for other machines)")
    parser.add_argument("--profile", help="profile the server's loop (cProfile) into files "
                                          "named PROFILE.*, merged into PROFILE at the end")
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("server", "clients"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "server":
        server_main(args.port, args.tls_dir)
        return
    if args.role == "clients":
        clients_main(args.port, args.first, args.count, args.timeout, args.tls_dir)
        return
    if args.profile:
        os.environ["NETQ_STORM_PROFILE"] = args.profile  # the server child inherits it
    if args.busy < 0:
        raise SystemExit("--busy: a number of processes, >= 0")
    sys.path.insert(0, str(HERE))
    from busy import BusyLoops

    results = []
    busy = BusyLoops(args.busy)
    try:
        busy.start()
        for run in range(args.runs):
            load = os.getloadavg()[0]
            result = run_storm(args.clients, args.processes, args.restart, args.timeout,
                               client_nice=args.nice, tls=args.tls)
            result["load_before"] = load
            result["busy"] = args.busy
            results.append(result)
            print(f"run {run + 1}/{args.runs} (load {load:.1f}"
                  f"{f', {args.busy} busy loops' if args.busy else ''}): {_summary(result)}",
                  flush=True)
    finally:
        busy.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.profile:
        import glob
        import pstats

        parts = sorted(glob.glob(f"{glob.escape(args.profile)}.*"))
        if parts:
            stats = pstats.Stats(*parts)
            stats.dump_stats(args.profile)
            for part in parts:
                os.remove(part)
            print(f"server loop profile: {args.profile} ({len(parts)} parts merged)")
    sys.exit(0 if all(result["ok"] for result in results) else 1)


if __name__ == "__main__":
    main()
