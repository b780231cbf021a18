"""Client loops on the process's shared I/O thread (netq.shared_io).

A process's first ``OWN_THREADS`` clients run their own I/O thread; from then on (or always,
with ``io_thread="shared"``) they share one. The conformance suite runs over shared clients
(transports ``tcp-shared`` and ``tls-shared``); these tests check what only sharing has: how
many threads run, that the shared thread goes when its last client does, that one client's
done-callback may use another client of the same thread, and that a forked child gets a
shared thread of its own.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

import netq as nq
from harness import report_from_forked_child
from netq import shared_io

T = 30.0  # seconds a single step may take before the test counts as stuck

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shared_io.can_share(), reason="needs epoll and eventfd (Linux)"),
]


def _io_threads() -> dict[str, int]:
    counts = {"own": 0, "shared": 0}
    for thread in threading.enumerate():
        if thread.name == "netq-io-shared":
            counts["shared"] += 1
        elif thread.name.startswith("netq-io-client-"):
            counts["own"] += 1
    return counts


def _server() -> nq.Communicator:
    return nq.new(nq.Protocol.TCP, nq.Purpose.SERVER,
                  nq.CommunicatorOptions(netloc=nq.NetworkLocation("127.0.0.1", 0)))


def _client(server: nq.Communicator, io_thread: str = "auto") -> nq.Communicator:
    return nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", server.address[1]),
        connection=nq.ConnectionOptions(io_thread=io_thread)))


def _close_all(server: nq.Communicator, clients: list[nq.Communicator]) -> None:
    for client in clients:
        client.close(timeout=T)
    server.close(timeout=T)


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + T
    while not condition():
        assert time.monotonic() < deadline, f"still not {what} after {T} s"
        time.sleep(0.01)


def test_a_process_with_many_clients_runs_one_shared_io_thread():
    server = _server()
    clients = []
    try:
        extra = 5
        clients = [_client(server) for _ in range(shared_io.OWN_THREADS + extra)]
        assert _io_threads() == {"own": shared_io.OWN_THREADS, "shared": 1}
        for index, client in enumerate(clients):
            client.put(("up", index)).result(timeout=T)
        got = {server.get(timeout=T).data for _ in clients}
        assert got == {("up", index) for index in range(len(clients))}
        for index, client in enumerate(clients):
            server.put(("down", index), client.id).result(timeout=T)
        for index, client in enumerate(clients):
            assert client.get(timeout=T) == (server.id, ("down", index))
        # The shared clients close first: the thread ends with the last of them.
        for client in clients[shared_io.OWN_THREADS:]:
            client.close(timeout=T)
        _wait_until(lambda: _io_threads()["shared"] == 0, "ended")
        # Own threads were taken: the next client shares again, on a new shared thread.
        late = _client(server)
        clients.append(late)
        assert _io_threads()["shared"] == 1
        late.put("late").result(timeout=T)
        assert server.get(timeout=T) == (late.id, "late")
    finally:
        _close_all(server, clients)


def test_own_and_shared_are_what_they_say():
    server = _server()
    clients = []
    try:
        clients.append(_client(server, "shared"))
        assert _io_threads() == {"own": 0, "shared": 1}
        clients.append(_client(server, "own"))
        assert _io_threads() == {"own": 1, "shared": 1}
        for client in clients:
            client.put("hello").result(timeout=T)
            assert server.get(timeout=T) == (client.id, "hello")
    finally:
        _close_all(server, clients)
    with pytest.raises(ValueError, match="io_thread"):
        nq.ConnectionOptions(io_thread="pooled")


def test_a_done_callback_on_the_shared_thread_may_use_another_shared_client():
    """A put's done-callback runs on the shared thread, while it serves one client's loop: a
    put on another client of that thread from there is written and delivered."""
    server = _server()
    first = second = None
    try:
        first, second = _client(server, "shared"), _client(server, "shared")
        first.put("warm-up").result(timeout=T)
        second.put("warm-up").result(timeout=T)
        for _ in range(2):
            server.get(timeout=T)
        relayed: list[nq.Future] = []
        on_thread: list[str] = []

        def relay(_future) -> None:
            on_thread.append(threading.current_thread().name)
            relayed.append(second.put("relayed from the callback"))

        first.put("trigger").add_done_callback(relay)
        assert server.get(timeout=T) == (first.id, "trigger")
        assert server.get(timeout=T) == (second.id, "relayed from the callback")
        _wait_until(lambda: relayed, "relayed")
        relayed[0].result(timeout=T)
        assert on_thread == ["netq-io-shared"]
    finally:
        _close_all(server, [client for client in (first, second) if client is not None])


def _child_client(port: int, connection) -> None:
    """In a forked child: a new shared client of the parent's server, one round trip."""
    report: dict = {"pid": os.getpid()}
    try:
        client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation("127.0.0.1", port),
            connection=nq.ConnectionOptions(io_thread="shared")))
        client.put(("from the child", os.getpid())).result(timeout=T)
        report["threads"] = _io_threads()
        client.close(timeout=T)
        report["ok"] = True
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        report["error"] = repr(error)
    connection.send(json.dumps(report))
    connection.close()


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_a_forked_child_gets_a_shared_thread_of_its_own():
    server = _server()
    parent_client = _client(server, "shared")  # the parent's shared thread runs when forking
    try:
        parent_client.put("before").result(timeout=T)
        assert server.get(timeout=T) == (parent_client.id, "before")
        report = report_from_forked_child(_child_client, (server.address[1],), T + 10)
        assert report.get("ok"), report
        assert report["threads"]["shared"] == 1, report
        message = server.get(timeout=T)
        assert message.data == ("from the child", report["pid"])
        parent_client.put("after").result(timeout=T)
        assert server.get(timeout=T) == (parent_client.id, "after")
    finally:
        _close_all(server, [parent_client])


# ============================================================================ the thread alone


class _Member:
    """A stand-in loop: an eventfd as its poller descriptor, turns recorded."""

    def __init__(self, waits: list[float | None], fail_on_turn: int | None = None) -> None:
        self.poll_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.waits = waits  # what each turn returns (the last one repeats)
        self.fail_on_turn = fail_on_turn
        self.turns: list[float] = []
        self.begun = 0
        self.ended = threading.Event()
        self.error: BaseException | None = None

    def begin(self) -> None:
        self.begun += 1

    def turn(self) -> float | None:
        self.turns.append(time.monotonic())
        if self.fail_on_turn == len(self.turns):
            raise RuntimeError("this turn fails")
        try:
            os.eventfd_read(self.poll_fd)  # what it was woken for is taken
        except BlockingIOError:
            pass
        index = min(len(self.turns), len(self.waits)) - 1
        return self.waits[index]

    def end(self, error: BaseException | None) -> None:
        self.error = error
        os.close(self.poll_fd)
        self.ended.set()


def test_the_shared_thread_turns_a_member_when_woken_when_due_and_ends_with_the_last():
    thread = shared_io.SharedIOThread()
    sleeper = _Member([3600.0])  # wants no turn of its own for an hour
    ticker = _Member([0.05, 0.05, 0.05, None])  # three timed turns, then it ends
    thread.add(sleeper)
    thread.add(ticker)
    assert ticker.ended.wait(T) and ticker.error is None
    assert len(ticker.turns) == 4 and ticker.begun == 1
    timed = ticker.turns[1:]  # the turns its timers asked for
    gaps = [later - earlier for earlier, later in zip(timed, timed[1:], strict=False)]
    assert all(gap >= 0.05 for gap in gaps), gaps  # never before its timer
    _wait_until(lambda: len(sleeper.turns) == 1, "begun")
    os.eventfd_write(sleeper.poll_fd, 1)  # its descriptor readable: a turn at once
    _wait_until(lambda: len(sleeper.turns) == 2, "woken")
    sleeper.waits = [None]
    os.eventfd_write(sleeper.poll_fd, 1)
    assert sleeper.ended.wait(T) and sleeper.error is None
    _wait_until(lambda: thread.ident is None, "ended with its last member")
    assert len(thread) == 0


def test_a_member_whose_turn_raises_ends_with_that_error_and_the_others_go_on():
    thread = shared_io.SharedIOThread()
    failing = _Member([0.01], fail_on_turn=2)
    steady = _Member([0.01, 0.01, 0.01, 0.01, 0.01, None])
    thread.add(failing)
    thread.add(steady)
    assert failing.ended.wait(T)
    assert isinstance(failing.error, RuntimeError)
    assert steady.ended.wait(T) and steady.error is None and len(steady.turns) == 6
    _wait_until(lambda: thread.ident is None, "ended")


def test_if_the_shared_thread_itself_fails_every_member_hears_why(monkeypatch):
    thread = shared_io.SharedIOThread()
    members = [_Member([0.01]), _Member([3600.0])]

    def broken(*_args):
        raise RuntimeError("the thread's own bookkeeping failed")

    monkeypatch.setattr(shared_io.heapq, "heappush", broken)
    for member in members:
        thread.add(member)
    for member in members:
        assert member.ended.wait(T), "a member of a dead thread was left waiting"
        assert isinstance(member.error, RuntimeError)
    _wait_until(lambda: thread.ident is None, "closed")
