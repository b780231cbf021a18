"""MQTT in the transport suite: a session-wide private mosquitto and the TransportSpec for it.

Every server gets its own *service* (``NetworkLocation.path``) on the one broker, so tests never
see each other's topics. ``cut()`` shuts the client's broker connection down below paho (as the
socket spec shuts a socket down): paho reconnects, the server sees the client's Last Will, and
netq resumes the session over a new link epoch.
"""

from __future__ import annotations

import uuid

import pytest

import netq as nq
from netq.exceptions import BrokerUnavailable
from netq_testing import shut_down_below


@pytest.fixture(scope="session")
def mqtt_broker():
    """A mosquitto on a free loopback port for the whole session (default limits)."""
    from netq.lab.brokers import local_broker

    broker = local_broker()
    try:
        yield broker
    finally:
        broker.close()


class MQTTSpec:
    """Protocol.MQTT through the session's mosquitto."""

    name = "mqtt"
    protocol = nq.Protocol.MQTT
    byte_stream = False
    supports_cut = True

    def __repr__(self) -> str:
        return "<transport mqtt>"

    def unavailable(self) -> str | None:
        try:
            import paho.mqtt  # noqa: F401

            from netq.lab.brokers import find_mosquitto
            find_mosquitto()
        except (ImportError, BrokerUnavailable) as error:
            return f"MQTT not usable here: {error}"
        return None

    def server_netloc(self, env) -> nq.NetworkLocation:
        broker = env.request.getfixturevalue("mqtt_broker")
        return nq.NetworkLocation(broker.host, broker.port, path=f"t-{uuid.uuid4().hex[:12]}")

    def client_netloc(self, netloc: nq.NetworkLocation, address) -> nq.NetworkLocation:
        return nq.NetworkLocation(*netloc)

    def security(self, env, purpose):
        return None

    def raw_connect(self, env, netloc, *, wrap: bool = True):
        raise NotImplementedError("MQTT is not a byte stream")

    def upstream(self, netloc: nq.NetworkLocation):
        """The broker: an MQTT client connects to it, never to the netq server."""
        return (netloc.host, netloc.port)

    def through(self, netloc: nq.NetworkLocation, address) -> nq.NetworkLocation:
        return nq.NetworkLocation(address[0], address[1], path=netloc.path)  # same service

    def cut(self, client: nq.Communicator) -> bool:
        transport = client._loop.carrier
        if transport.links.current is None or transport.links.current.closed:
            return False
        sock = transport._client.socket()
        return sock is not None and shut_down_below(sock.fileno())


def mosquitto_missing() -> str | None:
    """Why no private mosquitto can be started here (None when one can)."""
    from netq.lab.brokers import find_mosquitto

    try:
        find_mosquitto()
    except nq.BrokerUnavailable as error:
        return str(error)
    return None
