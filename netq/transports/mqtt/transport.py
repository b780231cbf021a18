"""The MQTT transport itself: :class:`MQTTTransport`, the packet-transport hooks around the
channel table, the presence protocol and paho.

What it holds (the rest of the subpackage, see :mod:`netq.transports.mqtt`, is split out):

- construction: topics from ``MQTTOptions.prefix`` and the service (``netloc.path``), the
  transport's shared state, the paho client (:func:`~.paho_adapter.new_client` plus our
  callbacks, timer and Last Will);
- the broker connection: ``connect_async`` + paho's thread (``loop_start``), and paho's
  callbacks: CONNACK (read the broker's maximum packet size, subscribe), SUBACK (announce
  ourselves, ready), disconnect (every link ends, a new instance), message (status or link
  packet: hand it to the presence or channel part);
- delayed ACKs: a publish carrying nothing but netq ACK/CREDIT frames
  (:meth:`netq.protocol.Connection.output_is_only_acks`) waits up to ``_ACK_DELAY`` for a
  reply to ride with it (``write_now``, ``_wait``); each publish is a broker round of its own,
  so a request/response pair costs two publishes instead of four;
- cutting the output into packets (``_write_packets``: the packet base's loop, but a large
  packet goes to paho as a list of buffers, never joined) and packet size negotiation
  (``_packet_limit``): at most min(``max_size``, 1 MiB, the broker's maximum packet size minus
  the link header, the topic and ``_MQTT_OVERHEAD``);
- the other hooks: listen (wait for the broker, or :class:`~netq.BrokerUnavailable`), start a
  client attempt, window check, link header, publish, close, authorize (the HELLO's id must be
  the topic's client id), stop (clear our status, stop paho);
- :func:`link_statistics`, the link-layer counters.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import paho.mqtt.client as paho

from ...brokers import INSTALL_HINT
from ...exceptions import BrokerUnavailable, ConnectionLost
from ..packets import PACKET_SIZE, PacketTransport, next_packet
from . import paho_adapter
from .channels import Channel, ChannelTableMixin
from .link import HEADER_SIZE, Kind, Window, parse_header
from .paho_adapter import ZERO_COPY_FROM, PahoClient, new_client
from .presence import SERVER, PresenceMixin, new_instance

__all__ = ("MQTTTransport", "link_statistics")

LOGGER = logging.getLogger("netq")
_MQTT_OVERHEAD = 64  # fixed header, packet id, property lengths: a generous upper bound
_OPEN, _DATA = int(Kind.OPEN), int(Kind.DATA)
_ACK_DELAY = 0.001  # seconds a lone netq ACK/CREDIT waits for a reply to share its publish


class MQTTTransport(PresenceMixin, ChannelTableMixin, PacketTransport):
    """The broker-carried transport; see :mod:`netq.transports.mqtt`."""

    family_name = "mqtt"
    # A lone put on an idle link is published by the calling thread (paho's publish is
    # thread-safe, and the packet goes out from that thread too, see PahoClient._write_direct):
    # one thread hop less per request than through the I/O thread.
    direct_writes = True

    def __init__(self, engine) -> None:
        options = engine.options
        self._mqtt = mqtt = options.mqtt
        netloc = options.netloc
        service = netloc.path or "netq"
        if any(c in service for c in "#+") or not service.strip("/"):
            raise ValueError(f"MQTT service name {service!r}: a topic without wildcards")
        security = options.security
        if security is not None and security.client_ca is not None:
            raise ValueError("MQTT: client certificates are checked by the broker "
                             "(mosquitto require_certificate/cafile), "
                             "not by SecurityOptions.client_ca")
        self._base = f"{mqtt.prefix}/{service.strip('/')}"
        self._c2s = f"{self._base}/c2s/"
        self._s2c = f"{self._base}/s2c/"
        self._status = f"{self._base}/status/"
        self._is_server = engine.purpose.value == "server"
        self._my_cid = str(options.id)
        self._lock = threading.Lock()  # channels, readiness, pending attempts
        self._channels: dict[tuple[str, int], Channel] = {}  # server: (cid, epoch) -> channel
        self._current: Channel | None = None  # client: the live channel
        self._windows: dict[str, Window] = {}  # per client id: survives links
        self._connected = False  # broker CONNACK ok and subscriptions granted
        self._connect_error: str | None = None
        self._ready_event = threading.Event()
        self._servers: dict[int, str] = {}  # client: server instance -> its id, online
        self._attempt_pending = False
        self._acks_due = False
        self._held: set = set()  # links whose lone ACK/CREDIT output waits (I/O thread)
        self._last_tick = 0.0
        self._refusing = False
        self._stopped = False
        self._carrier_stopped = False
        self._attempts = 0
        self._instance = new_instance()
        self._broker_max_packet: int | None = None
        self._close_replies: dict[tuple[str, int], float] = {}
        self.counters = {"gaps": 0, "duplicates": 0, "stale_packets": 0, "probes": 0,
                         "acks_sent": 0, "refused_ids": 0, "broker_connects": 0,
                         "broker_disconnects": 0, "invalid_packets": 0}
        self._client = self._make_client(options)
        super().__init__(engine)
        if not self._is_server:
            self._start_client()

    # ================================================================== broker connection

    def _make_client(self, options) -> PahoClient:
        role = "s" if self._is_server else "c"
        client_id = f"netq-{role}-{str(options.id)[:8]}-{os.urandom(4).hex()}"
        client = new_client(options, client_id)
        client.tick = self._tick
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        self._set_will(client)
        return client

    def _broker_connect(self) -> None:
        netloc = self._options.netloc
        # MQTT 5: a fresh session on every connect; 3.1.1 ignores it (paho's default).
        clean_start: paho.CleanStartOption = (
            True if self._mqtt.protocol_version == 5 else paho.MQTT_CLEAN_START_FIRST_ONLY)
        self._client.connect_async(netloc.host, netloc.port, keepalive=self._mqtt.keepalive,
                                   clean_start=clean_start)
        self._client.loop_start()

    def _start_client(self) -> None:
        self._broker_connect()

    # ------------------------------------------------------------------ paho callbacks
    # (paho's thread: only bookkeeping and hand-offs)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._connect_error = f"the broker refused us: {reason_code}"
            LOGGER.warning("netq mqtt: %s", self._connect_error)
            return
        self.counters["broker_connects"] += 1
        limit = None
        if properties is not None and hasattr(properties, "MaximumPacketSize"):
            limit = properties.MaximumPacketSize
        self._broker_max_packet = limit
        qos = self._mqtt.qos
        if self._is_server:
            topics = [(f"{self._c2s}+", qos), (f"{self._status}+/+", qos)]
        else:
            topics = [(f"{self._s2c}{self._my_cid}", qos), (f"{self._status}{SERVER}/+", qos)]
        client.subscribe(topics)

    def _on_connect_fail(self, client, userdata) -> None:
        self._connect_error = "could not reach the broker"

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        if any(code.is_failure for code in reason_codes):
            self._connect_error = f"the broker refused our subscriptions: {reason_codes}"
            LOGGER.warning("netq mqtt: %s", self._connect_error)
            return
        self._announce(client)
        with self._lock:
            self._connected = True
            self._connect_error = None
        self._ready_event.set()
        self._maybe_open()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._lock:
            was_connected = self._connected
            self._connected = False
            self._servers.clear()
            channels = self._all_channels()
        if was_connected:
            self.counters["broker_disconnects"] += 1
        if not self._stopped:
            self._next_instance(client)
            if was_connected:
                LOGGER.info("netq mqtt %s: broker connection lost (%s); reconnecting",
                            self.engine.purpose.value, reason_code)
        for channel in channels:
            self._end(channel, ConnectionLost(self._peer(channel),
                                              f"MQTT broker connection lost ({reason_code})"),
                      notify=False)

    def _on_message(self, client, userdata, message) -> None:
        topic = message.topic
        payload = message.payload
        if topic.startswith(self._status):
            self._on_status(topic[len(self._status):], payload)
            return
        header = parse_header(payload)
        if header is None:
            self.counters["invalid_packets"] += 1
            return
        if self._is_server:
            if not topic.startswith(self._c2s):
                return
            self._server_packet(topic[len(self._c2s):], header, payload)
        else:
            self._client_packet(header, payload)

    # ================================================================== PacketTransport hooks

    def _wait(self, timeout: float) -> None:
        held = self._held
        if held:
            # A snapshot: a user thread writing directly may add or remove a link meanwhile.
            due = min([link.channel.hold_until for link in tuple(held)])
            timeout = min(timeout, max(0.0, due - time.monotonic()))
        super()._wait(timeout)  # writes every link with output; held ones write once due
        if self._acks_due:
            self._flush_acks()

    def write_now(self, link) -> None:
        """Publish the link's output, except a lone ACK/CREDIT: that waits up to
        ``_ACK_DELAY`` for a reply to ride with it (each publish is a broker round of its own;
        a request/response pair costs two publishes instead of four)."""
        channel = link.channel
        if not link.closing and link.conn.output_is_only_acks(credit=True):
            now = time.monotonic()
            if channel.hold_until == 0.0:
                channel.hold_until = now + _ACK_DELAY
                self._held.add(link)
                if not self.on_io_thread:
                    self.wake()  # the I/O thread's wait must end by the new deadline
                return
            if now < channel.hold_until:
                return
        if channel.hold_until:
            channel.hold_until = 0.0
            self._held.discard(link)
        self._write_packets(link)

    def _release_held(self, link) -> None:
        """Publish a link's held ACK/CREDIT output now (link lock held)."""
        if link.channel.hold_until:
            link.channel.hold_until = 0.0
            self._held.discard(link)
            self._write_packets(link)

    def _write_packets(self, link) -> None:
        """The packet base's cutting loop (``PacketTransport.write_now``), without its join: a
        packet of at least ``ZERO_COPY_FROM`` bytes goes to paho as its list of buffers (link
        header + slices of the link's output), written with one ``sendmsg``; smaller ones are
        joined (one buffer is cheaper than an iovec list when small)."""
        if link.dropped:
            return
        conn = link.conn
        channel = link.channel
        while conn.has_output and self._can_send(link):
            parts, size = next_packet(conn, self._packet_limit(link))
            parts.insert(0, self._packet_header(link, size))
            if not channel.closed:
                if size >= ZERO_COPY_FROM:
                    self._client.publish_parts(channel.topic_out, parts, HEADER_SIZE + size,
                                               self._mqtt.qos)
                else:
                    self._client.publish(channel.topic_out, b"".join(parts), qos=self._mqtt.qos)
                channel.published_seq = channel.state.next_seq - 1
            conn.sent(size)
        link.write_blocked = conn.has_output

    def _listen(self) -> None:
        netloc = self._options.netloc
        self.address = f"mqtt://{netloc.host}:{netloc.port}/{self._base}"
        self._broker_connect()
        if not self._ready_event.wait(self._mqtt.connect_timeout):
            why = self._connect_error or "no answer"
            self._stop_carrier()
            raise BrokerUnavailable(
                f"no MQTT broker at {netloc.host}:{netloc.port} within "
                f"{self._mqtt.connect_timeout:g} s ({why}); start one with "
                f"netq.brokers.local_broker(), or {INSTALL_HINT}")

    def _start_connect(self) -> None:
        with self._lock:
            self._attempt_pending = True
        self._maybe_open()

    def _can_send(self, link) -> bool:
        channel = link.channel
        if channel.state.can_send():
            return True
        channel.wants_wake = True
        if channel.state.can_send():  # an ack landed between the check and the flag
            channel.wants_wake = False
            return True
        return False

    def _packet_limit(self, link) -> int:
        limit = min(PACKET_SIZE, self.engine.options.connection.max_size)
        broker = self._mqtt.max_packet_size or self._broker_max_packet
        if broker:
            room = broker - HEADER_SIZE - len(link.channel.topic_out) - _MQTT_OVERHEAD
            limit = min(limit, max(room, 1024))
        return limit

    def _packet_header(self, link, size: int) -> bytes:
        channel = link.channel
        kind = _OPEN if not self._is_server and channel.state.next_seq == 1 else _DATA
        return channel.state.header(kind, size)

    def _close_channel(self, link) -> None:
        # A lone ACK held back on this link will never be written: forget its deadline, or
        # _wait() keeps waking for it (at once, once it has passed) for ever.
        self._held.discard(link)
        channel = link.channel
        self._end(channel, "closed", notify=not channel.peer_closed, tell_base=False)

    def _authorize(self, link, peer_id) -> bool:
        if not self._is_server:
            return True
        if str(peer_id) == link.channel.cid:
            return True
        self.counters["refused_ids"] += 1
        LOGGER.warning("netq mqtt: refused a link on the topic of client %s whose HELLO claims "
                       "id %s", link.channel.cid, peer_id)
        return False

    def _stop_listening(self) -> None:
        self._refusing = True

    def _stop_carrier(self) -> None:
        if self._carrier_stopped:
            return
        self._carrier_stopped = True
        self._stopped = True
        client = self._client
        if self._connected:
            self._announce_leaving(client)
        paho_adapter.stop(client)

    # ================================================================== introspection

    def link_statistics(self) -> dict:
        """Counters of the link layer (gaps = broker drops detected) and the send windows."""
        with self._lock:
            windows = {cid: (w.packets, w.gaps) for cid, w in self._windows.items()}
            links = len(self._channels) + (self._current is not None)
        return {**self.counters, "links": links, "windows": windows,
                "broker_max_packet": self._broker_max_packet, "connected": self._connected}


def link_statistics(communicator) -> dict:
    """The MQTT link-layer counters of a ``Protocol.MQTT`` communicator."""
    transport = communicator.transport
    if not isinstance(transport, MQTTTransport):
        raise TypeError("not an MQTT communicator")
    return transport.link_statistics()
