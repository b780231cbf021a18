"""The MQTT channel table (netq/transports/mqtt/channels.py) without a broker: a
:class:`ChannelTable` fed link packets through :meth:`~ChannelTable.on_packet`, publishing into a
recorder and posting to a fake loop.

What a real mistake here costs: a link opened for a forged or flooding OPEN, a gap delivered
as data (a hole in the byte stream), a client link opened before a live server is known or
kept after that server left, a link ack never sent (the peer's window stalls).
"""

from __future__ import annotations

import threading
import uuid

import pytest

pytest.importorskip("paho.mqtt", reason="Protocol.MQTT needs paho-mqtt")

import netq as nq
from netq.exceptions import ConnectionLost
from netq.transports.mqtt import channels as channels_module
from netq.transports.mqtt.channels import Channel, ChannelTable
from netq.transports.mqtt.link import ACK_REQUEST, GAP, Kind, encode, parse_header
from netq.transports.mqtt.topics import Topics

TOPICS = Topics.of("netq", "svc")
OPEN, DATA, ACK, CLOSE = int(Kind.OPEN), int(Kind.DATA), int(Kind.ACK), int(Kind.CLOSE)


class Loop:
    """The packet carrier's posts, recorded."""

    def __init__(self) -> None:
        self.opened: list[tuple[Channel, object, str | None]] = []
        self.received: list[tuple[Channel, bytes]] = []
        self.closed: list[tuple[Channel, BaseException | None]] = []
        self.wakes = 0

    def channel_opened(self, channel: Channel, address: object,
                       bound_to: str | None = None) -> None:
        self.opened.append((channel, address, bound_to))

    def packet_received(self, channel: Channel, payload) -> None:
        self.received.append((channel, bytes(payload)))

    def channel_closed(self, channel: Channel, error: BaseException | None = None) -> None:
        self.closed.append((channel, error))

    def wake(self) -> None:
        self.wakes += 1


class Harness:
    def __init__(self, is_server: bool) -> None:
        self.loop = Loop()
        self.published: list[tuple[str, bytes, int]] = []
        self.connected = True
        self.servers: dict[int, str] = {}
        self.live_servers = lambda: dict(self.servers)  # presence's, as the table calls it
        self.instance = 0x1234
        self.cid = str(uuid.uuid4())
        self.table = ChannelTable(
            TOPICS, nq.MQTTOptions(), is_server=is_server, my_cid=self.cid,
            address="mqtt://broker:1883/netq/svc", role="server" if is_server else "client",
            publish=lambda topic, payload, qos: self.published.append((topic, payload, qos)),
            connected=lambda: self.connected, events=self.loop,
            live_servers=lambda: self.live_servers(), instance=lambda: self.instance)


def _packet(kind: int, epoch: int, seq: int, body: bytes = b"", flags: int = 0,
            ack: int = 0) -> bytes:
    return encode(kind, flags, epoch, seq, ack) + body


def test_a_server_opens_a_link_for_an_open_and_delivers_in_order():
    h = Harness(is_server=True)
    cid = str(uuid.uuid4())
    topic = f"{TOPICS.c2s}{cid}"
    h.table.on_packet(topic, _packet(OPEN, 7, 1, b"hello"))
    [(channel, address, bound_to)] = h.loop.opened
    assert (channel.cid, channel.epoch, channel.topic_out) == (cid, 7, f"{TOPICS.s2c}{cid}")
    assert (address, bound_to) == (f"mqtt:{cid}", cid)  # bound to its topic's client id
    h.table.on_packet(topic, _packet(DATA, 7, 2, b"world"))
    h.table.on_packet(topic, _packet(DATA, 7, 2, b"world"))  # a broker redelivery
    assert [body for _, body in h.loop.received] == [b"hello", b"world"]
    assert h.table.counters["duplicates"] == 1
    assert h.table.statistics() == (1, {cid: (nq.MQTTOptions().window_packets, 0)})


def test_a_gap_ends_the_link_and_tells_the_peer():
    h = Harness(is_server=True)
    cid = str(uuid.uuid4())
    topic = f"{TOPICS.c2s}{cid}"
    h.table.on_packet(topic, _packet(OPEN, 7, 1, b"a"))
    h.table.on_packet(topic, _packet(DATA, 7, 4, b"d"))  # 2 and 3 never arrived
    assert [body for _, body in h.loop.received] == [b"a"]  # never the packet after a hole
    [(channel, error)] = h.loop.closed
    assert isinstance(error, ConnectionLost) and "2..3" in str(error)
    assert channel.closed and h.table.counters["gaps"] == 1
    [(out, payload, _)] = h.published
    kind, flags, epoch, _, ack = parse_header(payload)
    assert (out, kind, flags & GAP, epoch, ack) == (channel.topic_out, CLOSE, GAP, 7, 1)
    assert h.table.statistics()[0] == 0


def test_forged_and_flooding_opens_open_nothing():
    h = Harness(is_server=True)
    h.table.on_packet(f"{TOPICS.c2s}not-a-uuid", _packet(OPEN, 1, 1))
    h.table.on_packet(f"{TOPICS.c2s}{uuid.uuid4()}", _packet(DATA, 1, 1))  # not an OPEN
    h.table.on_packet(f"{TOPICS.s2c}{uuid.uuid4()}", _packet(OPEN, 1, 1))  # not our topic
    h.table.on_packet(f"{TOPICS.c2s}{uuid.uuid4()}", b"garbage")
    assert h.loop.opened == [] and h.table.counters["invalid_packets"] == 1
    cid = str(uuid.uuid4())
    for epoch in range(1, 7):
        h.table.on_packet(f"{TOPICS.c2s}{cid}", _packet(OPEN, epoch, 1))
    assert len(h.loop.opened) == channels_module._MAX_PENDING_EPOCHS
    h.table.refuse_new()
    h.table.on_packet(f"{TOPICS.c2s}{uuid.uuid4()}", _packet(OPEN, 1, 1))
    assert len(h.loop.opened) == channels_module._MAX_PENDING_EPOCHS


def test_a_stale_epoch_gets_a_rate_limited_close_answer():
    h = Harness(is_server=True)
    cid = str(uuid.uuid4())
    h.table.on_packet(f"{TOPICS.c2s}{cid}", _packet(DATA, 9, 5))
    h.table.on_packet(f"{TOPICS.c2s}{cid}", _packet(DATA, 9, 6))  # within the interval
    h.table.on_packet(f"{TOPICS.c2s}{cid}", _packet(CLOSE, 10, 0))  # a CLOSE is not answered
    assert h.table.counters["stale_packets"] == 3
    [(topic, payload, _)] = h.published
    assert topic == f"{TOPICS.s2c}{cid}"
    assert parse_header(payload)[:3] == (CLOSE, 0, 9) and payload.endswith(b"unknown link")


def test_a_client_opens_only_when_asked_connected_and_a_server_is_live():
    h = Harness(is_server=False)
    h.table.maybe_open()  # nobody asked
    h.table.request_attempt()  # no live server yet
    assert h.loop.opened == []
    h.connected = False
    h.servers = {0xAA: str(uuid.uuid4())}
    h.table.maybe_open()  # no broker session
    assert h.loop.opened == []
    h.connected = True
    h.table.maybe_open()
    [(channel, address, bound_to)] = h.loop.opened
    assert (address, bound_to) == ("mqtt://broker:1883/netq/svc", None)
    assert channel.epoch == (0x1234 << 32) | 1 and channel.servers == {0xAA}
    assert channel.topic_out == f"{TOPICS.c2s}{h.cid}" and h.table.current is channel
    assert h.table.peer(channel) == uuid.UUID(h.servers[0xAA])
    h.table.maybe_open()  # the attempt is done: no second link
    assert len(h.loop.opened) == 1
    h.table.server_left(0xBB)  # another server instance: not ours
    assert not channel.closed
    h.table.server_left(0xAA)
    assert channel.closed and h.table.current is None
    [(_, error)] = h.loop.closed
    assert "the server left" in str(error)
    assert h.published == []  # unannounced: the server is gone


def test_a_server_leaving_while_a_link_opens_with_it_ends_that_link():
    """Presence forgets a server, then tells the table (server_left) on paho's thread, while
    the loop's thread opens a link with the servers it read just before: the table must end
    that link once it is registered, not look too early and miss it."""
    h = Harness(is_server=False)
    left: list[threading.Thread] = []

    def live_servers() -> dict[int, str]:
        servers = {0xAA: ""}  # read; presence forgets 0xAA right after and says so
        thread = threading.Thread(target=h.table.server_left, args=(0xAA,))
        thread.start()
        thread.join(0.2)  # it waits for the link to be registered
        left.append(thread)
        return servers

    h.live_servers = live_servers
    h.table.request_attempt()
    left[0].join(5)
    [(channel, _, _)] = h.loop.opened
    assert channel.closed and h.table.current is None
    assert "the server left" in str(h.loop.closed[0][1])


def test_a_client_ignores_packets_of_other_epochs():
    h = Harness(is_server=False)
    h.servers = {1: ""}
    h.table.request_attempt()
    channel = h.table.current
    assert channel is not None
    topic = f"{TOPICS.s2c}{h.cid}"
    h.table.on_packet(topic, _packet(DATA, channel.epoch + 1, 1, b"x"))
    assert h.loop.received == [] and h.table.counters["stale_packets"] == 1
    assert h.table.peer(channel) == uuid.UUID(int=0)  # the server announced no id


def test_a_requested_link_ack_waits_for_a_packet_to_carry_it_then_goes_alone(monkeypatch):
    clock = [50.0]
    monkeypatch.setattr(channels_module.time, "monotonic", lambda: clock[0])
    h = Harness(is_server=True)
    cid = str(uuid.uuid4())
    h.table.on_packet(f"{TOPICS.c2s}{cid}", _packet(OPEN, 3, 1, b"x", flags=ACK_REQUEST))
    assert h.table.acks_due and h.loop.wakes >= 1
    wait = h.table.flush_acks(clock[0])
    assert wait == pytest.approx(channels_module._LINK_ACK_DELAY) and h.published == []
    assert h.table.acks_due  # still due
    clock[0] += channels_module._LINK_ACK_DELAY
    assert h.table.flush_acks(clock[0]) == float("inf")
    [(topic, payload, qos)] = h.published
    assert (topic, qos) == (f"{TOPICS.s2c}{cid}", 0)
    assert parse_header(payload) == (ACK, 0, 3, 0, 1)
    assert h.table.counters["acks_sent"] == 1 and not h.table.acks_due


def test_a_lost_broker_connection_ends_every_link_unannounced():
    h = Harness(is_server=True)
    cids = [str(uuid.uuid4()) for _ in range(3)]
    for cid in cids:
        h.table.on_packet(f"{TOPICS.c2s}{cid}", _packet(OPEN, 1, 1))
    h.table.client_left(cids[0], 0)  # epoch 1 is instance 0
    assert len(h.loop.closed) == 1 and h.loop.closed[0][0].cid == cids[0]
    h.connected = False
    h.table.end_all("MQTT broker connection lost (gone)")
    assert len(h.loop.closed) == 3 and h.published == []
    assert all("broker connection lost" in str(error) for _, error in h.loop.closed[1:])
    assert h.table.statistics()[0] == 0


def test_the_probe_timer_probes_a_silent_tail_until_it_is_acknowledged(monkeypatch):
    clock = [10.0]
    monkeypatch.setattr(channels_module.time, "monotonic", lambda: clock[0])
    h = Harness(is_server=False)
    h.servers = {1: ""}
    h.table.request_attempt()
    channel = h.table.current
    assert channel is not None
    h.table.tick()  # nothing outstanding
    assert h.published == []
    channel.state.header(OPEN, 10)  # what the carrier's _send does for one packet
    channel.published_seq = 1
    clock[0] += channels_module._TICK
    h.table.tick()
    [(topic, payload, qos)] = h.published
    assert topic == channel.topic_out and qos == nq.MQTTOptions().qos
    assert parse_header(payload) == (ACK, ACK_REQUEST, channel.epoch, 1, 0)
    clock[0] += channels_module._TICK
    h.table.tick()  # probed less than _PROBE_AFTER ago
    assert len(h.published) == 1
    clock[0] += channels_module._PROBE_AFTER
    h.table.tick()
    assert len(h.published) == 2 and h.table.counters["probes"] == 2
    h.table.on_packet(f"{TOPICS.s2c}{h.cid}", _packet(ACK, channel.epoch, 0, ack=1))
    clock[0] += 10
    h.table.tick()  # acknowledged: nothing to probe
    assert len(h.published) == 2
