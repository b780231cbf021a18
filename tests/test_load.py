"""Load: 500 client communicators on one server, mixed sizes, every message checked, fairness.

The clients live in 5 child processes of 100 (``tests/load_child.py``); the server is in
this process. Each client sends 20 messages of 64 B .. 1 MiB (``load_child.size_of``: log-uniform
64 B .. 64 KiB, plus a 1 MiB message from every tenth client and a 256 KiB one from every tenth
other: ~160 MiB in all), all clients at once.

**Fairness, the measure.** netq promises round robin across the peers that have messages
waiting. So the measure is taken where that promise applies: once every one of the N peers
has at least k = 1 message queued at the server (all backlogged, all still flooding), the
server's next N * k get() calls are counted per peer. The spread is
``max |count - mean| / mean`` over peers (mean = k); the issue asks for at most 20 %; round
robin over backlogged peers gives 0. A scheduler that drains one peer before the next (FIFO by
arrival), or favours peers with more or smaller messages, fails it at once. k is 1 because the
server runs with default options: each peer's unread messages stay within its share of the
64 MiB receive budget (about 130 KiB for 500 peers), and a client whose first message is
1 MiB has that one message queued until it is read.

**Memory.** The server's receive budget bounds what it holds however many clients flood it:
``test_500_clients_flooding_an_unread_server_stay_within_its_budget`` offers 500 MiB to a
server that reads nothing until its budget is full.

Figures (server peak RSS, duration, aggregate messages/s, the children's peak RSS) are printed
with ``-s`` and kept in docs/guarantees.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

import psutil
import pytest

import netq as nq
from load_child import payload_of, size_of
from netq_testing import Sampler, rss, wait_for

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
T = 60.0

CLIENTS = 500
MESSAGES = 20
BACKLOG = 1  # k: messages every peer has queued when the fairness window starts
FLOOD_MESSAGES = 64  # per client, of FLOOD_SIZE bytes, in the budget test (500 MiB in all)
FLOOD_SIZE = 16 * 1024


class LoadChild:
    """One process of ``tests/load_child.py`` clients, driven over pipes."""

    def __init__(self, protocol: nq.Protocol, address, first: int, count: int,
                 messages: int, log: Path, size: int | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        spec = {"protocol": protocol.value, "host": address[0], "port": address[1],
                "first": first, "clients": count, "messages": messages, "size": size}
        self._log = open(log, "wb")
        self.log_path = log
        self.proc = subprocess.Popen([sys.executable, str(HERE / "load_child.py"),
                                      json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     bufsize=1, env=env)
        self.first = first
        self.ids: list[uuid.UUID] = []

    def read(self, timeout: float) -> dict:
        result = {}

        def read_line():
            result["line"] = self.proc.stdout.readline()

        reader = threading.Thread(target=read_line, name="load-reader", daemon=True)
        reader.start()
        reader.join(timeout)
        line = result.get("line")
        if not line:
            raise RuntimeError(f"load child {self.proc.pid} silent or gone; log:\n"
                               f"{self.log_path.read_text(errors='replace')[-3000:]}")
        reply = json.loads(line)
        if reply.get("ok") is False:
            raise RuntimeError(f"load child failed: {reply}")
        return reply

    def ready(self, timeout: float) -> None:
        self.ids = [uuid.UUID(text) for text in self.read(timeout)["ids"]]

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def _cpu(children) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by this process and by the children."""
    own = psutil.Process().cpu_times()
    theirs = 0.0
    for child in children:
        times = psutil.Process(child.proc.pid).cpu_times()
        theirs += times.user + times.system
    return own.user + own.system, theirs


def spread(counts: dict) -> float:
    mean = sum(counts.values()) / len(counts)
    return max(abs(count - mean) for count in counts.values()) / mean


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("protocol,processes", [(nq.Protocol.TCP, 5)], ids=["tcp"])
def test_500_clients_mixed_sizes_all_delivered_fairly(tmp_path, protocol, processes):
    """TCP only. gRPC passed this test with 5 x 100 clients on a quiet machine in 72-78 s but
    timed out waiting for the backlog on a loaded one (5 x 100 and 10 x 50): with grpc.aio,
    each communicator runs its own event loop and the CPU cost per message grows with the
    number of gRPC communicators in one process (1 KiB messages: 0.02 ms with one client,
    0.3 ms with 20, 1.6 ms with 100). 200 gRPC clients in one process:
    tests/transports/test_grpc.py::test_200_clients_grpc_one_server_thread."""
    per_process = CLIENTS // processes
    clients = processes * per_process
    total = clients * MESSAGES
    server = nq.new(protocol, nq.Purpose.SERVER,
                    nq.CommunicatorOptions(netloc=nq.NetworkLocation("127.0.0.1", 0)))
    children: list[LoadChild] = []
    figures = {}
    try:
        base = rss()
        with Sampler(rss, interval=0.05) as server_memory:
            started = time.monotonic()
            children = [LoadChild(protocol, server.address, index * per_process,
                                  per_process, MESSAGES, tmp_path / f"load{index}.log")
                        for index in range(processes)]
            for child in children:
                child.ready(T)
            index_of = {peer: child.first + offset
                        for child in children for offset, peer in enumerate(child.ids)}
            try:
                wait_for(lambda: len(server.peers) == clients, 2 * T)
            except AssertionError:
                raise AssertionError(f"{len(server.peers)} of {clients} clients connected "
                                     f"within {2 * T} s") from None
            figures["connect_s"] = time.monotonic() - started
            figures["server_connected_growth_mib"] = round((rss() - base) / nq.MiB, 1)

            flood_started = time.monotonic()
            cpu_before = _cpu(children)
            for child in children:
                child.send("go")
            # The fairness window: every peer backlogged with >= BACKLOG messages.
            wait_for(lambda: all(row.queue_in >= BACKLOG
                                 for row in server.statistics().peers)
                     and len(server.statistics().peers) == clients, 3 * T, interval=0.1,
                     message=f"every peer to have {BACKLOG} messages queued")
            received = {index: [] for index in range(clients)}
            window = {index: 0 for index in range(clients)}
            for position in range(total):
                message = server.get(timeout=T)
                client, seq, crc, payload = message.data
                assert index_of[message.peer] == client, "a message under another peer's id"
                assert len(payload) == size_of(client, seq)
                assert zlib.crc32(payload) == crc and payload == payload_of(client, seq), \
                    f"client {client} message {seq} corrupted"
                received[client].append(seq)
                if position < clients * BACKLOG:
                    window[client] += 1
            flood_s = time.monotonic() - flood_started
            for child in children:
                figures.setdefault("client_s", []).append(round(child.read(T)["seconds"], 2))
            cpu_after = _cpu(children)
            figures["server_cpu_s"] = round(cpu_after[0] - cpu_before[0], 1)
            figures["children_cpu_s"] = round(cpu_after[1] - cpu_before[1], 1)
            for index in range(clients):
                assert received[index] == list(range(MESSAGES)), \
                    f"client {index}: lost, duplicated or out of order"
            fairness = spread(window)
            assert fairness <= 0.20, (fairness, sorted(window.values())[:5],
                                      sorted(window.values())[-5:])
            for child in children:
                child.send("close")
            child_peaks = [child.read(T)["peak_rss"] for child in children]
            wait_for(lambda: not server.peers, T, message="every client to leave")
        total_bytes = sum(size_of(c, s) for c in range(clients) for s in range(MESSAGES))
        figures.update(
            protocol=protocol.value, clients=clients, processes=processes,
            delivered_msgs_per_s=round(total / max(figures["client_s"])), messages=total,
            payload_mib=round(total_bytes / nq.MiB, 1),
            flood_s=round(flood_s, 2), msgs_per_s=round(total / flood_s),
            mib_per_s=round(total_bytes / nq.MiB / flood_s, 1),
            server_peak_rss_mib=round(server_memory.peak / nq.MiB, 1),
            server_growth_mib=round((server_memory.peak - base) / nq.MiB, 1),
            child_peak_rss_mib=round(max(child_peaks) / nq.MiB, 1),
            fairness_spread=fairness, total_s=round(time.monotonic() - started, 2),
            connect_s=round(figures["connect_s"], 2))
        print("\nload figures:", json.dumps(figures))
        assert figures["total_s"] < 150  # target < 90 s (takes ~4-20 s); fail only when far off
    finally:
        for child in children:
            child.close()
        server.close(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_500_clients_flooding_an_unread_server_stay_within_its_budget(tmp_path):
    """500 clients put 64 x 16 KiB each (500 MiB) at a server with default options that reads
    nothing until its receive budget is full: what it holds stays within recv_budget plus, per
    peer, the floor and one message started on positive credit (docs/guarantees.md); then it
    reads everything, complete and in order."""
    from netq.flow import CREDIT_FLOOR

    processes, per_process = 5, CLIENTS // 5
    clients = processes * per_process
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER,
                    nq.CommunicatorOptions(netloc=nq.NetworkLocation("127.0.0.1", 0)))
    budget = server.options.connection.recv_budget
    engine = server._engine
    children: list[LoadChild] = []
    try:
        children = [LoadChild(nq.Protocol.TCP, server.address, index * per_process,
                              per_process, FLOOD_MESSAGES, tmp_path / f"flood{index}.log",
                              size=FLOOD_SIZE) for index in range(processes)]
        for child in children:
            child.ready(T)
        wait_for(lambda: len(server.peers) == clients, 2 * T,
                 message=f"{clients} clients to connect")
        base = rss()
        with Sampler(lambda: engine.budget.held_bytes + engine.budget.outstanding_bytes) as held, \
                Sampler(rss, interval=0.05) as server_memory:
            for child in children:
                child.send("go")
            # The clients put far more than the budget holds: wait for the budget to fill.
            wait_for(lambda: engine.budget.held_bytes >= budget - clients * FLOOD_SIZE, 3 * T,
                     interval=0.1, message="the receive budget to fill")
            peak_held = held.peak
            offered = clients * FLOOD_MESSAGES * FLOOD_SIZE
            received = {index: 0 for index in range(clients)}
            index_of = {peer: child.first + offset
                        for child in children for offset, peer in enumerate(child.ids)}
            for _ in range(clients * FLOOD_MESSAGES):
                message = server.get(timeout=T)
                client, seq, crc, payload = message.data
                assert index_of[message.peer] == client
                assert seq == received[client], f"client {client}: lost or out of order"
                assert zlib.crc32(payload) == crc and len(payload) == FLOOD_SIZE
                received[client] += 1
        for child in children:
            child.read(T)  # every future resolved
        wire = FLOOD_SIZE + 64  # the payload and its tuple, pickled
        bound = budget + clients * (CREDIT_FLOOR + wire)
        print(f"\nflood: {offered / nq.MiB:.0f} MiB offered; held + credit peak "
              f"{peak_held / nq.MiB:.1f} MiB (bound {bound / nq.MiB:.1f} MiB, recv_budget "
              f"{budget / nq.MiB:.0f} MiB); server RSS +{(server_memory.peak - base) / nq.MiB:.0f}"
              f" MiB")
        assert peak_held <= bound
        assert server_memory.peak - base <= bound + 64 * nq.MiB  # + allocator and pickles
        for child in children:
            child.send("close")
        for child in children:
            child.read(T)
        wait_for(lambda: not server.peers, T, message="every client to leave")
    finally:
        for child in children:
            child.close()
        server.close(timeout=10)
