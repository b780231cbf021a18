"""MQTT presence (netq/transports/mqtt/presence.py) without a broker: a :class:`Presence` fed
status messages through its public interface, publishing into a recorder.

What a real mistake here costs: a retained "online" taken for a live server (a client opens
links to a dead one), a server leaving unnoticed (its link lingers until heartbeats), a Last
Will of an old broker connection ending a newer one, a server clearing its own status.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("paho.mqtt", reason="Protocol.MQTT needs paho-mqtt")

from netq.transports.mqtt import presence as presence_module
from netq.transports.mqtt.presence import STALE_AFTER, Presence
from netq.transports.mqtt.topics import SERVER, Topics

TOPICS = Topics.of("netq", "svc")
STATUS = TOPICS.status


class Recorder:
    """A broker client that records what presence publishes, and its Will."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, int, bool]] = []
        self.will: tuple[str, bytes, int, bool] | None = None

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.published.append((topic, payload, qos, retain))

    def will_set(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.will = (topic, payload, qos, retain)


class Told:
    """The channel table's side: what presence told it."""

    def __init__(self) -> None:
        self.client_left: list[tuple[str, int]] = []
        self.server_found = 0
        self.server_left: list[int] = []


def _presence(is_server: bool, my_id: str | None = None) -> tuple[Presence, Recorder, Told]:
    client, told = Recorder(), Told()

    def found() -> None:
        told.server_found += 1

    presence = Presence(client, TOPICS, is_server=is_server, my_id=my_id or str(uuid.uuid4()),
                        client_left=lambda cid, instance: told.client_left.append((cid, instance)),
                        server_found=found, server_left=told.server_left.append)
    return presence, client, told


def test_a_retained_online_is_a_hint_until_a_live_status_confirms_it(monkeypatch):
    """A client: "online" (maybe replayed from a dead server) only makes it ask; "live"
    makes the server known; an empty status (the Will) makes it leave again."""
    clock = [100.0]
    monkeypatch.setattr(presence_module.time, "monotonic", lambda: clock[0])
    server_id = str(uuid.uuid4())
    presence, client, told = _presence(is_server=False)
    presence.on_status(f"{SERVER}/0000abcd", f"online {server_id}".encode())
    assert told.server_found == 0 and presence.live_servers() == {}
    assert client.published[-1][0] == TOPICS.query  # asked the live server to confirm
    clock[0] += STALE_AFTER
    why = presence.explain(clock[0], "broker:1883", connected_since=90.0)
    assert why is not None and "0000abcd" in why and "stale" in why
    presence.on_status(f"{SERVER}/0000abcd", f"live {server_id}".encode())
    assert told.server_found == 1
    assert presence.live_servers() == {0xABCD: server_id}
    assert presence.explain(clock[0], "broker:1883", connected_since=90.0) is None
    presence.on_status(f"{SERVER}/0000abcd", b"")
    assert told.server_left == [0xABCD] and presence.live_servers() == {}


def test_a_client_ignores_other_clients_and_malformed_instances():
    presence, client, told = _presence(is_server=False)
    presence.on_status(f"{uuid.uuid4()}/00000001", b"")  # another client left
    presence.on_status(f"{SERVER}/not-hex", b"live x")
    assert (told.server_found, told.server_left, told.client_left) == (0, [], [])
    assert client.published == []


def test_a_server_ends_the_links_of_a_client_instance_that_went_offline():
    presence, client, told = _presence(is_server=True)
    cid = str(uuid.uuid4())
    presence.on_status(f"{cid}/00000007", b"online")  # joining: nothing to do
    presence.on_status(f"{cid}/00000007", b"")  # its Will
    assert told.client_left == [(cid, 7)]
    assert client.published == []


def test_a_server_clears_another_servers_retained_online_never_its_own():
    presence, client, _ = _presence(is_server=True)
    own = f"{SERVER}/{presence.instance:08x}"
    presence.on_status(own, b"online me")
    presence.on_status(f"{SERVER}/00000001", b"live someone")  # live: not ours to clear
    assert client.published == []
    presence.on_status(f"{SERVER}/00000001", b"online dead")
    assert client.published == [(f"{STATUS}{SERVER}/00000001", b"", 1, True)]


def test_each_broker_connection_is_a_new_instance_with_its_own_will():
    """The Will names this connection's instance: a late Will of an old connection must not
    look like the new one leaving."""
    presence, client, _ = _presence(is_server=False, my_id="me")
    presence.set_will()
    first = presence.instance
    assert client.will == (f"{STATUS}me/{first:08x}", b"", 1, True)
    presence.next_instance()
    assert presence.instance != first
    assert client.will == (f"{STATUS}me/{presence.instance:08x}", b"", 1, True)
    presence.announce()
    assert client.published[0] == (f"{STATUS}me/{presence.instance:08x}", b"online me", 1, True)
    presence.leave()
    assert client.published[-1] == (f"{STATUS}me/{presence.instance:08x}", b"", 1, True)


def test_the_server_announces_live_on_questions_and_on_its_timer(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(presence_module.time, "monotonic", lambda: clock[0])
    presence, client, _ = _presence(is_server=True, my_id="srv")
    live = (f"{STATUS}{SERVER}/{presence.instance:08x}", b"live srv", 1, False)
    presence.announce()
    assert client.published == [(live[0], b"online srv", 1, True), live]
    presence.on_question()  # a burst of questions is answered once
    assert len(client.published) == 2
    clock[0] += 0.1
    presence.on_question()
    assert client.published[-1] == live and len(client.published) == 3
    presence.tick(clock[0] + presence_module.ANNOUNCE_INTERVAL - 0.01)
    assert len(client.published) == 3
    presence.tick(clock[0] + presence_module.ANNOUNCE_INTERVAL + 0.01)
    assert len(client.published) == 4
    assert presence.subscriptions() == [f"{STATUS}+/+", TOPICS.query]


def test_a_client_asks_again_only_while_it_knows_no_live_server():
    presence, client, _ = _presence(is_server=False, my_id="me")
    presence.tick(100.0)
    assert client.published == [(TOPICS.query, b"me", 1, False)]
    presence.tick(100.5)  # within QUERY_INTERVAL
    assert len(client.published) == 1
    presence.on_status(f"{SERVER}/00000002", b"live srv")
    presence.tick(200.0)  # a live server is known: no question
    assert len(client.published) == 1
    presence.broker_lost()
    assert presence.live_servers() == {}
    presence.tick(300.0)
    assert len(client.published) == 2
    assert presence.subscriptions() == [f"{STATUS}{SERVER}/+"]
