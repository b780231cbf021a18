"""The packet-carrier base, driven through an in-process carrier.

MQTT and gRPC run the whole conformance suite over the base; this file pins the base's own
contract with a carrier small enough to reason about: packets are slices of the byte stream
(cut at the packet limit, frames spanning packets), a link's packets arrive in order, carrier
back-pressure (``_can_send``) holds output until ``wake()``, a cut channel resumes the session,
a channel bound to one peer refuses another, and nothing is left running after close.
"""

from __future__ import annotations

import threading
import uuid

import pytest

import netq as nq
from netq.carrier import cut
from netq.communicator import Communicator
from netq.exceptions import ConnectionLost
from netq.loop import carrier_loop
from netq.transports.packets import PacketCarrier

T = 20.0
_SERVERS: dict[str, InProcessCarrier] = {}
_SERVERS_LOCK = threading.Lock()


class Wire:
    """One in-process link: whatever one end sends, the other receives."""

    def __init__(self) -> None:
        self.ends: list[End] = []
        self.closed = False
        self.packets = 0
        self.sizes: list[int] = []

    def other(self, end: End) -> End:
        for other in self.ends:
            if other is not end:
                return other
        raise LookupError("no other end")

    def cut(self) -> None:
        """The network fails under both ends at once."""
        self.closed = True
        for end in self.ends:
            end.carrier.channel_closed(end, ConnectionLost(None, "cut"))


class End:
    """One carrier's end of a wire: the channel the loop knows."""

    def __init__(self, wire: Wire, carrier: InProcessCarrier) -> None:
        self.wire = wire
        self.carrier = carrier
        wire.ends.append(self)


class InProcessCarrier(PacketCarrier[End]):
    packet_limit = 1000  # bytes: small, so messages and even HELLOs span packets
    window = 3  # packets a side may have unconsumed before _can_send says no
    bind_to: str | None = None  # server: the peer id every channel is bound to (None: any)

    def __init__(self, options, purpose) -> None:
        self.wires: list[Wire] = []
        self.unconsumed = 0  # packets sent that the receiving loop has not taken yet
        self.counter_lock = threading.Lock()
        self.callbacks: list = []  # run on this carrier's loop thread after its events
        super().__init__(options, purpose)

    def _listen(self) -> None:
        name = self._options.netloc.path
        with _SERVERS_LOCK:
            if name in _SERVERS:
                raise OSError(f"{name} is taken")
            _SERVERS[name] = self
        self.address = name

    def _start_connect(self) -> None:
        server = _SERVERS.get(self._options.netloc.path)
        if server is None:
            self.connect_failed()
            return
        wire = Wire()
        self.wires.append(wire)
        mine, theirs = End(wire, self), End(wire, server)
        self.channel_opened(mine, "client")
        server.channel_opened(theirs, "server", bound_to=server.bind_to)

    def _can_send(self, channel: End) -> bool:
        return self.unconsumed < self.window

    def _packet_limit(self, channel: End) -> int:
        return self.packet_limit

    def _send(self, channel: End, parts, size: int) -> None:
        payload = b"".join(parts)
        assert len(payload) == size <= self.packet_limit
        wire = channel.wire
        if wire.closed:
            return
        wire.packets += 1
        wire.sizes.append(size)
        peer = wire.other(channel)
        with self.counter_lock:
            self.unconsumed += 1

        def consumed(sender=self):
            with sender.counter_lock:
                sender.unconsumed -= 1
            sender.wake()

        # The receiver takes the packet on its loop thread; then the sender has room again.
        peer.carrier.packet_received(peer, payload)
        peer.carrier._post_callback(consumed)

    def _post_callback(self, callback) -> None:
        self.callbacks.append(callback)
        self.wake()

    def wait(self, timeout: float):
        events = super().wait(timeout)
        while self.callbacks:
            self.callbacks.pop(0)()
        return events

    def _close_channel(self, channel: End) -> None:
        wire = channel.wire
        if wire.closed:
            return
        wire.closed = True
        peer = wire.other(channel)
        peer.carrier.channel_closed(peer)

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
        comm = Communicator(nq.Protocol.TCP, purpose, options, carrier_loop(InProcessCarrier))
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
    wire = client._loop.carrier.wires[0]
    assert wire.packets >= 11
    assert max(wire.sizes) == InProcessCarrier.packet_limit


def test_back_pressure_holds_output_until_wake(make):
    """With a 3-packet carrier window, 200 KiB still arrives: writes stop at the window and
    the carrier's wake() resumes them (the channel is reported WRITABLE)."""
    server, client = pair(make)
    futures = [client.put(bytes([i]) * 20_000) for i in range(10)]
    for index in range(10):
        assert server.get(timeout=T).data == bytes([index]) * 20_000
    for future in futures:
        future.result(T)
    assert client._loop.carrier.unconsumed <= InProcessCarrier.window


def test_cut_channel_resumes_session_without_loss(make):
    server, client = pair(make, reconnect_min=0.01, reconnect_max=0.05)
    client.put("before").result(T)
    assert server.get(timeout=T).data == "before"
    client._loop.carrier.wires[0].cut()
    futures = [client.put(("after", index)) for index in range(100)]
    for index in range(100):
        assert server.get(timeout=T).data == ("after", index)
    for future in futures:
        future.result(T)
    assert len(client._loop.carrier.wires) >= 2
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
    assert not client._loop._thread.is_alive()
    with pytest.raises(nq.ResourceClosed):
        client.put("late")


def test_taken_name_raises_from_new(make):
    name = f"pkt-{uuid.uuid4()}"
    make(nq.Purpose.SERVER, name)
    with pytest.raises(OSError, match="taken"):
        make(nq.Purpose.SERVER, name)


def test_a_channel_bound_to_another_peer_refuses_the_hello(make):
    """A carrier that binds a channel to one peer id (MQTT: the topic's client id): a HELLO
    naming another id is refused for good (AuthenticationError)."""
    name = f"pkt-{uuid.uuid4()}"
    server = make(nq.Purpose.SERVER, name)
    server._loop.carrier.bind_to = str(uuid.uuid4())
    client = make(nq.Purpose.CLIENT, name)
    with pytest.raises(nq.AuthenticationError):
        client.put("hello").result(T)
    assert server.peers == ()


@pytest.mark.parametrize("sizes, limit, packet", [
    ([40, 12, 400, 40, 12, 1000], 1100, [40, 12, 400, 40, 12]),  # the next body waits whole
    ([40, 12, 1000, 40, 12, 1000], 1100, [40, 12, 1000]),  # a large body ends its packet
    ([40, 12, 549, 40, 12, 300], 1100, [40, 12, 549, 40, 12, 300]),  # below half: goes on
    ([40, 2000], 1100, [40, 1060]),  # larger than a packet: cut anyway, where the packet ends
    ([2000, 40], 1100, [1100]),  # the first buffer is always cut to fit
    ([500, 600, 5], 1100, [500, 600]),  # exactly full
])
def test_a_packet_ends_before_a_buffer_that_fits_a_packet_of_its_own(sizes, limit, packet):
    """A body that fits a packet travels as the buffer it is, and one of half a packet or
    more ends its packet: the frame headers behind it go with the next body (the receiver
    keeps a body that ends its packet without copying it)."""
    buffers = [bytes(size) for size in sizes]
    parts, size = cut(buffers, limit)
    assert [len(part) for part in parts] == packet and size == sum(packet)
    for part, buffer in zip(parts, buffers[: len(parts)], strict=True):
        assert part is buffer or len(part) < len(buffer)  # whole buffers are not copied
