"""The MQTT carrier itself: :class:`MQTTCarrier`, the packet-carrier hooks around the
channel table, the presence protocol and paho.

What it holds (the rest of the subpackage, see :mod:`netq.transports.mqtt`, is split out):

- construction: topics from ``MQTTOptions.prefix`` and the service (``netloc.path``), the
  paho client (:func:`~.paho_adapter.new_client` plus our callbacks, timer and Last Will),
  and its two parts, wired together: :class:`~.presence.Presence` and
  :class:`~.channels.ChannelTable`;
- the broker connection: ``connect_async`` + paho's thread (``loop_start``), and paho's
  callbacks: CONNACK (read the broker's maximum packet size, subscribe), SUBACK (announce
  ourselves, ready), disconnect (every link ends, a new instance), message (status or link
  packet: hand it to the presence part or the channel table);
- delayed ACKs: the loop holds a publish carrying nothing but netq ACK/CREDIT frames up to
  ``_ACK_DELAY`` for a reply to ride with it (``ack_hold_always``); each publish is a broker
  round of its own, so a request/response pair costs two publishes instead of four;
- sending a packet (``_send``: a large packet goes to paho as a list of buffers, never
  joined) and packet size negotiation
  (``_packet_limit``): at most min(``max_size``, 1 MiB, the broker's maximum packet size minus
  the link header, the topic and ``_MQTT_OVERHEAD``);
- the other hooks: listen (wait for the broker, or :class:`~netq.BrokerUnavailable`), start a
  client attempt, window check, link header, publish, close, stop (clear our status, stop
  paho); a server's channels are bound to their topic's client id (the HELLO must name it);
- :func:`link_statistics`, the link-layer counters.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import paho.mqtt.client as paho

from ...carrier import Event
from ...exceptions import BrokerUnavailable, RemoteProtocolError
from ...options import CommunicatorOptions, Purpose
from ...protocol.sending import Buffer
from ..packets import PACKET_SIZE, PacketCarrier
from . import paho_adapter
from .channels import Channel, ChannelTable
from .link import HEADER_SIZE, Kind
from .paho_adapter import ZERO_COPY_FROM, PahoClient, new_client
from .presence import Presence
from .topics import Topics

__all__ = ("MQTTCarrier", "link_statistics")

LOGGER = logging.getLogger("netq")
_MQTT_OVERHEAD = 64  # fixed header, packet id, property lengths: a generous upper bound
_OPEN, _DATA = int(Kind.OPEN), int(Kind.DATA)
_ACK_DELAY = 0.001  # seconds a lone netq ACK/CREDIT waits for a reply to share its publish
# Seconds a broker gets to answer our CONNECT: past it, an MQTT 5 CONNECT is taken as not
# understood (amqtt 0.12 never answers one that carries a Will) and we try MQTT 3.1.1.
_CONNACK_TIMEOUT = 3.0
_PRESENCE_TICK = 0.2  # seconds between presence checks on paho's thread
_SMALLEST_CUT = 4 * 1024  # bytes: packets are never cut below this when the broker drops us
_QUICK_DROP = 5.0  # seconds: a drop this soon after connecting, twice, is the packet's fault
# MQTT 5 CONNACK reason codes (and a 3.1.1 "unacceptable protocol version", 1, read as one)
# that mean "speak another protocol": unspecified, malformed, protocol error, unsupported.
_PROTOCOL_REFUSALS = frozenset({0x01, 0x80, 0x81, 0x82, 0x84})


class MQTTCarrier(PacketCarrier[Channel]):
    """The broker-carried transport; see :mod:`netq.transports.mqtt`.

    Parts: ``presence`` (a ``Presence``, ``presence.py``: the status topics) and ``links``
    (a ``ChannelTable``, ``channels.py``: the links); each owns its state and lock
    (see their docstrings). The carrier wires them: presence tells the table when peers come
    and go (``_client_left``, ``_server_found``, ``_server_left``), the table reads presence's
    live servers and instance, and both publish through the paho client.

    State owned here: the broker connection (paho client, readiness, what goes wrong with it,
    MQTT 5 or 3.1.1, packet limits, the connect/disconnect counters) and the stop flags. It
    is written on paho's thread (its callbacks and timer) except the stop flags (the closing
    thread); other threads read single attributes (``_connected``, the packet limits), so no
    lock of its own: ``_connected`` goes False before the table is told to end every link, and
    the table reads it under its lock when it opens one, so no link outlives its broker
    connection.
    """

    # A lone put on an idle link is published by the calling thread (paho's publish is
    # thread-safe, and the packet goes out from that thread too, see PahoClient._write_direct):
    # one thread hop less per request than through the I/O thread.
    user_threads_write = True
    # Each publish is a broker round of its own: a lone ACK/CREDIT waits for a reply to
    # share its publish (a request/response pair costs two publishes instead of four).
    ack_hold = _ACK_DELAY
    ack_hold_always = True

    def __init__(self, options: CommunicatorOptions, purpose: Purpose) -> None:
        self._mqtt = mqtt = options.mqtt
        netloc = options.netloc
        topics = self._topics = Topics.of(mqtt.prefix, netloc.path or "netq")
        security = options.security
        if security is not None and security.client_ca is not None:
            raise ValueError("MQTT: client certificates are checked by the broker "
                             "(mosquitto require_certificate/cafile), "
                             "not by SecurityOptions.client_ca")
        self._base = topics.base
        self._is_server = purpose is Purpose.SERVER
        self._connected = False  # broker CONNACK ok and subscriptions granted
        self._ready_event = threading.Event()
        self._broker_ready_at = time.monotonic()
        # What the broker connection runs into (None: nothing yet, or connected), in words
        # for the engine's "not connected" explanations.
        self._broker_problem: str | None = None
        self._tcp_accepted = False  # some broker accepted our TCP connection at least once
        self._socket_opened_at: float | None = None  # a CONNECT awaits its CONNACK since then
        self._presence_checked_at = 0.0
        self._auto_protocol = mqtt.protocol_version is None
        # The broker has answered our MQTT 5 CONNECT: it speaks MQTT 5, and a connection that
        # ends before a later CONNACK is the network or a restart, never a reason to fall back.
        self._mqtt5_answered = False
        self._learned_max_packet: int | None = None  # 3.1.1: cut after the broker dropped us
        self._large_drop = 0  # the largest publish unacknowledged at the last broker drop
        self._stopped = False
        self._carrier_stopped = False
        self._broker_max_packet: int | None = None
        self._broker_connects = 0
        self._broker_disconnects = 0
        self._client = client = self._make_client(options)
        my_id = str(options.id)
        self.presence = Presence(client, topics, is_server=self._is_server, my_id=my_id,
                                 client_left=self._client_left,
                                 server_found=self._server_found,
                                 server_left=self._server_left)
        self.presence.set_will()
        self.links = ChannelTable(topics, mqtt, is_server=self._is_server, my_cid=my_id,
                                  address=f"mqtt://{netloc.host}:{netloc.port}/{topics.base}",
                                  role=purpose.value, publish=client.publish,
                                  connected=self._is_connected, events=self,
                                  live_servers=self.presence.live_servers,
                                  instance=self._instance)
        super().__init__(options, purpose)
        if not self._is_server:
            self._start_client()

    # ------------------------------------------------------------------ wiring the parts

    def _is_connected(self) -> bool:
        return self._connected

    def _instance(self) -> int:
        return self.presence.instance

    def _client_left(self, cid: str, instance: int) -> None:
        self.links.client_left(cid, instance)

    def _server_found(self) -> None:
        self.links.maybe_open()

    def _server_left(self, instance: int) -> None:
        self.links.server_left(instance)

    # ================================================================== broker connection

    def _make_client(self, options) -> PahoClient:
        role = "s" if self._is_server else "c"
        client_id = f"netq-{role}-{str(options.id)[:8]}-{os.urandom(4).hex()}"
        client = new_client(options, client_id)
        client.tick = self._carrier_tick
        client.on_socket_open = self._on_socket_open
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        return client

    def _broker_connect(self) -> None:
        netloc = self._options.netloc
        # MQTT 5: a fresh session on every connect; 3.1.1 ignores it (paho's default).
        clean_start: paho.CleanStartOption = (
            True if self._mqtt.protocol_version != 4 else paho.MQTT_CLEAN_START_FIRST_ONLY)
        self._client.connect_async(netloc.host, netloc.port, keepalive=self._mqtt.keepalive,
                                   clean_start=clean_start)
        self._client.loop_start()

    def _start_client(self) -> None:
        self._broker_connect()

    # ------------------------------------------------------------------ paho callbacks
    # (paho's thread: only bookkeeping and hand-offs)

    def _broker_name(self) -> str:
        netloc = self._options.netloc
        return f"the MQTT broker at {netloc.host}:{netloc.port}"

    def _protocol_name(self) -> str:
        return "MQTT 5" if paho_adapter.speaks_mqtt5(self._client) else "MQTT 3.1.1"

    def _fall_back(self, why: str) -> bool:
        """MQTT 5 failed for ``why``: speak 3.1.1 from the next CONNECT on, if we may choose
        (never once the broker has answered MQTT 5)."""
        if not (self._auto_protocol and paho_adapter.speaks_mqtt5(self._client)) \
                or self._mqtt5_answered:
            return False
        paho_adapter.use_mqtt311(self._client)
        LOGGER.info("netq mqtt %s: %s %s; speaking MQTT 3.1.1 instead (set "
                    "MQTTOptions(protocol_version=4) to skip trying MQTT 5)",
                    self._purpose.value, self._broker_name(), why)
        return True

    def _on_socket_open(self, client, userdata, sock) -> None:
        paho_adapter.on_socket_open(client, userdata, sock)
        self._tcp_accepted = True
        self._socket_opened_at = time.monotonic()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self._socket_opened_at = None
        if reason_code.is_failure:
            if reason_code.value in _PROTOCOL_REFUSALS and self._fall_back(
                    f"refused MQTT 5 ({reason_code})"):
                return
            self._broker_problem = f"{self._broker_name()} refused us: {reason_code}"
            LOGGER.warning("netq mqtt: %s", self._broker_problem)
            return
        self._broker_connects += 1
        if paho_adapter.speaks_mqtt5(client):
            self._mqtt5_answered = True
        limit = None
        if properties is not None and hasattr(properties, "MaximumPacketSize"):
            limit = properties.MaximumPacketSize
        self._broker_max_packet = limit
        qos = self._mqtt.qos
        topics = self._topics
        link_topic = (f"{topics.c2s}+" if self._is_server
                      else f"{topics.s2c}{self._options.id}")
        client.subscribe([(topic, qos) for topic in (link_topic, *self.presence.subscriptions())])

    def _on_connect_fail(self, client, userdata) -> None:
        self._socket_opened_at = None
        self._broker_problem = (f"no MQTT broker at {self._options.netloc.host}:"
                                f"{self._options.netloc.port} (nothing accepts the connection)")

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        if any(code.is_failure for code in reason_codes):
            self._broker_problem = (f"{self._broker_name()} refused our subscriptions: "
                                    f"{reason_codes}")
            LOGGER.warning("netq mqtt: %s", self._broker_problem)
            return
        self._broker_problem = None
        self._broker_ready_at = time.monotonic()
        self._connected = True
        self.presence.announce()
        self._ready_event.set()
        self.links.maybe_open()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        was_connected = self._connected
        self._connected = False
        self.presence.broker_lost()
        unanswered = self._socket_opened_at is not None
        self._socket_opened_at = None
        # Every link ends below; what paho would resend belongs to them.
        largest = paho_adapter.forget_publishes(client)
        if was_connected:
            self._broker_disconnects += 1
        if not self._stopped:
            self.presence.next_instance()
            if unanswered:
                protocol = self._protocol_name()
                if not self._fall_back("closed the connection without answering an MQTT 5 "
                                       "CONNECT"):
                    self._broker_problem = (
                        f"{self._broker_name()} closed the connection without answering "
                        f"CONNECT ({protocol}"
                        + (" unsupported?)" if protocol == "MQTT 5" and not self._mqtt5_answered
                           else ")"))
            elif was_connected:
                self._broker_problem = (f"{self._broker_name()} closed the connection "
                                        f"({reason_code}); reconnecting")
                LOGGER.info("netq mqtt %s: broker connection lost (%s); reconnecting",
                            self._purpose.value, reason_code)
                self._maybe_cut_packets(largest)
            else:
                self._large_drop = 0
        self.links.end_all(f"MQTT broker connection lost ({reason_code})")

    def _maybe_cut_packets(self, largest: int) -> None:
        """MQTT 3.1.1 tells no packet limit: a broker drops a client whose packet is over its
        limit, and again after each reconnect, as netq resends. Two drops in a row with a
        large publish unacknowledged, the second within ``_QUICK_DROP`` of connecting (a
        crashed or restarted broker is not that quick twice): cut packets to half that size
        (and again on the next such drop), so that a put gets through, not a reconnect loop."""
        now = time.monotonic()
        previous = self._large_drop
        self._large_drop = largest
        if (paho_adapter.speaks_mqtt5(self._client) or self._mqtt.max_packet_size is not None
                or largest < 2 * _SMALLEST_CUT or previous < 2 * _SMALLEST_CUT
                or now - self._broker_ready_at > _QUICK_DROP):
            return
        limit = max(_SMALLEST_CUT, min(largest, previous) // 2)
        learned = self._learned_max_packet
        if learned is not None and limit >= learned:
            return
        self._learned_max_packet = limit
        LOGGER.log(logging.WARNING if learned is None else logging.INFO,
                   "netq mqtt %s: %s dropped the connection twice with a %d-byte publish "
                   "unacknowledged; MQTT 3.1.1 does not tell the broker's packet limit, so "
                   "packets are now cut to at most %d bytes. Set MQTTOptions(max_packet_size=) "
                   "to the broker's limit (mosquitto: max_packet_size) to skip this",
                   self._purpose.value, self._broker_name(), largest, limit)

    def _carrier_tick(self) -> None:
        """paho's thread, every pass of its loop: the CONNACK deadline, presence, probes."""
        now = time.monotonic()
        if now - self._presence_checked_at >= _PRESENCE_TICK:
            self._presence_checked_at = now
            opened = self._socket_opened_at
            if opened is not None and now - opened >= _CONNACK_TIMEOUT:
                self._socket_opened_at = None
                protocol = self._protocol_name()
                self._broker_problem = (
                    f"{self._broker_name()} did not answer our {protocol} CONNECT within "
                    f"{_CONNACK_TIMEOUT:g} s" + (" (MQTT 5 unsupported?)"
                                                 if protocol == "MQTT 5"
                                                 and not self._mqtt5_answered else ""))
                if self._fall_back(f"did not answer an MQTT 5 CONNECT within "
                                   f"{_CONNACK_TIMEOUT:g} s"):
                    paho_adapter.drop_connection(self._client)
            elif self._connected and not self._stopped:
                self.presence.tick(now)
        self.links.tick()

    def _on_message(self, client, userdata, message) -> None:
        topic = message.topic
        status = self._topics.status
        if topic.startswith(status):
            self.presence.on_status(topic[len(status):], bytes(message.payload))
            return
        if self._is_server and topic == self._topics.query:
            self.presence.on_question()
            return
        self.links.on_packet(topic, message.payload)

    # ================================================================== PacketCarrier hooks

    def wait(self, timeout: float) -> list[Event]:
        links = self.links
        if links.acks_due:
            timeout = min(timeout, links.flush_acks(time.monotonic()))
        return super().wait(timeout)

    def _send(self, channel: Channel, parts: list[Buffer], size: int) -> None:
        """One packet: at least ``ZERO_COPY_FROM`` bytes go to paho as a list of buffers
        (link header + slices of the link's output), written with one ``sendmsg``; smaller
        ones are joined (one buffer is cheaper than an iovec list when small)."""
        parts.insert(0, self._packet_header(channel, size))
        if not channel.closed:
            if size >= ZERO_COPY_FROM:
                self._client.publish_parts(channel.topic_out, parts, HEADER_SIZE + size,
                                           self._mqtt.qos)
            else:
                self._client.publish(channel.topic_out, b"".join(parts), qos=self._mqtt.qos)
            channel.published_seq = channel.state.next_seq - 1

    def _listen(self) -> None:
        netloc = self._options.netloc
        self.address = f"mqtt://{netloc.host}:{netloc.port}/{self._base}"
        self._broker_connect()
        if not self._ready_event.wait(self._mqtt.connect_timeout):
            why = self._broker_problem or "no answer"
            self._stop_carrier()
            if self._tcp_accepted:
                raise RemoteProtocolError(
                    f"no MQTT session with the broker at {netloc.host}:{netloc.port} within "
                    f"{self._mqtt.connect_timeout:g} s: {why}")
            raise BrokerUnavailable(
                f"no MQTT broker at {netloc.host}:{netloc.port} within "
                f"{self._mqtt.connect_timeout:g} s ({why}); start one with "
                f"netq.lab.brokers.local_broker() (it runs mosquitto: `sudo apt-get install "
                f"-y mosquitto` on Debian/Ubuntu, `brew install mosquitto` on macOS)")

    def _start_connect(self) -> None:
        self.links.request_attempt()

    def _can_send(self, channel: Channel) -> bool:
        if channel.state.can_send():
            return True
        channel.wants_wake = True
        if channel.state.can_send():  # an ack landed between the check and the flag
            channel.wants_wake = False
            return True
        return False

    def _packet_limit(self, channel: Channel) -> int:
        limit = min(PACKET_SIZE, self._options.connection.max_size)
        broker = self._mqtt.max_packet_size or self._broker_max_packet \
            or self._learned_max_packet
        if broker:
            room = broker - HEADER_SIZE - len(channel.topic_out) - _MQTT_OVERHEAD
            limit = min(limit, max(room, 1024))
        return limit

    def _packet_header(self, channel: Channel, size: int) -> bytes:
        kind = _OPEN if not self._is_server and channel.state.next_seq == 1 else _DATA
        return channel.state.header(kind, size)

    def _close_channel(self, channel: Channel) -> None:
        self.links.end(channel, "closed", notify=not channel.peer_closed, tell_base=False)

    def _stop_listening(self) -> None:
        self.links.refuse_new()

    def _stop_carrier(self) -> None:
        if self._carrier_stopped:
            return
        self._carrier_stopped = True
        self._stopped = True
        self.links.refuse_new()
        if self._connected:
            self.presence.leave()
        paho_adapter.stop(self._client)

    # ================================================================== introspection

    def _target(self) -> str:
        """Client: where our server is looked for (the broker and the topics), for messages."""
        netloc = self._options.netloc
        return f"mqtt://{netloc.host}:{netloc.port}/{self._base}"

    def explain(self) -> str | None:
        """Client: why no link is up, in the transport's terms: no broker, a broker that
        refuses us or our protocol, or a broker with no live server on our topics."""
        if self._is_server:
            return None
        if self._connected:
            netloc = self._options.netloc
            return self.presence.explain(time.monotonic(), f"{netloc.host}:{netloc.port}",
                                         self._broker_ready_at)
        if self._broker_problem is not None:
            return self._broker_problem
        return f"no answer yet from {self._broker_name()}"

    @property
    def counters(self) -> dict[str, int]:
        """The link layer's counters (the channel table's) and the broker connection's."""
        links = self.links.counters
        return {"gaps": links["gaps"], "duplicates": links["duplicates"],
                "stale_packets": links["stale_packets"], "probes": links["probes"],
                "acks_sent": links["acks_sent"], "broker_connects": self._broker_connects,
                "broker_disconnects": self._broker_disconnects,
                "invalid_packets": links["invalid_packets"]}

    def link_statistics(self) -> dict:
        """Counters of the link layer (gaps = broker drops detected) and the send windows."""
        links, windows = self.links.statistics()
        return {**self.counters, "links": links, "windows": windows,
                "broker_max_packet": self._broker_max_packet,
                "learned_max_packet": self._learned_max_packet,
                "protocol": self._protocol_name(), "connected": self._connected}


def link_statistics(communicator) -> dict:
    """The MQTT link-layer counters of a ``Protocol.MQTT`` communicator."""
    carrier = getattr(communicator.loop, "carrier", None)
    if not isinstance(carrier, MQTTCarrier):
        raise TypeError("not an MQTT communicator")
    return carrier.link_statistics()
