"""Flow control on every transport: the receive budget, a close that finishes, no silent wait.

The patterns a new user meets first, with default options unless a test says otherwise: one
thread puts a batch and then gets it; clients close before the server has read; a receiver
that stops reading; a client with no server. Each ends, or says within ``stall_warning``
seconds what it waits for.
"""

from __future__ import annotations

import contextlib
import logging
import random
import subprocess
import sys
import threading
import time

import psutil
import pytest

import netq as nq
from netq.flow import CREDIT_FLOOR
from netq_testing import rss, wait_for

KiB = nq.KiB
MiB = nq.MiB
T = 60.0


def payload(index: int, size: int) -> bytes:
    head = index.to_bytes(4, "little")
    return head + bytes(max(size - 4, 0))


@pytest.mark.timeout(240)
def test_one_thread_puts_64_mib_of_mixed_sizes_then_gets_them_all(transport):
    """The notebook cell: put a batch, then get it, on one thread, with default options."""
    server = transport.make_server()
    client = transport.connect(server)
    rng = random.Random(12)
    sizes: list[int] = []
    while sum(sizes) < 64 * MiB:
        sizes.append(rng.randrange(4, MiB))
    started = time.monotonic()
    # A put that had to wait would raise Full after T seconds instead of hanging the suite.
    futures = [client.put(payload(index, size), timeout=T) for index, size in enumerate(sizes)]
    for index, size in enumerate(sizes):
        data = server.get(timeout=T).data
        assert len(data) == size and int.from_bytes(data[:4], "little") == index
    for future in futures:
        assert future.result(T) is None
    print(f"\n{transport.spec.name}: {len(sizes)} messages, {sum(sizes) / MiB:.0f} MiB put "
          f"then got in {time.monotonic() - started:.1f} s")


@pytest.mark.timeout(240)
def test_a_batch_put_right_after_a_loop_of_gets_fits_the_budget_again(transport):
    """A consumer that just took messages holds each peer to its window; the next cell puts a
    batch larger than the window plus the send budget before it gets any: once nobody takes
    messages the batch is granted the receive budget again, and put() returns."""
    budgets = {"recv_budget": 8 * MiB, "send_budget": 2 * MiB}
    server = transport.make_server(**budgets)
    client = transport.connect(server, **budgets)
    size = 256 * KiB
    for index in range(8):  # a loop of put, get: a consumer at work
        client.put(payload(index, size), timeout=T)
        assert int.from_bytes(server.get(timeout=T).data[:4], "little") == index
    count = 7 * MiB // size  # more than window_max (4 MiB) + send_budget, less than both budgets
    futures = [client.put(payload(index, size), timeout=T) for index in range(count)]
    for index in range(count):
        assert int.from_bytes(server.get(timeout=T).data[:4], "little") == index
    for future in futures:
        assert future.result(T) is None


@pytest.mark.timeout(240)
def test_a_consumer_that_lags_queues_a_window_of_large_messages_not_the_budget(transport):
    """A stream of 2 MiB messages to a consumer slower than the link (default options: a
    64 MiB budget, windows up to 32 MiB): what the receiver holds and has promised stays
    within the window and a message or two, not the budget."""
    server = transport.make_server()
    client = transport.connect(server)
    size, count = 2 * MiB, 40
    window_max = nq.ConnectionOptions().window_max
    assert window_max is not None
    sender = threading.Thread(
        target=lambda: [client.put(payload(index, size), timeout=T) for index in range(count)])
    sender.start()
    most = 0
    try:
        for index in range(count):
            assert int.from_bytes(server.get(timeout=T).data[:4], "little") == index
            stats = server.statistics()
            most = max(most, stats.recv_held + stats.recv_outstanding)
            # The consumer's work on a message (the workload, not a wait for an event): long
            # enough for the sender to fill whatever credit it has meanwhile.
            time.sleep(0.02)
    finally:
        sender.join(T)
    assert not sender.is_alive()
    assert most <= window_max + 2 * size, most / MiB


@pytest.mark.timeout(240)
def test_clients_close_before_the_server_reads_and_lose_nothing(transport):
    """Three clients put 40 x 200 kB (24 MB in all) and close: close() returns once the
    server's netq holds their messages, before the server's code has read one."""
    server = transport.make_server()
    clients = [transport.connect(server) for _ in range(3)]
    futures = []
    for number, client in enumerate(clients):
        futures += [client.put((number, index, bytes(200_000))) for index in range(40)]
    for client in clients:
        started = time.monotonic()
        client.close(timeout=T)
        assert time.monotonic() - started < T - 5, "close() ran into its timeout"
    for future in futures:
        assert future.result(0) is None  # delivered to the server's netq, not failed
    assert server.statistics().recv_held >= 24_000_000
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for _ in range(120):
        number, index, data = server.get(timeout=T).data
        assert len(data) == 200_000
        seen[number].append(index)
    assert all(indices == list(range(40)) for indices in seen.values())


def _warnings(caplog, text: str) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "netq" and record.levelno == logging.WARNING
            and text in record.getMessage()]


@pytest.mark.timeout(120)
def test_a_blocked_put_and_a_blocked_close_say_why(transport, caplog):
    caplog.set_level(logging.WARNING, logger="netq")
    server = transport.make_server(recv_budget=256 * KiB, stall_warning=1.0)
    client = transport.connect(server, send_budget=256 * KiB, stall_warning=1.0)
    block = bytes(64 * KiB)
    started = time.monotonic()
    with pytest.raises(nq.Full) as raised:
        for _ in range(1000):
            client.put(block, timeout=3.0)
    waited = time.monotonic() - started
    assert "not calling get()" in str(raised.value)
    said = _warnings(caplog, "put() has waited")
    assert said and "not calling get()" in said[0], caplog.text
    # Both ends live in this process, as in a notebook kernel: the get() that would free the
    # put may be meant to run on the very thread that waits.
    assert "That peer is a communicator of this process" in said[0], said[0]
    row = client.statistics().peers[0]
    assert "not calling get()" in row.blocked and row.blocked_for > 1.0
    assert waited < 30
    wait_for(lambda: _warnings(caplog, "receive budget has had no room"), 10,
             message="the server to warn that its budget is full")
    assert "not taken by get()" in _warnings(caplog, "receive budget has had no room")[0]
    caplog.clear()
    closer = threading.Thread(target=client.close, kwargs={"timeout": 4.0}, name="test-close")
    closer.start()
    wait_for(lambda: _warnings(caplog, "close() has waited"), 10,
             message="close() to warn that it waits")
    assert "acknowledge" in _warnings(caplog, "close() has waited")[0]
    assert "a communicator of this process" in _warnings(caplog, "close() has waited")[0]
    closer.join(T)
    assert not closer.is_alive()


BLOCKED_PUT_SCRIPT = """
import netq as nq
connection = nq.ConnectionOptions(recv_budget=256 * nq.KiB, send_budget=256 * nq.KiB,
                                  stall_warning=0.5)
options = nq.CommunicatorOptions(netloc=nq.NetworkLocation("127.0.0.1", 0),
                                 connection=connection)
with nq.new("tcp", "server", options) as server:
    host, port = server.address[:2]
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(host, port),
                                     connection=connection)
    with nq.new("tcp", "client", options) as client:
        try:
            for _ in range(1000):
                client.put(bytes(64 * nq.KiB), timeout=3.0)
        except nq.Full:
            print("Full")
        server.get_many(max_messages=1000, timeout=0.5)  # let close() finish at once
"""


@pytest.mark.timeout(120)
def test_a_blocked_put_says_so_on_stderr_where_nothing_configured_logging():
    """A plain script that configures no logging: a put() blocked past stall_warning prints
    its WARNING (why it waits) on stderr, through Python's last-resort handler."""
    done = subprocess.run([sys.executable, "-c", BLOCKED_PUT_SCRIPT], capture_output=True,
                          text=True, timeout=T)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Full"], done.stdout
    said = [line for line in done.stderr.splitlines() if "put() has waited" in line]
    assert said and "not calling get()" in said[0], done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_a_full_budget_that_get_keeps_emptying_is_not_a_stall(transport, caplog):
    """Messages as large as the receive budget fill it each time one arrives, so the sender
    always waits for credit; while get() keeps taking them, no WARNING says the budget has had
    no room. Once get() stops, the WARNING comes within stall_warning (and the look after)."""
    caplog.set_level(logging.WARNING, logger="netq")
    stall = 1.0
    server = transport.make_server(recv_budget=256 * KiB, stall_warning=stall)
    client = transport.connect(server, stall_warning=60.0)
    block = bytes(256 * KiB)
    for _ in range(4):
        client.put(block)
    server.get(timeout=T)  # the link is up and the budget full from here on
    started = last = time.monotonic()
    taken, longest_gap = 1, 0.0
    while last - started < 3 * stall:  # a consumer at work, paced by the sender
        client.put(block)
        server.get(timeout=T)
        now = time.monotonic()
        taken, longest_gap, last = taken + 1, max(longest_gap, now - last), now
        time.sleep(stall / 10)
    # A WARNING needs stall_warning seconds with nothing taken; only a machine too loaded to
    # run this loop for that long could give it one (then the gap says so).
    warned = _warnings(caplog, "receive budget has had no room")
    assert not warned or longest_gap >= stall, (longest_gap, caplog.text)
    for _ in range(4):
        client.put(block)  # queued behind a budget that nobody empties now
    wait_for(lambda: _warnings(caplog, "receive budget has had no room"), 10 + 2 * stall,
             message="the server to warn once get() stopped taking")
    assert taken >= 3


@pytest.mark.timeout(120)
def test_a_get_that_waits_says_what_for(transport, caplog):
    """A server's get() after its last client left: one WARNING and statistics() say that no
    client is connected; a client's get() on a silent server says so in statistics() only."""
    caplog.set_level(logging.WARNING, logger="netq")
    server = transport.make_server(stall_warning=1.0)
    client = transport.connect(server, stall_warning=1.0)
    outcome: list[BaseException] = []

    def get_forever(communicator) -> None:
        try:
            communicator.get()
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            outcome.append(error)

    try:
        waiting = threading.Thread(target=get_forever, args=(client,), name="test-client-get")
        waiting.start()
        wait_for(lambda: client.statistics().get_waiting, T,
                 message="the client's statistics to say that get() waits")
        assert "the server is connected" in client.statistics().get_waiting
        client.put("hello").result(T)
        assert server.get(timeout=T).data == "hello"
        server.put("bye")
        waiting.join(T)
        assert not waiting.is_alive() and not outcome
        assert client.statistics().get_waiting == ""
        # A client waiting for its server: statistics only, no WARNING.
        assert not _warnings(caplog, "get() waits and has returned no message")
        client.close(timeout=T)
        wait_for(lambda: not any(row.state == "connected" for row in server.statistics().peers),
                 T, message="the server to see its client gone")
        waiting = threading.Thread(target=get_forever, args=(server,), name="test-server-get")
        waiting.start()
        wait_for(lambda: _warnings(caplog, "get() waits and has returned no message"), T,
                 message="a warning that the server's get() waits with no client")
        said = _warnings(caplog, "get() waits and has returned no message")
        assert len(said) == 1 and "no client is connected" in said[0], said
        assert "no client is connected" in server.statistics().get_waiting
        assert "no client is connected" in server.statistics().summary()
    finally:
        client.close(timeout=T)
        server.close(timeout=T)
    waiting.join(T)
    assert not waiting.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], nq.ResourceClosed), outcome


@contextlib.contextmanager
def client_with_no_server(transport, caplog):
    """A client (stall_warning 1 s) whose server is gone: nobody answers where it connects."""
    caplog.set_level(logging.WARNING, logger="netq")
    server = transport.make_server()
    options = transport.client_options(server, stall_warning=1.0)
    server.close(timeout=5)
    client = nq.new(transport.spec.protocol, nq.Purpose.CLIENT, options)
    try:
        yield client, options
    finally:
        client.close(timeout=1)


@pytest.mark.timeout(60)
def test_a_client_with_no_server_says_so(transport, caplog):
    with client_with_no_server(transport, caplog) as (client, options):
        future = client.put("anyone?")
        wait_for(lambda: _warnings(caplog, "not connected to the server"), 10,
                 message="a warning that the client cannot connect")
        said = _warnings(caplog, "not connected to the server")[0]
        # Where it connects, in the transport's terms (MQTT: the broker and the topic prefix).
        assert client.loop.connect_target() in said
        if transport.spec.protocol is not nq.Protocol.MQTT:
            assert str(options.netloc) in said
        assert not future.done()
        row = client.statistics().peers[0]
        assert "not connected" in row.blocked
        with pytest.raises(TimeoutError, match=r"not acknowledged within 0.05 s: not sent yet: "
                                               r"not connected to it now; netq reconnects"):
            future.result(timeout=0.05)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_what_a_refused_connection_says(transport, caplog):
    with client_with_no_server(transport, caplog) as (client, _):
        wait_for(lambda: client.statistics().connect_error, 10)
        assert "refused" in client.statistics().connect_error
        wait_for(lambda: _warnings(caplog, "refused"), 10, message="the refusal in a warning")
        with pytest.raises(nq.Empty, match=r"; the server is not connected \(the last attempt "
                                           r"failed with: connection refused"):
            client.get(timeout=0.05)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_a_peer_that_is_not_netq_is_named_as_such(transport, caplog):
    """A client pointed at something that answers, but not in netq frames."""
    import socket

    caplog.set_level(logging.WARNING, logger="netq")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def answer_http() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            accepted.append(sock)
            sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer_http, name="test-http")
    thread.start()
    options = nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", listener.getsockname()[1]),
        connection=nq.ConnectionOptions(stall_warning=1.0))
    client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options)
    try:
        wait_for(lambda: _warnings(caplog, "not a netq"), 10,
                 message="a warning that the other end is not netq")
    finally:
        client.close(timeout=1)
        stop.set()
        thread.join(T)
        listener.close()
        for sock in accepted:
            sock.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "mqtt", "grpc"], indirect=True)
def test_a_stalled_receiver_keeps_both_processes_within_their_budgets(transport):
    budget = 16 * MiB
    message = 1 * MiB
    child = transport.spawn_server(recv_budget=budget)
    client = transport.make_client(child, send_budget=budget)
    process = psutil.Process(child.pid)
    for _ in range(4):  # warm up the allocators and the link, then measure from there
        client.put(bytes(message)).result(T)
    child.request("get", count=4, timeout=T)
    child_base, own_base = process.memory_info().rss, rss()
    accepted = 0
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        try:
            client.put(bytes(message), block=False)
            accepted += 1
        except nq.Full:
            held = child.request("stats")["recv_held"]
            if held >= budget - message and client.statistics().peers[0].queue_out_bytes \
                    >= budget - message:
                break
            time.sleep(0.05)  # pacing the retry of a non-blocking put; the loop is bounded
    child_growth = process.memory_info().rss - child_base
    own_growth = rss() - own_base
    stats = child.request("stats")
    assert stats["recv_held"] <= budget + message + CREDIT_FLOOR
    # Both sides within their budget plus a message or two, and allocator slack.
    assert child_growth <= budget + 2 * message + 24 * MiB, child_growth / MiB
    assert own_growth <= budget + 2 * message + 24 * MiB, own_growth / MiB
    print(f"\n{transport.spec.name}: {accepted} MiB accepted; receiver RSS +"
          f"{child_growth / MiB:.0f} MiB, sender RSS +{own_growth / MiB:.0f} MiB "
          f"(budgets {budget // MiB} MiB each)")
    child.request("get", count=accepted, timeout=T)
