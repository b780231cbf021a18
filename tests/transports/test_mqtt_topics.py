"""The MQTT topic names (netq/transports/mqtt/topics.py): the wire's addresses, so a change
here strands every peer of an older netq."""

from __future__ import annotations

import pytest

pytest.importorskip("paho.mqtt", reason="Protocol.MQTT needs paho-mqtt")

from netq.transports.mqtt.topics import QUERY, SERVER, Topics


def test_topics_of_a_service_under_its_prefix():
    topics = Topics.of("netq", "/jobs/")  # netloc.path keeps its slashes
    assert topics == Topics(base="netq/jobs", c2s="netq/jobs/c2s/", s2c="netq/jobs/s2c/",
                            status="netq/jobs/status/", query=f"netq/jobs/{QUERY}")
    assert (QUERY, SERVER) == ("who", "server")


@pytest.mark.parametrize("service", ["a/+", "#", "//", ""])
def test_a_service_must_be_a_plain_topic(service):
    with pytest.raises(ValueError, match="without wildcards"):
        Topics.of("netq", service)
