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
offline (both long before netq's heartbeat would notice). :class:`Presence` only tells
(``client_left``, ``server_found``, ``server_left``); the channel table ends and opens links.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .topics import SERVER, Topics

__all__ = ("Presence", "Publisher", "new_instance", "ANNOUNCE_INTERVAL", "QUERY_INTERVAL",
           "STALE_AFTER")

LOGGER = logging.getLogger("netq")
ANNOUNCE_INTERVAL = 10.0  # seconds between a server's unprompted announcements
QUERY_INTERVAL = 1.0  # seconds between a client's questions while it knows no live server
STALE_AFTER = 3.0  # seconds after which an unconfirmed retained "online" is called stale
_ANSWER_INTERVAL = 0.1  # seconds: a server answers a burst of questions once


def new_instance() -> int:
    """A random nonzero 32-bit name for one broker connection."""
    return int.from_bytes(os.urandom(4), "big") or 1


class Publisher(Protocol):
    """What presence needs of the broker client (paho's: thread-safe)."""

    def publish(self, topic: str, payload: bytes, qos: int = 0,
                retain: bool = False) -> object: ...

    def will_set(self, topic: str, payload: bytes, qos: int = 0,
                 retain: bool = False) -> None: ...


class Presence:
    """The status and question topics: our own status and Last Will, and everyone else's.

    State owned: :attr:`instance` (our broker connection's name), the live servers and the
    unconfirmed hints (client), when we last announced (server) or asked (client).

    Threads and lock: everything runs on paho's network thread (its callbacks and its timer)
    except :meth:`live_servers` (whichever thread opens a client link, holding the channel
    table's lock), :meth:`explain` (a user's thread) and :meth:`leave` (the closing thread).
    ``_lock`` guards the live servers and the hints, the state those other threads read; it is
    never held while calling out (``client_left``, ``server_found``, ``server_left``), so it
    is always the innermost lock. :attr:`instance` is written on paho's thread only, between
    two broker connections, and read whole.

    Received at construction: the broker client (a :class:`Publisher`), the topics, the role,
    our id, and three callbacks into the channel table, each called on paho's thread without
    ``_lock``: ``client_left(cid, instance)`` (server: that client instance went offline),
    ``server_found()`` (client: a live server is known) and ``server_left(instance)`` (client:
    that server instance went offline).
    """

    def __init__(self, client: Publisher, topics: Topics, *, is_server: bool, my_id: str,
                 client_left: Callable[[str, int], None], server_found: Callable[[], None],
                 server_left: Callable[[int], None]) -> None:
        self._client = client
        self._topics = topics
        self._is_server = is_server
        self._my_id = my_id
        self._client_left = client_left
        self._server_found = server_found
        self._server_left = server_left
        self._lock = threading.Lock()  # _servers, _hints
        self.instance = new_instance()  # this broker connection (read by the channel table)
        self._servers: dict[int, str] = {}  # client: live server instance -> its id
        self._hints: dict[int, float] = {}  # client: retained "online" instance -> first seen
        self._announced_at = 0.0  # server: our last "live"
        self._asked_at = 0.0  # client: our last question on <base>/who

    # ------------------------------------------------------------------ our own status

    def _status_topic(self) -> str:
        who = SERVER if self._is_server else self._my_id
        return f"{self._topics.status}{who}/{self.instance:08x}"

    def subscriptions(self) -> list[str]:
        """What to subscribe to for presence, besides our link topic."""
        if self._is_server:
            return [f"{self._topics.status}+/+", self._topics.query]
        return [f"{self._topics.status}{SERVER}/+"]

    def set_will(self) -> None:
        """Before connecting: our Last Will. An empty retained payload: "offline" to
        subscribers, and it deletes the retained "online" so the broker keeps nothing for
        departed peers."""
        self._client.will_set(self._status_topic(), b"", qos=1, retain=True)

    def announce(self) -> None:
        """Subscribed (paho's thread): our retained "online" (a hint for whoever subscribes
        later); then the server says it is live, a client asks for the live server."""
        self._client.publish(self._status_topic(), f"online {self._my_id}".encode(), qos=1,
                             retain=True)
        if self._is_server:
            self._announce_live()
        else:
            self._ask(time.monotonic())

    def _announce_live(self) -> None:
        """Server: "live <id>" on our status topic, never retained, so that no broker can
        replay it: whoever receives it knows this server is there now."""
        self._announced_at = time.monotonic()
        self._client.publish(self._status_topic(), f"live {self._my_id}".encode(), qos=1)

    def _ask(self, now: float) -> None:
        self._asked_at = now
        self._client.publish(self._topics.query, self._my_id.encode(), qos=1)

    def leave(self) -> None:
        """Leaving cleanly: clear our retained status (peers see "offline" at once)."""
        self._client.publish(self._status_topic(), b"", qos=1, retain=True)

    def broker_lost(self) -> None:
        """The broker connection was lost (paho's thread): nobody is known live any more."""
        with self._lock:
            self._servers.clear()
            self._hints.clear()

    def next_instance(self) -> None:
        """The broker connection was lost and another follows: a new instance, its own Will."""
        self.instance = new_instance()
        self.set_will()

    def tick(self, now: float) -> None:
        """paho's thread, a few times a second while connected: announce, or ask again."""
        if self._is_server:
            if now - self._announced_at >= ANNOUNCE_INTERVAL:
                self._announce_live()
        elif not self._servers and now - self._asked_at >= QUERY_INTERVAL:
            self._ask(now)

    # ------------------------------------------------------------------ everyone else's

    def on_question(self) -> None:
        """Server: a client asks which server is live (paho's thread)."""
        if time.monotonic() - self._announced_at >= _ANSWER_INTERVAL:
            self._announce_live()

    def on_status(self, rest: str, payload: bytes) -> None:
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
                if online and not live and instance != self.instance:
                    # One server per service: another server's retained "online" is a dead
                    # one's (a broker restarted with persistence keeps it for ever).
                    LOGGER.info("netq mqtt server: clearing the stale retained status of "
                                "server instance %08x on %s", instance, self._topics.base)
                    self._client.publish(f"{self._topics.status}{rest}", b"", qos=1,
                                         retain=True)
                return
            if not online:
                self._client_left(who, instance)
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
                self._ask(now)
                return
            text = payload.decode(errors="replace").split()
            with self._lock:
                self._servers[instance] = text[1] if len(text) > 1 else ""
                self._hints.pop(instance, None)
            self._server_found()
            return
        with self._lock:
            self._servers.pop(instance, None)
            self._hints.pop(instance, None)
        self._server_left(instance)

    def live_servers(self) -> dict[int, str]:
        """Client: the live server instances and their announced ids (a copy; any thread)."""
        with self._lock:
            return dict(self._servers)

    def explain(self, now: float, broker: str, connected_since: float) -> str | None:
        """Client, connected to ``broker`` (``host:port``) since ``connected_since``: why no
        link is up (None: a live server is known)."""
        with self._lock:
            if self._servers:
                return None
            stale = [instance for instance, since in self._hints.items()
                     if now - since >= STALE_AFTER]
        waited = now - connected_since
        text = (f"connected to the MQTT broker at {broker}, no server "
                f"announced on {self._topics.base} for {waited:.0f} s")
        if stale:
            text += (f" (the broker keeps a retained \"online\" of server instance "
                     f"{stale[0]:08x}, but no live server answers: a stale status, left by a "
                     f"server that died while the broker was down or restarted)")
        return text
