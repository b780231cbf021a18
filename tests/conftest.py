"""Fixtures for the transport conformance and fault-injection suites.

* ``leak_check`` (autouse): a test must not leave ``netq-*`` threads or file descriptors behind.
* ``tls_files`` (session): a throwaway CA, a server certificate for 127.0.0.1/::1/localhost and
  a client certificate, made with ``cryptography``.
* ``transport``: parametrized over :data:`TRANSPORTS`; yields a :class:`Harness` whose
  ``make_server(**overrides)`` / ``make_client(server, **overrides)`` build the right options for
  that transport and whose teardown closes everything it made, with timeouts.

Adding a transport (MQTT, gRPC) means adding one :class:`TransportSpec` subclass instance to
:data:`TRANSPORTS`: it says how a server's location is chosen, how a client finds it, which
security options it needs, and (optionally) how to open a raw byte stream to the server and how
to cut a client's live link. Tests that need a capability a spec lacks skip themselves.

Overrides accepted by ``make_server`` / ``make_client`` (and ``options``/``spawn``): any field
of :class:`netq.ConnectionOptions`, :class:`netq.SerializationOptions` or
:class:`netq.SecurityOptions` by name (``heartbeat=0.2``, ``queue_size=1``, ``authkey=b"k"``),
or a :class:`netq.CommunicatorOptions` field (``id``, ``netloc``, ``connection``, ...).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

import netq as nq
from harness import Env, Harness, SocketSpec, TLSFiles, TransportSpec, write_tls_files
from transports.brokers_testing import (  # noqa: F401 - session broker fixtures
    RABBITMQ_START_ALLOWANCE,
    RabbitMQSpec,
    amqtt_binary,
    rabbitmq,
    rabbitmq_brokers,
    rabbitmq_cluster,
)
from transports.grpc_testing import GRPCSpec
from transports.mqtt_testing import MQTTSpec, mqtt_broker  # noqa: F401 - the session broker fixture

LEAK_GRACE = 5.0  # seconds a finished test's threads and sockets get to go away
CLOSE_TIMEOUT = 3.0  # seconds each communicator gets at fixture teardown

# ============================================================================ leak check


def _open_fds() -> dict[int, str]:
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the descriptor listdir itself used, already closed
    return fds


def _netq_threads(ignore: set) -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.name.startswith("netq-") and t.is_alive() and t not in ignore]


@pytest.fixture(autouse=True)
def leak_check(request):
    """Fail a test that leaves ``netq-*`` threads or open file descriptors behind."""
    threads_before = set(_netq_threads(set()))
    fds_before = _open_fds()
    yield
    deadline = time.monotonic() + LEAK_GRACE
    while True:
        threads = _netq_threads(threads_before)
        fds = _open_fds()
        if not threads and len(fds) <= len(fds_before):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    new = {fd: target for fd, target in fds.items() if fds_before.get(fd) != target}
    pytest.fail(f"leaked after {request.node.nodeid}: threads {[t.name for t in threads]}, "
                f"{len(fds) - len(fds_before)} more fds than before: {new}", pytrace=False)


# ============================================================================ TLS files



@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> TLSFiles:
    """A throwaway CA, a server cert (127.0.0.1, ::1, localhost) and a client cert."""
    return write_tls_files(tmp_path_factory.mktemp("tls"))



@pytest.fixture
def loopback_listener():
    """A listening TCP socket on 127.0.0.1 (any free port), closed after the test."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        yield listener
    finally:
        listener.close()


# ============================================================================ transports


TRANSPORTS: dict[str, TransportSpec] = {
    "tcp": SocketSpec("tcp", nq.Protocol.TCP, host="127.0.0.1"),
    "tls": SocketSpec("tls", nq.Protocol.TCP, host="127.0.0.1", tls=True),
    "unix": SocketSpec("unix", nq.Protocol.UNIX),  # large parts in shared memory (the default)
    "unix-noshm": SocketSpec("unix-noshm", nq.Protocol.UNIX, shared_memory=False),
    "tcp6": SocketSpec("tcp6", nq.Protocol.TCP, host="::1"),
    # Clients on the process's shared I/O thread (netq.shared_io: a process's 9th client on)
    "tcp-shared": SocketSpec("tcp-shared", nq.Protocol.TCP, host="127.0.0.1",
                             io_thread="shared"),
    "tls-shared": SocketSpec("tls-shared", nq.Protocol.TCP, host="127.0.0.1", tls=True,
                             io_thread="shared"),
    "mqtt": MQTTSpec(), "mqtt-rabbitmq": RabbitMQSpec(),
    "grpc": GRPCSpec("grpc"), "grpc-tls": GRPCSpec("grpc-tls", tls=True),
}


def _transport_ids():
    return list(TRANSPORTS)


# RabbitMQ runs the conformance suite: what the MQTT transport promises, on another broker. The
# fault, flow-control and hostile-input suites test netq's side of a link and run on mosquitto;
# RabbitMQ's own failures (node and cluster restarts, either start order) are
# tests/transports/test_mqtt_brokers.py. The shared I/O thread changes which thread runs a
# client's loop, not what a link does: the conformance suite covers it. This keeps CI within
# its time.
_SUITES_PER_TRANSPORT = {"mqtt-rabbitmq": ("test_conformance.py",),
                         "tcp-shared": ("test_conformance.py", "test_fork.py"),
                         "tls-shared": ("test_conformance.py",)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, deselected = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("transport") if callspec is not None else None
        suites = _SUITES_PER_TRANSPORT.get(name) if isinstance(name, str) else None
        (deselected if suites is not None and item.path.name not in suites else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
    for item in items:
        _allow_for_rabbitmq_start(config, item)


def _allow_for_rabbitmq_start(config: pytest.Config, item: pytest.Item) -> None:
    """A test that may be the first to need a RabbitMQ node or the cluster gets their start on
    top of its own timeout (pytest-timeout counts fixture setup): the start has its own bound
    (BrokerUnavailable), and a loaded machine must make it slower, never red."""
    callspec = getattr(item, "callspec", None)
    names = set(getattr(item, "fixturenames", ()))
    nodes = 0
    if "rabbitmq" in names or (callspec is not None
                               and callspec.params.get("transport") == "mqtt-rabbitmq"):
        nodes += 1
    if "rabbitmq_cluster" in names:
        nodes += 2
    if not nodes:
        return
    marker = item.get_closest_marker("timeout")
    own = marker.args[0] if marker is not None and marker.args else config.getini("timeout")
    item.add_marker(pytest.mark.timeout(float(own) + nodes * RABBITMQ_START_ALLOWANCE),
                    append=False)


@pytest.fixture(params=_transport_ids())
def transport(request):
    """A Harness for each transport in TRANSPORTS (skipped where unusable)."""
    spec = TRANSPORTS[request.param]
    reason = spec.unavailable()
    if reason is not None:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="nq-"))  # short: Unix socket paths are limited
    harness = Harness(spec, Env(directory, request))
    try:
        yield harness
    finally:
        problems = harness.close_all()
        shutil.rmtree(directory, ignore_errors=True)
        if problems:
            pytest.fail("teardown: " + "; ".join(problems), pytrace=False)
