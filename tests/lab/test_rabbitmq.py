"""netq.lab.rabbitmq: a RabbitMQ node whose ports are taken while it boots starts again on new
ones. The MQTT scenarios over RabbitMQ are in tests/transports/test_mqtt_brokers.py."""

from __future__ import annotations

import logging
import socket

import pytest

from netq.lab.rabbitmq import RabbitMQCluster
from transports.brokers_testing import rabbitmq_missing

T = 30  # seconds: generous bound for one step on a loaded machine
# A node needs ~12 s to start on an idle machine, and several times that on a loaded 2-core one.
RESTART_BOUND = 300


@pytest.mark.timeout(RESTART_BOUND)
def test_a_rabbitmq_node_whose_port_is_taken_while_it_boots_starts_on_new_ports(caplog):
    """Another program binds a node's AMQP port between the port's choice and the node's
    listen (seconds on a busy machine): the node exits on ``eaddrinuse``, and the cluster
    starts it again on new ports, with a warning, instead of failing."""
    reason = rabbitmq_missing()
    if reason is not None:
        pytest.skip(reason)
    caplog.set_level(logging.WARNING, logger="netq.lab.rabbitmq")
    cluster = RabbitMQCluster(1)
    node = cluster.nodes[0]
    taken = node.amqp_port
    try:
        with socket.socket() as squatter:
            squatter.bind((cluster.host, taken))
            squatter.listen()
            cluster.start()
        assert node.amqp_port != taken
        with socket.create_connection((cluster.host, node.mqtt_port), timeout=T):
            pass
        assert any(f"{taken}" in r.getMessage() and "taken while it started" in r.getMessage()
                   for r in caplog.records)
    finally:
        cluster.close()
