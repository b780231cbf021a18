"""Protocol.MQTT across two bridged brokers: the netq server on broker A, its clients on B.

The shape of a broker cluster or an edge-to-cloud federation: every link packet, the server's
retained "online" status and every client's Last Will cross a mosquitto bridge (see
``tests/transports/mqtt_bridge_testing.py`` for the configuration and why each line is there).

* numbered traffic both ways, 0 B to 1 MiB, three clients: every message arrives once, intact
  and in order, and every put future resolves;
* presence: a client joining shows in ``server.peers``; one that closes leaves and puts to it
  raise ConnectionLost; a SIGKILLed client process is noticed through its Last Will, carried
  by the bridge, long before netq's own heartbeat could;
* faults: broker B (the clients' side) crashes and restarts mid-traffic, then the bridge link
  alone is reset; after netq reconnects every message has arrived exactly once, in order,
  through a bridge that preserves in-flight messages and through one that loses them;
* what the network must (and need not) preserve: a bridge that drops the RETAIN flag no longer
  hides the server from clients that join later (they ask, the live server answers); a far
  broker's smaller packet limit is met by ``MQTTOptions.max_packet_size``.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

pytest.importorskip("paho.mqtt", reason="Protocol.MQTT needs paho-mqtt")

import netq as nq
from harness import Child
from netq.transports.mqtt import link_statistics
from netq_child import encode_options
from netq_testing import peer_row, sequence_payload, wait_for
from transports.mqtt_bridge_testing import PREFIX, BridgedBrokers, Watcher
from transports.mqtt_testing import mosquitto_missing

KiB, MiB = nq.KiB, nq.MiB
T = 30.0
SIZES = (0, 1, 100, 1000, 4 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)

pytestmark = [pytest.mark.skipif(mosquitto_missing() is not None,
                                 reason=mosquitto_missing() or ""),
              pytest.mark.timeout(180)]


# ============================================================================ helpers


@pytest.fixture
def bridged(request, tmp_path):
    """Broker A and broker B bridged to it; ``BridgedBrokers`` settings by indirect
    parametrization (``via_proxy``, ``qos``, ``overrides``). Request it before
    ``cluster_factory``, so the communicators close before the brokers stop."""
    with BridgedBrokers(tmp_path / "brokers", **getattr(request, "param", {})) as brokers:
        yield brokers


def _options(netloc: nq.NetworkLocation, mqtt: nq.MQTTOptions | None = None,
             **connection) -> nq.CommunicatorOptions:
    return nq.CommunicatorOptions(netloc=netloc, connection=nq.ConnectionOptions(**connection),
                                  mqtt=mqtt or nq.MQTTOptions())


class Cluster:
    """A server on broker A and clients on broker B; closes them all (with timeouts)."""

    def __init__(self, brokers: BridgedBrokers, service: str | None = None,
                 mqtt: nq.MQTTOptions | None = None, **connection) -> None:
        self.brokers = brokers
        self.service = service or f"b-{uuid.uuid4().hex[:12]}"
        self.mqtt = mqtt
        self.connection = connection
        self.server = nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER,
                             _options(brokers.server_netloc(self.service), mqtt, **connection))
        self.clients: list[nq.Communicator] = []
        self.children: list[Child] = []

    def client_options(self, **connection) -> nq.CommunicatorOptions:
        return _options(self.brokers.client_netloc(self.service), self.mqtt,
                        **{**self.connection, **connection})

    def client(self, **connection) -> nq.Communicator:
        client = nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT, self.client_options(**connection))
        self.clients.append(client)
        return client

    def connect(self, timeout: float = T, **connection) -> nq.Communicator:
        """A client whose first message crossed the bridge to the server."""
        client = self.client(**connection)
        client.put(("hello", str(client.id))).result(timeout)
        assert self.server.get(client.id, timeout=timeout).data == ("hello", str(client.id))
        return client

    def spawn(self, log, **connection) -> Child:
        """A client in a child process (tests/netq_child.py), on broker B."""
        options = self.client_options(**connection)
        child = Child(encode_options(nq.Protocol.MQTT, nq.Purpose.CLIENT, options), log,
                      options.netloc)
        self.children.append(child)
        return child

    def close(self) -> None:
        for child in self.children:
            child.close()
        closers = [threading.Thread(target=c.close, kwargs={"timeout": 5}, name="test-closer")
                   for c in self.clients]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(20)
        self.server.close(timeout=5)


@pytest.fixture
def cluster_factory():
    made = []

    def make(brokers, service=None, mqtt=None, **connection) -> Cluster:
        cluster = Cluster(brokers, service, mqtt, **connection)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def _stamp(client_no: int, index: int) -> int:
    return client_no << 20 | index


def _size(index: int) -> int:
    return SIZES[index % len(SIZES)]


class Traffic:
    """Numbered messages both ways between the server and each client, checked on arrival:
    per direction and client, the indexes seen (in arrival order) and any error."""

    def __init__(self, server, clients, count: int, size=_size, pace: int = 0,
                 get_timeout: float = 60) -> None:
        self.server = server
        self.clients = clients
        self.count = count
        self.size = size
        self.pace = pace  # pause 50 ms after every `pace` puts (0: never)
        self.get_timeout = get_timeout
        self.futures: list = []
        self.errors: list = []
        self.up = {client.id: [] for client in clients}  # what the server got, per client
        self.down = {client.id: [] for client in clients}  # what each client got
        self.bytes = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._guard, args=(self._server_send,),
                                         name="test-send"),
                        threading.Thread(target=self._guard, args=(self._server_receive,),
                                         name="test-recv")]
        for number, client in enumerate(clients):
            self.threads.append(threading.Thread(
                target=self._guard, args=(self._client_send, number, client), name="test-send"))
            self.threads.append(threading.Thread(
                target=self._guard, args=(self._client_receive, number, client),
                name="test-recv"))

    def _guard(self, target, *args) -> None:
        try:
            target(*args)
        except BaseException as error:  # noqa: BLE001 - reported by check()
            self.errors.append(error)

    def _payload(self, number: int, index: int) -> tuple:
        return (number, index, sequence_payload(_stamp(number, index), self.size(index)))

    def _keep(self, future) -> None:
        with self._lock:
            self.futures.append(future)

    def _pause(self, index: int) -> None:
        if self.pace and index % self.pace == self.pace - 1:
            time.sleep(0.05)  # traffic keeps flowing across the faults the test injects

    def _server_send(self) -> None:
        for index in range(self.count):
            for number, client in enumerate(self.clients):
                self._keep(self.server.put(self._payload(number, index), client.id))
            self._pause(index)

    def _client_send(self, number: int, client) -> None:
        for index in range(self.count):
            self._keep(client.put(self._payload(number, index)))
            self._pause(index)

    def _check(self, number: int, index: int, data: bytes) -> None:
        expected = sequence_payload(_stamp(number, index), self.size(index))
        assert data == expected, f"message {index} of client {number} is corrupt"
        with self._lock:
            self.bytes += len(data)

    def _server_receive(self) -> None:
        numbers = {client.id: number for number, client in enumerate(self.clients)}
        for _ in range(self.count * len(self.clients)):
            message = self.server.get(timeout=self.get_timeout)
            number, index, data = message.data
            assert number == numbers[message.peer], "a message arrived from the wrong peer"
            self._check(number, index, data)
            self.up[message.peer].append(index)

    def _client_receive(self, number: int, client) -> None:
        for _ in range(self.count):
            got_number, index, data = client.get(timeout=self.get_timeout).data
            assert got_number == number, "a message for another client arrived here"
            self._check(number, index, data)
            self.down[client.id].append(index)

    def received(self) -> int:
        return sum(map(len, self.up.values())) + sum(map(len, self.down.values()))

    def start(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self.threads if thread.is_alive()]
        assert not alive, f"traffic threads still running after {timeout} s: {alive}"

    def check(self) -> None:
        """Every message arrived exactly once, intact, in order; every future resolved."""
        assert not self.errors, self.errors
        expected = list(range(self.count))
        for client in self.clients:
            assert self.up[client.id] == expected, f"server from {client.id}"
            assert self.down[client.id] == expected, f"client {client.id}"
        for future in self.futures:
            assert future.result(T) is None


def _link_counters(*comms) -> dict:
    totals: dict = {}
    for comm in comms:
        for name, value in link_statistics(comm).items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[name] = totals.get(name, 0) + value
    return totals


# ============================================================================ (a) traffic


def test_numbered_traffic_both_ways_across_the_bridge(bridged, cluster_factory):
    """Three clients on broker B, the server on broker A: 300 messages each way per client,
    0 B to 1 MiB, at once. Every one arrives once, intact, in order; every future resolves;
    nothing was routed back through the bridge (no duplicates at the link layer)."""
    count = 300
    cluster = cluster_factory(bridged)
    clients = [cluster.connect() for _ in range(3)]
    assert set(cluster.server.peers) == {client.id for client in clients}
    traffic = Traffic(cluster.server, clients, count)
    started = time.monotonic()
    traffic.start()
    traffic.join(150)
    elapsed = time.monotonic() - started
    traffic.check()
    counters = _link_counters(cluster.server, *clients)
    # try_private: broker A never echoes B's publishes back over the bridge (nor B A's); an
    # echo would reach the sender's own subscriptions as duplicates.
    assert counters["duplicates"] == 0, counters
    assert counters["broker_disconnects"] == 0, counters
    messages = 2 * count * len(clients)
    print(f"\nbridge traffic: {messages} messages, {traffic.bytes / MiB:.1f} MiB in "
          f"{elapsed:.2f} s: {traffic.bytes / MiB / elapsed:.1f} MiB/s, "
          f"{messages / elapsed:.0f} msg/s; link gaps {counters['gaps']}, "
          f"probes {counters['probes']}")


@pytest.mark.parametrize("bridged", [pytest.param({"a_limits": {"max_packet_size": 64 * KiB}},
                                                 id="A-64KiB-packets")], indirect=True)
def test_packet_limit_of_the_far_broker_set_in_mqtt_options(bridged, cluster_factory):
    """Broker A accepts packets up to 64 KiB; B has no limit. A client's CONNACK only tells it
    B's limit, and broker A drops the whole bridge connection on a larger packet (every
    netq link through it stalls while the bridge reconnects and resends it), so every
    communicator is given the network's smallest limit in MQTTOptions.max_packet_size:
    then 1 MiB messages cross both ways in 64 KiB packets."""
    cluster = cluster_factory(bridged, mqtt=nq.MQTTOptions(max_packet_size=64 * KiB))
    clients = [cluster.connect() for _ in range(2)]
    bridges = bridged.bridge_log_lines("New bridge connected")
    traffic = Traffic(cluster.server, clients, 24).start()
    traffic.join(120)
    traffic.check()
    assert bridged.bridge_log_lines("oversize packet") == 0
    assert bridged.bridge_log_lines("New bridge connected") == bridges  # never dropped


# ============================================================================ (b) presence


def test_presence_join_close_and_killed_client_through_the_bridge(bridged, cluster_factory,
                                                                  tmp_path):
    """Join: a client on B shows in server.peers. Close: it leaves and puts to it raise
    ConnectionLost. Kill: a client process SIGKILLed is seen through its Last Will (broker B
    publishes it when the socket closes, the bridge carries it to A) within the keepalive,
    although the heartbeat (60 s: 3 minutes of silence before netq's own liveness check
    would end the link) is far longer; its session then expires after session_timeout."""
    session_timeout = 1.0
    keepalive = nq.MQTTOptions().keepalive
    cluster = cluster_factory(bridged, heartbeat=60.0, session_timeout=session_timeout)
    server = cluster.server

    started = time.monotonic()
    client = cluster.client()
    wait_for(lambda: client.id in server.peers, T, message="the client to join")
    joined = time.monotonic() - started
    client.put("hi").result(T)
    assert server.get(client.id, timeout=T) == nq.Message(client.id, "hi")
    server.put("hello", client.id).result(T)
    assert client.get(timeout=T) == nq.Message(server.id, "hello")

    client.close(timeout=T)
    wait_for(lambda: client.id not in server.peers, T, message="the closed client to leave")
    with pytest.raises(nq.ConnectionLost) as caught:  # the client closed, not the server
        server.put("after close", client.id)
    assert caught.value.peer == client.id

    child = cluster.spawn(tmp_path / "child.log", heartbeat=60.0,
                          session_timeout=session_timeout)
    child.request("put", data="from the child")
    assert server.get(child.id, timeout=T) == nq.Message(child.id, "from the child")
    server.put("delivered", child.id).result(T)  # nothing outstanding when it dies
    assert peer_row(server, child.id).state == "connected"
    killed = time.monotonic()
    child.kill()
    wait_for(lambda: peer_row(server, child.id) is None
             or peer_row(server, child.id).state != "connected", 1.5 * keepalive + 5,
             message="the killed client's Last Will")
    noticed = time.monotonic() - killed
    late = server.put("to the dead", child.id)
    error = late.exception(session_timeout + T)
    assert isinstance(error, nq.ConnectionLost), error
    wait_for(lambda: child.id not in server.peers, T, message="the dead client's session")
    gone = time.monotonic() - killed
    assert noticed < 1.5 * keepalive, noticed
    assert gone < noticed + session_timeout + 5, (noticed, gone)
    print(f"\nbridge presence: join {joined * 1000:.0f} ms, killed client's link down after "
          f"{noticed * 1000:.0f} ms (Last Will), session gone after {gone * 1000:.0f} ms "
          f"(session_timeout {session_timeout:g} s)")


@pytest.mark.parametrize("bridged", [pytest.param({"overrides": {"try_private": "false"}},
                                                 id="plain-client-bridge")], indirect=True)
def test_a_bridge_that_drops_the_retain_flag_still_lets_late_clients_find_the_server(
        bridged, cluster_factory):
    """With ``try_private false`` broker A treats the bridge as an ordinary MQTT 3.1.1 client
    and clears the RETAIN flag of what it forwards, so broker B never stores the server's
    "online" status. A client that joins B after the server came up finds it anyway: it asks
    on the question topic and the live server answers (retained statuses are only a hint)."""
    service = f"b-{uuid.uuid4().hex[:12]}"
    # Watch B for the server's status: once it is seen there, it has crossed the bridge, and
    # a client joining after that cannot learn of the server from B's retained store.
    with Watcher(bridged.b, f"{PREFIX}/{service}/status/server/+") as status:
        cluster = cluster_factory(bridged, service=service)
        assert status.arrived.wait(T), "the server's status never crossed the bridge"
    assert status.messages[0][1].startswith(b"online")
    late = cluster.client()
    late.put("anyone there?").result(T)
    assert cluster.server.get(timeout=T).data == "anyone there?"


# ============================================================================ (c) faults


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bridged", [
    pytest.param({"via_proxy": True}, id="preserving"),
    # QoS 0 and no session on A: what was in flight on the bridge link when it broke is gone.
    pytest.param({"via_proxy": True, "qos": 0, "overrides": {"cleansession": "true"}},
                 id="lossy"),
], indirect=True)
def test_edge_broker_restart_then_bridge_reset_every_put_arrives_in_order(
        bridged, cluster_factory):
    """Traffic both ways (two clients, 600 messages each way per client) while broker B, the
    clients' broker, crashes and restarts on the same port, and later while the bridge link
    alone is reset (both brokers stay up; the bridge runs through a FaultProxy). Broker B
    keeps nothing (persistence false): the clients find the server again through its
    retained status, which the bridge copies back from A. With the preserving bridge (QoS 1,
    cleansession false) the reset costs duplicates that the link layer drops; with the lossy
    one it costs gaps, which end the link and netq's session resume repairs. Either way every
    message arrives exactly once and in order, and every future resolves."""
    brokers = bridged
    count = 600
    cluster = cluster_factory(brokers, session_timeout=30, reconnect_max=0.5)
    clients = [cluster.connect() for _ in range(2)]
    total = 2 * count * len(clients)
    traffic = Traffic(cluster.server, clients, count,
                      size=lambda index: index * 97 % 20000, pace=20)
    traffic.start()
    try:
        wait_for(lambda: traffic.received() > total // 4, 2 * T, message="a quarter")
        bridges_before = brokers.bridge_log_lines("New bridge connected")
        crashed = time.monotonic()
        brokers.b.kill()  # a crash: no goodbyes, no Last Wills, sockets reset
        brokers.b.start()  # same port, empty: no retained messages, no sessions
        wait_for(lambda: all(peer_row(c, cluster.server.id) is not None
                             and peer_row(c, cluster.server.id).reconnects >= 1
                             and peer_row(c, cluster.server.id).state == "connected"
                             for c in clients), T, message="the clients to resume")
        resumed = time.monotonic() - crashed
        wait_for(lambda: traffic.received() > total // 2, 2 * T, message="half, after B")
        assert brokers.bridge_log_lines("New bridge connected") > bridges_before
        bridges_before = brokers.bridge_log_lines("New bridge connected")
        reset = time.monotonic()
        assert brokers.proxy.reset() >= 1  # the bridge link, RST both ways
        wait_for(lambda: brokers.bridge_log_lines("New bridge connected") > bridges_before,
                 T, message="the bridge to reconnect")
        relinked = time.monotonic() - reset
        wait_for(lambda: traffic.received() > 3 * total // 4, 2 * T,
                 message="three quarters, after the bridge reset")
    finally:
        traffic.join(150)
    traffic.check()
    for client in clients:
        assert client.statistics().peers[0].reconnects >= 1
        assert link_statistics(client)["broker_disconnects"] >= 1
    assert link_statistics(cluster.server)["broker_disconnects"] == 0
    counters = _link_counters(cluster.server, *clients)
    print(f"\nbridge faults (bridge QoS {brokers.qos}): B down to clients resumed "
          f"{resumed:.2f} s, bridge reset to bridge back {relinked:.2f} s; link gaps "
          f"{counters['gaps']}, duplicates {counters['duplicates']}, stale "
          f"{counters['stale_packets']}, probes {counters['probes']}")
