"""Regression tests for what the soak found (each names the soak run that showed it)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

import netq as nq
from netq.lab.brokers import free_port

T = 30.0


def _wait_until_the_server_lets_go(server: nq.Communicator) -> None:
    """Bounded poll: the server ends the session of a client that said goodbye."""
    deadline = time.monotonic() + T
    while server.peers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not server.peers, "the server kept the session of a client that left"


def _the_next_process_with_the_id_receives_nothing_twice(
        server: nq.Communicator, options: nq.CommunicatorOptions, id: uuid.UUID) -> None:
    """A new client with ``id``, straight to the server: what it puts arrives, and the first
    message it receives is the one the server puts to it now (nothing of the last process's)."""
    again = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, dataclasses.replace(
        options, id=id, netloc=nq.NetworkLocation("127.0.0.1", server.address[1])))
    try:
        again.put("second process").result(T)
        assert server.get(timeout=T).data == "second process"
        server.put("to the second process", again.id).result(T)
        assert again.get(timeout=T).data == "to the second process"
    finally:
        again.close(timeout=2)


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
        netloc=nq.NetworkLocation("127.0.0.1", free_port()),
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
    from netq.lab.brokers import LocalBroker, find_mosquitto
    from netq.lab.relay import Relay
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
    from netq.lab.relay import DOWN, Relay

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


@dataclasses.dataclass
class _Goodbye:
    """A server, a relay in front of it, and a client (``options``) that took a message
    (``sent``: the server's future for it) whose ACK the relay dropped on its way up."""

    server: nq.Communicator
    relay: Any
    client: nq.Communicator
    options: nq.CommunicatorOptions
    sent: nq.DeliveryFuture


@contextlib.contextmanager
def _a_client_that_took_a_message_the_server_does_not_know_it_took(
        connection: nq.ConnectionOptions) -> Iterator[_Goodbye]:
    from netq.lab.relay import UP, Relay

    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", 0), connection=connection))
    relay = Relay(server.address, name="netq-relay-test")
    options = nq.CommunicatorOptions(netloc=relay.netloc, connection=connection)
    client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options)
    try:
        client.put("hello").result(T)
        assert server.get(timeout=T).data == "hello"
        relay.drop(UP)  # the client's ACK (and BYE) never reach the server
        sent = server.put("to the first process", client.id)
        assert client.get(timeout=T).data == "to the first process"
        deadline = time.monotonic() + T
        while relay.stats().dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # bounded poll: the client's ACK was sent, and dropped
        assert relay.stats().dropped > 0
        yield _Goodbye(server, relay, client, options, sent)
    finally:
        client.close(timeout=2)
        server.close(timeout=2)
        relay.close()


def _the_goodbye_got_through(setup: _Goodbye) -> None:
    """The server learned that the client took the message (its put resolves as delivered),
    ended the session, and the next process with the id receives nothing twice."""
    assert setup.sent.result(T) is None, "the server never learned the client had it"
    _wait_until_the_server_lets_go(setup.server)
    _the_next_process_with_the_id_receives_nothing_twice(setup.server, setup.options,
                                                         setup.client.id)


def _goodbye_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "goodbye" in r.getMessage()]


@pytest.mark.parametrize("reset_before_close", [False, True], ids=["during", "before"])
def test_a_goodbye_cut_by_a_reset_is_finished_on_a_new_link(reset_before_close, caplog):
    """Seeds 11 and 7040, tcp: a client's ``close()`` said goodbye, a reset cut the link before
    the server's BYE came back, and close() returned. The server had not heard the BYE, nor the
    ACKs of the last messages it had sent that client: it kept the session, and the next
    process with that id received those messages again. Now the closing client reconnects,
    the handshake tells the server what it received, and the BYE follows on the new link: the
    server's put resolves as delivered, and a new client with the same id receives nothing
    twice. Also when the link broke before close() began (nothing left to send: no reconnect
    until the goodbye)."""
    caplog.set_level(logging.WARNING, logger="netq")
    with _a_client_that_took_a_message_the_server_does_not_know_it_took(
            nq.ConnectionOptions(heartbeat=0.3)) as setup:
        relay = setup.relay
        if reset_before_close:
            relay.reset()
            relay.restore()
            setup.client.close(timeout=T)
        else:
            dropped = relay.stats().dropped
            closer = threading.Thread(target=setup.client.close, kwargs={"timeout": T},
                                      name="test-closer")
            closer.start()
            # Bounded poll: the BYE is sent (and dropped) before the cut.
            deadline = time.monotonic() + T
            while relay.stats().dropped == dropped and time.monotonic() < deadline:
                time.sleep(0.01)
            relay.reset()
            relay.restore()
            closer.join(T)
            assert not closer.is_alive()
        _the_goodbye_got_through(setup)
        assert not _goodbye_warnings(caplog)


def test_a_goodbye_that_cannot_be_finished_is_reported_and_bounded(caplog):
    """The other side of the test above: when no reconnect gets through within close()'s
    timeout (the network refuses every new connection), close() returns within its timeout
    and a WARNING says that the server may keep the session and resend what it holds as
    unacknowledged."""
    caplog.set_level(logging.WARNING, logger="netq")
    with _a_client_that_took_a_message_the_server_does_not_know_it_took(
            nq.ConnectionOptions(heartbeat=0.3)) as setup:
        setup.relay.refuse()
        setup.relay.reset()
        started = time.monotonic()
        setup.client.close(timeout=1.5)
        took = time.monotonic() - started
        assert took < T, took
        said = _goodbye_warnings(caplog)
        assert len(said) == 1 and "could not finish its goodbye" in said[0], said
        assert str(setup.client.id) in said[0] and "session_timeout" in said[0]


def test_close_without_a_timeout_finishes_a_goodbye_once_the_network_lets_it(caplog):
    """Seed 3078923807, tcp: a client's ``close()`` without a timeout began as its link was
    reset and new connections were refused for about 2 s. It tried to finish its goodbye for
    one heartbeat (1 s at least), gave up with a WARNING and returned; the server kept the
    session and sent a message the client had received again to the next process with its
    id. Without a timeout, close() now tries for as long as the server may hold the session,
    and says what it waits for while it does."""
    caplog.set_level(logging.WARNING, logger="netq")
    with _a_client_that_took_a_message_the_server_does_not_know_it_took(
            nq.ConnectionOptions(heartbeat=0.3, stall_warning=1.5)) as setup:
        setup.relay.refuse()
        setup.relay.reset()
        closer = threading.Thread(target=setup.client.close, name="test-closer")
        closer.start()
        # Bounded poll: the stall WARNING (after 1.5 s, past the old one-second bound).
        deadline = time.monotonic() + T
        while closer.is_alive() and time.monotonic() < deadline and not any(
                "finishing its goodbye" in text for text in _goodbye_warnings(caplog)):
            time.sleep(0.02)
        said = _goodbye_warnings(caplog)
        assert closer.is_alive(), f"close() returned while the network refused: {said}"
        assert len(said) == 1 and "close() has waited" in said[0] \
            and ": finishing its goodbye" in said[0], said
        assert "last failed with" in said[0] and "stops trying in" in said[0], said
        setup.relay.restore()
        closer.join(T)
        assert not closer.is_alive()
        _the_goodbye_got_through(setup)
        assert _goodbye_warnings(caplog) == said  # nothing about giving up


def test_close_without_a_timeout_tries_no_longer_than_the_server_holds_the_session(caplog):
    """The bound of the test above: when no reconnect gets through, close() without a timeout
    stops trying once the server has ended the session (``session_timeout`` after the break,
    plus 3 heartbeats for a server to notice a silent link), and says so. The server then
    sends nothing of that session to the next process with the id."""
    caplog.set_level(logging.WARNING, logger="netq")
    connection = nq.ConnectionOptions(heartbeat=0.2, session_timeout=1.0)
    with _a_client_that_took_a_message_the_server_does_not_know_it_took(connection) as setup:
        setup.relay.refuse()
        setup.relay.reset()
        started = time.monotonic()
        setup.client.close()
        took = time.monotonic() - started
        assert connection.session_timeout <= took < T, took
        said = _goodbye_warnings(caplog)
        assert len(said) == 1 and "close() ends without its goodbye" in said[0], said
        assert isinstance(setup.sent.exception(T), nq.ConnectionLost)  # the session expired
        assert not setup.server.peers
        setup.relay.restore()
        _the_next_process_with_the_id_receives_nothing_twice(setup.server, setup.options,
                                                             setup.client.id)


def test_what_a_closed_client_has_not_read_is_not_called_a_leak(tmp_path):
    """Soak seed 4263096297 (unix, 1 min): a client closed while its reader was paused had
    shared-memory messages in its inbox. After close() they are still the caller's to get()
    (the README's contract), and each keeps the descriptors of its mapping until taken; the
    peer counted them as descriptors leaked by close(). It takes what arrived, as get() allows
    after close, before it counts; and that is all it takes to free them."""
    np = pytest.importorskip("numpy")
    from netq import _shm
    if _shm.unavailable() is not None:
        pytest.skip(f"no shared memory here: {_shm.unavailable()}")
    from harness import Child  # tests/ is on sys.path (conftest)
    from netq_child import encode_options
    from tests.soak.peer import payload
    from tests.soak.run import PEER_SCRIPT

    netloc = nq.NetworkLocation(path=str(tmp_path / "server.sock"))
    options = nq.CommunicatorOptions(netloc=netloc)
    server = nq.new(nq.Protocol.UNIX, nq.Purpose.SERVER, options)
    spec = encode_options(nq.Protocol.UNIX, nq.Purpose.CLIENT, options)
    spec["soak"] = {"name": "c0", "incarnation": 0, "seed": 0, "peers": {},
                    "journal": str(tmp_path / "c0.0.jsonl"),
                    # puts nothing of its own: one every 1e9 s on average, and no bytes
                    "rate": 1e-9, "large_every": 60, "max_size": 0, "budget_bytes": 0}
    child = Child(spec, tmp_path / "c0.0.log", netloc, script=PEER_SCRIPT)
    try:
        child.request("pause", seconds=3600)
        data = payload("server", 0, 0, 0, 2 * nq.MiB)
        array = np.frombuffer(data, np.uint8).copy()  # out of band: through shared memory
        crc = zlib.crc32(data)
        server.put(("server", 0, 0, 0, 1, crc, array), child.id).result(T)  # in its inbox
        assert server.statistics().shm_bytes_out >= 2 * nq.MiB
        closed = child.request("close", timeout=T, timeout_=T)
        assert closed["fds"] == 0 and closed["threads"] == [], closed
        journal = [json.loads(line) for line in (tmp_path / "c0.0.jsonl").read_text().splitlines()]
        received = [line[2:] for line in journal if line[0] == "recv"]
        assert received == [["server", 0, 0, 0, 1, 2 * nq.MiB, True]], received
    finally:
        child.close()
        server.close(timeout=T)
