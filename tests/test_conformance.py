"""Transport conformance: the put()/get() contract, identical on every transport.

Each test runs once per entry of ``conftest.TRANSPORTS`` (tcp, tls, unix, tcp6 where IPv6
loopback works; MQTT and gRPC join by adding an entry there). The ``transport`` fixture builds
servers and clients with the right options for the transport and closes them at teardown; the
autouse leak check fails any test that leaves netq threads or file descriptors behind.

Timeouts are generous (T seconds per blocking call): the machine may be loaded by benchmarks,
and nothing here measures speed. Where a bound is the point (put(timeout=0.2)), the assertion
allows a wide margin above it.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import queue
import threading
import time
import uuid

import numpy as np
import pytest

import netq as nq
from netq_testing import Sampler, peer_row, rss, sequence_payload, wait_for

KiB, MiB = nq.KiB, nq.MiB
T = 30.0  # seconds any single blocking step may take before the test is considered stuck

pytestmark = pytest.mark.timeout(90)


def drain(comm: nq.Communicator, count: int, *peers: uuid.UUID) -> list:
    return [comm.get(*peers, timeout=T).data for _ in range(count)]


def assert_closed(error: BaseException | None) -> None:
    """``error`` says this side closed it (close() was called): ResourceClosed, for this
    communicator, and not its sibling ConnectionLost; the common base catches it."""
    assert isinstance(error, nq.ResourceClosed), repr(error)
    assert not isinstance(error, nq.ConnectionLost), repr(error)
    assert isinstance(error, nq.ResourceGone) and error.peer is None, repr(error)


def assert_broken(error: BaseException | None, peer: uuid.UUID) -> None:
    """``error`` says ``peer`` or the network ended it, not this side: ConnectionLost naming
    the peer, and not its sibling ResourceClosed; the common base catches it."""
    assert isinstance(error, nq.ConnectionLost), repr(error)
    assert not isinstance(error, nq.ResourceClosed), repr(error)
    assert isinstance(error, nq.ResourceGone) and error.peer == peer, repr(error)


def come_back_for_more(comm: nq.Communicator) -> None:
    """Ask for the next message when there is none. The credit of the message get() returned
    last goes back to its sender only now (the caller held it until it came back), so tests
    with a one-message window call this after their last get()."""
    with pytest.raises(nq.Empty):
        comm.get_nowait()


# ============================================================================ basics


def test_round_trip(transport):
    server = transport.make_server()
    client = transport.make_client(server)
    future = client.put({"hello": "server", "n": 1})
    assert isinstance(future, nq.DeliveryFuture)
    assert future.result(T) is None
    message = server.get(timeout=T)
    assert isinstance(message, nq.Message)
    assert message.peer == client.id
    assert message.data == {"hello": "server", "n": 1}
    assert server.peers == (client.id,)

    assert server.put(["reply", 2], message.peer).result(T) is None
    reply = client.get(timeout=T)
    assert reply.peer == server.id
    assert reply.data == ["reply", 2]
    assert client.peers == (server.id,)


@pytest.mark.timeout(120)
def test_fifo_per_peer_10k_mixed_sizes(transport):
    """10k messages per client, sizes from 0 B to 300 KiB, two clients at once: each peer's
    messages arrive in put() order and intact; the same for 10k server -> client."""
    count = 10_000

    def size_of(index: int) -> int:
        if index % 1000 == 500:
            return 300 * KiB
        if index % 50 == 25:
            return 16 * KiB
        return index % 97

    server = transport.make_server()
    clients = [transport.connect(server) for _ in range(2)]
    futures: list = []

    def send(client):
        futures.extend(client.put((index, sequence_payload(index, size_of(index))))
                       for index in range(count))

    senders = [threading.Thread(target=send, args=(c,), name="test-sender") for c in clients]
    for thread in senders:
        thread.start()
    received = {client.id: [] for client in clients}
    for _ in range(count * len(clients)):
        message = server.get(timeout=T)
        index, payload = message.data
        assert payload == sequence_payload(index, size_of(index)), f"message {index} corrupted"
        received[message.peer].append(index)
    for thread in senders:
        thread.join(T)
    for client in clients:
        assert received[client.id] == list(range(count)), "out of order, lost or duplicated"
    for future in futures:
        assert future.result(T) is None

    target = clients[0]
    back = [server.put((index, sequence_payload(index, size_of(index))), target.id)
            for index in range(count)]
    for expected in range(count):
        index, payload = target.get(timeout=T).data
        assert index == expected
        assert payload == sequence_payload(index, size_of(index))
    for future in back:
        assert future.result(T) is None


@pytest.mark.parametrize("payload", [b"", None, [], "", (), {}, bytearray()],
                         ids=["bytes", "None", "list", "str", "tuple", "dict", "bytearray"])
def test_empty_payloads(transport, payload):
    server = transport.make_server()
    client = transport.make_client(server)
    client.put(payload).result(T)
    message = server.get(timeout=T)
    assert message.data == payload
    assert type(message.data) is type(payload)
    server.put(payload, message.peer).result(T)
    back = client.get(timeout=T).data
    assert back == payload
    assert type(back) is type(payload)


@pytest.mark.timeout(180)
def test_64_mib_payload_arrives_intact_as_a_read_only_view(transport):
    """A large read-only payload arrives as a read-only memoryview of the buffer it was
    received into (netq._buffers: no copy, and no bytes object can be filled without one)."""
    data = np.random.default_rng(64).bytes(64 * MiB)
    server = transport.make_server()
    client = transport.make_client(server)
    client.put(data).result(120)
    message = server.get(timeout=120)
    assert type(message.data) is memoryview and message.data.readonly
    assert len(message.data) == len(data)
    assert message.data == data


def _arrays():
    rng = np.random.default_rng(5)
    return [
        np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000),
        np.asfortranarray(np.arange(600, dtype=np.int16).reshape(20, 30)),
        np.arange(300, dtype=np.uint8)[::3],  # not contiguous
        np.zeros(0, dtype=np.float32),
        np.array(3.5),
        np.array([(1, 2.0), (3, 4.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
        rng.standard_normal((128, 64)).astype(np.complex64),
        rng.integers(0, 2, size=(7, 5, 3)).astype(bool),
    ]


def test_numpy_arrays_equal_and_writable(transport):
    server = transport.make_server()
    client = transport.make_client(server)
    arrays = _arrays()
    for array in arrays:
        client.put(array)
    for index, array in enumerate(arrays):
        got = server.get(timeout=T).data
        assert isinstance(got, np.ndarray), index
        assert got.dtype == array.dtype and got.shape == array.shape, index
        assert np.array_equal(got, array), index
        assert got.flags.writeable, f"array {index} arrived read-only"
        got[...] = got  # really writable, not just flagged
    # and server -> client, in one message
    server.put({"arrays": arrays}, client.id).result(T)
    for array, got in zip(arrays, client.get(timeout=T).data["arrays"], strict=True):
        assert np.array_equal(got, array) and got.dtype == array.dtype
        assert got.flags.writeable


# ============================================================================ addressing


def test_a_broadcast_with_no_client_connected_says_it_reached_no_one(transport, caplog):
    # The natural first cell: make a server and a client and put at once, while the client is
    # still connecting. The message goes nowhere (net-queue's contract: a put() that names
    # no peer goes to the clients connected now), and netq says so instead of nothing.
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "reached no one" in r.getMessage()]

    with caplog.at_level("WARNING", logger="netq"):
        server = transport.make_server()
        future = server.put("to no one")
        assert future.done() and future.result() is None
        assert "remaining=0" in repr(future)
        server.put("again")
        assert len(said()) == 1  # once, not per put
        assert "no client is connected" in said()[0] and "server.peers" in said()[0]
        client = transport.connect(server)
        wait_for(lambda: server.peers, T, message="the client to connect")
        server.put("reaches").result(T)
        assert client.get(timeout=T).data == "reaches"
        client.close(timeout=T)
        wait_for(lambda: not server.peers, T, message="the client to leave")
        server.put("to no one again")
        assert len(said()) == 2  # a broadcast reached a client in between: said again


def test_a_get_that_times_out_says_whom_it_waited_for(transport):
    server = transport.make_server()
    with pytest.raises(nq.Empty, match=r"get\(timeout=0.05\) found no message in 0.05 s; no "
                                       r"client is connected$"):
        server.get(timeout=0.05)
    client = transport.connect(server)
    wait_for(lambda: server.peers, T, message="the client to connect")
    with pytest.raises(nq.Empty, match="; 1 client is connected, and nothing came from it"):
        server.get(timeout=0.05)
    with pytest.raises(nq.Empty, match="from the peer it named; 1 client is connected"):
        server.get(client.id, timeout=0.05)
    with pytest.raises(nq.Empty, match="; the server is connected, and nothing came from it"):
        client.get(timeout=0.05)
    with pytest.raises(nq.Empty) as nothing:
        client.get_nowait()  # a poll in a loop: no text to build
    assert str(nothing.value) == ""


def test_broadcast_future_resolves_only_when_every_peer_has_it(transport):
    server = transport.make_server()
    clients = [transport.connect(server) for _ in range(4)]
    slow = transport.connect(server, queue_size=1)  # holds at most one unconsumed message
    server.put("filler", slow.id).result(T)  # slow's only message slot is now taken

    future = server.put("broadcast")
    for client in clients:
        assert client.get(timeout=T).data == "broadcast"
    wait_for(lambda: peer_row(server, slow.id).queue_out == 1, T,
             message="the broadcast to wait in the server's queue for slow")
    # "Not resolved" has no event: a correct netq never resolves it while slow's copy
    # waits, so a slow machine only gives a wrong one less time to show, never a failure.
    time.sleep(0.5)
    assert not future.done(), "broadcast resolved before the fifth peer received it"
    assert peer_row(server, slow.id).queue_out == 1

    assert slow.get(timeout=T).data == "filler"
    time.sleep(0.3)  # the same negative window: filler's credit is not back yet
    assert not future.done(), "slow's netq cannot take it while filler is in slow's hands"
    # Coming back for the next message returns filler's credit: the broadcast goes out.
    assert slow.get(timeout=T).data == "broadcast"
    assert future.result(T) is None
    for client in clients + [slow]:
        with pytest.raises(nq.Empty):
            client.get_nowait()


def test_a_peer_leaving_mid_broadcast_costs_the_others_nothing(transport):
    """Three clients that each hold at most one unconsumed message, so a broadcast of 20
    waits in the server's queue for all of them. One leaves: the other two still receive all
    20, in order, and the futures the leaver did not acknowledge then fail, saying that 2 of
    3 peers have the message and why the third does not."""
    count = 20
    server = transport.make_server()
    staying = [transport.connect(server, queue_size=1) for _ in range(2)]
    leaving = transport.connect(server, queue_size=1)
    futures = [server.put(index) for index in range(count)]
    wait_for(lambda: peer_row(server, leaving.id).queue_out >= count - 2, T,
             message="the broadcast to queue up for the leaving client")
    leaving.close(timeout=T)
    for client in staying:
        assert [client.get(timeout=T).data for _ in range(count)] == list(range(count))
        with pytest.raises(nq.Empty):
            client.get(timeout=0.2)
    for future in futures[-5:]:
        with pytest.raises(nq.BroadcastIncomplete) as raised:
            future.result(T)
        assert (raised.value.delivered, raised.value.addressed) == (2, 3)
        assert list(raised.value.failed) == [leaving.id]
        assert_broken(raised.value.failed[leaving.id], leaving.id)  # its doing, not ours


def test_put_to_named_peers(transport):
    server = transport.make_server()
    a, b, c = (transport.connect(server) for _ in range(3))
    server.put("only b", b.id).result(T)
    assert b.get(timeout=T).data == "only b"
    for other in (a, c):
        with pytest.raises(nq.Empty):
            other.get(timeout=0.3)

    server.put("a and c", a.id, c.id).result(T)
    assert a.get(timeout=T).data == "a and c"
    assert c.get(timeout=T).data == "a and c"
    with pytest.raises(nq.Empty):
        b.get(timeout=0.3)
    # a client names its server explicitly, or nobody
    a.put("to the server", server.id).result(T)
    assert server.get(timeout=T) == nq.Message(a.id, "to the server")


def test_get_filters_by_peer(transport):
    server = transport.make_server()
    a = transport.connect(server)
    b = transport.connect(server)
    a.put("a1").result(T)
    a.put("a2").result(T)
    b.put("b1").result(T)
    assert server.get(b.id, timeout=T) == nq.Message(b.id, "b1")
    with pytest.raises(nq.Empty):
        server.get(b.id, timeout=0.2)  # a's messages wait, but b has nothing more
    assert server.get(a.id, b.id, timeout=T) == nq.Message(a.id, "a1")
    assert server.get(timeout=T) == nq.Message(a.id, "a2")
    server.put("x", a.id).result(T)
    assert a.get(server.id, timeout=T).data == "x"


def test_get_timeout_and_get_nowait_raise_empty(transport):
    server = transport.make_server()
    client = transport.connect(server)
    for comm in (server, client):
        started = time.monotonic()
        with pytest.raises(nq.Empty) as caught:
            comm.get(timeout=0.3)
        elapsed = time.monotonic() - started
        assert isinstance(caught.value, queue.Empty)
        assert 0.25 <= elapsed < 10
        with pytest.raises(queue.Empty):
            comm.get_nowait()
        with pytest.raises(nq.Empty):
            comm.get(block=False)
        with pytest.raises(nq.Empty):
            comm.get_many(timeout=0.05)


def test_unknown_peer(transport):
    server = transport.make_server()
    client = transport.connect(server)
    stranger = uuid.uuid4()
    # What the caller may have meant: a server names how many clients it has; a client has
    # only its server.
    not_a_client = "no client with this id has connected to this server (server.peers lists " \
                   "the 1 it has now)"
    not_the_server = "not this client's server; a client puts to and gets from its server " \
                     "only: name no peer"
    for call, says in ((lambda: server.put("x", stranger), not_a_client),
                       (lambda: server.put("x", client.id, stranger), not_a_client),
                       (lambda: server.get(stranger, timeout=1), not_a_client),
                       (lambda: client.put("x", stranger), not_the_server),
                       (lambda: client.get(stranger, timeout=1), not_the_server)):
        with pytest.raises(nq.UnknownPeer) as caught:
            call()
        assert isinstance(caught.value, KeyError)
        assert caught.value.peer == stranger
        assert str(caught.value) == f"unknown peer {stranger}: {says}"
    # nothing was half-sent to the known peer by the mixed call
    with pytest.raises(nq.Empty):
        client.get(timeout=0.3)


# ============================================================================ scale and fairness


def _many_clients(transport, count: int) -> None:
    server = transport.make_server()
    clients = [transport.make_client(server) for _ in range(count)]
    futures = [client.put(("index", index)) for index, client in enumerate(clients)]
    seen = {}
    for _ in range(count):
        message = server.get(timeout=T)
        seen[message.peer] = message.data[1]
    assert seen == {client.id: index for index, client in enumerate(clients)}
    for future in futures:
        assert future.result(T) is None
    assert len(server.peers) == count
    for peer, index in seen.items():
        server.put(index * 2, peer)
    for index, client in enumerate(clients):
        assert client.get(timeout=T).data == index * 2
    assert len(server.statistics().peers) == count


def test_many_clients(transport):
    _many_clients(transport, 50)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_200_clients_tcp(transport):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    started = time.monotonic()
    _many_clients(transport, 200)
    assert time.monotonic() - started < 60  # target < 30 s; fail only when far off


def test_fairness_four_flooding_clients(transport):
    server = transport.make_server()
    clients = [transport.connect(server) for _ in range(4)]
    futures: list = []

    def flood(client):
        futures.extend(client.put((str(client.id), index)) for index in range(600))

    threads = [threading.Thread(target=flood, args=(c,), name="test-flood") for c in clients]
    for thread in threads:
        thread.start()
    # Every client has a backlog at the server before it starts taking.
    wait_for(lambda: all(peer_row(server, c.id).queue_in >= 150
                         for c in clients), T, message="a backlog of 150 from every client")
    counts = {str(client.id): 0 for client in clients}
    for _ in range(400):
        counts[server.get(timeout=T).data[0]] += 1
    assert all(70 <= n <= 130 for n in counts.values()), counts
    for thread in threads:
        thread.join(T)
    for future in futures:
        future.result(T)


def test_put_many_get_many(transport):
    server = transport.make_server()
    client = transport.connect(server)
    before = peer_row(server, client.id).messages_in
    client.put_many(range(1000)).result(T)
    assert peer_row(server, client.id).messages_in == before + 1  # one wire message
    got = []
    while len(got) < 1000:
        batch = server.get_many(max_messages=300, timeout=T)
        assert 1 <= len(batch) <= 300
        assert all(message.peer == client.id for message in batch)
        got.extend(message.data for message in batch)
    assert got == list(range(1000))

    # batches and single puts interleave in order; get() takes batch elements one by one
    client.put("a")
    client.put_many(["b", "c", "d"])
    client.put("e").result(T)
    assert server.get(timeout=T).data == "a"
    assert server.get(timeout=T).data == "b"
    assert [m.data for m in server.get_many(max_messages=2, timeout=T)] == ["c", "d"]
    assert [m.data for m in server.get_many(timeout=T)] == ["e"]

    with pytest.raises(ValueError):
        client.put_many([])
    server.put_many([1, 2, 3], client.id).result(T)
    assert [m.data for m in client.get_many(max_messages=10, timeout=T)] == [1, 2, 3]


# ======================================================================== delivery and flow control


def test_future_resolves_on_delivery_not_on_get(transport):
    """Delivery = received by the peer's netq. With queue_size=1 the peer's netq holds one
    unconsumed message at most (the one in its queue, or the one get() returned last, until
    the caller comes back for the next), so a second put stays pending until then."""
    server = transport.make_server(recv_budget=64 * KiB, queue_size=1)
    client = transport.connect(server)
    come_back_for_more(server)  # done with the hello
    big = bytes(256 * KiB)
    first = client.put(big)
    assert first.result(T) is None  # nobody called get(): still delivered
    second = client.put(big)
    # "Not delivered" has no event: a correct netq never delivers it while the server holds
    # its only allowed message, so a slow machine only gives a wrong one less time to show.
    time.sleep(0.5)
    assert not second.done(), "delivered although the server holds its only allowed message"
    row = client.statistics().peers[0]
    assert row.queue_out == 1 and row.inflight == 0
    assert len(server.get(timeout=T).data) == len(big)  # first: now in the caller's hands
    time.sleep(0.3)  # the same negative window: the server has not come back for more yet
    assert not second.done()
    assert len(server.get(timeout=T).data) == len(big)  # coming back lets second in
    assert second.result(T) is None


def test_put_landing_during_an_io_pump_is_not_stranded(transport):
    """Regression (fixed in 3b9077f): a put() that lands while the I/O thread is pumping the
    same session used to find ``scheduled`` cleared, schedule the session again, and be
    dropped by the pass's de-duplication with ``scheduled`` left True: no later put, ACK or
    CREDIT rescheduled it, and the peer's outbox stalled forever. The interleaving is forced
    here by putting from another thread inside the I/O thread's pump."""
    server = transport.make_server()
    client = transport.connect(server)
    original = client._engine._pump
    fired = threading.Event()
    helpers: list = []

    def pump(session, link):
        original(session, link)
        if (not fired.is_set() and session.inflight
                and threading.current_thread().name.startswith("netq-io")):
            fired.set()
            helper = threading.Thread(
                target=lambda: helpers.append(client.put(("late", bytes(100 * KiB)))),
                name="test-late-put")
            helper.start()
            helper.join(T)

    client._engine._pump = pump
    first = client.put(("first", bytes(100 * KiB)))
    second = client.put(("second", bytes(100 * KiB)))  # in flight behind `first`: I/O thread
    wait_for(fired.is_set, T, message="the I/O thread to pump")
    got = [server.get(timeout=10).data[0] for _ in range(3)]
    assert sorted(got) == ["first", "late", "second"]  # late vs second: two threads, any order
    assert got.index("first") < got.index("second")
    for future in [first, second] + helpers:
        assert future.result(T) is None


def test_backpressure_full(transport):
    server = transport.make_server(recv_budget=1 * KiB, queue_size=1)
    client = transport.connect(server, send_budget=64 * KiB)
    come_back_for_more(server)  # done with the hello
    message = bytes(32 * KiB)
    futures = [client.put(message)]
    futures[0].result(T)  # took the server's whole credit: nothing more goes out
    futures.append(client.put(message))
    futures.append(client.put(message))  # 64 KiB unsent: the send window is full
    with pytest.raises(nq.Full) as caught:
        client.put(message, block=False)
    assert isinstance(caught.value, queue.Full)
    started = time.monotonic()
    with pytest.raises(nq.Full):
        client.put(message, timeout=0.2)
    elapsed = time.monotonic() - started
    assert 0.18 <= elapsed < 5, elapsed
    with pytest.raises(nq.Full):
        client.put_many([message], block=False)

    # A blocked put proceeds once the server consumes; nothing is lost.
    blocked: list = []
    thread = threading.Thread(target=lambda: blocked.append(client.put(("last", message))),
                              name="test-blocked-put")
    thread.start()
    # "Still blocked" has no event: a correct put blocks until the server consumes, so a
    # slow machine only means the thread may not have reached put() yet, never a failure.
    time.sleep(0.2)
    assert thread.is_alive() and not blocked, "put did not block on a full window"
    for _ in range(3):
        assert server.get(timeout=T).data == message
    thread.join(T)
    assert server.get(timeout=T).data == ("last", message)
    for future in futures + blocked:
        assert future.result(T) is None


@pytest.mark.timeout(120)
def test_memory_bounded_200_mib_through_slow_consumer(transport):
    window = 4 * MiB
    size = 1 * MiB
    count = 200
    server = transport.make_server(recv_budget=window)
    client = transport.connect(server, send_budget=window)
    block = np.random.default_rng(7).bytes(size)
    consumed: list = []
    errors: list = []

    def consume(n):
        try:
            for _ in range(n):
                data = server.get(timeout=T).data
                consumed.append(int.from_bytes(data[:4], "little"))
                del data
                time.sleep(0.003)  # a slow consumer (the subject), not a wait for a state
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    def produce(first, n):
        futures = []
        for index in range(first, first + n):
            payload = bytearray(block)
            payload[:4] = index.to_bytes(4, "little")
            futures.append(client.put(payload))
        return futures

    # Warm up the allocator and the links, then measure from there.
    warm = threading.Thread(target=consume, args=(16,), name="test-consumer")
    warm.start()
    for future in produce(0, 16):
        future.result(T)
    warm.join(T)
    gc.collect()
    baseline = rss()

    def netq_memory():
        return server.statistics().memory + client.statistics().memory

    consumer = threading.Thread(target=consume, args=(count,), name="test-consumer")
    with Sampler(rss) as rss_peak, Sampler(netq_memory) as netq_peak:
        consumer.start()
        futures = produce(16, count)
        consumer.join(120)
    assert not errors, errors
    assert consumed == list(range(16 + count))
    for future in futures:
        assert future.result(T) is None
    # netq's own accounting: receiver <= window + one message, sender <= send window + one
    # message unsent plus what the receiver's credit lets be in flight.
    assert netq_peak.peak <= 3 * (window + size) + size, netq_peak.peak
    growth = rss_peak.peak - baseline
    assert growth < 64 * MiB, f"RSS grew by {growth / MiB:.1f} MiB while 200 MiB passed"


def test_message_too_large(transport):
    """put() raises MessageTooLarge itself (a mistake in the caller's code, reported where it
    is made): no future, nothing queued or sent, and the next put goes through."""
    server = transport.make_server()
    client = transport.connect(server, message_size=1 * KiB)
    with pytest.raises(nq.MessageTooLarge) as caught:
        client.put(bytes(2 * KiB))
    error = caught.value
    assert isinstance(error, ValueError) and error.peer is None  # our own limit
    assert error.limit == 1 * KiB and error.size > 2 * KiB
    with pytest.raises(nq.MessageTooLarge):
        client.put_many([bytes(600), bytes(600)])
    assert client.statistics().peers[0].queue_out == 0  # nothing was queued
    # Never split, never sent, nothing else lost: the next put goes through, alone.
    client.put(bytes(100)).result(T)
    assert server.get(timeout=T).data == bytes(100)
    with pytest.raises(nq.Empty):
        server.get(timeout=0.3)
    # The server's own limit applies to what it puts.
    limited = transport.make_server(message_size=1 * KiB)
    other = transport.connect(limited)
    with pytest.raises(nq.MessageTooLarge):
        limited.put(bytes(2 * KiB), other.id)
    limited.put(bytes(100), other.id).result(T)
    assert other.get(timeout=T).data == bytes(100)


def test_put_over_a_connected_peers_message_size_raises_at_once(transport):
    """The peer's limit came with its handshake: put() raises, naming the peer, and the
    communicator still works."""
    server = transport.make_server(message_size=1 * KiB)
    client = transport.connect(server)
    with pytest.raises(nq.MessageTooLarge) as caught:
        client.put(bytes(4 * KiB))
    assert (caught.value.limit, caught.value.peer) == (1 * KiB, server.id)
    client.put("still alive").result(T)
    assert server.get(timeout=T).data == "still alive"
    with pytest.raises(nq.Empty):
        server.get(timeout=0.3)  # the large one was never sent


def test_a_broadcast_over_one_peers_message_size_goes_to_no_one(transport):
    """One of the addressed peers takes less than the message: put() raises before sending
    to anyone (no peer gets a message the others do not), naming that peer."""
    server = transport.make_server()
    roomy = transport.connect(server)
    small = transport.connect(server, message_size=1 * KiB)
    for peers in ((), (roomy.id, small.id)):
        with pytest.raises(nq.MessageTooLarge) as caught:
            server.put(bytes(4 * KiB), *peers)
        assert (caught.value.limit, caught.value.peer) == (1 * KiB, small.id)
    server.put(bytes(4 * KiB), roomy.id).result(T)  # alone, roomy takes it
    server.put("to everyone").result(T)
    assert roomy.get(timeout=T).data == bytes(4 * KiB)
    for client in (roomy, small):
        assert client.get(timeout=T).data == "to everyone"
        with pytest.raises(nq.Empty):
            client.get(timeout=0.3)


def test_a_peers_message_size_learnt_after_the_put_fails_its_future(transport):
    """Put before the server's handshake: its limit is not known yet, so put() cannot raise;
    the future fails with MessageTooLarge once it is, and only that message is lost."""
    placeholder = transport.make_server()
    location = transport.location(placeholder)
    placeholder.close()
    client = transport.make_client(location, reconnect_max=0.2)
    large = client.put(bytes(4 * KiB))
    after = client.put("after")
    server = transport.make_server(netloc=location, message_size=1 * KiB)
    error = large.exception(T)
    assert isinstance(error, nq.MessageTooLarge), error
    assert (error.limit, error.peer) == (1 * KiB, server.id)
    assert after.result(T) is None
    assert server.get(timeout=T).data == "after"


# ============================================================================ closing


def test_client_close_flushes_then_server_drains_then_resource_closed(transport):
    server = transport.make_server()
    client = transport.connect(server)
    futures = [client.put(index) for index in range(100)]
    client.close()  # waits until the server has everything, then says goodbye
    assert client.closed
    for future in futures:
        assert future.done() and future.exception() is None
    wait_for(lambda: client.id not in server.peers, T, message="the client to leave")

    server.close(timeout=T)  # nobody left to wait for; what was received stays gettable
    assert drain(server, 100) == list(range(100))
    with pytest.raises(nq.ResourceClosed) as caught:
        server.get(timeout=1)
    assert_closed(caught.value)
    with pytest.raises(nq.ResourceClosed):
        server.get_nowait()
    with pytest.raises(nq.ResourceClosed) as caught:
        client.get(timeout=1)
    assert_closed(caught.value)


def test_server_close_with_timeout_fails_pending_futures(transport):
    """The server gives up on an attached client after ``timeout``: its own pending puts fail
    with ResourceClosed (it closed them), the client's with ConnectionLost (the server went
    away: told so, or after the client's session_timeout if it is not)."""
    server = transport.make_server(recv_budget=1 * KiB, queue_size=1)
    client = transport.connect(server, queue_size=1, session_timeout=2.0)
    come_back_for_more(server)  # done with the hello
    server.put(("to client", 0), client.id).result(T)  # takes the client's only slot
    server_pending = [server.put(("to client", index), client.id) for index in (1, 2)]
    client.put(bytes(32 * KiB)).result(T)  # takes the server's whole credit
    client_pending = [client.put(bytes(32 * KiB)) for _ in range(2)]
    # "Still pending" has no event: with both sides' credit taken a correct netq delivers
    # none of them, so a slow machine only gives a wrong one less time to show.
    time.sleep(0.2)
    assert not any(future.done() for future in server_pending + client_pending)

    started = time.monotonic()
    server.close(timeout=0.5)
    assert time.monotonic() - started < 10
    for future in server_pending:
        assert_closed(future.exception(0))
    for future in client_pending:
        assert_broken(future.exception(T), server.id)
    assert client.get(timeout=T).data == ("to client", 0)  # what arrived stays gettable
    started = time.monotonic()
    client.close(timeout=T)
    assert time.monotonic() - started < 10


def test_server_close_with_timeout_tells_attached_clients(transport):
    server = transport.make_server()
    client = transport.connect(server)
    io = server._loop
    carrier = io.carrier
    wait = carrier.wait  # every carrier's: the loop waits for its events there

    def slow_wait(timeout):
        events = wait(timeout)
        # An I/O thread slow to wake up, as on a loaded machine: it resumes once close() has
        # decided to abort, or after 0.3 s (close() with a grace period passes this test).
        deadline = time.monotonic() + 0.3
        while not io._aborted and time.monotonic() < deadline:
            time.sleep(0.001)  # simulates the slow wake-up (bounded poll on _aborted)
        return events

    carrier.wait = slow_wait
    server.close(timeout=0.2)
    wait_for(lambda: client.statistics().peers[0].state == "closed", 3,
             message="the client to learn that the server shut down")
    with pytest.raises(nq.ConnectionLost) as caught:
        client.put("after the shutdown")
    assert_broken(caught.value, server.id)


def test_client_get_after_server_shutdown_raises_connection_lost(transport):
    """The server went away (it closed; the client did not): put() and, once what arrived
    was taken, get() raise ConnectionLost, not ResourceClosed."""
    server = transport.make_server()
    client = transport.connect(server)
    server.put("last words", client.id).result(T)
    # Sidestep the close(timeout) race above (test_server_close_with_timeout_tells_attached_
    # clients): without the immediate abort, the server's I/O thread always sends SHUTDOWN.
    server._loop.abort = lambda: None
    server.close(timeout=0.2)
    wait_for(lambda: client.statistics().peers[0].state == "closed", T,
             message="the client to learn that the server shut down")
    with pytest.raises(nq.ConnectionLost) as caught:
        client.put("after the shutdown")
    assert_broken(caught.value, server.id)
    assert client.get(timeout=T).data == "last words"
    for call in (lambda: client.get(timeout=1), client.get_nowait, client.get_many):
        with pytest.raises(nq.ConnectionLost) as caught:
            call()
        assert_broken(caught.value, server.id)


def test_put_to_a_closed_communicator_raises_resource_closed(transport):
    server = transport.make_server()
    client = transport.connect(server)
    client.close()
    client.close()  # idempotent
    for call in (lambda: client.put("x"), lambda: client.put_many(["x"]),
                 lambda: client.put("x", server.id), lambda: client.put(bytes(1 * KiB))):
        with pytest.raises(nq.ResourceClosed) as caught:
            call()
        assert_closed(caught.value)
    wait_for(lambda: not server.peers, T, message="the client to leave")
    server.close()
    with pytest.raises(nq.ResourceClosed) as caught:
        server.put("x")
    assert_closed(caught.value)
    assert server.statistics().state == "closed"


def test_put_to_a_peer_that_left_raises_connection_lost(transport):
    """The client closed, not the server: to the server that is "it broke"."""
    server = transport.make_server(heartbeat=0.1)
    client = transport.connect(server)
    client.close()
    wait_for(lambda: peer_row(server, client.id) is None, T, message="the session to end")
    with pytest.raises(nq.ConnectionLost) as caught:
        server.put("x", client.id)
    assert_broken(caught.value, client.id)


def test_a_killed_peer_is_connection_lost_not_resource_closed(transport):
    """A client process SIGKILLed: what the server queued to it fails once its session
    expires, and later puts to it raise, all with ConnectionLost (the peer's doing)."""
    server = transport.make_server(session_timeout=2.0)
    child = transport.spawn_client(server)
    child.request("put", data="hello")
    assert server.get(child.id, timeout=T).data == "hello"
    child.kill()
    wait_for(lambda: (row := peer_row(server, child.id)) is None or row.state != "connected",
             T, message="the server to notice the dead process")
    try:
        pending = server.put("to the dead", child.id)
    except nq.ConnectionLost as error:  # its session expired already (a slow machine)
        assert_broken(error, child.id)
    else:
        assert_broken(pending.exception(T), child.id)  # no reconnect within session_timeout
    with pytest.raises(nq.ConnectionLost) as caught:
        server.put("after the expiry", child.id)
    assert_broken(caught.value, child.id)
    with pytest.raises(nq.ResourceGone):  # for code that does not care which
        server.put("after the expiry", child.id)
    server.put("the server still works").result(T)  # to no one: nobody else is here


def test_a_killed_server_is_connection_lost_for_its_client(transport):
    """The server process SIGKILLed: the client's puts fail with ConnectionLost once it has
    not reached the server for session_timeout; the client's own close() is not to blame."""
    server = transport.spawn_server()
    client = transport.make_client(server, session_timeout=1.0, reconnect_max=0.2)
    client.put("hello").result(T)
    server.kill()
    future = client.put("to the dead")
    assert_broken(future.exception(T), server.id)
    assert not client.closed


def test_client_started_before_its_server(transport):
    """new() never blocks: puts made before any server listens are queued, in order, and
    delivered once one appears at the client's address."""
    placeholder = transport.make_server()
    location = transport.location(placeholder)
    placeholder.close()
    client = transport.make_client(location, reconnect_max=0.2)
    futures = [client.put(("early", index)) for index in range(5)]
    # "Not delivered" has no event: there is no server to deliver to, so a slow machine
    # only gives a wrong resolution less time to show, never a failure.
    time.sleep(0.3)
    assert not any(future.done() for future in futures)
    server = transport.make_server(netloc=location)
    assert drain(server, 5) == [("early", index) for index in range(5)]
    for future in futures:
        assert future.result(T) is None


def test_client_close_gives_up_when_no_server_ever_answers(transport):
    placeholder = transport.make_server()
    location = transport.location(placeholder)
    placeholder.close()
    client = transport.make_client(location, session_timeout=0.5, reconnect_max=0.1)
    future = client.put("nobody listens")
    started = time.monotonic()
    client.close()  # no timeout: it must still return (never connected within session_timeout)
    assert time.monotonic() - started < 15
    # Either: close() gave up on it (ResourceClosed), or the client's session_timeout without
    # a server ran out first (ConnectionLost); both are what the base is for.
    assert isinstance(future.exception(T), nq.ResourceGone)


# ============================================================================ sessions


def test_stalled_receiver_holds_one_window_across_reconnects(transport):
    """A server that never calls get() while its client's link is cut again and again holds
    at most recv_budget + one message of that client's, not a window per link: each new
    link's SESSION takes back what the server still holds. Then everything drains in order."""
    window, size = 64 * KiB, 16 * KiB
    server = transport.make_server(recv_budget=window)
    client = transport.connect(server, send_budget=4 * MiB, reconnect_min=0.01,
                               reconnect_max=0.05)
    come_back_for_more(server)  # done with the hello
    futures = [client.put((index, bytes(size))) for index in range(40)]  # 640 KiB
    held = lambda: peer_row(server, client.id).queue_in_bytes  # noqa: E731
    wait_for(lambda: held() >= window, T, message="the server's window to fill")

    def reconnected_since(before: int) -> bool:
        row = client.statistics().peers[0]
        return row.reconnects > before and row.state == "connected"

    for _ in range(3):
        before = client.statistics().peers[0].reconnects
        wait_for(lambda: transport.cut(client), T, message="a live link to cut")
        wait_for(functools.partial(reconnected_since, before), T,
                 message="the client to reconnect")
        # An upper bound has no event: a correct netq never exceeds it, so the pause only
        # gives whatever the new link's credit lets through time to arrive and show.
        time.sleep(0.2)
        assert held() <= window + size + 1024, held()
    assert [server.get(timeout=T).data[0] for _ in range(40)] == list(range(40))
    for future in futures:
        assert future.result(T) is None


@pytest.mark.timeout(150)
def test_session_resume_after_network_cuts_loses_and_duplicates_nothing(transport):
    """A client with a fixed id loses its link three times (shutdown() below netq, no
    goodbye) while messages are queued, in flight and being consumed both ways. Every
    message is sequence-numbered: both sides must receive exactly 0..N-1, in order."""
    count = 1500

    def size_of(index: int) -> int:
        return 1 * MiB if index % 300 == 150 else (index * 37) % 3000

    fixed = uuid.UUID("0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0")
    server = transport.make_server(recv_budget=256 * KiB)
    client = transport.connect(server, id=fixed, recv_budget=256 * KiB)
    assert client.id == fixed
    futures: list = []
    received = {"server": [], "client": []}
    errors: list = []

    def send(comm, tag, *peers):
        try:
            for index in range(count):
                futures.append(comm.put((tag, index, sequence_payload(index, size_of(index))),
                                        *peers))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    def receive(comm, tag, out):
        try:
            for _ in range(count):
                got_tag, index, payload = comm.get(timeout=T).data
                assert got_tag == tag
                assert payload == sequence_payload(index, size_of(index)), index
                out.append(index)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    def cut() -> None:
        before = client.statistics().peers[0].reconnects
        wait_for(lambda: transport.cut(client), T, message="a live link to cut")
        wait_for(lambda: (row := client.statistics().peers[0]).reconnects > before
                 and row.state == "connected", T, message="the client to reconnect")

    senders = [threading.Thread(target=send, args=(client, "c"), name="test-send"),
               threading.Thread(target=send, args=(server, "s", fixed), name="test-send")]
    for thread in senders:
        thread.start()
    # Nobody consumes yet: both inboxes fill to the window, the rest queues and is in flight.
    wait_for(lambda: peer_row(server, fixed).queue_in >= 20
             and client.statistics().peers[0].queue_in >= 20, T,
             message="messages queued both ways")
    cut()
    receivers = [
        threading.Thread(target=receive, args=(server, "c", received["server"]),
                         name="test-recv"),
        threading.Thread(target=receive, args=(client, "s", received["client"]),
                         name="test-recv"),
    ]
    for thread in receivers:
        thread.start()
    def server_received(at_least: float) -> bool:
        return len(received["server"]) >= at_least or bool(errors)

    for fraction in (3, 1.5):
        wait_for(functools.partial(server_received, count / fraction), T * 2)
        cut()
    for thread in senders + receivers:
        thread.join(T * 3)
    assert not errors, errors
    assert received["server"] == list(range(count))
    assert received["client"] == list(range(count))
    for future in futures:
        assert future.result(T) is None
    assert client.statistics().peers[0].reconnects >= 3
    assert peer_row(server, fixed).reconnects >= 3


@pytest.mark.timeout(90)
def test_new_process_with_same_id_resumes_server_queue(transport):
    server = transport.make_server()
    fixed = uuid.uuid4()
    first = transport.spawn_client(server, id=fixed)
    assert first.id == fixed
    first.request("put", data=["hello", 1])
    assert server.get(fixed, timeout=T).data == ["hello", 1]
    first.kill()  # SIGKILL: no goodbye
    wait_for(lambda: peer_row(server, fixed).state == "disconnected", T,
             message="the server to notice the dead process")

    futures = [server.put(["queued", index], fixed) for index in range(20)]
    # "Not delivered" has no event: the process is dead, so a slow machine only gives a
    # wrong resolution less time to show, never a failure.
    time.sleep(0.2)
    assert not any(future.done() for future in futures)
    second = transport.spawn_client(server, id=fixed)
    assert second.request("get", count=20, timeout=T) == [["queued", i] for i in range(20)]
    for future in futures:
        assert future.result(T) is None
    second.request("put", data="from the second process")
    assert server.get(fixed, timeout=T).data == "from the second process"
    row = peer_row(server, fixed)
    assert row.state == "connected" and row.reconnects >= 1
    second.request("close", timeout=T)
    wait_for(lambda: peer_row(server, fixed) is None or peer_row(server, fixed).state
             in ("closed", "closing"), T, message="the second process to leave")


# ============================================================================ statistics


def test_statistics_snapshot_is_sane_and_frozen(transport):
    server = transport.make_server()
    client = transport.connect(server)  # hello: one message in
    for _ in range(10):
        client.put(bytes(1000)).result(T)
    drain(server, 10)
    server.put("out", client.id).result(T)
    assert client.get(timeout=T).data == "out"
    come_back_for_more(server)  # the last message taken counts as held until then

    stats = server.statistics()
    assert isinstance(stats, nq.CommunicatorStatistics)
    assert stats.id == server.id and stats.purpose == "server"
    assert stats.protocol == transport.protocol.value
    assert stats.state == "open" and stats.uptime > 0
    assert isinstance(stats.peers, tuple) and len(stats.peers) == 1
    row = stats.peer(client.id)
    assert isinstance(row, nq.PeerStatistics)
    assert row.state == "connected"
    assert row.messages_in == 11 and row.bytes_in >= 10 * 1000
    assert row.messages_out == 1 and row.bytes_out > 0
    assert (row.queue_in, row.queue_in_bytes, row.queue_out, row.queue_out_bytes) == (0, 0, 0, 0)
    assert (row.inflight, row.inflight_bytes, row.memory) == (0, 0, 0)
    assert row.reconnects == 0 and row.connected_for > 0
    assert row.credit_in > 0 and row.credit_out > 0
    assert min(row.messages_in_per_s, row.bytes_in_per_s, row.messages_out_per_s,
               row.bytes_out_per_s) >= 0
    assert stats.messages_in >= row.messages_in and stats.messages_out >= row.messages_out
    assert stats.memory == sum(r.memory for r in stats.peers) == 0
    assert isinstance(stats.summary(), str)

    for target, field in ((stats, "state"), (row, "messages_in"), (stats, "peers")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(target, field, None)

    client.put("one more").result(T)
    assert stats.peer(client.id).messages_in == 11  # a snapshot never changes
    assert server.statistics().peer(client.id).messages_in == 12
    with pytest.raises(KeyError):
        stats.peer(uuid.uuid4())

    mine = client.statistics()
    assert mine.purpose == "client" and [r.peer for r in mine.peers] == [server.id]
    assert mine.peers[0].messages_out == 12 and mine.peers[0].messages_in == 1
    server.get(timeout=T)
    client.close()
    wait_for(lambda: not server.peers, T)
    server.close()
    assert server.statistics().state == "closed"
    assert server.statistics().messages_in == 12  # totals survive departed peers


def test_statistics_queue_in_bytes_matches_queue_in(transport):
    server = transport.make_server()
    client = transport.connect(server)
    client.put(bytes(1000)).result(T)
    assert server.get(timeout=T).data == bytes(1000)
    row = peer_row(server, client.id)
    assert row.queue_in == 0
    assert row.queue_in_bytes == 0, row


# ============================================================================ security


@pytest.mark.parametrize("server_key,client_key", [
    (b"right key", b"wrong key"),
    (b"right key", None),
    (None, b"a key"),
], ids=["wrong", "client-has-none", "server-has-none"])
def test_wrong_authkey_never_delivers(transport, server_key, client_key):
    server_overrides = {} if server_key is None else {"authkey": server_key}
    client_overrides = {} if client_key is None else {"authkey": client_key}
    server = transport.make_server(**server_overrides)
    client = transport.make_client(server, **client_overrides)
    try:
        future = client.put("must never be seen")
    except nq.AuthenticationError:
        future = None  # the handshake already failed: put() says so at once
    if future is not None:
        # It never succeeds: netq fails it with AuthenticationError (retrying cannot help).
        error = future.exception(T)
        assert isinstance(error, nq.AuthenticationError), error
    with pytest.raises(nq.AuthenticationError):
        client.put("again")
    # The client has given up for good: had anything reached the server, it would be there.
    with pytest.raises(nq.Empty):
        server.get(timeout=0.5)
    assert server.statistics().messages_in == 0 and not server.peers


def test_matching_authkey_delivers(transport):
    server = transport.make_server(authkey=b"shared secret")
    client = transport.make_client(server, authkey=b"shared secret")
    client.put("authenticated").result(T)
    assert server.get(timeout=T).data == "authenticated"


@pytest.mark.parametrize("transport", ["tls", "grpc-tls"], indirect=True)
def test_mutual_tls(transport):
    files = transport.env.tls
    server = transport.make_server(client_ca=files.ca)
    anonymous = transport.make_client(server)
    anonymous.put("no certificate")
    with pytest.raises(nq.Empty):
        server.get(timeout=2)
    anonymous.close(timeout=0.5)  # it retries (a refused handshake is not fatal): stop it
    known = transport.make_client(server, key=files.client_key,
                                  client_certificate=files.client_cert)
    known.put("with certificate").result(T)
    assert server.get(timeout=T) == nq.Message(known.id, "with certificate")
    with pytest.raises(nq.Empty):
        server.get(timeout=0.3)
