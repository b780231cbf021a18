"""MQTT presence: who is online. A client asks, the live server answers; retained statuses
are only a hint.

Topics under ``<base>/``::

    who                         a client asks "which server is live?" (payload: its id)
    status/<client-id>/<inst>   retained "online" once subscribed; Last Will: empty retained
    status/server/<inst>        retained "online <server-id>" once subscribed, then "live
                                <server-id>" (never retained); Last Will: empty retained

The server answers every question (at most every ``_ANSWER_INTERVAL``) and announces itself
every ``ANNOUNCE_INTERVAL`` anyway, with "live"; a client asks when it has subscribed and every
``QUERY_INTERVAL`` while it knows no live server. Only "live", which no broker stores, names a
live server; "online" may be replayed from the broker's retained store long after: brokers
disagree about retained messages (RabbitMQ replays them only to exact-topic subscriptions,
never through ``status/server/+``, and keeps them per cluster node; a broker killed with
persistence on keeps a dead server's "online" for ever), but every broker forwards live
publishes through wildcards and across cluster nodes. A retained "online" that no live status
confirms within ``STALE_AFTER`` is stale: the client says so, and the next server clears it.

``<inst>`` names one broker connection (8 hex digits, :func:`new_instance`, new on every
reconnect), so a late Last Will of an old connection never ends a newer one. An empty retained
payload both announces "offline" and deletes the retained status, so the broker does not
accumulate dead peers; a peer that leaves cleanly publishes it itself.

The server ends the links of a client instance that went offline; a client opens a link only
while a live server is known and ends it when the server instance it opened it with goes
offline (both long before netq's heartbeat would notice).

:class:`PresenceMixin` is a part of :class:`~netq.transports.mqtt.transport.MQTTCarrier`
(split out by topic, not a class of its own): it uses the transport's ``_status``,
``_is_server``, ``_my_cid``, ``_instance``, ``_lock``, ``_channels``, ``_current``,
``_servers``, ``_options`` and the channel table's ``_end``, ``_peer`` and ``_maybe_open`` (all
declared on :class:`~netq.transports.mqtt.shared.MQTTShared`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from ...exceptions import ConnectionLost
from .shared import MQTTShared

if TYPE_CHECKING:
    from .paho_adapter import PahoClient

__all__ = ("PresenceMixin", "SERVER", "new_instance", "ANNOUNCE_INTERVAL", "QUERY_INTERVAL",
           "STALE_AFTER")

LOGGER = logging.getLogger("netq")
SERVER = "server"  # the server's name on the status topic (clients use their id)
QUERY = "who"  # the topic (under <base>/) on which clients ask for the live server
ANNOUNCE_INTERVAL = 10.0  # seconds between a server's unprompted announcements
QUERY_INTERVAL = 1.0  # seconds between a client's questions while it knows no live server
STALE_AFTER = 3.0  # seconds after which an unconfirmed retained "online" is called stale
_ANSWER_INTERVAL = 0.1  # seconds: a server answers a burst of questions once


def new_instance() -> int:
    """A random nonzero 32-bit name for one broker connection."""
    return int.from_bytes(os.urandom(4), "big") or 1


class PresenceMixin(MQTTShared):
    """The status and question topics: our own status and Last Will, and everyone else's."""

    def _status_topic(self) -> str:
        who = SERVER if self._is_server else self._my_cid
        return f"{self._status}{who}/{self._instance:08x}"

    def _presence_topics(self) -> list[str]:
        """What to subscribe to for presence, besides our link topic."""
        if self._is_server:
            return [f"{self._status}+/+", f"{self._base}/{QUERY}"]
        return [f"{self._status}{SERVER}/+"]

    def _set_will(self, client: PahoClient) -> None:
        # An empty retained payload: "offline" to subscribers, and it deletes the retained
        # "online" so the broker keeps nothing for departed peers.
        client.will_set(self._status_topic(), b"", qos=1, retain=True)

    def _announce(self, client: PahoClient) -> None:
        """Subscribed (paho's thread): our retained "online" (a hint for whoever subscribes
        later); then the server says it is live, a client asks for the live server."""
        client.publish(self._status_topic(), f"online {self._options.id}".encode(), qos=1,
                       retain=True)
        if self._is_server:
            self._announce_live(client)
        else:
            self._ask(client, time.monotonic())

    def _announce_live(self, client: PahoClient) -> None:
        """Server: "live <id>" on our status topic, never retained, so that no broker can
        replay it: whoever receives it knows this server is there now."""
        self._announced_at = time.monotonic()
        client.publish(self._status_topic(), f"live {self._options.id}".encode(), qos=1)

    def _ask(self, client: PahoClient, now: float) -> None:
        self._asked_at = now
        client.publish(f"{self._base}/{QUERY}", self._my_cid.encode(), qos=1)

    def _announce_leaving(self, client: PahoClient) -> None:
        """Leaving cleanly: clear our retained status (peers see "offline" at once)."""
        client.publish(self._status_topic(), b"", qos=1, retain=True)

    def _next_instance(self, client: PahoClient) -> None:
        """The broker connection was lost: the next one is a new instance with its own Will."""
        self._instance = new_instance()
        self._set_will(client)

    def _presence_tick(self, client: PahoClient, now: float) -> None:
        """paho's thread, a few times a second while connected: announce, or ask again."""
        if self._is_server:
            if now - self._announced_at >= ANNOUNCE_INTERVAL:
                self._announce_live(client)
        elif not self._servers and now - self._asked_at >= QUERY_INTERVAL:
            self._ask(client, now)

    def _on_question(self, client: PahoClient) -> None:
        """Server: a client asks which server is live (paho's thread)."""
        if time.monotonic() - self._announced_at >= _ANSWER_INTERVAL:
            self._announce_live(client)

    def _on_status(self, client: PahoClient, rest: str, payload: bytes) -> None:
        """A status message (paho's thread); ``rest`` is the topic after ``status/``. Payloads:
        ``online <id>`` (retained: a hint, maybe replayed long after), ``live <id>`` (a server
        that is there now) and empty (offline). Brokers differ in how they set the retain
        flag on what they forward; the payload says it all."""
        who, _, instance_text = rest.partition("/")
        try:
            instance = int(instance_text, 16)
        except ValueError:
            return
        online = bool(payload)
        live = payload.startswith(b"live")
        if self._is_server:
            if who == SERVER:
                if online and not live and instance != self._instance:
                    # One server per service: another server's retained "online" is a dead
                    # one's (a broker restarted with persistence keeps it for ever).
                    LOGGER.info("netq mqtt server: clearing the stale retained status of "
                                "server instance %08x on %s", instance, self._base)
                    client.publish(f"{self._status}{rest}", b"", qos=1, retain=True)
                return
            if online:
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
            now = time.monotonic()
            if not live:
                # A hint only: ask the live server to confirm (it answers live).
                with self._lock:
                    if instance not in self._servers:
                        self._hints.setdefault(instance, now)
                self._ask(client, now)
                return
            text = payload.decode(errors="replace").split()
            with self._lock:
                self._servers[instance] = text[1] if len(text) > 1 else ""
                self._hints.pop(instance, None)
                self._server_seen_at = now
            self._maybe_open()
            return
        with self._lock:
            self._servers.pop(instance, None)
            self._hints.pop(instance, None)
            current = self._current
        if current is not None and instance in current.servers:
            self._end(current, ConnectionLost(self._peer(current),
                                              "the server left (its MQTT status went offline)"),
                      notify=False)

    def _presence_state(self, now: float) -> str | None:
        """Client, connected to the broker: why no link is up (None: a live server is known)."""
        with self._lock:
            if self._servers:
                return None
            stale = [instance for instance, since in self._hints.items()
                     if now - since >= STALE_AFTER]
        netloc = self._options.netloc
        waited = now - self._broker_ready_at
        text = (f"connected to the MQTT broker at {netloc.host}:{netloc.port}, no server "
                f"announced on {self._base} for {waited:.0f} s")
        if stale:
            text += (f" (the broker keeps a retained \"online\" of server instance "
                     f"{stale[0]:08x}, but no live server answers: a stale status, left by a "
                     f"server that died while the broker was down or restarted)")
        return text
