"""The paho-mqtt adaptation: every use of paho's private API, and why paho is pinned.

netq's MQTT extra pins ``paho-mqtt==2.2.0`` exactly, because of this module. :class:`PahoClient`
overrides private methods of ``paho.mqtt.client.Client``: sending (``_send_publish``,
``_packet_queue``, ``_packet_write``, ``_sock_send``, ``_sock_close``), receiving
(``_packet_read``, ``_handle_publish``, ``_handle_pubackcomp``), and :meth:`PahoClient.
publish_parts` repeats ``publish`` for a list of buffers. Inside them it uses private
attributes and helpers (``_in_packet``, ``_out_packet``, ``_out_messages``,
``_out_message_mutex``, ``_inflight_messages``, ``_mid_generate``, ``_pack_remaining_length``,
``_packet_handle``, ``_do_on_publish``, ``_handle_on_message``, ``_send_puback``, ``_sock``,
``_sockpairW``, ``_thread``, ``_state``, ``_protocol``, ``_manual_ack``, ``_msgtime_mutex``,
``_last_msg_out``, ``_last_bytes_received``, ``_call_socket_register_write``); :func:`stop` calls
``_reset_sockets``; :func:`use_mqtt311` sets ``_protocol`` and ``_clean_session`` (the fallback
from MQTT 5), :func:`drop_connection` calls ``_sock_close`` and :func:`forget_publishes`
empties ``_out_messages``. None of these is paho's public contract: before moving the pin,
check them against the new paho (``tests/transports/test_mqtt.py`` and the conformance suite
exercise every path). ``_reset_sockets`` has no public equivalent (without it paho's wake-up
socketpair stays open after ``loop_stop``).

Everything else here is public paho API: :func:`new_client` builds the client from netq's
options (MQTT 5 or 3.1.1, no paho-side flow control, reconnect backoff, credentials, TLS) and
:func:`on_socket_open` turns Nagle off on the broker connection.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, _ConnectionState
from paho.mqtt.exception import MalformedPacket
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ..._buffers import ReceivePool
from ...protocol.sending import Buffer

if TYPE_CHECKING:
    from ...options import CommunicatorOptions

__all__ = ("Gather", "PahoClient", "new_client", "on_socket_open", "stop", "ZERO_COPY_FROM",
           "use_mqtt311", "drop_connection", "forget_publishes", "speaks_mqtt5")

ZERO_COPY_FROM = 64 * 1024  # packets at least this large skip paho's copying paths
_IOV_MAX = 1024  # buffers per sendmsg (Linux UIO_MAXIOV); the rest goes in the next call
_GATHER_WRITES = hasattr(socket.socket, "sendmsg")  # Windows has no sendmsg
# What a short PUBACK means, for paho's on_publish callback (netq sets none): never changed.
_PUBACK_SUCCESS = ReasonCode(PacketTypes.PUBACK)
_DIRECT_COMMANDS = (paho.PUBLISH, paho.PUBACK)  # packets another thread may write itself
_CONNECTED = _ConnectionState.MQTT_CS_CONNECTED
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)


class Gather:
    """A publish's payload (or a queued packet) as a list of buffers, written with one
    scatter-gather ``sendmsg``: a large packet is never joined into one ``bytes``, neither by
    netq (link header + slices of its byte stream) nor by paho (MQTT header + payload).

    paho slices a queued packet as ``packet[pos:]`` after a partial write; that gives the
    ``Gather`` of what is left. The buffers must not change until written: netq hands over only
    sealed output buffers and the user's message buffers, which it holds until the peer has
    acknowledged them (after this packet was written).
    """

    __slots__ = ("buffers", "size")

    def __init__(self, buffers: list[Buffer], size: int) -> None:
        self.buffers = buffers
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice) -> Gather:
        skip = key.start or 0
        buffers = self.buffers
        index = 0
        while skip and skip >= len(buffers[index]):
            skip -= len(buffers[index])
            index += 1
        rest = buffers[index:]
        if skip:
            rest[0] = memoryview(rest[0])[skip:]
        return Gather(rest, self.size - (key.start or 0))


class PahoClient(paho.Client):
    """paho's client with a timer (``loop_misc`` runs on every pass of paho's thread) and
    zero-copy paths for large publishes, out (:meth:`publish_parts`, ``_send_publish``,
    ``_sock_send``) and in (``_packet_read``, ``_handle_publish``).

    Out: a large publish is a :class:`Gather` of paho's header and netq's buffers, written with
    ``sendmsg`` (paho would copy the payload into one ``bytearray`` with the header, and netq
    would have joined it before that). In: paho reads a packet's body in pieces and appends
    each to a growing ``bytearray`` (copies and reallocations); a large body is read with
    ``recv_into`` straight into one buffer of its final size instead. Then paho 2.2 decodes a
    PUBLISH with ``struct.unpack`` into fresh ``bytes`` three or four times (topic split, packet
    id, properties), each a copy of the whole payload. For a large QoS 0/1 publish without
    properties we read the few header fields from a memoryview and hand the payload on as a
    view of that buffer (a new one per packet, so the view stays valid). Anything else goes
    through paho's own code.
    """

    tick: Callable[[], None] | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._large_buffers = ReceivePool()  # large packet bodies (paho's thread only)
        # Whoever writes the socket holds it: paho's thread, or another thread that writes
        # directly (_write_direct); re-entrant for paho's thread (a callback that publishes).
        self._write_lock = threading.RLock()

    def loop_misc(self):
        result = super().loop_misc()
        tick = self.tick
        if tick is not None:
            tick()
        return result

    # ------------------------------------------------------------------ sending

    def publish_parts(self, topic: str, buffers: list[Buffer], size: int,
                      qos: int) -> paho.MQTTErrorCode:
        """``publish(topic, b"".join(buffers), qos)`` without the join (QoS 0 or 1): paho's
        ``publish`` with a :class:`Gather` payload, which our ``_send_publish`` writes as it is.
        paho keeps it (as ``publish`` keeps a payload) to resend it after a reconnect."""
        topic_bytes = topic.encode()
        payload = Gather(buffers, size)
        mid = self._mid_generate()
        if qos == 0:
            info = paho.MQTTMessageInfo(mid)
            return self._send_publish(mid, topic_bytes, payload, 0, False, False, info, None)
        message = paho.MQTTMessage(mid, topic_bytes)
        message.timestamp = paho.time_func()
        message.payload = payload  # type: ignore[assignment]  # paho: bytes only
        message.qos = qos
        with self._out_message_mutex:
            # Our link windows bound what is outstanding (new_client lifts paho's limits).
            self._out_messages[mid] = message
            self._inflight_messages += 1
            message.state = paho.mqtt_ms_wait_for_puback
            rc = self._send_publish(mid, topic_bytes, payload, qos, False, False, message.info,
                                    None)
            if rc == paho.MQTTErrorCode.MQTT_ERR_NO_CONN:
                self._inflight_messages -= 1
                message.state = paho.mqtt_ms_publish
            message.info.rc = rc
            return rc

    def _send_publish(self, mid, topic, payload=b"", qos=0, retain=False, dup=False, info=None,
                      properties=None):
        if type(payload) is not Gather:
            return super()._send_publish(mid, topic, payload, qos, retain, dup, info,
                                         properties)
        if self._sock is None:
            return paho.MQTTErrorCode.MQTT_ERR_NO_CONN
        header = bytearray()
        header.append(paho.PUBLISH | ((dup & 0x1) << 3) | (qos << 1) | retain)
        packed_properties = b""
        if self._protocol == paho.MQTTv5:
            packed_properties = b"\x00" if properties is None else properties.pack()
        remaining = 2 + len(topic) + (2 if qos else 0) + len(packed_properties) + payload.size
        self._pack_remaining_length(header, remaining)
        header += len(topic).to_bytes(2, "big")
        header += topic
        if qos:
            header += mid.to_bytes(2, "big")
        header += packed_properties
        packet = Gather([header, *payload.buffers], len(header) + payload.size)
        return self._packet_queue(paho.PUBLISH, packet, mid, qos, info)

    def _packet_queue(self, command, packet, mid, qos, info=None):
        # paho writes a queued packet as ``packet[pos:]``: a full copy of a bytearray before
        # every send call (twice or more for a 1 MiB packet that the socket takes in parts).
        # A memoryview slices for free, and a packet is never touched again once queued.
        if type(packet) is not Gather and len(packet) >= ZERO_COPY_FROM:
            packet = memoryview(packet)
        if (command & 0xF0) not in _DIRECT_COMMANDS or self._thread is None:
            return super()._packet_queue(command, packet, mid, qos, info)
        # Write it from the calling thread when the socket takes it, instead of waking paho's
        # thread for it: from netq's I/O thread or a user's put, a thread hop and two syscalls
        # less on the way out of every request; from paho's own thread (a PUBACK), a pass
        # through its select loop less.
        self._out_packet.append({"command": command, "mid": mid, "qos": qos, "pos": 0,
                                 "to_process": len(packet), "packet": packet, "info": info})
        wake = self._sockpairW
        if not self._write_direct() and wake is not None:
            try:
                wake.send(paho.sockpair_data)
            except BlockingIOError:  # a wake-up is pending already
                pass
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS

    def _write_direct(self) -> bool:
        """Write queued PUBLISH/PUBACK packets on the calling thread; True when nothing is left
        for paho's thread. Plain sockets only (an SSL object must not be used by two threads
        at once; paho's thread reads it), on a connected session, and never blocking: if
        paho's thread is writing, or the socket is full, paho's thread does the rest."""
        write_lock = self._write_lock
        if not write_lock.acquire(blocking=False):
            return False
        try:
            sock = self._sock
            if (sock is None or isinstance(sock, ssl.SSLSocket) or self.on_publish is not None
                    or self._state != _CONNECTED):
                return False
            queue = self._out_packet
            while queue:
                packet = queue[0]
                command = packet["command"] & 0xF0
                if command not in _DIRECT_COMMANDS:
                    return False
                try:
                    sent = self._sock_send(packet["packet"][packet["pos"]:])
                except OSError:  # full (BlockingIOError) or broken: paho's thread handles it
                    return False
                packet["to_process"] -= sent
                packet["pos"] += sent
                with self._msgtime_mutex:
                    self._last_msg_out = paho.time_func()
                if packet["to_process"]:
                    return False
                queue.popleft()
                info = packet["info"]
                if command == paho.PUBLISH and packet["qos"] == 0 and info is not None:
                    info._set_as_published()
            return True
        finally:
            write_lock.release()

    def _packet_write(self):
        with self._write_lock:
            return super()._packet_write()

    def _sock_close(self):
        # Never under a direct write in progress on another thread.
        with self._write_lock:
            return super()._sock_close()

    def _sock_send(self, buf) -> int:
        if type(buf) is not Gather:
            return super()._sock_send(buf)
        sock = cast(socket.socket | None, self._sock)  # paho: SocketLike, a real socket here
        if isinstance(sock, ssl.SSLSocket) or not _GATHER_WRITES:  # one buffer per call
            return super()._sock_send(buf.buffers[0])  # type: ignore[arg-type]  # any buffer
        if sock is None:
            raise ConnectionError("self._sock is None")
        try:
            return sock.sendmsg(buf.buffers[:_IOV_MAX])
        except BlockingIOError:
            self._call_socket_register_write()
            raise

    # ------------------------------------------------------------------ receiving

    def _packet_read(self):
        incoming = self._in_packet
        if not incoming["have_remaining"] or incoming["remaining_length"] < ZERO_COPY_FROM:
            # paho reads the fixed header, then (small packet) the body, or returns with the
            # header read and the body still to come: then the next call takes the path below.
            if not incoming["have_remaining"]:
                return self._read_fixed_header()
            return super()._packet_read()
        return self._read_large_body()

    def _read_fixed_header(self):
        # paho's _packet_read stops after the fixed header only if the body is not there yet;
        # we need it to stop there always, to read a large body our way: read the command and
        # the remaining length as paho does, then let paho or us read the body.
        incoming = self._in_packet
        sock_recv = self._sock_recv
        try:
            if incoming["command"] == 0:
                command = sock_recv(1)
                if not command:
                    return paho.MQTTErrorCode.MQTT_ERR_CONN_LOST
                incoming["command"] = command[0]
            while True:
                byte = sock_recv(1)
                if not byte:
                    return paho.MQTTErrorCode.MQTT_ERR_CONN_LOST
                value = byte[0]
                incoming["remaining_count"].append(value)
                if len(incoming["remaining_count"]) > 4:
                    return paho.MQTTErrorCode.MQTT_ERR_PROTOCOL
                incoming["remaining_length"] += (value & 127) * incoming["remaining_mult"]
                incoming["remaining_mult"] *= 128
                if not value & 128:
                    break
        except BlockingIOError:
            return paho.MQTTErrorCode.MQTT_ERR_AGAIN
        except OSError:  # TimeoutError included
            return paho.MQTTErrorCode.MQTT_ERR_CONN_LOST
        incoming["have_remaining"] = 1
        incoming["to_process"] = incoming["remaining_length"]
        return self._packet_read()

    def _read_large_body(self):
        incoming = self._in_packet
        size = incoming["remaining_length"]
        packet = incoming["packet"]
        if len(packet) != size:  # the first read of this body
            # Uninitialized, and a recent buffer again once netq has copied its body out
            # (bytearray(size) zero-fills, and fresh pages fault: each costs about a copy).
            fresh, view = self._large_buffers.allocate(size, readonly=False)
            view.release()
            packet = incoming["packet"] = cast(bytearray, fresh)  # readonly=False: bytearray
        sock = cast(socket.socket | None, self._sock)  # paho: SocketLike, a real socket here
        if sock is None:
            return paho.MQTTErrorCode.MQTT_ERR_NO_CONN
        with memoryview(packet) as view:
            for _ in range(100):  # as paho: other work (writes, pings) gets its turn
                try:
                    count = sock.recv_into(view[size - incoming["to_process"]:])
                except (BlockingIOError, ssl.SSLWantReadError):
                    return paho.MQTTErrorCode.MQTT_ERR_AGAIN
                except ssl.SSLWantWriteError:
                    self._call_socket_register_write()
                    return paho.MQTTErrorCode.MQTT_ERR_AGAIN
                except OSError:
                    return paho.MQTTErrorCode.MQTT_ERR_CONN_LOST
                if not count:
                    return paho.MQTTErrorCode.MQTT_ERR_CONN_LOST
                incoming["to_process"] -= count
                with self._msgtime_mutex:
                    self._last_bytes_received = paho.time_func()
                if not incoming["to_process"]:
                    break
            else:
                return paho.MQTTErrorCode.MQTT_ERR_AGAIN
        incoming["pos"] = 0
        try:
            rc = self._packet_handle()
        except MalformedPacket:
            rc = paho.MQTTErrorCode.MQTT_ERR_PROTOCOL
        self._in_packet = {"command": 0, "have_remaining": 0, "remaining_count": [],
                           "remaining_mult": 1, "remaining_length": 0, "packet": bytearray(),
                           "to_process": 0, "pos": 0}
        return rc

    def _handle_publish(self):
        incoming = self._in_packet
        packet = incoming["packet"]
        command = incoming["command"]
        qos = (command & 0x06) >> 1
        if qos == 2 or not isinstance(packet, bytearray):
            return super()._handle_publish()
        view = memoryview(packet)
        topic_length = int.from_bytes(view[:2], "big")
        position = 2 + topic_length
        topic = bytes(view[2:position])
        mid = 0
        if qos:
            mid = int.from_bytes(view[position:position + 2], "big")
            position += 2
        if self._protocol == paho.MQTTv5:
            if view[position] != 0:  # properties present: paho's parser handles them
                view.release()
                return super()._handle_publish()
            position += 1
        message = paho.MQTTMessage(mid=mid, topic=topic)
        message.dup = bool(command & 0x08)
        message.qos = qos
        message.retain = bool(command & 0x01)
        # No properties object: building an empty one costs more than decoding the packet,
        # and the transport never reads it.
        if len(packet) >= ZERO_COPY_FROM:
            # paho types the payload as bytes; a read-only view is what we hand on (zero-copy,
            # the transport only slices it).
            message.payload = view[position:]  # type: ignore[assignment]  # paho: bytes only
        else:
            message.payload = bytes(view[position:])
        message.timestamp = paho.time_func()
        self._handle_on_message(message)
        if qos == 1 and not self._manual_ack:
            return self._send_puback(mid)
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_pubackcomp(self, cmd):
        # A successful PUBACK is the packet id alone (MQTT 5 omits the reason code and
        # properties then): skip paho's decoder and its reason code and properties objects.
        packet = self._in_packet["packet"]
        if cmd != "PUBACK" or len(packet) != 2:
            return super()._handle_pubackcomp(cmd)
        mid = int.from_bytes(packet, "big")
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, _PUBACK_SUCCESS, _NO_PROPERTIES)
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS

def new_client(options: CommunicatorOptions, client_id: str) -> PahoClient:
    """A paho client set up from ``options`` (a :class:`netq.CommunicatorOptions`); the
    transport adds its callbacks, its timer and its Last Will."""
    mqtt = options.mqtt
    if mqtt.protocol_version != 4:  # 5, or None: MQTT 5 first (see use_mqtt311)
        client = PahoClient(CallbackAPIVersion.VERSION2, client_id=client_id,
                            protocol=paho.MQTTv5)
    else:
        client = PahoClient(CallbackAPIVersion.VERSION2, client_id=client_id,
                            protocol=paho.MQTTv311, clean_session=True)
    # Our link windows bound what is outstanding; paho must neither hold publishes back
    # (its inflight limit: 0 is none, which also spares a scan of every unacknowledged
    # publish per PUBACK) nor refuse them (its queue limit).
    client.max_inflight_messages_set(0)
    client.max_queued_messages_set(0)
    connection = options.connection
    # The packet bodies it reuses stay within what the communicator may hold received.
    client._large_buffers.limit = connection.recv_budget
    # paho reconnects to the broker by itself, with our backoff (seconds; paho documents
    # ints and computes with floats).
    client.reconnect_delay_set(max(0.05, connection.reconnect_min),  # type: ignore[arg-type]
                               max(0.05, connection.reconnect_max))  # type: ignore[arg-type]
    if mqtt.username is not None:
        client.username_pw_set(mqtt.username, mqtt.password)
    security = options.security
    if security is not None and security.certificate is not None:  # security.tls
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_verify_locations(os.fspath(security.certificate))
        if security.client_certificate is not None:
            # No key: it is in the certificate file (as for the socket transports).
            context.load_cert_chain(os.fspath(security.client_certificate), security.key)
        client.tls_set_context(context)
    client.on_socket_open = on_socket_open
    return client


def on_socket_open(client, userdata, sock) -> None:
    """paho's ``on_socket_open``: small publishes (acks, requests) must not wait for Nagle."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):
        pass


def stop(client: PahoClient) -> None:
    """Disconnect, stop and join paho's thread, and close every socket paho holds."""
    client.disconnect()
    client.loop_stop()
    client._reset_sockets()  # paho keeps its wake-up socketpair open after loop_stop


def speaks_mqtt5(client: PahoClient) -> bool:
    """The client's next CONNECT (or its current session) is MQTT 5."""
    return client._protocol == paho.MQTTv5


def use_mqtt311(client: PahoClient) -> None:
    """Speak MQTT 3.1.1 from the next CONNECT on (a fresh session each time, as netq's MQTT 5
    connections have): for brokers that do not answer an MQTT 5 CONNECT. paho fixes the
    protocol in its constructor; switching in place keeps the client, its callbacks, its Will
    and its thread."""
    client._protocol = paho.MQTTv311
    client._clean_session = True


def drop_connection(client: PahoClient) -> None:
    """Close the broker socket (paho's thread only, e.g. from the ``tick`` timer): paho's
    loop finds it gone and reconnects after its backoff, as after a broken connection."""
    client._sock_close()


def forget_publishes(client: PahoClient) -> int:
    """Forget every publish paho still holds unacknowledged (it would resend them after a
    reconnect); returns the largest payload among them (0 if none), in bytes.

    netq ends every link when the broker connection drops and resends what matters on new
    links, so these resends are useless at best; at worst a publish the broker cannot take
    (over its packet limit) would end every new connection again."""
    largest = 0
    with client._out_message_mutex:
        for message in client._out_messages.values():
            largest = max(largest, len(message.payload))
        client._out_messages.clear()
        client._inflight_messages = 0
    return largest
