"""A server knows a client by its id (``CommunicatorOptions.id``): two live clients of one
server under one id take each other's connection in turn, and neither gets through. Within a
process netq refuses the second at ``netq.new()``, before it makes anything; between
processes (a worker pool forked with the parent's options) the client whose connection the
server replaced says why in a WARNING. Real TCP on loopback."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest

import netq as nq
from netq_testing import wait_for

T = 30.0  # seconds any single blocking step may take before the test is considered stuck

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER,
                    nq.CommunicatorOptions(netloc=nq.NetworkLocation("127.0.0.1", 0)))
    yield server
    server.close(timeout=5)


def _options(server: nq.Communicator, host: str = "127.0.0.1") -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(netloc=nq.NetworkLocation(host, server.address[1]))


def test_a_second_live_client_with_the_same_options_is_refused_before_it_starts(server):
    options = _options(server)
    first = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options)
    try:
        first.put("first").result(T)
        threads = threading.active_count()
        with pytest.raises(nq.LocalProtocolError, match="its own CommunicatorOptions"):
            nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options)
        assert threading.active_count() == threads  # it started no I/O thread
        # The first is unaffected, and a client with a fresh id gets through beside it.
        other = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options.replace(id=uuid.uuid4()))
        try:
            first.put("first again").result(T)
            other.put("other").result(T)
            got = {server.get(timeout=T).data for _ in range(3)}
            assert got == {"first", "first again", "other"}
        finally:
            other.close(timeout=5)
    finally:
        first.close(timeout=5)
    # Closed, the id is free again: a new client with it resumes nothing and gets through.
    again = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options)
    try:
        again.put("again").result(T)
        assert server.get(timeout=T).data == "again"
    finally:
        again.close(timeout=5)


def test_one_id_for_different_servers_or_keys_is_allowed(server):
    second = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER,
                    nq.CommunicatorOptions(netloc=nq.NetworkLocation("127.0.0.1", 0)))
    options = _options(server)
    clients = [nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options),
               nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options.replace(
                   netloc=nq.NetworkLocation("127.0.0.1", second.address[1])))]
    try:
        for client in clients:
            client.put("hello").result(T)
        assert server.get(timeout=T).data == second.get(timeout=T).data == "hello"
    finally:
        for client in clients:
            client.close(timeout=5)
        second.close(timeout=5)


def test_a_client_replaced_by_another_live_client_with_its_id_says_why(server, caplog):
    """Another process with the same id, played in one process: the same server under two
    spellings of its address (127.0.0.1 and 127.1) is two servers to the in-process check,
    one to the server."""
    caplog.set_level(logging.WARNING, logger="netq")
    first = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, _options(server))
    try:
        first.put("first").result(T)
        twin = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT,
                      _options(server, "127.1").replace(id=first.id))
        try:
            wait_for(lambda: any("another live client uses id" in record.getMessage()
                                 and str(first.id) in record.getMessage()
                                 for record in caplog.records), T)
        finally:
            twin.close(timeout=5)
    finally:
        first.close(timeout=5)
