"""Regression tests for what the soak found (each names the soak run that showed it)."""

from __future__ import annotations

import logging
import socket
import time

import pytest

import netq as nq

T = 30.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_link_failure_is_not_called_a_closed_communicator():
    """``ConnectionLost(None, ...)`` is this communicator's link failing, not the communicator
    closing: its text says "connection lost" (seed 2, grpc-tls: a client whose server was being
    restarted warned "last failed with: communicator is closed: gRPC: UNAVAILABLE ...")."""
    error = nq.ConnectionLost(None, "gRPC: UNAVAILABLE")
    assert str(error) == "connection lost: gRPC: UNAVAILABLE"
    assert str(nq.ConnectionLost(None)) == "connection lost"
    assert str(nq.ResourceClosed(None, "close() was called")) == \
        "communicator is closed: close() was called"
    assert error.peer is None and error.reason == "gRPC: UNAVAILABLE"


def test_a_grpc_client_with_no_server_does_not_say_it_is_closed(caplog):
    pytest.importorskip("grpc")
    caplog.set_level(logging.WARNING, logger="netq")
    options = nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", _free_port()),
        connection=nq.ConnectionOptions(stall_warning=0.5))
    client = nq.new(nq.Protocol.GRPC, nq.Purpose.CLIENT, options)
    try:
        future = client.put(b"waits for a server")
        deadline = time.monotonic() + T
        while not client.statistics().connect_error and time.monotonic() < deadline:
            time.sleep(0.05)
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.05)
        said = [client.statistics().connect_error or ""] + [r.getMessage()
                                                             for r in caplog.records]
        assert said[0] and len(said) > 1, said
        assert not client.closed
        assert not any("communicator is closed" in text for text in said), said
        assert any("connection lost: gRPC" in text for text in said), said
    finally:
        client.close(timeout=1)
    assert isinstance(future.exception(T), nq.ResourceClosed)


def test_a_cut_during_connect_does_not_downgrade_a_proven_mqtt5_broker(caplog, tmp_path):
    """A broker that has answered this client's MQTT 5 CONNECT speaks MQTT 5: a connection cut
    before the next CONNACK (a reset, a truncated packet, a broker restart) is the network, not
    the protocol (seed 2, mqtt: a truncated CONNECT switched a client to MQTT 3.1.1 for good,
    and two resets during resends then cut its packets to half a large publish's size)."""
    from netq.brokers import LocalBroker, find_mosquitto
    from netq.relay import Relay
    from netq.transports.mqtt import link_statistics

    try:
        find_mosquitto()
    except nq.BrokerUnavailable as error:
        pytest.skip(str(error))
    caplog.set_level(logging.INFO, logger="netq")
    with LocalBroker(directory=tmp_path / "broker") as broker, \
            Relay((broker.host, broker.port), name="netq-relay-test") as relay:
        server = nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(broker.host, broker.port, path="cut-connect")))
        client = nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(relay.address[0], relay.address[1], path="cut-connect")))
        try:
            client.put("before").result(T)
            assert server.get(timeout=T).data == "before"
            assert link_statistics(client)["protocol"] == "MQTT 5"
            connects = link_statistics(client)["broker_connects"]
            relay.truncate(4)  # the next CONNECT is cut after 4 bytes, its connection closed
            relay.reset()
            deadline = time.monotonic() + T
            while (relay.stats().truncated == 0 or link_statistics(client)["broker_connects"]
                   <= connects) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert relay.stats().truncated == 1
            client.put("after").result(T)
            assert server.get(timeout=T).data == "after"
            assert link_statistics(client)["protocol"] == "MQTT 5"
            assert not any("3.1.1 instead" in r.getMessage() for r in caplog.records)
        finally:
            client.close(timeout=5)
            server.close(timeout=5)


def test_a_resume_after_the_servers_session_expired_duplicates_nothing():
    """Seed 7040, tcp: the server's session for a client expired (its puts to that client
    failed ConnectionLost) while the client's attempts hung in handshakes (not counted by its
    own clock); when it got through, its unacknowledged message arrived a second time. Now the
    server says, in the new session, how far it got in the one that ended: what it had
    resolves (delivered), nothing comes twice."""
    from netq.relay import DOWN, Relay

    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", 0),
        connection=nq.ConnectionOptions(heartbeat=0.2, session_timeout=1.0)))
    relay = Relay(server.address, name="netq-relay-test")
    client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
        netloc=relay.netloc, connection=nq.ConnectionOptions(heartbeat=0.2)))
    try:
        client.put("one").result(T)
        assert server.get(timeout=T).data == "one"
        relay.drop(DOWN)  # the server's ACK of the next message never reaches the client
        unacknowledged = client.put("two")
        assert server.get(timeout=T).data == "two"
        relay.blackhole()  # the client's attempts hang; the server's session runs out
        deadline = time.monotonic() + T
        while server.peers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.peers, "the server kept the session"
        relay.restore()
        client.put("three").result(T)
        received = [server.get(timeout=T).data]
        while received[-1] != "three":
            received.append(server.get(timeout=T).data)
        assert received == ["three"], f"after the expiry the server got {received}"
        assert unacknowledged.result(T) is None  # the server had it: delivered
    finally:
        client.close(timeout=2)
        server.close(timeout=2)
        relay.close()
