"""A communicator used in a child forked after it was created.

The child inherits copies of the communicator's sockets but not its I/O thread (a fork copies
only the calling thread). Every call in the child must fail at once with
:class:`netq.UsedInForkedChild`, which names both processes; ``close()`` in the child must not
touch the links (no goodbye the parent would see); and the parent's communicator keeps working:
its next put is delivered, on the same session.

Two ways to fork: ``multiprocessing`` with the ``fork`` start method (the default on Linux up to
Python 3.13, and what worker pools in notebooks do) and a bare ``os.fork()`` whose child leaves
with ``os._exit``. The child reports what it saw through a pipe, as one JSON line.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

import netq as nq
from harness import report_from_forked_child

T = 20.0  # seconds any single blocking step in the parent may take before the test is stuck
FAST = 2.0  # seconds: a call in the child must fail within this

pytestmark = [
    pytest.mark.timeout(90),
    # Forking a process that runs threads (the communicators' I/O threads) is exactly the
    # situation under test; Python 3.12+ warns about it with a DeprecationWarning.
    pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning"),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)"),
]


def use_in_child(server: nq.Communicator, client: nq.Communicator) -> dict:
    """What happens to every call on the inherited communicators (run in the child)."""
    report: dict = {"pid": os.getpid(), "calls": {}}
    calls = {
        "client.put": lambda: client.put(b"from the child").result(timeout=T),
        "client.put_many": lambda: client.put_many([b"a", b"b"]).result(timeout=T),
        "client.get": lambda: client.get(timeout=T),
        "client.get_many": lambda: client.get_many(timeout=T),
        "client.statistics": client.statistics,
        "server.put": lambda: server.put(b"from the child").result(timeout=T),
        "server.get": lambda: server.get(timeout=T),
    }
    for name, call in calls.items():
        start = time.monotonic()
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - every outcome is reported to the parent
            outcome = {"type": type(error).__name__, "message": str(error),
                       "is_resource_closed": isinstance(error, nq.ResourceClosed)}
        else:
            outcome = {"type": None, "message": "returned"}
        outcome["seconds"] = time.monotonic() - start
        report["calls"][name] = outcome
    report["closed"] = [client.closed, server.closed]
    start = time.monotonic()
    client.close()  # must return at once and say nothing to the server
    server.close()
    report["close_seconds"] = time.monotonic() - start
    return report


def check_child_report(report: dict, parent_pid: int, server, client) -> None:
    child_pid = report["pid"]
    assert child_pid != parent_pid
    for name, outcome in report["calls"].items():
        assert outcome["type"] == "UsedInForkedChild", (name, outcome)
        assert outcome["is_resource_closed"], (name, outcome)
        assert outcome["seconds"] < FAST, (name, outcome)
        message = outcome["message"]
        assert f"created in process {parent_pid}" in message, message
        assert f"forked child {child_pid}" in message, message
        assert "create communicators after fork" in message, message
        assert "spawn" in message, message
    assert report["closed"] == [True, True]
    assert report["close_seconds"] < FAST


def check_parent_unaffected(server: nq.Communicator, client: nq.Communicator) -> None:
    """No goodbye reached the server, nothing the child tried was sent, and the next put of
    each side is delivered on the same session."""
    assert not client.closed and not server.closed
    assert server.peers == (client.id,)
    client.put(b"after the fork").result(timeout=T)
    message = server.get(timeout=T)
    assert message == (client.id, b"after the fork")  # not "from the child", nor a/b
    server.put(b"reply", client.id).result(timeout=T)
    assert client.get(timeout=T) == (server.id, b"reply")
    stats = server.statistics()
    (row,) = stats.peers
    assert row.state == "connected" and row.reconnects == 0, row
    with pytest.raises(nq.Empty):
        server.get_nowait()


def connected_pair(transport) -> tuple[nq.Communicator, nq.Communicator]:
    server = transport.make_server()
    client = transport.connect(server)
    # One round trip each way first, so that both I/O threads are mid-flight when forking.
    client.put(b"before").result(timeout=T)
    assert server.get(timeout=T).data == b"before"
    return server, client


def _multiprocessing_child(server, client, connection) -> None:
    connection.send(json.dumps(use_in_child(server, client)))
    connection.close()


# Not gRPC: grpcio's own fork handlers crash a child forked while its channels and servers run
# (a segmentation fault in the child, before any netq code there), which netq cannot prevent;
# README "Platforms and processes" says so.
@pytest.mark.parametrize("transport", ["tcp", "tcp-shared", "unix", "tls", "mqtt"],
                         indirect=True)
def test_multiprocessing_fork_child_fails_fast_and_parent_keeps_working(transport):
    server, client = connected_pair(transport)
    report = report_from_forked_child(_multiprocessing_child, (server, client), T)
    check_child_report(report, os.getpid(), server, client)
    check_parent_unaffected(server, client)


@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_bare_os_fork_child_fails_fast_and_parent_keeps_working(transport):
    server, client = connected_pair(transport)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        status = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(use_in_child(server, client)).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        chunks = []
        while chunk := os.read(read_end, 65536):  # ends when the child's end closes
            chunks.append(chunk)
        deadline = time.monotonic() + T
        while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            assert time.monotonic() < deadline, f"forked child {pid} did not exit"
            time.sleep(0.01)
        pid = 0
        assert os.waitstatus_to_exitcode(waited[1]) == 0
    finally:
        os.close(read_end)
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    check_child_report(json.loads(b"".join(chunks)), os.getpid(), server, client)
    check_parent_unaffected(server, client)


def test_communicator_created_in_the_child_works():
    """The advice in the error works: a communicator made after the fork is the child's own."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    with nq.new(purpose=nq.Purpose.SERVER,
                options=nq.CommunicatorOptions(netloc=nq.NetworkLocation(port=0))) as server:
        port = server.address[1]
        child = context.Process(target=_client_made_in_child, args=(port, sender))
        child.start()
        sender.close()
        try:
            message = server.get(timeout=T)
            assert message.data == b"made after the fork"
            assert receiver.poll(T)
            assert receiver.recv() == "delivered"
            child.join(T)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()
                child.join(T)
            child.close()
            receiver.close()


def _client_made_in_child(port: int, connection) -> None:
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(port=port))
    with nq.new(purpose=nq.Purpose.CLIENT, options=options) as client:
        client.put(b"made after the fork").result(timeout=T)
    connection.send("delivered")
    connection.close()
