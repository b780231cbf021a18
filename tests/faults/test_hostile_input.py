"""Hostile and careless peers, end to end over real communicators (issue 7, part B).

* a malicious pickle against ``PickleSerializer(restrict=...)``: a typed error, no side effect,
  the sender and everyone else carry on;
* unauthenticated and impersonating peers against an authkey: the deserializer is never
  called, the real client's session is untouched;
* the default ``NetworkLocation`` listens on loopback only;
* ``future.cancel()`` behind a stalled receiver: cancelled puts never arrive and stop holding
  memory at once; a put already on the wire cannot be cancelled and arrives;
* the close handshake: ``close()`` right after 10 000 puts loses none of them, on both ends.

Random bytes and oversize length fields at the listening port are in ``test_faults.py`` (byte
streams) and ``test_grpc.py`` (gRPC); their MQTT counterpart through the broker is here, next
to ``test_mqtt.py::test_impersonation_is_refused``.
"""

from __future__ import annotations

import concurrent.futures as cf
import ipaddress
import os
import pickle
import socket
import sys
import threading
import time
import uuid

import psutil
import pytest

import netq as nq
from netq import protocol as proto
from netq.protocol import frames
from netq.stream import PickleSerializer
from netq_testing import error_codes, peer_row, sequence_payload, wait_for

KiB, MiB = nq.KiB, nq.MiB
T = 30.0

pytestmark = pytest.mark.timeout(120)


class CountingLoad:
    """A ``load`` that counts its calls (to prove it is never reached) and delegates."""

    def __init__(self, serializer: PickleSerializer) -> None:
        self.serializer = serializer
        self.calls = 0

    def __call__(self, stream):
        self.calls += 1
        return self.serializer.load(stream)


# ============================================================================ malicious pickle


class _Exploit:
    """Pickles as ``how(*args)``: unpickling it unrestricted runs that call."""

    def __init__(self, how, args) -> None:
        self.how = how
        self.args = args

    def __reduce__(self):
        return self.how, self.args


def _exploits(marker: str) -> dict:
    return {
        "os.system": _Exploit(os.system, (f"touch {marker}",)),
        "builtins.exec": _Exploit(exec, (f"open({marker!r}, 'w').close()",)),
        "builtins.open": _Exploit(open, (marker, "w")),
        "nested": {"innocent": [1, 2, _Exploit(os.system, (f"touch {marker}",))]},
    }


@pytest.mark.parametrize("exploit", ["os.system", "builtins.exec", "builtins.open", "nested"])
def test_malicious_pickle_is_refused_without_side_effects(transport, tmp_path, exploit):
    """A client with a permissive serializer sends a pickle that would create a file when
    loaded. The server (restrict=["builtins"]) raises DeserializationError naming the sender,
    the file never appears, the message is counted (not silently dropped), and the sender, a
    bystander and the server all go on working."""
    marker = tmp_path / "pwned"
    evil = _exploits(str(marker))[exploit]
    load = CountingLoad(PickleSerializer(restrict=["builtins"]))
    server = transport.make_server(load=load)
    attacker = transport.connect(server)
    bystander = transport.connect(server)
    before = server.statistics().messages_in

    attacker.put(evil).result(T)  # delivered: netq received it; loading is the get()'s job
    attacker.put("after the exploit").result(T)
    bystander.put("bystander").result(T)

    with pytest.raises(nq.DeserializationError) as caught:
        server.get(attacker.id, timeout=T)
    assert caught.value.peer == attacker.id
    assert "forbidden by restrict" in str(caught.value)
    assert not marker.exists()
    # Counted as received, and reported by get(): not a silent drop.
    assert server.statistics().messages_in == before + 3
    # The attacker's next message, the bystander and both directions still work.
    assert server.get(attacker.id, timeout=T).data == "after the exploit"
    assert server.get(bystander.id, timeout=T).data == "bystander"
    server.put("still here").result(T)
    assert attacker.get(timeout=T).data == "still here"
    assert bystander.get(timeout=T).data == "still here"
    assert set(server.peers) == {attacker.id, bystander.id}
    time.sleep(0.2)  # an exploit that ran late (a thread, a child process) would show by now
    assert not marker.exists()


def test_malicious_pickle_does_run_without_restrict(transport, tmp_path):
    """The control: the same exploit against an unrestricted server creates the file, so the
    test above would see it if restrict let it through."""
    marker = tmp_path / "pwned"
    server = transport.make_server()
    client = transport.connect(server)
    client.put(_exploits(str(marker))["builtins.exec"]).result(T)
    server.get(timeout=T)
    assert marker.exists()


# ============================================================================ authentication


def _raw_impostor_hello(victim: uuid.UUID) -> bytes:
    """A client HELLO claiming ``victim``'s id and an authkey, then a made-up AUTH digest,
    a SESSION and a DATA frame, all pipelined (the server must read none past the AUTH)."""
    hello = proto.make_hello(proto.Role.CLIENT, victim, auth=True, max_message=64 * MiB,
                             max_frame=1 * MiB, recv_window=8 * MiB,
                             recv_messages=frames.UNLIMITED_MESSAGES)
    data = frames.encode_hello(hello)
    data += frames.encode_header(frames.FrameType.AUTH, 0, 32, 0) + os.urandom(32)
    data += frames.encode_header(frames.FrameType.SESSION, 0, 48, 0) + bytes(48)
    descriptor = frames.encode_descriptor(5, [5])
    data += (frames.encode_header(frames.FrameType.DATA, frames.DataFlags.FIRST
                                  | frames.DataFlags.LAST, len(descriptor) + 5, 1)
             + descriptor + b"\x80\x05K\x07.")  # pickle of 7
    return data


def test_unauthenticated_and_impersonating_peers_never_reach_the_deserializer(transport):
    """authkey on the server. Peers with no key, a wrong key, and the real client's id with a
    wrong key (and, on byte streams, a raw HELLO claiming the real client's id with a made-up
    proof and DATA pipelined behind it): each is refused with AuthenticationError (or an
    ERROR AUTHENTICATION frame), the server's ``load`` is never called, and the real client's
    session is untouched: no reconnect, and the messages queued both ways at the time all
    arrive, in order."""
    key = b"the shared secret"
    load = CountingLoad(PickleSerializer())
    server = transport.make_server(authkey=key, load=load, session_timeout=5.0)
    real = transport.connect(server, authkey=key)
    # Messages waiting both ways while the impostors try: the server does not get() the real
    # client's until the end, and the real client does not get() the server's.
    to_server = [real.put(("up", index)) for index in range(20)]
    to_real = [server.put(("down", index), real.id) for index in range(20)]
    for future in to_server + to_real:
        future.result(T)
    calls = load.calls  # the hello of connect()
    assert calls == 1

    impostors = [
        transport.make_client(server),  # no key at all
        transport.make_client(server, authkey=b"a wrong key"),
        transport.make_client(server, id=real.id),  # the real id, no key
        transport.make_client(server, id=real.id, authkey=b"a wrong key"),
    ]
    for impostor in impostors:
        try:
            future = impostor.put(("impostor", str(impostor.id)))
        except nq.AuthenticationError:
            continue  # the handshake already failed: put() says so at once
        assert isinstance(future.exception(T), nq.AuthenticationError)
        with pytest.raises(nq.AuthenticationError):
            impostor.put("again")

    if transport.spec.byte_stream:
        raw = transport.raw_connect(server)
        try:
            raw.sendall(_raw_impostor_hello(real.id))
            received = bytearray()
            raw.settimeout(T)
            while True:
                try:
                    chunk = raw.recv(65536)
                except (ConnectionResetError, BrokenPipeError):
                    break
                if not chunk:
                    break
                received += chunk
        finally:
            raw.close()
        assert frames.ErrorCode.AUTHENTICATION in error_codes(bytes(received))

    for impostor in impostors:
        impostor.close(timeout=1)
    assert load.calls == calls, "an unauthenticated peer's bytes reached the deserializer"
    assert server.peers == (real.id,)
    row = peer_row(server, real.id)
    assert row.state == "connected" and row.reconnects == 0
    assert real.statistics().peers[0].reconnects == 0
    assert [server.get(real.id, timeout=T).data for _ in range(20)] == \
        [("up", index) for index in range(20)]
    assert [real.get(timeout=T).data for _ in range(20)] == \
        [("down", index) for index in range(20)]
    assert load.calls == calls + 20
    real.put("after").result(T)
    assert server.get(timeout=T).data == "after"


# ============================================================================ loopback default


def _listening_addresses(port: int) -> set[str]:
    """Where this process listens on ``port`` (a v4-mapped IPv6 address, as gRPC binds
    127.0.0.1 through a dual-stack socket, counts as the IPv4 address it maps)."""
    found = set()
    for conn in psutil.Process().net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
            address = ipaddress.ip_address(conn.laddr.ip.split("%")[0])
            mapped = getattr(address, "ipv4_mapped", None)
            found.add(str(mapped or address))
    return found


@pytest.mark.parametrize("protocol", [nq.Protocol.TCP, nq.Protocol.GRPC])
def test_server_listens_on_loopback_unless_told_otherwise(protocol):
    """``NetworkLocation()`` binds 127.0.0.1 only: the listening socket's address is
    127.0.0.1, and another address of this host (127.0.0.2, loopback too, but not the one
    bound) refuses the connection, which a wildcard bind (0.0.0.0) would accept."""
    if protocol is nq.Protocol.GRPC:
        pytest.importorskip("grpc")
    assert nq.NetworkLocation().host == "127.0.0.1"
    assert nq.CommunicatorOptions().netloc.host == "127.0.0.1"
    # Only the port changes (0: any free one), the host stays the default.
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(port=0))
    if protocol is nq.Protocol.GRPC:
        # gRPC reports the port it bound; pick a free one first so the check below is exact.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(port=port))
    server = nq.new(protocol, nq.Purpose.SERVER, options)
    try:
        port = server.address[1]
        assert server.address[0] == "127.0.0.1"
        assert wait_for(lambda: _listening_addresses(port), 10) == {"127.0.0.1"}
        with socket.socket() as other:
            other.settimeout(5)
            assert other.connect_ex(("127.0.0.2", port)) != 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # and it is listening where it says
    finally:
        server.close(timeout=5)


# ============================================================================ cancel


@pytest.mark.timeout(150)
def test_cancel_behind_a_stalled_receiver(transport):
    """The server grants 256 KiB and does not get(): the first three puts of 96 KiB go on the wire,
    the rest wait in the client's queue. Cancelling every other waiting one returns True; they
    leave the client's queue and memory at once (the payload is released) and never arrive.
    cancel() on one already on the wire returns False, and it arrives. Everything not
    cancelled arrives, in order, once the server reads."""
    size, count = 96 * KiB, 24
    server = transport.make_server(recv_window=256 * KiB)
    client = transport.connect(server)
    payloads = [sequence_payload(index, size) for index in range(count)]
    baseline = [sys.getrefcount(payload) for payload in payloads]
    futures = [client.put(payload) for payload in payloads]

    def on_wire() -> list[int]:
        return [index for index, future in enumerate(futures)
                if future.running() or future.done()]

    # A message may start while credit is positive: 256 KiB of credit lets 3 of 96 KiB start
    # (after two, 64 KiB is left), then nothing more moves: the server never returns credit.
    wait_for(lambda: on_wire() == [0, 1, 2] and peer_row(server, client.id).queue_in == 3,
             T, message="three messages on the wire and received")
    time.sleep(0.3)
    sent = on_wire()
    assert sent == [0, 1, 2], sent
    waiting = list(range(len(sent), count))
    row = peer_row(client, server.id)
    assert row.queue_out == len(waiting)
    assert row.queue_out_bytes >= len(waiting) * size

    cancelled = waiting[::2]
    kept = [index for index in range(count) if index not in cancelled]
    for index in cancelled:
        assert futures[index].cancel() is True
        assert futures[index].cancelled()
    assert futures[0].cancel() is False  # on the wire already
    assert not futures[0].cancelled()

    row = peer_row(client, server.id)
    assert row.queue_out == len(waiting) - len(cancelled)
    unsent = [index for index in waiting if index not in cancelled]
    assert row.queue_out_bytes < (len(unsent) + 1) * (size + KiB)
    for index in cancelled:
        # Only our list and getrefcount's argument still hold it: netq let go.
        assert sys.getrefcount(payloads[index]) == baseline[index], index
    for index in unsent:
        assert sys.getrefcount(payloads[index]) > baseline[index], index

    received = []
    for _ in kept:
        message = server.get(timeout=T)
        assert message.peer == client.id
        data = message.data
        index = int.from_bytes(data[:4], "little")
        assert data == payloads[index], f"message {index} corrupted"
        received.append(index)
    assert received == kept
    with pytest.raises(nq.Empty):
        server.get(timeout=1.0)
    for index in kept:
        assert futures[index].result(T) is None
    for index in cancelled:
        with pytest.raises(cf.CancelledError):
            futures[index].result(0)
    row = peer_row(client, server.id)
    assert row.queue_out == 0 and row.inflight == 0
    assert row.messages_out == len(kept) + 1  # + the hello of connect()


# ============================================================================ close handshake


def _close_size(index: int) -> int:
    """64 B .. 256 KiB: mostly small, every 50th 16 KiB, every 1000th 256 KiB."""
    if index % 1000 == 500:
        return 256 * KiB
    if index % 50 == 25:
        return 16 * KiB
    return 64 + index % 193


def _close_message(index: int):
    return index, sequence_payload(index, _close_size(index))


@pytest.mark.timeout(240)
def test_client_close_right_after_10k_puts_loses_none(transport):
    """A client puts 10 000 messages (64 B .. 256 KiB, 6.5 MiB: more than the server's window)
    and calls close() at once, waiting on no future. close() returns once the server has
    acknowledged all of them; the server gets all 10 000, in order and intact."""
    count = 10_000
    server = transport.make_server()
    client = transport.make_client(server)
    futures = []
    outcome = {}

    def send_and_close():
        try:
            futures.extend(client.put(_close_message(index)) for index in range(count))
            client.close()
            outcome["closed"] = True
        except BaseException as error:  # noqa: BLE001 - reported below
            outcome["error"] = error

    sender = threading.Thread(target=send_and_close, name="test-sender")
    sender.start()
    try:
        for expected in range(count):
            message = server.get(timeout=T)
            assert message.peer == client.id
            index, payload = message.data
            assert index == expected, f"got {index}, expected {expected}"
            assert payload == sequence_payload(index, _close_size(index))
    finally:
        sender.join(2 * T)
    assert outcome == {"closed": True}
    assert all(future.done() and future.exception() is None for future in futures)
    wait_for(lambda: client.id not in server.peers, T, message="the client to leave")
    server.close(timeout=T)
    with pytest.raises(nq.ResourceClosed):
        server.get(timeout=1)


@pytest.mark.timeout(300)
def test_server_close_after_broadcast_loses_none(transport):
    """A server broadcasts 10 000 messages to 3 clients and calls close(timeout=60) at once.
    The clients read everything (in order, intact) and then close; the server's close()
    returns when they have left, with every broadcast future resolved as delivered."""
    count = 10_000
    server = transport.make_server()
    clients = [transport.connect(server) for _ in range(3)]
    got = {client.id: [] for client in clients}
    problems = []

    def read_all(client):
        try:
            for _ in range(count):
                message = client.get(timeout=T)
                index, payload = message.data
                if payload != sequence_payload(index, _close_size(index)):
                    problems.append(f"{client.id}: message {index} corrupted")
                got[client.id].append(index)
            client.close(timeout=T)
        except BaseException as error:  # noqa: BLE001 - reported below
            problems.append(f"{client.id}: {error!r}")

    readers = [threading.Thread(target=read_all, args=(client,), name="test-reader")
               for client in clients]
    for reader in readers:
        reader.start()
    futures = [server.put(_close_message(index)) for index in range(count)]
    started = time.monotonic()
    server.close(timeout=60)
    closed_in = time.monotonic() - started
    for reader in readers:
        reader.join(2 * T)
    assert not problems, problems
    for client in clients:
        assert got[client.id] == list(range(count)), "lost, duplicated or out of order"
    assert all(future.done() and future.exception() is None for future in futures)
    assert closed_in < 55, f"close() ran into its timeout ({closed_in:.1f} s)"


# ============================================================================ careless input


def test_more_buffers_than_a_message_carries(transport):
    """A message carries at most 1024 parts (the pickle and its out-of-band buffers). An
    object with 1100 out-of-band buffers still travels (the buffers past 1023 go in band), on
    the caller's thread and the I/O thread alike; a custom ``dump`` that makes more parts than
    that fails only its own future with LocalProtocolError, and the link goes on."""
    from netq.protocol.frames import MAX_PARTS
    from netq.stream import MAX_OUT_OF_BAND, Stream

    assert MAX_OUT_OF_BAND == MAX_PARTS - 1
    eager = PickleSerializer(copy_threshold=16)  # every buffer of 16 B or more out of band
    server = transport.make_server()
    client = transport.connect(server, dump=eager.dump)
    arrays = [bytearray(sequence_payload(index, 100)) for index in range(1100)]
    many = [pickle.PickleBuffer(array) for array in arrays]  # out of band, back as bytearray
    assert len(eager.dump_parts(many)) == MAX_PARTS
    # The first put finds an idle link (written by this thread), the others queue behind it
    # (written by the I/O thread).
    futures = [client.put(many) for _ in range(3)]
    for future in futures:
        assert future.result(T) is None
    for _ in futures:
        assert server.get(timeout=T).data == arrays

    def too_many_parts(obj) -> Stream:
        return Stream([memoryview(bytes([index % 256])) for index in range(MAX_PARTS + 1)])

    careless = transport.make_client(server, dump=too_many_parts)
    # Connected first: closed mid-handshake, it would leave the server a session to wait for.
    wait_for(lambda: careless.peers, T, message="the careless client to connect")
    error = careless.put("anything").exception(T)
    assert isinstance(error, nq.LocalProtocolError), error
    client.put("still fine").result(T)
    assert server.get(timeout=T).data == "still fine"


# ============================================================================ MQTT: hostile packets


@pytest.mark.parametrize("transport", ["mqtt"], indirect=True)
def test_mqtt_garbage_and_oversize_headers_through_the_broker(transport):
    """The MQTT counterpart of the byte-stream garbage tests: a raw broker client publishes
    random bytes on a connected client's topic and on a new one, a 1 MiB random packet, and a
    link OPEN whose netq bytes are a HELLO header claiming 2**32 - 1 bytes. The server
    answers the last one with ERROR LIMIT on that topic, allocates nothing for the claim,
    counts the rest as invalid, and the real client never notices."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from netq.transports import mqtt_link
    from netq.transports.mqtt_link import Kind

    server = transport.make_server()
    victim = transport.connect(server)
    base = f"{server.options.mqtt.prefix}/{server.options.netloc.path}"
    intruder = uuid.uuid4()
    answers: list[bytes] = []
    broker = server.options.netloc
    raw = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"hostile-{uuid.uuid4().hex[:6]}")
    raw.on_message = lambda client, userdata, message: answers.append(bytes(message.payload))
    raw.connect(broker.host, broker.port)
    raw.loop_start()
    try:
        raw.subscribe(f"{base}/s2c/{intruder}", qos=1)
        time.sleep(0.2)  # the subscription is in place before the server could answer
        invalid = server._transport.counters["invalid_packets"]
        baseline = psutil.Process().memory_info().rss
        for topic, payload in [
            # 0xff first: never a link header's version byte, so these are always invalid.
            (f"{base}/c2s/{victim.id}", b"\xff" + os.urandom(4095)),
            (f"{base}/c2s/{intruder}", b"\xff" + os.urandom(4095)),
            (f"{base}/c2s/{uuid.uuid4()}", b"\xff" + os.urandom(1 * MiB - 1)),
        ]:
            raw.publish(topic, payload, qos=1).wait_for_publish(T)
        open_packet = mqtt_link.encode(int(Kind.OPEN), 0, 0x77 << 32 | 1, 1, 0)
        claim = frames.encode_header(frames.FrameType.HELLO, 0, 2**32 - 1, 0)
        raw.publish(f"{base}/c2s/{intruder}", open_packet + claim, qos=1).wait_for_publish(T)

        def limit_error_seen() -> bool:
            return any(frames.ErrorCode.LIMIT in error_codes(answer[mqtt_link.HEADER_SIZE:])
                       for answer in list(answers))

        wait_for(limit_error_seen, T, message="ERROR LIMIT on the intruder's topic")
        wait_for(lambda: server._transport.counters["invalid_packets"] >= invalid + 3, T,
                 message="the server to count the random packets as invalid")
        assert psutil.Process().memory_info().rss - baseline < 64 * MiB
        with pytest.raises(nq.Empty):
            server.get(timeout=0.5)
        assert server.peers == (victim.id,)
        victim.put("still here").result(T)
        assert server.get(timeout=T) == nq.Message(victim.id, "still here")
        server.put("and back", victim.id).result(T)
        assert victim.get(timeout=T).data == "and back"
        assert victim.statistics().peers[0].reconnects == 0
    finally:
        raw.disconnect()
        raw.loop_stop()


def test_client_closed_during_its_handshake_leaves_no_session(transport):
    """Clients closed a moment after they were created (some before, some during, some after
    their handshake): none leaves the server a disconnected session to wait for, so the
    server's close() (no timeout) returns at once instead of after session_timeout (20 s)."""
    server = transport.make_server(session_timeout=20.0)
    for index in range(24):
        client = nq.new(transport.protocol, nq.Purpose.CLIENT, transport.client_options(server))
        time.sleep(0.002 * (index % 8))
        client.close()
    time.sleep(0.2)  # a BYE or EOF still on its way
    left = [row.state for row in server.statistics().peers]
    assert "disconnected" not in left, left
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < 10
