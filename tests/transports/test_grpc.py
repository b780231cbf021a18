"""gRPC-specific behaviour, beyond the conformance suite (which also runs over gRPC).

Real grpcio servers and clients on loopback: a killed client process is noticed through its
stream (well before any heartbeat), 200 clients on one server with no thread per stream,
mutual TLS and untrusted certificates, raw gRPC streams that send garbage or stay silent (the
counterparts of the byte-stream fault tests), bind failures and the message-size limits.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import signal
import socket
import threading
import time

import pytest

import netq as nq
from netq.protocol import frames
from netq.protocol.sending import SendSide
from netq_testing import error_codes, peer_row, rss, wait_for
from test_conformance import _many_clients

grpc = pytest.importorskip("grpc")

from netq.transports.grpc import (  # noqa: E402  (needs grpcio)
    loop as grpc_loop,
    streams as grpc_streams,
    transport as grpc_transport,
)
from netq.transports.packets import PACKET_SIZE  # noqa: E402

T = 30.0
pytestmark = pytest.mark.timeout(90)
plain = pytest.mark.parametrize("transport", ["grpc"], indirect=True)
tls = pytest.mark.parametrize("transport", ["grpc-tls"], indirect=True)


def raw_stream(server, packets):
    """A bare gRPC client on netq's stream method: sends ``packets``, returns (channel, the
    response iterator). No netq on this side."""
    port = server.address[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    responses = channel.stream_stream(grpc_streams.PATH)(iter(packets))
    return channel, responses


def drain_until_closed(responses, timeout: float, into: bytearray | None = None) -> float:
    """Read the server's packets (into ``into``) until it ends the stream; when it did."""
    done = threading.Event()
    ended = []

    def read():
        try:
            for packet in responses:
                if into is not None:
                    into.extend(packet)
        except grpc.RpcError:
            pass
        ended.append(time.monotonic())
        done.set()

    reader = threading.Thread(target=read, name="test-raw-reader", daemon=True)
    reader.start()
    assert done.wait(timeout), f"the server kept the stream open for {timeout} s"
    reader.join()
    return ended[0]


# ============================================================================ liveness


@plain
def test_killed_client_is_noticed_through_its_stream_at_once(transport):
    """SIGKILL: the kernel closes the TCP connection, gRPC cancels the server's handler and the
    session is marked disconnected in well under one heartbeat (5 s by default here)."""
    server = transport.make_server()
    child = transport.spawn_client(server)
    child.request("put", data="alive")
    assert server.get(child.id, timeout=T).data == "alive"
    child.kill()
    killed_at = time.monotonic()
    wait_for(lambda: peer_row(server, child.id).state == "disconnected", T,
             interval=0.002, message="the server to notice the killed client")
    noticed_after = time.monotonic() - killed_at
    assert noticed_after < 1.0, noticed_after  # measured ~10 ms; heartbeats would take 15 s
    late = transport.connect(server)
    late.put("still serving").result(T)
    assert server.get(late.id, timeout=T).data == "still serving"


@plain
def test_silent_raw_stream_dropped_within_three_heartbeats(transport):
    heartbeat = 0.2
    server = transport.make_server(heartbeat=heartbeat)
    blocker = threading.Event()

    def silence():
        blocker.wait(T)  # the request iterator sends nothing (and never half-closes)
        return
        yield  # pragma: no cover - makes this a generator

    channel, responses = raw_stream(server, silence())
    try:
        opened = time.monotonic()
        ended = drain_until_closed(responses, T)
        assert ended - opened < 3 * heartbeat + 2.0, ended - opened
    finally:
        blocker.set()
        channel.close()


def _garbage(kind: str) -> tuple[bytes, int]:
    """(packet, the ERROR code the server must answer with)"""
    if kind == "junk":
        return b"\xff" + bytes(range(256)) * 16, frames.ErrorCode.PROTOCOL
    if kind == "http":
        return b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", frames.ErrorCode.PROTOCOL
    if kind == "header-2**32-1":
        return (frames.encode_header(frames.FrameType.DATA, 0, 2**32 - 1, 1),
                frames.ErrorCode.LIMIT)
    return frames.encode_header(frames.FrameType.HELLO, 0, 2**32 - 1, 0), frames.ErrorCode.LIMIT


@plain
@pytest.mark.parametrize("kind", ["junk", "http", "header-2**32-1", "hello-2**32-1"])
def test_garbage_on_a_raw_stream_drops_only_that_stream(transport, kind):
    """Bytes that are not netq, as the first gRPC message of a stream: the server answers
    ERROR, ends that stream only, and allocates nothing for absurd sizes."""
    server = transport.make_server()
    other = transport.connect(server)
    packet, expected_code = _garbage(kind)
    blocker = threading.Event()
    received = bytearray()

    def requests():
        yield packet
        blocker.wait(T)

    baseline = rss()
    channel, responses = raw_stream(server, requests())
    try:
        drain_until_closed(responses, T, received)
    finally:
        blocker.set()
        channel.close()
    codes = error_codes(bytes(received))
    assert expected_code in codes, codes
    assert rss() - baseline < 64 * nq.MiB
    other.put("unaffected").result(T)
    assert server.get(other.id, timeout=T).data == "unaffected"
    assert server.peers == (other.id,)


# ============================================================================ scale


@pytest.mark.slow
@pytest.mark.timeout(120)
@plain
def test_200_clients_grpc_one_server_thread(transport):
    """200 client communicators on one gRPC server: every message arrives both ways, and the
    server holds them without a thread per stream (grpc.aio on its one I/O thread)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    count = 200
    threads_before = threading.active_count()
    started = time.monotonic()
    _many_clients(transport, count)
    elapsed = time.monotonic() - started
    # Ours: one I/O thread per communicator (200 clients + the server); gRPC adds its
    # process-wide poller. A thread-per-stream server would add 200 more.
    assert threading.active_count() - threads_before <= count + 1 + 4
    assert elapsed < 60, elapsed


# ============================================================================ TLS


@tls
@pytest.mark.parametrize("mistake", ["untrusted-ca", "wrong-hostname"])
def test_untrusted_server_certificate_is_fatal(transport, mistake):
    files = transport.env.tls
    server = transport.make_server()
    if mistake == "untrusted-ca":
        client = transport.make_client(server, certificate=files.client_cert)  # not the CA
    else:
        client = transport.make_client(server, server_hostname="not-this-server.example")
    try:
        future = client.put("must never be seen")
    except nq.AuthenticationError:
        future = None
    if future is not None:
        assert isinstance(future.exception(T), nq.AuthenticationError)
    with pytest.raises(nq.AuthenticationError):
        client.put("again")
    with pytest.raises(nq.Empty):
        server.get(timeout=0.3)


@tls
def test_server_hostname_names_the_certificate(transport):
    server = transport.make_server()
    client = transport.make_client(server, server_hostname="localhost")  # a SAN of the cert
    client.put("checked against localhost").result(T)
    assert server.get(timeout=T).data == "checked against localhost"


# ============================================================================ set-up


@plain
def test_port_zero_reports_the_bound_port_and_a_taken_port_raises(transport):
    server = transport.make_server()
    host, port = server.address
    assert host == "127.0.0.1" and port > 0
    with pytest.raises(OSError):
        transport.make_server(netloc=nq.NetworkLocation(host="127.0.0.1", port=port))


@plain
def test_server_starts_and_binds_on_a_thread_running_an_event_loop(transport):
    """A Jupyter kernel runs every cell inside its asyncio loop, and so does a coroutine that
    calls ``netq.aio.new``: asyncio allows one running loop per thread, so the transport's own
    loop must not run on the caller's thread there. A server starts, serves and closes, and a
    taken port still raises OSError (not asyncio's RuntimeError from the clean-up)."""
    async def inside_a_running_loop():
        server = transport.make_server()
        client = transport.connect(server)
        server.put("from inside a loop", client.id).result(T)
        assert client.get(timeout=T).data == "from inside a loop"
        client.close(timeout=T)
        server.close(timeout=T)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(OSError):
                transport.make_server(
                    netloc=nq.NetworkLocation("127.0.0.1", taken.getsockname()[1]))

    asyncio.run(inside_a_running_loop())


@plain
def test_16_mib_message_travels_as_1_mib_grpc_messages(transport):
    """Nothing meets gRPC's 4 MiB default: packets are at most 1 MiB and both ends accept
    1 MiB + 64 KiB per gRPC message."""
    assert PACKET_SIZE == nq.MiB
    assert grpc_streams.MESSAGE_LIMIT >= PACKET_SIZE + 1024
    server = transport.make_server(max_size=16 * nq.MiB)
    client = transport.connect(server, max_size=16 * nq.MiB)
    payload = bytes(range(256)) * (16 * nq.MiB // 256)
    server.put(payload, client.id).result(T)
    assert client.get(timeout=T).data == payload


@plain
def test_a_large_bytes_body_travels_in_one_grpc_message_and_is_received_without_a_copy(
        transport, monkeypatch):
    """A 1 MiB ``bytes`` body and its frame header are one gRPC message (one write and one
    read per message), and the read-only part ``get()`` returns is a view of the very packet
    gRPC handed over. Small messages are still joined with their headers."""
    pushed: list = []
    received: list = []
    push = grpc_streams.CallStream.push
    packet_received = grpc_loop.LoopDrivenCarrier.packet_received

    def recorded_push(self, packet):
        pushed.append(packet)
        push(self, packet)

    def recorded_packet(self, channel, payload):
        received.append(payload)
        packet_received(self, channel, payload)

    monkeypatch.setattr(grpc_streams.CallStream, "push", recorded_push)
    monkeypatch.setattr(grpc_loop.LoopDrivenCarrier, "packet_received", recorded_packet)
    server = transport.make_server()
    client = transport.connect(server)
    body = bytes(range(256)) * (nq.MiB // 256)
    for _ in range(3):
        client.put(body).result(T)
        data = server.get(timeout=T).data
        assert data == body
        assert type(data) is memoryview and data.readonly
        (packet,) = [p for p in received if type(p) is bytes and data.obj is p]
        assert nq.MiB < len(packet) < nq.MiB + 100  # the body, its header and descriptor
    assert sum(len(packet) >= nq.MiB for packet in pushed) == 3
    small = b"s" * 100
    client.put(small).result(T)
    assert server.get(timeout=T).data == small
    assert not any(packet is small for packet in pushed)  # joined with its header


@plain
def test_a_stream_of_large_puts_is_received_whole_and_every_future_resolves(transport):
    """Large messages put back to back say that another follows (FOLLOWS) wherever the
    client's pump queues several at once, and the server then acknowledges several with one
    ACK: every message still arrives whole and in order, and every future resolves."""
    server = transport.make_server()
    client = transport.connect(server)
    bodies = [bytes([i]) * (256 * 1024) for i in range(40)]
    futures = [client.put(body) for body in bodies]
    for body in bodies:
        assert server.get(timeout=T).data == body
    for future in futures:
        future.result(T)
    wait_for(lambda: not server._loop._driver.owing, T, message="the server owes no ACK")


@plain
def test_an_ack_owed_for_a_message_nothing_follows_is_written_within_its_bound(
        transport, monkeypatch):
    """A sender whose next message never comes after all (cancelled after the pump saw it)
    still hears: the receiver writes the ACK it deferred once the carrier's ``ack_defer``
    has passed. Here every large message says FOLLOWS though nothing follows: each put's
    future resolves, no sooner than the bound. (64 KiB: the credit a link starts with,
    256 KiB, lasts past three of them, so each says FOLLOWS.)"""
    original = SendSide.queue_message

    def always_follows(self, seq, parts, total, batch, queued_behind=()):
        original(self, seq, parts, total, batch, [None])

    monkeypatch.setattr(SendSide, "queue_message", always_follows)
    server = transport.make_server()
    client = transport.connect(server)
    body = b"f" * (64 * 1024)
    for _ in range(3):
        started = time.monotonic()
        client.put(body).result(T)
        assert time.monotonic() - started >= grpc_transport.ACK_DEFER
        assert server.get(timeout=T).data == body


@plain
def test_an_owed_ack_is_written_while_callers_lead_the_loop(transport, monkeypatch):
    """A receiver whose ``get()`` waits for each message (it may read it itself, leading the
    loop while the I/O thread is parked) leaves with the message's ACK owed: the loop's next
    turn, whoever takes it, writes it once due, well before any timer of the engine's
    (heartbeats of 60 s here, longer than the test waits for a future)."""
    original = SendSide.queue_message

    def always_follows(self, seq, parts, total, batch, queued_behind=()):
        original(self, seq, parts, total, batch, [None])

    monkeypatch.setattr(SendSide, "queue_message", always_follows)
    server = transport.make_server(heartbeat=60.0)
    client = transport.connect(server, heartbeat=60.0)

    def get_while_client_puts(data) -> object:
        got: list = []
        reader = threading.Thread(target=lambda: got.append(server.get(timeout=T)),
                                  name="test-leading-get", daemon=True)
        reader.start()
        wait_for(lambda: server._inboxes._getters, T, message="the server's get() waits")
        client.put(data).result(T)
        reader.join(T)
        assert got
        return got[0].data

    # A small message handed to a waiting get(): the server's I/O thread leaves the loop to
    # callers from then on (leader/followers).
    assert get_while_client_puts("small") == "small"
    body = b"p" * (64 * 1024)
    for _ in range(3):
        assert get_while_client_puts(body) == body


@plain
def test_unix_socket_target(transport):
    """``NetworkLocation(path=...)``: gRPC over a Unix socket (``unix:`` target); the file is
    gone after close and the path can be bound again."""
    path = str(transport.env.unique_path("g", ".sock"))
    server = transport.make_server(netloc=nq.NetworkLocation(path=path))
    assert server.address == path
    client = transport.make_client(nq.NetworkLocation(path=path))
    client.put("over a unix socket").result(T)
    assert server.get(timeout=T).data == "over a unix socket"
    client.close(timeout=T)
    server.close(timeout=T)
    again = transport.make_server(netloc=nq.NetworkLocation(path=path))
    again.close(timeout=T)


@plain
def test_a_stream_that_ended_is_freed_at_once_with_its_buffers(transport):
    """A cut link's gRPC stream goes, with its pool of 1 MiB packet buffers and the link's
    connection state, as soon as the call is over: not whenever the cyclic garbage collector
    next runs (the stream and its link refer to each other)."""
    server = transport.make_server(max_size=16 * nq.MiB)
    client = transport.connect(server, max_size=16 * nq.MiB)
    payload = bytes(4 * nq.MiB)  # fills the client stream's pool

    def streams() -> list:
        return [o for o in gc.get_objects() if type(o) is grpc_streams.CallStream]

    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            client.put(payload).result(T)
            assert len(server.get(timeout=T).data) == len(payload)
            wait_for(lambda: transport.cut(client), T, message="a live link to cut")
        client.put(payload).result(T)  # on the fourth link
        assert len(server.get(timeout=T).data) == len(payload)
        # One stream per end is left: the current call's.
        wait_for(lambda: len(streams()) == 2, T,
                 message="the streams of the cut calls to be freed")
        assert all(not stream.finished and stream.opened for stream in streams())
    finally:
        gc.enable()


# ============================================================================ hot path


def echo_rounds(server, client, rounds: int) -> tuple[list, list]:
    """``rounds`` request/replies: the client puts 2i, a thread of the server's side gets it
    and puts 2i + 1 back, the client checks the reply. Returns the futures of both sides."""
    sent: list = []
    answered: list = []

    def serve():
        for _ in range(rounds):
            message = server.get(timeout=T)
            answered.append(server.put(message.data + 1, message.peer))

    worker = threading.Thread(target=serve, name="test-echo", daemon=True)
    worker.start()
    for i in range(rounds):
        sent.append(client.put(2 * i))
        assert client.get(timeout=T).data == 2 * i + 1
    worker.join(T)
    assert not worker.is_alive()
    return sent, answered


@plain
def test_round_trips_with_direct_writes_and_held_acks(transport):
    """Request/response: the ACK of each message waits (delayed ACK) for the reply, which a
    caller's thread writes itself (``direct_writes``) and which carries it. Every future
    resolves, including those of the last message each way, whose ACK no reply carries (the
    hold's timer sends it), and no message is lost, duplicated or reordered."""
    server = transport.make_server()
    client = transport.connect(server)
    sent, answered = echo_rounds(server, client, 300)
    for future in sent + answered:
        future.result(T)  # acknowledged: the held ACKs all left
    assert client._loop.direct_writes and server._loop.direct_writes


@plain
def test_a_blocked_get_runs_the_loop_itself_and_a_later_lone_put_still_goes(transport):
    """Leader/followers over gRPC: during round trips a blocked get() runs the netq loop, and
    the asyncio loop gRPC lives on, on its own thread (no hand-over from the I/O thread).
    Afterwards, with the I/O thread parked and nobody in get(), lone puts from the same
    threads still leave at once and are acknowledged: the caller's thread starts its own
    gRPC write, and the ACK is read by whoever runs the loop next."""
    server = transport.make_server()
    client = transport.connect(server)
    sent, answered = echo_rounds(server, client, 100)
    for future in sent + answered:
        future.result(T)
    assert client._loop.caller_led_turns > 0
    assert server._loop.caller_led_turns > 0
    # Lone puts both ways, no get() on the putting side afterwards.
    client.put("lone from the client").result(T)
    assert server.get(timeout=T).data == "lone from the client"
    server.put("lone from the server", client.id).result(T)
    assert client.get(timeout=T).data == "lone from the server"


@plain
def test_ctrl_c_during_a_write_pass_on_the_main_thread_waits_for_its_end(transport, monkeypatch,
                                                                          request):
    """On the main thread, the asyncio loop runs in a put's pass (the loop is free while the
    I/O thread is parked) or in a leading get()'s wait, and with it the stream's writer. A
    Ctrl-C landing inside the writer's task waits for the end of the pass or the turn and is
    raised then, from put() or get(): raised in the task, it would end the writer for good and
    the link would send nothing until heartbeats gave it up. No message is lost, and the link
    goes on. (Raised from put(), it may cut the put's bookkeeping short, as a Ctrl-C in put()
    can on every transport: the link is then replaced and the session resumed.)"""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread (signal handlers run there)")
    # Python's own handler, whatever the process inherited (SIGINT is ignored under nohup and
    # in a background CI step): the one a user's interpreter starts with.
    inherited = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, inherited))
    landed = threading.Event()
    writers: list = []  # the writer's task the interrupt landed in
    write = grpc.aio._call._StreamRequestMixin.write

    def write_with_a_ctrl_c(self, request):
        if not landed.is_set() and threading.current_thread() is threading.main_thread():
            landed.set()
            writers.append(asyncio.current_task())
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the task
        return write(self, request)

    # Before the client exists: its writer takes the method when the stream opens.
    monkeypatch.setattr(grpc.aio._call._StreamRequestMixin, "write", write_with_a_ctrl_c)
    server = transport.make_server()
    client = transport.connect(server)
    stop = threading.Event()

    def echo():
        while not stop.is_set():
            try:
                message = server.get(timeout=0.1)
            except nq.Empty:
                continue
            server.put(message.data, message.peer)

    echoing = threading.Thread(target=echo, name="test-echo", daemon=True)
    echoing.start()
    interrupts = []

    def round_trip(value):
        # The interrupt surfaces from put() (its pass) or from get() (the end of the turn
        # in which a leading get() ran the writer): either way nothing is lost.
        try:
            client.put(value)
        except KeyboardInterrupt:
            interrupts.append(value)
        while True:
            try:
                return client.get(timeout=T).data
            except KeyboardInterrupt:
                interrupts.append(value)

    try:
        for i in range(500):  # until the writer ran on this thread
            assert round_trip(i) == i
            if landed.is_set():
                break
        assert landed.is_set(), "the writer never ran on the main thread"
        assert interrupts == [i]
        for j in range(10):  # the writer lives on
            assert round_trip(1000 + j) == 1000 + j
        assert interrupts == [i]
        writer = writers[0]  # running still, or cancelled with its stream: not killed
        assert not (writer.done() and not writer.cancelled()
                    and isinstance(writer.exception(), KeyboardInterrupt))
    finally:
        stop.set()
        echoing.join(T)


@plain
def test_a_held_ack_wait_ends_with_the_reply_not_its_timer(transport, monkeypatch):
    """While a wait is no longer than a held ACK (``ack_hold``), the reply ends it: either a
    caller's thread writes it (it carries the ACK; the wait ends with that write) or it is
    read as a packet. No such wait runs into its timer (a wake-up per round trip for
    nothing). The hold is made long here (5 s) so that a wait that ran into its timer would
    show as one of at least 5 s, however slow the machine."""
    hold = 5.0
    monkeypatch.setattr(grpc_transport.GRPCCarrier, "ack_hold", hold)
    short_waits: list[float] = []
    sleep = grpc_loop.LoopDrivenCarrier._sleep

    def timed_sleep(self, timeout: float) -> None:
        began = time.monotonic()
        sleep(self, timeout)
        if 0 < timeout <= hold:
            short_waits.append(time.monotonic() - began)

    monkeypatch.setattr(grpc_loop.LoopDrivenCarrier, "_sleep", timed_sleep)
    server = transport.make_server()
    client = transport.connect(server)
    rounds = 50
    echo_rounds(server, client, rounds)
    # Each side holds the ACK of nearly every message it gets, and its reply carries it.
    assert len(short_waits) >= rounds, short_waits
    assert max(short_waits) < hold, max(short_waits)


def test_waits_share_the_deadline_timer_and_never_end_later_than_asked():
    """The asyncio timer that ends the netq loop's waits is kept across waits for the same
    deadline (no timer handle per wait); a wait as short as a held ACK's gets one of its own
    and leaves the kept one alone; any other deadline earlier than the kept timer, or far
    earlier than the wait asks for, replaces it, and the waits after it share the new one (a
    caller leading the loop waits in slices). No wait ends later than its timeout (beyond the
    selector's millisecond)."""
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(host="127.0.0.1", port=1))
    carrier = grpc_transport.GRPCCarrier(options, nq.Purpose.CLIENT)
    try:
        loop = carrier._loop
        assert carrier._timer_for(5.0) is None
        kept = carrier._deadline_timer
        assert kept is not None and abs(kept.when() - (loop.time() + 5.0)) < 0.1
        assert carrier._timer_for(kept.when() - loop.time()) is None  # the same deadline
        assert carrier._deadline_timer is kept
        own = carrier._timer_for(carrier.ack_hold)  # a held ACK's wait
        assert own is not None and own.when() <= loop.time() + carrier.ack_hold
        assert carrier._deadline_timer is kept and not kept.cancelled()
        own.cancel()
        assert carrier._timer_for(0.05) is None  # a leading get()'s slice replaces it
        assert kept.cancelled()
        sliced = carrier._deadline_timer
        assert sliced is not None and sliced.when() <= loop.time() + 0.05
        assert carrier._timer_for(0.05) is None and carrier._deadline_timer is sliced
        assert carrier._timer_for(60.0) is None  # the kept one would end it 59 s early
        assert sliced.cancelled() and carrier._deadline_timer is not None
        later = carrier._deadline_timer.when()
        assert loop.time() + 60.0 - 6.0 <= later <= loop.time() + 60.0 + grpc_loop.LATE_ALLOWANCE
    finally:
        carrier.close(None)
