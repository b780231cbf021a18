"""Protocol.MQTT: netq links through an MQTT broker (paho-mqtt, ``CallbackAPIVersion.VERSION2``).

Server and clients are all clients of the broker (``CommunicatorOptions.netloc``). Topics, under
``<prefix>/<service>`` (``MQTTOptions.prefix``, default ``netq``; service ``netloc.path``,
default ``netq``)::

    <base>/c2s/<client-id>             client -> server link packets (server subscribes c2s/+)
    <base>/s2c/<client-id>             server -> client link packets
    <base>/status/<client-id>/<inst>   retained "online"; Last Will: empty retained (= offline)
    <base>/status/server/<inst>        retained "online <server-id>" (a hint), then "live
                                       <server-id>" (never retained; every 10 s and on each
                                       question); Last Will: empty retained
    <base>/who                         a client asks for the live server (see presence.py)

netq speaks MQTT 5 and falls back to MQTT 3.1.1 by itself (``MQTTOptions.protocol_version``
None) when a broker refuses MQTT 5, closes without a CONNACK or does not answer in 3 s.

``<inst>`` names one broker connection (8 hex digits, new on every reconnect), so a late Last
Will of an old connection never ends a newer one; an empty retained payload both announces
"offline" and deletes the retained status, so the broker does not accumulate dead peers.

Every publish is a link packet (:mod:`.link`): a 28-byte header (epoch, seq, ack) and a slice
of the link's netq byte stream, at most min(``max_size``, 1 MiB, the broker's maximum packet
size minus our overhead) long. A link is one epoch chosen by the client; the receiver checks
sequence numbers, so a packet the broker dropped ends the link (reported as a gap) and netq's
session resume resends whatever was not acknowledged. The sender keeps at most a window of
packets and bytes in the broker per link, so broker memory stays bounded and drops stay rare.

Threads: paho's network thread (``loop_start``) only parses link headers and posts bodies as
``DATA`` events (:class:`~netq.transports.packets.PacketCarrier`); the netq loop feeds them to
the link's Connection on its I/O thread. The loop's ``write`` calls (its I/O thread, or a
user's thread for a lone put on an idle link: ``user_threads_write``) cut the output into
packets and publish them (``_send``); paho writes a publish on the calling thread when the
socket takes it (plain sockets), else on its own thread. A requested link ack rides on the
next packet published, else goes alone 2 ms after it was asked for
(``ChannelTable.flush_acks``). The loop holds a lone netq ACK/CREDIT up to 1 ms for a reply
to share its publish (``ack_hold_always``). Probes and CLOSE answers to stale epochs are
published from paho's thread (its ``loop_misc`` is the probe timer). paho's thread is stopped
and joined in ``_stop_carrier``. Which lock guards what: each part's class docstring (the
channel table's lock, then presence's, never the other way; neither is held while publishing
or posting).

Security: with ``SecurityOptions.certificate`` the broker connection uses TLS and trusts that
certificate or CA (on both server and clients: both are broker clients); ``client_certificate``
+ ``key`` present a certificate to a broker that requires one. ``authkey`` works as on every
transport, and the server also refuses a HELLO whose id is not the client id of the topic the
link's packets came from (its channels are bound to that id: ``Opened.bound_to``; no
impersonation through someone else's topics). The broker itself is trusted: anyone allowed to
publish on our topics can disturb links (use broker ACLs).

Files (the transport is :class:`MQTTCarrier` holding two parts, each with its own state and
lock, which it wires together and to paho)::

    transport.py      MQTTCarrier: construction and wiring, the broker connection and paho's
                      callbacks, the delayed-ACK setting, packet size negotiation, the
                      packet-carrier hooks, link_statistics()
    presence.py       Presence: the status topic, our retained "online" and Last Will, peers
                      joining and leaving (it tells the channel table; it ends nothing itself)
    channels.py       ChannelTable (and Channel): opening links, judging every packet, link
                      acks, the probe timer, ending links
    topics.py         Topics: the topic names of one service (a leaf)
    link.py           the link layer, sans I/O: header, sequence numbers, gaps, AIMD window
    paho_adapter.py   paho set-up and TLS, and every use of paho's private API (the reason
                      for the exact paho-mqtt==2.2.0 pin)
"""

try:
    import paho.mqtt.client  # noqa: F401
except ImportError as missing:  # pragma: no cover - depends on the installation
    raise ImportError("Protocol.MQTT needs paho-mqtt: pip install 'netq[mqtt]' "
                      f"(paho-mqtt==2.2.0): {missing}") from missing

from .transport import MQTTCarrier, link_statistics

__all__ = ("MQTTCarrier", "link_statistics")
