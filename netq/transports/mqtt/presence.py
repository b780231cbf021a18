"""MQTT presence: who is online, told by retained messages on the status topic.

Every broker connection publishes, under ``<base>/status/``::

    <client-id>/<inst>   retained "online" once subscribed; Last Will: empty retained
    server/<inst>        retained "online <server-id>"; Last Will: empty retained

``<inst>`` names one broker connection (8 hex digits, :func:`new_instance`, new on every
reconnect), so a late Last Will of an old connection never ends a newer one. An empty retained
payload both announces "offline" and deletes the retained status, so the broker does not
accumulate dead peers; a peer that leaves cleanly publishes it itself.

The server ends the links of a client instance that went offline; a client opens a link only
while a server is online and ends it when the server instance it opened it with goes offline
(both long before netq's heartbeat would notice).

:class:`PresenceMixin` is a part of :class:`~netq.transports.mqtt.transport.MQTTTransport`
(split out by topic, not a class of its own): it uses the transport's ``_status``,
``_is_server``, ``_my_cid``, ``_instance``, ``_lock``, ``_channels``, ``_current``,
``_servers``, ``engine`` and the channel table's ``_end``, ``_peer`` and ``_maybe_open`` (all
declared on :class:`~netq.transports.mqtt.shared.MQTTShared`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...exceptions import ConnectionLost
from .shared import MQTTShared

if TYPE_CHECKING:
    from .paho_adapter import PahoClient

__all__ = ("PresenceMixin", "SERVER", "new_instance")

SERVER = "server"  # the server's name on the status topic (clients use their id)


def new_instance() -> int:
    """A random nonzero 32-bit name for one broker connection."""
    return int.from_bytes(os.urandom(4), "big") or 1


class PresenceMixin(MQTTShared):
    """The status topic: our own retained status and Last Will, and everyone else's."""

    def _status_topic(self) -> str:
        who = SERVER if self._is_server else self._my_cid
        return f"{self._status}{who}/{self._instance:08x}"

    def _set_will(self, client: PahoClient) -> None:
        # An empty retained payload: "offline" to subscribers, and it deletes the retained
        # "online" so the broker keeps nothing for departed peers.
        client.will_set(self._status_topic(), b"", qos=1, retain=True)

    def _announce(self, client: PahoClient) -> None:
        """Subscribed (paho's thread): tell everyone we are online, as this instance."""
        payload = f"online {self.engine.id}".encode()
        client.publish(self._status_topic(), payload, qos=1, retain=True)

    def _announce_leaving(self, client: PahoClient) -> None:
        """Leaving cleanly: clear our retained status (peers see "offline" at once)."""
        client.publish(self._status_topic(), b"", qos=1, retain=True)

    def _next_instance(self, client: PahoClient) -> None:
        """The broker connection was lost: the next one is a new instance with its own Will."""
        self._instance = new_instance()
        self._set_will(client)

    def _on_status(self, rest: str, payload: bytes) -> None:
        """A status message (paho's thread); ``rest`` is the topic after ``status/``."""
        who, _, instance_text = rest.partition("/")
        try:
            instance = int(instance_text, 16)
        except ValueError:
            return
        online = bool(payload)
        if self._is_server:
            if online or who == SERVER:
                return
            with self._lock:
                leaving = [c for c in self._channels.values()
                           if c.cid == who and c.instance == instance]
            for channel in leaving:
                self._end(channel, ConnectionLost(self._peer(channel),
                                                  "the client left (its MQTT status went offline)"),
                          notify=False)
            return
        if who != SERVER:
            return
        if online:
            text = payload.decode(errors="replace").split()
            with self._lock:
                self._servers[instance] = text[1] if len(text) > 1 else ""
            self._maybe_open()
            return
        with self._lock:
            self._servers.pop(instance, None)
            current = self._current
        if current is not None and instance in current.servers:
            self._end(current, ConnectionLost(self._peer(current),
                                              "the server left (its MQTT status went offline)"),
                      notify=False)
