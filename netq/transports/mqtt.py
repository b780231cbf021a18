"""Protocol.MQTT: netq links through an MQTT broker (paho-mqtt 2.x, ``CallbackAPIVersion.VERSION2``).

Server and clients are all clients of the broker (``CommunicatorOptions.netloc``). Topics, under
``<prefix>/<service>`` (``MQTTOptions.prefix``, default ``netq``; service ``netloc.path``,
default ``netq``)::

    <base>/c2s/<client-id>             client -> server link packets (server subscribes c2s/+)
    <base>/s2c/<client-id>             server -> client link packets
    <base>/status/<client-id>/<inst>   retained "online"; Last Will: empty retained (= offline)
    <base>/status/server/<inst>        retained "online <server-id>"; Last Will: empty retained

``<inst>`` names one broker connection (8 hex digits, new on every reconnect), so a late Last
Will of an old connection never ends a newer one; an empty retained payload both announces
"offline" and deletes the retained status, so the broker does not accumulate dead peers.

Every publish is a link packet (``mqtt_link``): a 28-byte header (epoch, seq, ack) and a slice
of the link's netq byte stream, at most min(``max_size``, 1 MiB, the broker's maximum packet
size minus our overhead) long. A link is one epoch chosen by the client; the receiver checks
sequence numbers, so a packet the broker dropped ends the link (reported as a gap) and netq's
session resume resends whatever was not acknowledged. The sender keeps at most a window of
packets and bytes in the broker per link, so broker memory stays bounded and drops stay rare.

Threads: paho's network thread (``loop_start``) only parses link headers and hands bodies to the
base class, which feeds them to the engine on the I/O thread; ``_send_packet`` (I/O thread)
calls ``publish``, which queues for paho's thread. A requested link ack goes out after the I/O
thread's next pass, on a netq packet if that pass produced one, else alone; a lone netq
ACK/CREDIT waits up to 1 ms for a reply to share its publish. Probes and CLOSE answers to stale
epochs are published from paho's thread (its ``loop_misc`` is the probe timer). paho's thread
is stopped and joined in ``_stop_carrier``.

Security: with ``SecurityOptions.certificate`` the broker connection uses TLS and trusts that
certificate or CA (on both server and clients: both are broker clients); ``client_certificate``
+ ``key`` present a certificate to a broker that requires one. ``authkey`` works as on every
transport, and the server also refuses a HELLO whose id is not the client id of the topic the
link's packets came from (no impersonation through someone else's topics). The broker itself
is trusted: anyone allowed to publish on our topics can disturb links (use broker ACLs).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
import uuid

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..exceptions import BrokerUnavailable, ConnectionLost
from ..brokers import INSTALL_HINT
from . import mqtt_link
from .mqtt_link import HEADER_SIZE, Kind, LinkState, Verdict, Window, parse_header
from .packets import PACKET_SIZE, PacketTransport

__all__ = ("MQTTTransport", "link_statistics")

LOGGER = logging.getLogger("netq")
_SERVER = "server"
_PROBE_AFTER = 0.5  # seconds without ack progress after which a sender probes its tail
_TICK = 0.25  # seconds between probe checks on paho's thread (it passes at least every 1 s)
_MAX_PENDING_EPOCHS = 4  # links per client id not yet authenticated (bounds OPEN floods)
_CLOSE_REPLY_INTERVAL = 0.5  # seconds between CLOSE answers to one stale epoch
_MQTT_OVERHEAD = 64  # fixed header, packet id, property lengths: a generous upper bound
_OPEN, _DATA = int(Kind.OPEN), int(Kind.DATA)
_ZERO_COPY_FROM = 64 * 1024  # publishes at least this large skip paho's copying decoder
_ACK_DELAY = 0.001  # seconds a lone netq ACK/CREDIT waits for a reply to share its publish


class _Channel:
    """One link's carrier state: which client and epoch, where its packets go, its seq state."""

    __slots__ = ("cid", "epoch", "state", "topic_out", "link", "closed", "peer_closed",
                 "wants_wake", "published_seq", "last_probe", "servers", "ack_due",
                 "hold_until")

    def __init__(self, cid: str, epoch: int, state: LinkState, topic_out: str) -> None:
        self.cid = cid
        self.epoch = epoch
        self.state = state
        self.topic_out = topic_out
        self.link = None
        self.closed = False
        self.peer_closed = False
        self.wants_wake = False
        self.published_seq = 0  # highest seq handed to paho (probes never name more)
        self.last_probe = 0.0
        self.servers: frozenset = frozenset()  # client: server instances online at open
        self.ack_due = False  # the peer asked for an ack that no packet has carried yet
        self.hold_until = 0.0  # a lone netq ACK/CREDIT waits until then for company

    @property
    def instance(self) -> int:
        return self.epoch >> 32


class _Paho(paho.Client):
    """paho's client with a timer (``loop_misc`` runs on every pass of paho's thread) and
    zero-copy paths for large publishes, out (``_packet_queue``) and in (``_handle_publish``).

    paho 2.2 decodes a PUBLISH with ``struct.unpack`` into fresh ``bytes`` three or four times
    (topic split, packet id, properties), each a copy of the whole payload: for 1 MiB packets
    that is most of its receive cost. For a large QoS 0/1 publish without properties we read
    the few header fields from a memoryview and hand the payload on as a view of paho's own
    packet buffer (paho allocates a new one per packet, so the view stays valid). Anything else
    goes through paho's own ``_handle_publish``. (Private paho API: pinned paho-mqtt==2.2.0;
    a paho without it simply takes the normal path.)
    """

    tick = None

    def loop_misc(self):
        result = super().loop_misc()
        tick = self.tick
        if tick is not None:
            tick()
        return result

    def _packet_queue(self, command, packet, mid, qos, info=None):
        # paho writes a queued packet as ``packet[pos:]``: a full copy of a bytearray before
        # every send call (twice or more for a 1 MiB packet that the socket takes in parts).
        # A memoryview slices for free, and a packet is never touched again once queued.
        if len(packet) >= _ZERO_COPY_FROM:
            packet = memoryview(packet)
        return super()._packet_queue(command, packet, mid, qos, info)

    def _handle_publish(self):
        incoming = self._in_packet
        packet = incoming["packet"]
        command = incoming["command"]
        qos = (command & 0x06) >> 1
        if len(packet) < _ZERO_COPY_FROM or qos == 2 or not isinstance(packet, bytearray):
            return super()._handle_publish()
        view = memoryview(packet)
        topic_length = int.from_bytes(view[:2], "big")
        position = 2 + topic_length
        topic = bytes(view[2:position])
        mid = 0
        if qos:
            mid = int.from_bytes(view[position:position + 2], "big")
            position += 2
        properties = None
        if self._protocol == paho.MQTTv5:
            if view[position] != 0:  # properties present: paho's parser handles them
                view.release()
                return super()._handle_publish()
            properties = Properties(PacketTypes.PUBLISH)
            position += 1
        message = paho.MQTTMessage(mid=mid, topic=topic)
        message.dup = bool(command & 0x08)
        message.qos = qos
        message.retain = bool(command & 0x01)
        message.properties = properties
        message.payload = view[position:]
        message.timestamp = paho.time_func()
        self._handle_on_message(message)
        if qos == 1 and not self._manual_ack:
            return self._send_puback(mid)
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS


def _instance() -> int:
    return int.from_bytes(os.urandom(4), "big") or 1


class MQTTTransport(PacketTransport):
    """The broker-carried transport; see the module docstring."""

    family_name = "mqtt"

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
                             "(mosquitto require_certificate/cafile), not by SecurityOptions.client_ca")
        self._base = f"{mqtt.prefix}/{service.strip('/')}"
        self._c2s = f"{self._base}/c2s/"
        self._s2c = f"{self._base}/s2c/"
        self._status = f"{self._base}/status/"
        self._is_server = engine.purpose.value == "server"
        self._my_cid = str(options.id)
        self._lock = threading.Lock()  # channels, readiness, pending attempts
        self._channels: dict[tuple[str, int], _Channel] = {}  # server: (cid, epoch) -> channel
        self._current: _Channel | None = None  # client: the live channel
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
        self._instance = _instance()
        self._broker_max_packet: int | None = None
        self._close_replies: dict[tuple[str, int], float] = {}
        self.counters = {"gaps": 0, "duplicates": 0, "stale_packets": 0, "probes": 0,
                         "acks_sent": 0, "refused_ids": 0, "broker_connects": 0,
                         "broker_disconnects": 0, "invalid_packets": 0}
        self._client = self._make_client(options)
        super().__init__(engine)
        if not self._is_server:
            self._start_client()

    # ================================================================== paho set-up

    def _make_client(self, options) -> _Paho:
        mqtt = self._mqtt
        role = "s" if self._is_server else "c"
        client_id = f"netq-{role}-{str(options.id)[:8]}-{os.urandom(4).hex()}"
        if mqtt.protocol_version == 5:
            client = _Paho(CallbackAPIVersion.VERSION2, client_id=client_id,
                           protocol=paho.MQTTv5)
        else:
            client = _Paho(CallbackAPIVersion.VERSION2, client_id=client_id,
                           protocol=paho.MQTTv311, clean_session=True)
        client.tick = self._tick
        # Our link windows bound what is outstanding; paho must neither hold publishes back
        # (its inflight limit) nor refuse them (its queue limit).
        client.max_inflight_messages_set(65535)
        client.max_queued_messages_set(0)
        connection = options.connection
        # paho reconnects to the broker by itself, with our backoff (seconds; paho documents
        # ints and computes with floats).
        client.reconnect_delay_set(max(0.05, connection.reconnect_min),  # type: ignore[arg-type]
                                   max(0.05, connection.reconnect_max))  # type: ignore[arg-type]
        if mqtt.username is not None:
            client.username_pw_set(mqtt.username, mqtt.password)
        security = options.security
        if security is not None and security.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_verify_locations(os.fspath(security.certificate))
            if security.client_certificate is not None:
                context.load_cert_chain(os.fspath(security.client_certificate),
                                        os.fspath(security.key))
            client.tls_set_context(context)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_socket_open = self._on_socket_open
        self._set_will(client)
        return client

    def _status_topic(self) -> str:
        who = _SERVER if self._is_server else self._my_cid
        return f"{self._status}{who}/{self._instance:08x}"

    def _set_will(self, client) -> None:
        # An empty retained payload: "offline" to subscribers, and it deletes the retained
        # "online" so the broker keeps nothing for departed peers.
        client.will_set(self._status_topic(), b"", qos=1, retain=True)

    def _broker_connect(self) -> None:
        netloc = self._options.netloc
        kwargs = {"clean_start": True} if self._mqtt.protocol_version == 5 else {}
        self._client.connect_async(netloc.host, netloc.port, keepalive=self._mqtt.keepalive,
                                   **kwargs)
        self._client.loop_start()

    def _start_client(self) -> None:
        self._broker_connect()

    # ================================================================== paho callbacks
    # (paho's thread: only bookkeeping and hand-offs)

    @staticmethod
    def _on_socket_open(client, userdata, sock) -> None:
        try:  # small publishes (acks, requests) must not wait for Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            pass

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
            topics = [(f"{self._s2c}{self._my_cid}", qos), (f"{self._status}{_SERVER}/+", qos)]
        client.subscribe(topics)

    def _on_connect_fail(self, client, userdata) -> None:
        self._connect_error = "could not reach the broker"

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        if any(code.is_failure for code in reason_codes):
            self._connect_error = f"the broker refused our subscriptions: {reason_codes}"
            LOGGER.warning("netq mqtt: %s", self._connect_error)
            return
        payload = f"online {self.engine.id}".encode()
        client.publish(self._status_topic(), payload, qos=1, retain=True)
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
            channels = list(self._channels.values())
            if self._current is not None:
                channels.append(self._current)
        if was_connected:
            self.counters["broker_disconnects"] += 1
        if not self._stopped:
            # The next connection is a new instance with its own Last Will.
            self._instance = _instance()
            self._set_will(client)
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

    # ------------------------------------------------------------------ status

    def _on_status(self, rest: str, payload: bytes) -> None:
        who, _, instance_text = rest.partition("/")
        try:
            instance = int(instance_text, 16)
        except ValueError:
            return
        online = bool(payload)
        if self._is_server:
            if online or who == _SERVER:
                return
            with self._lock:
                leaving = [c for c in self._channels.values()
                           if c.cid == who and c.instance == instance]
            for channel in leaving:
                self._end(channel, ConnectionLost(self._peer(channel),
                                                  "the client left (its MQTT status went offline)"),
                          notify=False)
            return
        if who != _SERVER:
            return
        if online:
            text = payload.decode(errors="replace").split()
            with self._lock:
                self._servers[instance] = text[1] if len(text) > 1 else ""
            self._maybe_open()
            return
        with self._lock:
            self._servers.pop(instance, None)
            channel = self._current
        if channel is not None and instance in channel.servers:
            self._end(channel, ConnectionLost(self._peer(channel),
                                              "the server left (its MQTT status went offline)"),
                      notify=False)

    # ------------------------------------------------------------------ packets

    def _server_packet(self, cid: str, header, payload: bytes) -> None:
        kind, flags, epoch, seq, ack = header
        key = (cid, epoch)
        channel = self._channels.get(key)
        if channel is None:
            if kind == _OPEN and seq == 1 and not self._refusing and not self._stopped:
                channel = self._open_server_channel(cid, epoch)
            if channel is None:
                self.counters["stale_packets"] += 1
                if kind != int(Kind.CLOSE):
                    self._reply_close(cid, epoch)
                return
        self._judge(channel, kind, flags, seq, ack, payload)

    def _open_server_channel(self, cid: str, epoch: int) -> _Channel | None:
        try:
            if str(uuid.UUID(cid)) != cid:
                return None
        except ValueError:
            return None
        with self._lock:
            if sum(1 for c in self._channels.values() if c.cid == cid) >= _MAX_PENDING_EPOCHS:
                # A flood of OPENs for one id: the older links of that id must finish first.
                return None
            window = self._windows.get(cid)
            if window is None:
                window = self._windows[cid] = self._new_window()
            channel = _Channel(cid, epoch, LinkState(epoch, window), f"{self._s2c}{cid}")
            self._channels[(cid, epoch)] = channel
        channel.link = self.channel_opened(channel, f"mqtt:{cid}")
        return channel

    def _client_packet(self, header, payload: bytes) -> None:
        kind, flags, epoch, seq, ack = header
        channel = self._current
        if channel is None or channel.epoch != epoch or channel.closed:
            self.counters["stale_packets"] += 1
            return
        self._judge(channel, kind, flags, seq, ack, payload)

    def _judge(self, channel: _Channel, kind, flags, seq, ack, payload: bytes) -> None:
        if channel.closed:
            return
        state = channel.state
        verdict, ack_now = state.receive(kind, flags, seq, ack, time.monotonic())
        if verdict is Verdict.DELIVER:
            if len(payload) > HEADER_SIZE:
                self.packet_received(channel.link, memoryview(payload)[HEADER_SIZE:])
        elif verdict is Verdict.DUPLICATE:
            self.counters["duplicates"] += 1
        elif verdict is Verdict.GAP:
            first, last = state.gap_range
            self.counters["gaps"] += 1
            LOGGER.warning("netq mqtt %s: gap on link %s epoch %x: packets %d..%d never "
                           "arrived (the broker dropped them); the link restarts and netq "
                           "resends from the last acknowledged message",
                           self.engine.purpose.value, channel.cid, channel.epoch, first, last)
            self._end(channel, ConnectionLost(
                self._peer(channel), f"MQTT broker dropped link packets {first}..{last}"),
                notify=True, gap=True)
            return
        elif verdict is Verdict.CLOSED:
            channel.peer_closed = True
            if flags & mqtt_link.GAP:
                state.window.lost()
            reason = bytes(payload[HEADER_SIZE:]).decode(errors="replace") or "closed"
            self._end(channel, ConnectionLost(self._peer(channel), f"peer ended the link: {reason}"),
                      notify=False)
            return
        elif verdict is Verdict.INVALID:
            self.counters["invalid_packets"] += 1
            self._end(channel, ConnectionLost(self._peer(channel), "invalid link acknowledgement"),
                      notify=True)
            return
        if ack_now and not channel.closed:
            # Asked for an ack: let the I/O thread send it after its next pass, so that it
            # rides on the netq frames that pass produces (ACK/CREDIT) when there are any.
            channel.ack_due = True
            self._acks_due = True
            self.wake()
        if channel.wants_wake and state.can_send():
            channel.wants_wake = False
            self.wake()

    def _reply_close(self, cid: str, epoch: int) -> None:
        """A packet for an epoch we do not have: tell its sender (rate-limited) to move on."""
        now = time.monotonic()
        key = (cid, epoch)
        last = self._close_replies.get(key)
        if last is not None and now - last < _CLOSE_REPLY_INTERVAL:
            return
        if len(self._close_replies) > 1024:
            self._close_replies.clear()
        self._close_replies[key] = now
        header = mqtt_link.encode(int(Kind.CLOSE), 0, epoch, 0, 0)
        self._client.publish(f"{self._s2c}{cid}", header + b"unknown link", qos=self._mqtt.qos)

    def _end(self, channel: _Channel, error, *, notify: bool, gap: bool = False,
             tell_base: bool = True) -> None:
        """The link is over (any thread): tell the peer if asked, then the base (unless the
        base is the one ending it)."""
        with self._lock:
            if channel.closed:
                return
            channel.closed = True
            if self._channels.get((channel.cid, channel.epoch)) is channel:
                del self._channels[(channel.cid, channel.epoch)]
            if self._current is channel:
                self._current = None
        if notify and self._connected:
            self._client.publish(channel.topic_out,
                                 channel.state.close_header(gap) + str(error).encode()[:200],
                                 qos=self._mqtt.qos)
        if tell_base and channel.link is not None:
            self.channel_closed(channel.link, error)

    def _peer(self, channel: _Channel):
        link = channel.link
        return link.peer_id if link is not None else None

    # ------------------------------------------------------------------ timer (paho thread)

    def _tick(self) -> None:
        """Probe links whose acks stopped while packets are outstanding (a lost tail)."""
        now = time.monotonic()
        if now - self._last_tick < _TICK:
            return
        self._last_tick = now
        with self._lock:
            channels = list(self._channels.values())
            if self._current is not None:
                channels.append(self._current)
        for channel in channels:
            state = channel.state
            if channel.closed or not state.outstanding or not self._connected:
                continue
            if now - state.last_progress < _PROBE_AFTER or now - channel.last_probe < _PROBE_AFTER:
                continue
            if channel.published_seq <= state.peer_acked:
                continue
            channel.last_probe = now
            self.counters["probes"] += 1
            ack = state.received
            state.ack_sent = ack
            probe = mqtt_link.encode(int(Kind.ACK), mqtt_link.ACK_REQUEST, channel.epoch,
                                     channel.published_seq, ack)
            # Same QoS as data: paho and the broker keep one QoS level in order, so the probe
            # never overtakes the packet it names.
            self._client.publish(channel.topic_out, probe, qos=self._mqtt.qos)

    # ================================================================== client attempts

    def _new_window(self) -> Window:
        mqtt = self._mqtt
        return Window(mqtt.window_packets, mqtt.window_packets_max, mqtt.window_bytes)

    def _maybe_open(self) -> None:
        """Client: complete a pending connection attempt once the broker and a server are up."""
        if self._is_server:
            return
        with self._lock:
            if not (self._attempt_pending and self._connected and self._servers) or self._stopped:
                return
            self._attempt_pending = False
            self._attempts = (self._attempts + 1) & 0xFFFFFFFF
            epoch = (self._instance << 32) | self._attempts
            window = self._windows.get(_SERVER)
            if window is None:
                window = self._windows[_SERVER] = self._new_window()
            channel = _Channel(self._my_cid, epoch, LinkState(epoch, window),
                               f"{self._c2s}{self._my_cid}")
            channel.servers = frozenset(self._servers)
            self._current = channel
        netloc = self._options.netloc
        channel.link = self.channel_opened(channel, f"mqtt://{netloc.host}:{netloc.port}/{self._base}")

    # ================================================================== PacketTransport hooks

    def _wait(self, timeout: float) -> None:
        held = self._held
        if held:
            due = min(link.channel.hold_until for link in held)
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
                return
            if now < channel.hold_until:
                return
        if channel.hold_until:
            channel.hold_until = 0.0
            self._held.discard(link)
        super().write_now(link)

    def _flush_acks(self) -> None:
        """I/O thread, after a pass: ack what the peer asked for, unless a packet already did."""
        self._acks_due = False
        with self._lock:
            channels = list(self._channels.values())
            if self._current is not None:
                channels.append(self._current)
        for channel in channels:
            if not channel.ack_due:
                continue
            channel.ack_due = False
            state = channel.state
            if channel.closed or state.ack_sent >= state.received:
                continue
            self.counters["acks_sent"] += 1
            self._client.publish(channel.topic_out, state.ack_header(), qos=0)

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

    def _send_packet(self, link, payload: bytes) -> None:
        channel = link.channel
        if channel.closed:
            return
        self._client.publish(channel.topic_out, payload, qos=self._mqtt.qos)
        channel.published_seq = channel.state.next_seq - 1

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
            # Leaving cleanly: clear our retained status (peers see "offline" at once).
            client.publish(self._status_topic(), b"", qos=1, retain=True)
        client.disconnect()
        client.loop_stop()
        client._reset_sockets()  # paho keeps its wake-up socketpair open after loop_stop

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
    transport = communicator._transport
    if not isinstance(transport, MQTTTransport):
        raise TypeError("not an MQTT communicator")
    return transport.link_statistics()
