"""Byte-stream transports (netq/transports/sockets.py): the caller-led loop and delayed ACKs.

A blocked ``get()`` may run the I/O loop on its own thread while the I/O thread is parked
(leader/followers), and an ACK may wait a moment for the reply of a waiting ``get()``. Both
save wake-ups; these tests check that neither ever costs liveness: what arrives while no
caller leads is still read and acknowledged, a held ACK still goes out when nobody replies, a
caller-led ``get()`` still honours its timeout and ``close()``. Runs on the byte streams of the
suite (tcp, tls, unix, tcp6); the packet carriers do not let callers lead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import netq as nq
from netq_testing import blocked_get, wait_for

T = 30.0  # seconds a blocking step may take before the test counts as stuck

pytestmark = pytest.mark.timeout(90)


def _stream_pair(transport):
    server = transport.make_server()
    if not server.loop.caller_leads:
        pytest.skip("only byte streams let a blocked get() lead the loop")
    client = transport.connect(server)
    return server, client


def _echo(server: nq.Communicator, count: int) -> threading.Thread:
    def serve() -> None:
        for _ in range(count):
            message = server.get(timeout=T)
            server.put(message.data, message.peer)

    thread = threading.Thread(target=serve, name="echo")
    thread.start()
    return thread


def _round_trips(server: nq.Communicator, client: nq.Communicator, count: int) -> None:
    """``count`` round trips: afterwards the client's I/O thread has left the loop to get()."""
    echo = _echo(server, count)
    for index in range(count):
        client.put(index)
        assert client.get(timeout=T).data == index
    echo.join(T)


@pytest.fixture(params=["default-handler", "ignored"])
def sigint_disposition(request):
    """The main thread's SIGINT as a program meets it: Python's handler, or ignored (nohup)."""
    found = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler if request.param == "default-handler"
                  else signal.SIG_IGN)
    yield request.param
    signal.signal(signal.SIGINT, found)


def test_round_trips_are_led_by_the_waiting_caller(transport, sigint_disposition):
    server, client = _stream_pair(transport)
    rounds = 300
    echo = _echo(server, rounds)
    for index in range(rounds):
        client.put(index)
        assert client.get(timeout=T).data == index
    echo.join(T)
    # After the first hand-over the I/O thread parks and the next get() reads for itself; on
    # a loaded machine it takes the loop back now and then (when a look finds no caller led).
    assert client.loop.caller_led_turns >= rounds // 10
    assert server.loop.caller_led_turns >= rounds // 10


def test_what_arrives_while_no_caller_leads_is_still_received(transport):
    server, client = _stream_pair(transport)
    _round_trips(server, client, 20)  # leaves the client's I/O thread parked, its caller gone
    future = server.put(b"while the client's code is busy elsewhere")
    # Acknowledged means the client's netq read it: the parked I/O thread took the loop back.
    assert future.result(T) is None
    assert client.get(timeout=T).data == b"while the client's code is busy elsewhere"


def test_a_held_ack_goes_out_when_the_waiting_caller_does_not_reply(transport):
    server, client = _stream_pair(transport)
    got = []
    waiting = threading.Thread(target=lambda: got.append(server.get(timeout=T)))
    waiting.start()
    wait_for(lambda: server.statistics() is not None and server._inboxes.getters > 0, T)
    started = time.monotonic()
    future = client.put(b"no reply will come")
    assert future.result(T) is None
    waiting.join(T)
    assert got and got[0].data == b"no reply will come"
    # The hold is 250 us and the parked I/O thread looks at least every PARK_MAX (4 ms).
    assert time.monotonic() - started < 5.0


def test_a_caller_led_get_keeps_its_timeout(transport):
    server, client = _stream_pair(transport)
    _round_trips(server, client, 5)
    for timeout in (0.05, 0.3):
        started = time.monotonic()
        with pytest.raises(nq.Empty):
            client.get(timeout=timeout)
        waited = time.monotonic() - started
        assert timeout <= waited < timeout + 5.0


def test_close_ends_a_caller_led_get(transport):
    server, client = _stream_pair(transport)
    _round_trips(server, client, 5)
    getter, outcome = blocked_get(client)
    wait_for(lambda: client._inboxes.getters > 0, T)
    client.close(timeout=T)
    getter.join(T)
    assert not getter.is_alive()
    assert outcome and isinstance(outcome[0], nq.ResourceClosed)


@pytest.mark.parametrize("event", ["message", "close"])
def test_what_happens_while_a_get_is_offered_the_loop_wakes_it(transport, monkeypatch, event):
    """get() releases its lock to offer itself as the loop's leader. If the I/O thread leads
    and delivers a message (or close() runs) just then, nobody is asleep to notify: the get
    must look again before it sleeps, or it sleeps until its timeout (forever without one).
    The offer is widened here so that this happens every time."""
    server, client = _stream_pair(transport)
    offered = threading.Event()
    original = client._inboxes._lead  # the transport's lead(), as get() calls it

    def lead_after(timeout, ready):
        if not offered.is_set():
            offered.set()
            if event == "message":
                server.put("meanwhile", client.id)
                wait_for(lambda: client.statistics().peers[0].queue_in == 1, T,
                         message="the I/O thread to deliver the message")
            else:
                closer = threading.Thread(target=client.close, kwargs={"timeout": T})
                closer.start()
                wait_for(lambda: not closer.is_alive(), T, message="close() to return")
            return False  # the I/O thread leads: this get() waits for its hand-over
        return original(timeout, ready)

    monkeypatch.setattr(client._inboxes, "_lead", lead_after)
    outcome: list[object] = []

    def get_without_timeout() -> None:
        try:
            outcome.append(client.get().data)
        except BaseException as error:  # noqa: BLE001 - the outcome is the assertion
            outcome.append(error)

    getter = threading.Thread(target=get_without_timeout, daemon=True)  # may be stuck for good
    getter.start()
    getter.join(T)
    if getter.is_alive():
        client.close(timeout=T)  # ends the stuck get(), then fail
        getter.join(T)
        pytest.fail(f"get() slept through the {event} that came while it offered to lead")
    assert offered.is_set()
    if event == "message":
        assert outcome == ["meanwhile"]
    else:
        assert len(outcome) == 1 and isinstance(outcome[0], nq.ResourceClosed), outcome


def test_ctrl_c_during_caller_led_gets_tears_no_link():
    """SIGINT hits the main thread again and again while its get() calls lead the loop.

    A turn of the loop is never torn (netq._interrupts defers the interrupt to the turn's
    end, or raises it while the turn only waits): the link stays up and nothing arrives twice
    or out of order. An interrupt that lands while get() unpickles gives the message back
    (tests/test_communicator.py); one in the few bytecodes between taking and returning, or in
    this loop's own code after get() returned, still drops it: at most one gap per interrupt.
    In a child process (tests/transports/interrupt_child.py): interrupts land anywhere in the
    main thread, the test runner's own code included.
    """
    child = subprocess.run([sys.executable, str(Path(__file__).with_name("interrupt_child.py"))],
                           capture_output=True, text=True, timeout=120)
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    assert child.returncode == 0 and lines, child.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["interrupts"] > 0
    assert result["caller_led_turns"] > 5
    assert result["in_order_no_duplicates"], "a message came twice or out of order"
    assert result["total"] - result["received"] <= result["interrupts"]
    assert result["reconnects"] == 0, "the link was torn"


def test_a_full_socket_hands_the_write_over_to_the_carrier(transport, monkeypatch):
    """A plain socket's link writes with the socket's own ``sendmsg``; when the socket is full
    (here: the server's process is stopped), the link writes once through the carrier's
    ``write``, which watches the socket for room. Once the server runs again, the rest goes
    out and every message arrives."""
    from netq.transports.sockets import SocketCarrier

    carrier_writes = []
    write = SocketCarrier.write

    def counted(self, channel, buffers, fds=None):
        carrier_writes.append(len(buffers))
        return write(self, channel, buffers, fds)

    if not transport.spec.byte_stream:
        pytest.skip(f"{transport.name} is not a byte stream")
    monkeypatch.setattr(SocketCarrier, "write", counted)  # before the client's link opens
    # Credit for all of it from the start: the stopped server grants none.
    server = transport.spawn_server(window_min=32 * nq.MiB, recv_budget=64 * nq.MiB)
    client = transport.make_client(server)
    client.put("hello").result(T)
    assert server.request("get", count=1, timeout=T) == ["hello"]
    if not carrier_writes:  # TLS writes through the carrier always; plain sockets do not
        assert transport.name != "tls"
    before = len(carrier_writes)
    size, count = 256 * nq.KiB, 64  # 16 MiB: more than the two socket buffers hold
    futures: list = []
    os.kill(server.pid, signal.SIGSTOP)
    try:
        putter = threading.Thread(target=lambda: futures.extend(
            client.put(bytes([index]) * size) for index in range(count)), name="putter")
        putter.start()
        wait_for(lambda: len(carrier_writes) > before, T)  # the socket filled up
    finally:
        os.kill(server.pid, signal.SIGCONT)
    putter.join(T)
    assert len(futures) == count
    for future in futures:
        assert future.result(T) is None
    assert server.request("get", count=count, timeout=T) == [{"bytes": size}] * count
