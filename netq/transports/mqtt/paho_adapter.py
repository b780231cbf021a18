"""The paho-mqtt adaptation: every use of paho's private API, and why paho is pinned.

netq's MQTT extra pins ``paho-mqtt==2.2.0`` exactly, because of this module. :class:`PahoClient`
overrides private methods of ``paho.mqtt.client.Client`` (``_packet_queue``,
``_handle_publish``) and uses private attributes and helpers inside them (``_in_packet``,
``_protocol``, ``_manual_ack``, ``_handle_on_message``, ``_send_puback``); :func:`stop` calls
``_reset_sockets``. None of these is paho's public contract: before moving the pin, check them
against the new paho (``tests/transports/test_mqtt.py`` and the conformance suite exercise every
path). A paho without the two overridden methods would never call the overrides and simply
take its normal, copying, path; ``_reset_sockets`` has no public equivalent (without it paho's
wake-up socketpair stays open after ``loop_stop``).

Everything else here is public paho API: :func:`new_client` builds the client from netq's
options (MQTT 5 or 3.1.1, no paho-side flow control, reconnect backoff, credentials, TLS) and
:func:`on_socket_open` turns Nagle off on the broker connection.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

if TYPE_CHECKING:
    from ...options import CommunicatorOptions

__all__ = ("PahoClient", "new_client", "on_socket_open", "stop", "ZERO_COPY_FROM")

ZERO_COPY_FROM = 64 * 1024  # publishes at least this large skip paho's copying decoder


class PahoClient(paho.Client):
    """paho's client with a timer (``loop_misc`` runs on every pass of paho's thread) and
    zero-copy paths for large publishes, out (``_packet_queue``) and in (``_handle_publish``).

    paho 2.2 decodes a PUBLISH with ``struct.unpack`` into fresh ``bytes`` three or four times
    (topic split, packet id, properties), each a copy of the whole payload: for 1 MiB packets
    that is most of its receive cost. For a large QoS 0/1 publish without properties we read
    the few header fields from a memoryview and hand the payload on as a view of paho's own
    packet buffer (paho allocates a new one per packet, so the view stays valid). Anything else
    goes through paho's own ``_handle_publish``.
    """

    tick: Callable[[], None] | None = None

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
        if len(packet) >= ZERO_COPY_FROM:
            packet = memoryview(packet)
        return super()._packet_queue(command, packet, mid, qos, info)

    def _handle_publish(self):
        incoming = self._in_packet
        packet = incoming["packet"]
        command = incoming["command"]
        qos = (command & 0x06) >> 1
        if len(packet) < ZERO_COPY_FROM or qos == 2 or not isinstance(packet, bytearray):
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
        # paho types the payload as bytes; a read-only view is what we hand on (zero-copy,
        # the transport only slices it).
        message.payload = view[position:]  # type: ignore[assignment]  # paho: bytes only
        message.timestamp = paho.time_func()
        self._handle_on_message(message)
        if qos == 1 and not self._manual_ack:
            return self._send_puback(mid)
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS


def new_client(options: CommunicatorOptions, client_id: str) -> PahoClient:
    """A paho client set up from ``options`` (a :class:`netq.CommunicatorOptions`); the
    transport adds its callbacks, its timer and its Last Will."""
    mqtt = options.mqtt
    if mqtt.protocol_version == 5:
        client = PahoClient(CallbackAPIVersion.VERSION2, client_id=client_id,
                            protocol=paho.MQTTv5)
    else:
        client = PahoClient(CallbackAPIVersion.VERSION2, client_id=client_id,
                            protocol=paho.MQTTv311, clean_session=True)
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
