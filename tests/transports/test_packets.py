"""The packet-transport base, driven through an in-process carrier.

MQTT and gRPC run the whole conformance suite over the base; this file pins the base's own
contract with a carrier small enough to reason about: packets are slices of the byte stream
(cut at the packet limit, frames spanning packets), a link's packets arrive in order, carrier
back-pressure (``_can_send``) holds output until ``wake()``, a cut channel resumes the session,
and nothing is left running after close.
"""

from __future__ import annotations

import threading
import uuid

import pytest

import netq as nq
from netq.communicator import Communicator
from netq.exceptions import ConnectionLost
from netq.transports.packets import PacketTransport

T = 20.0
_SERVERS: dict[str, InProcessTransport] = {}
_SERVERS_LOCK = threading.Lock()


class Channel:
    """Both ends of one in-process link: whatever one side sends, the other receives."""

    def __init__(self) -> None:
        self.ends: dict[InProcessTransport, object] = {}  # transport -> its link
        self.closed = False
        self.packets = 0
        self.sizes: list[int] = []

    def other(self, transport):
        for peer, link in self.ends.items():
            if peer is not transport:
                return peer, link
        raise LookupError("no other end")

    def cut(self) -> None:
        """The network fails under both ends at once."""
        self.closed = True
        for transport, link in self.ends.items():
            transport.channel_closed(link, ConnectionLost(link.peer_id, "cut"))


class InProcessTransport(PacketTransport):
    family_name = "in-process"
    packet_limit = 1000  # bytes: small, so messages and even HELLOs span packets
    window = 3  # packets a side may have unconsumed before _can_send says no

    def __init__(self, engine) -> None:
        self.channels: list[Channel] = []
        self.unconsumed = 0  # packets sent that the receiving I/O thread has not taken yet
        self.counter_lock = threading.Lock()
        self.callbacks: list = []  # run on this transport's I/O thread after its inbox
        super().__init__(engine)

    def _listen(self) -> None:
        name = self._options.netloc.path
        with _SERVERS_LOCK:
            if name in _SERVERS:
                raise OSError(f"{name} is taken")
            _SERVERS[name] = self
        self.address = name

    def _start_connect(self) -> None:
        server = _SERVERS.get(self._options.netloc.path)
        if server is None or server.engine.closing:
            self.connect_failed()
            return
        channel = Channel()
        self.channels.append(channel)
        channel.ends[self] = None
        channel.ends[server] = None
        channel.ends[self] = self.channel_opened(channel, "client")
        channel.ends[server] = server.channel_opened(channel, "server")

    def _can_send(self, link) -> bool:
        return self.unconsumed < self.window

    def _packet_limit(self, link) -> int:
        return self.packet_limit

    def _send_packet(self, link, payload: bytes) -> None:
        channel = link.channel
        assert len(payload) <= self.packet_limit
        if channel.closed:
            return
        channel.packets += 1
        channel.sizes.append(len(payload))
        peer, peer_link = channel.other(self)
        with self.counter_lock:
            self.unconsumed += 1

        def consumed(sender=self):
            with sender.counter_lock:
                sender.unconsumed -= 1
            sender.wake()

        # The receiver takes the packet on its I/O thread; then the sender has room again.
        peer.packet_received(peer_link, payload)
        peer._post_callback(consumed)

    def _post_callback(self, callback) -> None:
        self.callbacks.append(callback)
        self.wake()

    def _wait(self, timeout: float) -> None:
        super()._wait(timeout)
        while self.callbacks:
            self.callbacks.pop(0)()

    def _close_channel(self, link) -> None:
        channel = link.channel
        if channel is None or channel.closed:
            return
        channel.closed = True
        peer, peer_link = channel.other(self)
        if peer_link is not None:
            peer.channel_closed(peer_link)

    def _stop_listening(self) -> None:
        with _SERVERS_LOCK:
            if _SERVERS.get(self.address) is self:
                del _SERVERS[self.address]


@pytest.fixture
def make():
    made = []

    def make(purpose, name, **connection):
        options = nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(path=name),
            connection=nq.ConnectionOptions(**connection))
        comm = Communicator(nq.Protocol.TCP, purpose, options, InProcessTransport)
        made.append(comm)
        return comm

    yield make
    for comm in reversed(made):
        comm.close(timeout=5)


def pair(make, **connection):
    name = f"pkt-{uuid.uuid4()}"
    server = make(nq.Purpose.SERVER, name, **connection)
    client = make(nq.Purpose.CLIENT, name, **connection)
    return server, client


def test_round_trip_with_frames_spanning_packets(make):
    server, client = pair(make)
    payload = bytes(range(256)) * 40  # 10 KiB: ten-odd packets of at most 1000 bytes
    client.put(payload).result(T)
    message = server.get(timeout=T)
    assert message.data == payload and message.peer == client.id
    server.put("reply", client.id).result(T)
    assert client.get(timeout=T).data == "reply"
    channel = client._transport.channels[0]
    assert channel.packets >= 11
    assert max(channel.sizes) == InProcessTransport.packet_limit


def test_back_pressure_holds_output_until_wake(make):
    """With a 3-packet carrier window, 200 KiB still arrives: write_now stops at the window
    and the carrier's wake() resumes it."""
    server, client = pair(make)
    futures = [client.put(bytes([i]) * 20_000) for i in range(10)]
    for index in range(10):
        assert server.get(timeout=T).data == bytes([index]) * 20_000
    for future in futures:
        future.result(T)
    assert client._transport.unconsumed <= InProcessTransport.window


def test_cut_channel_resumes_session_without_loss(make):
    server, client = pair(make, reconnect_min=0.01, reconnect_max=0.05)
    client.put("before").result(T)
    assert server.get(timeout=T).data == "before"
    client._transport.channels[0].cut()
    futures = [client.put(("after", index)) for index in range(100)]
    for index in range(100):
        assert server.get(timeout=T).data == ("after", index)
    for future in futures:
        future.result(T)
    assert len(client._transport.channels) >= 2
    stats = server.statistics().peer(client.id)
    assert stats.reconnects >= 1


def test_client_waits_for_a_server_that_starts_later(make):
    name = f"pkt-{uuid.uuid4()}"
    client = make(nq.Purpose.CLIENT, name, reconnect_min=0.01, reconnect_max=0.05)
    future = client.put("early")
    server = make(nq.Purpose.SERVER, name)
    assert server.get(timeout=T).data == "early"
    future.result(T)


def test_close_says_goodbye_and_stops_threads(make):
    server, client = pair(make)
    for index in range(50):
        client.put(index)
    client.close(timeout=T)
    assert [server.get(timeout=T).data for _ in range(50)] == list(range(50))
    assert not client._transport._thread.is_alive()
    with pytest.raises(nq.ResourceClosed):
        client.put("late")


def test_taken_name_raises_from_new(make):
    name = f"pkt-{uuid.uuid4()}"
    make(nq.Purpose.SERVER, name)
    with pytest.raises(OSError, match="taken"):
        make(nq.Purpose.SERVER, name)


def test_transport_may_refuse_a_peer_id(make):
    """_authorize returning False: the client is refused for good (AuthenticationError)."""
    name = f"pkt-{uuid.uuid4()}"
    server = make(nq.Purpose.SERVER, name)
    server._transport._authorize = lambda link, peer_id: False
    client = make(nq.Purpose.CLIENT, name)
    with pytest.raises(nq.AuthenticationError):
        client.put("hello").result(T)
    assert server.peers == ()
