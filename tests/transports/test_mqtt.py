"""Protocol.MQTT beyond the conformance suite: the link layer (sans I/O) and a real mosquitto.

* the link layer's sequence numbers, duplicates, gaps, probes and AIMD window, byte by byte;
* a server whose broker is gone (the broker helper itself: tests/lab/test_brokers.py);
* a broker with tiny ``max_inflight_messages``/``max_queued_messages`` and a consumer much
  slower than its producer, in three processes: every message arrives intact and in order, and
  RSS stays bounded in the broker and both peers;
* a broker ``max_packet_size`` below netq's ``max_size`` (MQTT 5 and 3.1.1);
* a broker restart in the middle of traffic; a broker that never answers;
* impersonation attempts with a raw paho client;
* TLS to the broker with the test CA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytest.importorskip("paho.mqtt", reason="Protocol.MQTT needs paho-mqtt")

import netq as nq
from netq.lab.brokers import local_broker
from netq.protocol import make_hello
from netq.protocol.connection import Connection
from netq.protocol.frames import Role
from netq.transports.mqtt import link as mqtt_link, link_statistics
from netq.transports.mqtt.link import (
    ACK_REQUEST,
    GAP,
    HEADER_SIZE,
    Kind,
    LinkState,
    Verdict,
    Window,
)
from netq.transports.mqtt.paho_adapter import Gather
from netq_testing import cpu_fraction, wait_for
from transports.mqtt_testing import mosquitto_missing

needs_broker = pytest.mark.skipif(mosquitto_missing() is not None,
                                  reason=mosquitto_missing() or "")

KiB, MiB = nq.KiB, nq.MiB
T = 30.0
HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.timeout(120)


# ============================================================================ link layer


def test_header_round_trip_and_rejects_foreign_payloads():
    header = mqtt_link.encode(int(Kind.DATA), ACK_REQUEST, 0xDEADBEEF00000001, 7, 3)
    assert len(header) == HEADER_SIZE == 28
    assert mqtt_link.parse_header(header + b"body") == (int(Kind.DATA), ACK_REQUEST,
                                                        0xDEADBEEF00000001, 7, 3)
    assert mqtt_link.parse_header(b"short") is None
    assert mqtt_link.parse_header(b"\x02" + header[1:]) is None  # other version
    assert mqtt_link.parse_header(header[:1] + b"\x09" + header[2:]) is None  # unknown kind


def _pair(packets=8, nbytes=1 * MiB):
    window = Window(packets, 64, nbytes)
    return LinkState(1, window), LinkState(1, Window(packets, 64, nbytes))


def _parse(header: bytes):
    return mqtt_link.parse_header(header)


def test_in_order_packets_deliver_and_ack_frees_the_window():
    sender, receiver = _pair(packets=4)
    headers = [sender.header(int(Kind.DATA), 100) for _ in range(4)]
    assert not sender.can_send()  # 4 packets outstanding = the window
    for header in headers:
        kind, flags, _, seq, ack = _parse(header)
        verdict, _ = receiver.receive(kind, flags, seq, ack, 0.0)
        assert verdict is Verdict.DELIVER
    assert receiver.received == 4
    kind, flags, _, seq, ack = _parse(receiver.ack_header())
    assert (kind, seq, ack) == (int(Kind.ACK), 0, 4)
    assert sender.receive(kind, flags, seq, ack, 1.0) == (Verdict.CONTROL, False)
    assert sender.outstanding == 0 and sender.unacked_bytes == 0 and sender.can_send()
    assert sender.last_progress == 1.0


def test_ack_request_from_half_the_window_on():
    sender, _ = _pair(packets=8)
    flags = [_parse(sender.header(int(Kind.DATA), 10))[1] for _ in range(6)]
    assert flags == [0, 0, 0, ACK_REQUEST, ACK_REQUEST, ACK_REQUEST]
    sender2, _ = _pair(packets=64, nbytes=1000)
    assert _parse(sender2.header(int(Kind.DATA), 400))[1] == 0
    assert _parse(sender2.header(int(Kind.DATA), 100))[1] == ACK_REQUEST  # half the bytes
    assert not sender2.can_send() or sender2.unacked_bytes < 1000


def test_byte_window_blocks_before_the_packet_window():
    sender, _ = _pair(packets=64, nbytes=1000)
    sender.header(int(Kind.DATA), 999)
    assert sender.can_send()
    sender.header(int(Kind.DATA), 1)
    assert not sender.can_send()


def test_duplicates_are_dropped_and_still_answered():
    sender, receiver = _pair()
    first = _parse(sender.header(int(Kind.OPEN), 5))
    assert receiver.receive(*_without_epoch(first), 0.0)[0] is Verdict.DELIVER
    assert receiver.receive(*_without_epoch(first), 0.0)[0] is Verdict.DUPLICATE
    assert receiver.duplicates == 1 and receiver.received == 1


def _without_epoch(header):
    kind, flags, _, seq, ack = header
    return kind, flags, seq, ack


def test_a_missing_packet_is_a_gap_never_skipped():
    sender, receiver = _pair()
    packets = [_parse(sender.header(int(Kind.DATA), 5)) for _ in range(4)]
    assert receiver.receive(*_without_epoch(packets[0]), 0.0)[0] is Verdict.DELIVER
    # packets[1] and [2] were dropped by the broker
    assert receiver.receive(*_without_epoch(packets[3]), 0.0) == (Verdict.GAP, False)
    assert receiver.gap_range == (2, 3)
    assert receiver.received == 1  # nothing past the gap was accepted


def test_probe_reveals_a_lost_tail_and_is_answered_otherwise():
    sender, receiver = _pair()
    delivered = _parse(sender.header(int(Kind.DATA), 5))
    receiver.receive(*_without_epoch(delivered), 0.0)
    probe = _parse(mqtt_link.encode(int(Kind.ACK), ACK_REQUEST, 1, 1, 0))
    assert receiver.receive(*_without_epoch(probe), 0.0) == (Verdict.CONTROL, True)
    sender.header(int(Kind.DATA), 5)  # seq 2: lost
    probe = _parse(mqtt_link.encode(int(Kind.ACK), ACK_REQUEST, 1, 2, 0))
    assert receiver.receive(*_without_epoch(probe), 0.0) == (Verdict.GAP, False)
    assert receiver.gap_range == (2, 2)


def test_ack_for_packets_never_sent_is_invalid():
    sender, _ = _pair()
    sender.header(int(Kind.DATA), 5)
    assert sender.receive(int(Kind.ACK), 0, 0, 2, 0.0)[0] is Verdict.INVALID


def test_close_verdict_and_gap_flag():
    sender, receiver = _pair()
    kind, flags, _, seq, ack = _parse(receiver.close_header(gap=True))
    assert flags & GAP
    assert sender.receive(kind, flags, seq, ack, 0.0)[0] is Verdict.CLOSED


def test_gather_slices_like_the_joined_bytes():
    """paho resumes a partly written packet as ``packet[pos:]``: a Gather must give the same
    bytes as the join would, from any position."""
    buffers = [b"ab", bytearray(b"cde"), memoryview(b"xfghx")[1:4], b"", b"ij"]
    joined = b"".join(buffers)
    gather = Gather(list(buffers), len(joined))
    assert len(gather) == len(joined)
    for pos in range(len(joined) + 1):
        rest = gather[pos:]
        assert len(rest) == len(joined) - pos
        assert b"".join(rest.buffers) == joined[pos:]
    assert b"".join(gather[3:][2:].buffers) == joined[5:]


def test_window_aimd():
    window = Window(8, 10, MiB)
    window.acked(8)
    assert window.packets == 9
    window.acked(9 + 10)
    assert window.packets == 10  # capped
    window.lost()
    assert window.packets == 5 and window.gaps == 1
    for _ in range(5):
        window.lost()
    assert window.packets == 2  # floor


# ============================================================================ no broker


@needs_broker
def test_server_without_a_broker_raises_broker_unavailable():
    with local_broker() as broker:
        netloc = broker.netloc
    options = nq.CommunicatorOptions(netloc=netloc, mqtt=nq.MQTTOptions(connect_timeout=0.5))
    started = time.monotonic()
    with pytest.raises(nq.BrokerUnavailable, match="local_broker"):
        nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options)
    assert time.monotonic() - started < 5


# ============================================================================ real broker


def _options(broker, service=None, **connection):
    return nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(broker.host, broker.port,
                                  path=service or f"t-{uuid.uuid4().hex[:8]}"),
        connection=nq.ConnectionOptions(**connection))


def _pair_on(broker, mqtt=None, **connection):
    options = _options(broker, **connection)
    if mqtt is not None:
        options = options.replace(mqtt=mqtt)
    server = nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options)
    client = nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT, options.replace(id=uuid.uuid4()))
    return server, client


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


@needs_broker
@pytest.mark.timeout(240)
def test_tiny_broker_limits_slow_consumer_loses_nothing_memory_bounded(tmp_path):
    """mosquitto with max_inflight_messages 2 and max_queued_messages 10 drops QoS 1 messages
    past them; a producer at full speed and a consumer sleeping 20 ms per 64 KiB message
    (3.3 MB/s: a tenth of the unthrottled rate here, ~35-60 MB/s, or less). The consumer
    grants a 32 MiB window, far more than the broker queues, so the broker does drop link
    packets: netq sees the gaps, restarts the link and resends. Every message must arrive
    once, intact, in order; RSS stays bounded in all three processes."""
    count, size = 1000, 64 * KiB
    with local_broker(max_inflight_messages=2, max_queued_messages=10,
                      directory=tmp_path / "broker") as broker:
        spec = {"host": broker.host, "port": broker.port, "service": "loss", "count": count,
                "size": size, "delay": 0.02, "recv_budget": 32 * MiB, "timeout": 60}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]), str(HERE)]))
        script = str(HERE / "mqtt_loss_peer.py")
        consumer = subprocess.Popen(
            [sys.executable, script, json.dumps({**spec, "role": "consumer"})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        producer = None
        try:
            assert json.loads(consumer.stdout.readline()) == {"ready": True}
            producer = subprocess.Popen(
                [sys.executable, script, json.dumps({**spec, "role": "producer"})],
                stdout=subprocess.PIPE, text=True, env=env)
            peaks = {"broker": 0, "consumer": 0, "producer": 0}
            pids = {"broker": broker.pid, "consumer": consumer.pid, "producer": producer.pid}
            result_line: list = []
            reader = threading.Thread(target=lambda: result_line.append(consumer.stdout.readline()),
                                      name="test-reader")
            reader.start()
            deadline = time.monotonic() + 200
            while reader.is_alive() and time.monotonic() < deadline:
                for name, pid in pids.items():
                    try:
                        peaks[name] = max(peaks[name], _rss(pid))
                    except psutil.NoSuchProcess:
                        pass
                time.sleep(0.05)
            reader.join(1)
            assert result_line and result_line[0], "the consumer did not finish"
            consumed = json.loads(result_line[0])
            produced = json.loads(producer.stdout.readline())
            producer.wait(30)
        finally:
            consumer.stdin.close()
            consumer.wait(30)
            consumer.stdout.close()
            if producer is not None:
                if producer.poll() is None:
                    producer.kill()
                producer.wait(10)
                producer.stdout.close()
    print("loss test:", json.dumps({"peaks_mib": {k: v / MiB for k, v in peaks.items()},
                                    "consumer": consumed, "producer": produced}))
    assert consumed["received"] == count and consumed["bad"] == []
    assert produced["failed"] == 0
    total = count * size
    # Bounded: below the 62.5 MiB sent. Peers: interpreter + numpy-free netq (~25 MiB) plus
    # their windows (send 16 MiB, receive 32 MiB); the broker: the link window (16 MiB).
    assert peaks["consumer"] < 120 * MiB, peaks
    assert peaks["producer"] < 120 * MiB, peaks
    assert peaks["broker"] < 60 * MiB, peaks
    assert total > 60 * MiB


@needs_broker
def test_broker_packet_limit_below_max_size_adapts_chunks():
    """A broker that refuses packets over 256 KiB: netq (MQTT 5) reads the limit from CONNACK
    and cuts its packets under it instead of being disconnected."""
    with local_broker(max_packet_size=256 * KiB) as broker:
        server, client = _pair_on(broker)
        try:
            big = os.urandom(3 * MiB)
            client.put(big).result(T)
            assert server.get(timeout=T).data == big
            server.put(big[: MiB + 1], client.id).result(T)
            assert client.get(timeout=T).data == big[: MiB + 1]
            for comm in (client, server):
                stats = link_statistics(comm)
                assert stats["broker_max_packet"] == 256 * KiB
                assert stats["broker_disconnects"] == 0 and stats["gaps"] == 0
        finally:
            client.close(timeout=5)
            server.close(timeout=5)


@needs_broker
def test_mqtt_311_with_configured_packet_limit():
    """MQTT 3.1.1 has no CONNACK limit: MQTTOptions.max_packet_size says it."""
    with local_broker(max_packet_size=128 * KiB) as broker:
        mqtt = nq.MQTTOptions(protocol_version=4, max_packet_size=128 * KiB)
        server, client = _pair_on(broker, mqtt=mqtt)
        try:
            data = os.urandom(MiB)
            client.put(data).result(T)
            assert server.get(timeout=T).data == data
            assert link_statistics(client)["broker_disconnects"] == 0
        finally:
            client.close(timeout=5)
            server.close(timeout=5)


@needs_broker
@pytest.mark.timeout(180)
def test_broker_restart_every_put_arrives_in_order(tmp_path):
    """Traffic both ways while the broker restarts: the communicators reconnect, resume, and
    every message arrives exactly once and in order; every future resolves."""
    count = 600
    with local_broker(directory=tmp_path / "broker") as broker:
        server, client = _pair_on(broker, session_timeout=30, reconnect_max=0.5)
        try:
            client.put("hello").result(T)
            assert server.get(timeout=T).data == "hello"
            futures, errors, got = [], [], {"server": [], "client": []}

            def send(comm, *peers):
                for index in range(count):
                    futures.append(comm.put((index, bytes(index * 97 % 20000)), *peers))
                    if index % 20 == 0:
                        time.sleep(0.05)  # traffic keeps flowing across the restart

            def receive(comm, out):
                try:
                    for _ in range(count):
                        index, data = comm.get(timeout=60).data
                        assert len(data) == index * 97 % 20000
                        out.append(index)
                except BaseException as error:  # noqa: BLE001
                    errors.append(error)

            threads = [threading.Thread(target=send, args=(client,), name="test-send"),
                       threading.Thread(target=send, args=(server, client.id), name="test-send"),
                       threading.Thread(target=receive, args=(server, got["server"]),
                                        name="test-recv"),
                       threading.Thread(target=receive, args=(client, got["client"]),
                                        name="test-recv")]
            for thread in threads:
                thread.start()
            wait_for(lambda: len(got["server"]) > count // 4, T)
            broker.kill()  # a crash: no goodbyes, sockets reset
            time.sleep(0.5)
            broker.start()  # same port
            for thread in threads:
                thread.join(120)
            assert not errors, errors
            assert got["server"] == list(range(count))
            assert got["client"] == list(range(count))
            for future in futures:
                assert future.result(T) is None
            assert link_statistics(client)["broker_disconnects"] >= 1
            assert client.statistics().peers[0].reconnects >= 1
        finally:
            client.close(timeout=5)
            server.close(timeout=5)


def _raw_paho(broker):
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    raw = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"intruder-{uuid.uuid4().hex[:6]}")
    raw.connect(broker.host, broker.port)
    raw.loop_start()
    return raw


@needs_broker
def test_impersonation_is_refused(mqtt_broker):
    """A raw MQTT client (1) injects packets on a victim's topic with a made-up epoch, and (2)
    opens a link on its own topic with a HELLO claiming the victim's id. Neither reaches the
    server's queue, the victim's session keeps working, and the server counts both (the stale
    packets in the carrier's link statistics, the refused link in its loop)."""
    server, victim = _pair_on(mqtt_broker)
    raw = _raw_paho(mqtt_broker)
    try:
        victim.put("genuine").result(T)
        assert server.get(timeout=T) == nq.Message(victim.id, "genuine")
        base = f"netq/{server.options.netloc.path}"
        # (1) DATA on the victim's topic, an epoch the server never opened.
        for seq in range(1, 4):
            header = mqtt_link.encode(int(Kind.DATA), 0, 0x1234, seq, 0)
            raw.publish(f"{base}/c2s/{victim.id}", header + b"\x05" * 40, qos=1).wait_for_publish(5)
        # (2) OPEN on another topic whose HELLO claims to be the victim.
        hello = make_hello(Role.CLIENT, victim.id, auth=False, max_message=MiB, max_frame=MiB,
                           recv_window=MiB, recv_messages=2 ** 32 - 1)
        first_bytes = Connection(hello).data_to_send()
        intruder = uuid.uuid4()
        header = mqtt_link.encode(int(Kind.OPEN), 0, 0x99 << 32 | 1, 1, 0)
        raw.publish(f"{base}/c2s/{intruder}", header + first_bytes, qos=1).wait_for_publish(5)
        loop = server._loop
        wait_for(lambda: loop.refused_links >= 1
                 and link_statistics(server)["stale_packets"] >= 3, T,
                 message="the server to refuse")
        with pytest.raises(nq.Empty):
            server.get(timeout=0.5)
        assert server.peers == (victim.id,)
        victim.put("still me").result(T)
        assert server.get(timeout=T) == nq.Message(victim.id, "still me")
    finally:
        raw.disconnect()
        raw.loop_stop()
        raw._reset_sockets()
        victim.close(timeout=5)
        server.close(timeout=5)


@needs_broker
# paho-mqtt 2.2.0 leaves the SSLSocket of a failed TLS handshake unclosed (Client._ssl_wrap_socket
# does not close it when do_handshake() raises): the untrusted-CA half of this test.
@pytest.mark.filterwarnings("ignore:unclosed <ssl.SSLSocket:ResourceWarning")
def test_tls_to_the_broker(tls_files, tmp_path):
    with local_broker(certfile=tls_files.server_cert, keyfile=tls_files.server_key,
                      directory=tmp_path / "broker") as broker:
        security = nq.SecurityOptions(certificate=tls_files.ca)
        options = _options(broker).replace(security=security)
        server = nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options)
        client = nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT, options.replace(id=uuid.uuid4()))
        try:
            client.put(b"over TLS" * 1000).result(T)
            assert server.get(timeout=T).data == b"over TLS" * 1000
            # Large packets take paho's zero-copy paths (a list of buffers out, recv_into in),
            # which TLS sockets serve differently (no sendmsg): both directions, several packets.
            big = os.urandom(3 * MiB + 5)
            client.put(big).result(T)
            assert server.get(timeout=T).data == big
            server.put(big).result(T)
            assert client.get(timeout=T).data == big
            assert client._loop.carrier._client.socket().version() in ("TLSv1.2", "TLSv1.3")
        finally:
            client.close(timeout=5)
            server.close(timeout=5)
        # A client that does not trust the broker's CA never connects.
        wrong = nq.SecurityOptions(certificate=tls_files.client_cert)
        with pytest.raises(nq.BrokerUnavailable):
            nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER,
                   options.replace(security=wrong, mqtt=nq.MQTTOptions(connect_timeout=1)))


@needs_broker
def test_status_topics_surface_join_and_leave(mqtt_broker):
    """A client process killed without a goodbye: its Last Will marks it disconnected on the
    server within a moment (not after heartbeats), and a clean close clears its status."""
    server, local = _pair_on(mqtt_broker, heartbeat=30)
    try:
        local.put("x").result(T)
        server.get(timeout=T)
        row = server.statistics().peers[0]
        assert row.state == "connected"
        local._loop.carrier._client.socket().close()  # vanish: the broker publishes the Will
        started = time.monotonic()
        wait_for(lambda: server.statistics().peers[0].state != "connected", 10,
                 message="the Last Will to end the link")
        assert time.monotonic() - started < 5  # heartbeat is 30 s: the status did it
    finally:
        local.close(timeout=5)
        server.close(timeout=5)


@needs_broker
def test_link_broken_while_its_ack_is_held_leaves_no_busy_loop(mqtt_broker, monkeypatch):
    """A lone ACK/CREDIT waits ``_ACK_DELAY`` for a reply to share its publish. If its link
    breaks meanwhile, the I/O thread must forget it: it once kept the dead link's deadline
    and, once that passed, woke at once, forever (a core busy on both ends, found by the
    network-fault tests refusing a client's reconnects)."""
    import netq.transports.mqtt.transport as mqtt_transport
    from netq_testing import shut_down_below

    monkeypatch.setattr(mqtt_transport, "_ACK_DELAY", 0.3)  # wide enough to break the link in
    server, client = _pair_on(mqtt_broker, heartbeat=5, reconnect_max=0.2)
    try:
        client.put("hello").result(T)
        assert server.get(timeout=T).data == "hello"
        delivered = server.put("held ack", client.id)
        assert client.get(timeout=T).data == "held ack"  # its ACK now waits 0.3 s ...
        sock = client._loop.carrier._client.socket()
        assert sock is not None and shut_down_below(sock.fileno())  # ... on a broken link
        assert delivered.result(T) is None  # resent and acknowledged on the next link
        wait_for(lambda: (row := client.statistics().peers[0]).reconnects >= 1
                 and row.state == "connected", T, message="the client to reconnect")
        time.sleep(0.5)  # every hold deadline has passed
        cpu = cpu_fraction(1.0)
        assert cpu < 0.10, f"{cpu:.0%} of a core while idle"
    finally:
        client.close(timeout=5)
        server.close(timeout=5)
