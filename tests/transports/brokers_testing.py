"""Brokers other than the session mosquitto, for tests/transports/test_mqtt_brokers.py and the
conformance suite's ``mqtt-rabbitmq`` case.

* ``rabbitmq`` (session): a RabbitMQ node of its own, and ``rabbitmq_cluster`` (session): a
  2-node cluster (:class:`netq.lab.rabbitmq.RabbitMQCluster`, Debian's ``rabbitmq-server``
  with the ``rabbitmq_mqtt`` plugin); the single node and the cluster's first node are launched
  together on first use, the cluster's second node once its first has booted (about 15-35 s
  on this 2-core machine).
* ``amqtt_binary`` (session): the ``amqtt`` script of a venv of its own (amqtt's pins must not
  touch netq's environment), made once by :func:`netq.lab.brokers.ensure_amqtt` and cached
  under ``$NETQ_AMQTT_VENV`` (default ``~/.cache/netq/amqtt-0.12.1``).
* :class:`RabbitMQSpec`: Protocol.MQTT through the single RabbitMQ node, for the conformance
  suite.

Each skips with the reason only where the broker cannot be had (not installed, no network for
pip); a broker that is there but fails to start fails the test.
"""

from __future__ import annotations

import uuid

import pytest

import netq as nq
from netq.exceptions import BrokerUnavailable
from netq.lab.brokers import AMQTT_VERSION, ensure_amqtt
from netq.lab.rabbitmq import RABBITMQ_START_TIMEOUT, RabbitMQCluster, RabbitMQNode, find_rabbitmq
from transports.mqtt_testing import MQTTSpec


def rabbitmq_missing() -> str | None:
    try:
        find_rabbitmq()
    except BrokerUnavailable as error:
        return str(error)
    return None


class RabbitMQBrokers:
    """The session's RabbitMQ: a node of its own and a 2-node cluster, launched together (they
    boot in parallel) and each waited for where a test first needs it: a cluster slow to form
    on a loaded machine does not hold up the tests that need only the single node."""

    def __init__(self) -> None:
        self.single = RabbitMQCluster(1)
        self.cluster = RabbitMQCluster(2)

    def launch(self) -> RabbitMQBrokers:
        try:
            self.single.launch()
            self.cluster.launch()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self.single.close()
        self.cluster.close()


# Seconds a test that may be the first to need RabbitMQ gets on top of its own timeout: the
# nodes' start, bounded by netq.lab.brokers' own wait (BrokerUnavailable past it), must not be
# cut short by the test's timeout on a loaded machine.
RABBITMQ_START_ALLOWANCE = RABBITMQ_START_TIMEOUT
RABBITMQ_FIXTURES = frozenset({"rabbitmq", "rabbitmq_cluster", "rabbitmq_brokers"})


@pytest.fixture(scope="session")
def rabbitmq_brokers():
    reason = rabbitmq_missing()
    if reason is not None:
        pytest.skip(reason)
    brokers = RabbitMQBrokers()
    try:
        yield brokers.launch()
    finally:
        brokers.close()


@pytest.fixture(scope="session")
def rabbitmq(rabbitmq_brokers) -> RabbitMQNode:
    """A RabbitMQ node of its own (a cluster of one) for the whole session."""
    return rabbitmq_brokers.single.wait_ready().nodes[0]


@pytest.fixture(scope="session")
def rabbitmq_cluster(rabbitmq_brokers) -> RabbitMQCluster:
    """A 2-node RabbitMQ cluster for the whole session."""
    return rabbitmq_brokers.cluster.wait_ready()


_NODE_BACK_WITHIN = 45.0  # seconds a killed RabbitMQ node gets before a second start


def crash_and_restart(node: RabbitMQNode) -> None:
    """SIGKILL a RabbitMQ node and start it again with the same name, ports and data. Its MQTT
    plugin now and then does not reopen its listener after such a crash (its Raft member fails
    to restart); a second start brings a node of its own back. (On a cluster node it may not:
    the cluster test restarts its node cleanly instead.)"""
    node.kill()
    node.start_process()
    try:
        node.wait_ready(_NODE_BACK_WITHIN)
    except BrokerUnavailable:
        node.stop()
        node.start_process()
        node.wait_ready()


@pytest.fixture(scope="session")
def amqtt_binary() -> str:
    try:
        return ensure_amqtt()
    except BrokerUnavailable as error:
        pytest.skip(f"amqtt {AMQTT_VERSION} could not be installed in a venv of its own: "
                    f"{error}")


class RabbitMQSpec(MQTTSpec):
    """Protocol.MQTT through the session's single RabbitMQ node, with default options:
    netq finds out by itself that RabbitMQ speaks MQTT 3.1.1 only."""

    name = "mqtt-rabbitmq"

    def __repr__(self) -> str:
        return "<transport mqtt-rabbitmq>"

    def unavailable(self) -> str | None:
        try:
            import paho.mqtt  # noqa: F401
        except ImportError as error:
            return f"MQTT not usable here: {error}"
        return rabbitmq_missing()  # mosquitto is not needed

    def server_netloc(self, env) -> nq.NetworkLocation:
        node = env.request.getfixturevalue("rabbitmq")
        return nq.NetworkLocation(node.cluster.host, node.mqtt_port,
                                  path=f"t-{uuid.uuid4().hex[:12]}")
