"""Hostile input, end to end over real communicators: bytes and objects no well-behaved netq
peer would send.

* malformed frames and oversized length fields at the listening port (byte streams: random
  bytes, HTTP, a 2**32 - 1 header, a 1 TiB DATA descriptor, plaintext to TLS) and through the
  MQTT broker: an ERROR where the server can say it, that link dropped, nothing allocated for
  the claim, everyone else untouched; gRPC's counterpart is in ``tests/transports/test_grpc.py``;
* a malicious pickle against ``PickleSerializer(restrict=...)``: a typed error, no side effect,
  the sender and everyone else carry on;
* unauthenticated and impersonating peers against an authkey: the deserializer is never
  called, the real client's session is untouched (and ``test_mqtt.py::
  test_impersonation_is_refused`` through the broker);
* the default ``NetworkLocation`` listens on loopback only;
* careless input: more out-of-band buffers than a message carries.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import pickle
import socket
import threading
import time
import uuid

import psutil
import pytest

import netq as nq
from netq import protocol as proto
from netq.protocol import frames
from netq.serializers import PickleSerializer
from netq_testing import error_codes, frames_in, peer_row, rss, sequence_payload, wait_for

from .helpers import T, client_hello, raw_handshake, read_until_closed, round_trip

KiB, MiB = nq.KiB, nq.MiB

pytestmark = pytest.mark.timeout(120)


class CountingLoad:
    """A ``load`` that counts its calls (to prove it is never reached) and delegates."""

    def __init__(self, serializer: PickleSerializer) -> None:
        self.serializer = serializer
        self.calls = 0

    def __call__(self, stream):
        self.calls += 1
        return self.serializer.load(stream)


# ============================================================================ malformed frames


def _garbage_cases():
    return ["junk", "http", "header-2**32-1", "hello-2**32-1", "data-1-TiB", "plaintext-to-tls"]


@pytest.mark.parametrize("garbage", _garbage_cases())
def test_garbage_drops_only_that_link(transport, garbage, caplog):
    """Bytes that are not netq: the server answers ERROR (where it can), closes that link
    only, logs it, and allocates nothing for absurd sizes."""
    tls = getattr(transport.spec, "tls", False)
    if garbage == "plaintext-to-tls" and not tls:
        pytest.skip("only for TLS")
    caplog.set_level(logging.INFO, logger="netq")
    server = transport.make_server(session_timeout=1.0)
    other = transport.connect(server)
    round_trip(server, other, "before")
    baseline = rss()
    expected_code = frames.ErrorCode.PROTOCOL
    raw = transport.raw_connect(server, wrap=garbage != "plaintext-to-tls")
    caplog.clear()
    try:
        if garbage == "junk":
            raw.sendall(b"\xff" + os.urandom(4095))
        elif garbage == "http":
            raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        elif garbage == "header-2**32-1":
            raw.sendall(frames.encode_header(frames.FrameType.DATA, 0, 2**32 - 1, 1))
            expected_code = frames.ErrorCode.LIMIT
        elif garbage == "hello-2**32-1":
            raw.sendall(frames.encode_header(frames.FrameType.HELLO, 0, 2**32 - 1, 0))
            expected_code = frames.ErrorCode.LIMIT
        elif garbage == "data-1-TiB":
            conn = raw_handshake(raw)
            assert conn.state is proto.ConnectionState.OPEN
            tib = 2**40
            descriptor = frames.encode_descriptor(tib, [tib])
            raw.sendall(frames.encode_header(frames.FrameType.DATA, frames.DataFlags.FIRST,
                                             len(descriptor) + 4096, 1)
                        + descriptor + bytes(4096))
            expected_code = frames.ErrorCode.LIMIT
        elif garbage == "plaintext-to-tls":
            raw.sendall(client_hello())
            expected_code = None  # the TLS layer refuses; there is no netq ERROR to read
        received, _ = read_until_closed(raw, T)
    finally:
        raw.close()
    if expected_code is not None:
        assert expected_code in error_codes(received), frames_in(received)
        wait_for(lambda: any(record.name.startswith("netq") and record.levelno >= logging.INFO
                             for record in caplog.records),
                 T, message="the server to log the failed link")
    assert rss() - baseline < 64 * MiB
    round_trip(server, other, "after")
    if garbage != "data-1-TiB":  # that one got as far as a session, now disconnected
        assert server.peers == (other.id,)


@pytest.mark.parametrize("transport", ["mqtt"], indirect=True)
def test_mqtt_garbage_and_oversize_headers_through_the_broker(transport):
    """The MQTT counterpart of the byte-stream garbage tests: a raw broker client publishes
    random bytes on a connected client's topic and on a new one, a 1 MiB random packet, and a
    link OPEN whose netq bytes are a HELLO header claiming 2**32 - 1 bytes. The server
    answers the last one with ERROR LIMIT on that topic, allocates nothing for the claim,
    counts the rest as invalid, and the real client never notices."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from netq.transports.mqtt import link as mqtt_link
    from netq.transports.mqtt.link import Kind

    server = transport.make_server()
    victim = transport.connect(server)
    base = f"{server.options.mqtt.prefix}/{server.options.netloc.path}"
    intruder = uuid.uuid4()
    answers: list[bytes] = []
    broker = server.options.netloc
    raw = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"hostile-{uuid.uuid4().hex[:6]}")
    raw.on_message = lambda client, userdata, message: answers.append(bytes(message.payload))
    subscribed = threading.Event()
    raw.on_subscribe = lambda *args: subscribed.set()  # the broker's SUBACK
    raw.connect(broker.host, broker.port)
    raw.loop_start()
    try:
        raw.subscribe(f"{base}/s2c/{intruder}", qos=1)
        # the subscription is in place before the server could answer
        assert subscribed.wait(T), "no SUBACK from the broker"
        invalid = server._loop.carrier.counters["invalid_packets"]
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
        wait_for(lambda: server._loop.carrier.counters["invalid_packets"] >= invalid + 3, T,
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
    # An exploit that ran late (a thread, a child process) has no event to wait on: with
    # restrict it never runs, so a slow machine only gives a late one less time to show.
    time.sleep(0.2)
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


# ============================================================================ listening address


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


# ============================================================================ careless input


def test_more_buffers_than_a_message_carries(transport):
    """A message carries at most 1024 parts (the pickle and its out-of-band buffers). An
    object with 1100 out-of-band buffers still travels (the buffers past 1023 go in band), on
    the caller's thread and the I/O thread alike; a custom ``dump`` that makes more parts than
    that is refused by ``put()`` itself with LocalProtocolError, and the link goes on."""
    from netq.protocol.frames import MAX_PARTS
    from netq.serializers import MAX_OUT_OF_BAND
    from netq.stream import Stream

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
    with pytest.raises(nq.LocalProtocolError, match=f"{MAX_PARTS + 1} parts"):
        careless.put("anything")
    with pytest.raises(nq.LocalProtocolError, match=f"{MAX_PARTS + 1} parts"):
        careless.put_many(["anything", "else"])
    assert careless.statistics().messages_out == 0  # nothing of it was queued
    client.put("still fine").result(T)
    assert server.get(timeout=T).data == "still fine"
