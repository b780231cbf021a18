"""netq.lab.brokers: the private mosquitto (its configuration, stopped by its pid), the shared
broker named by $NETQ_MQTT_BROKER, and what a missing mosquitto says. No MQTT client is needed:
the helper starts and checks processes and sockets only."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import netq as nq
from netq.lab import brokers
from netq.lab.brokers import LocalBroker, broker, environment_broker, local_broker
from netq_testing import wait_for
from transports.mqtt_testing import mosquitto_missing

needs_broker = pytest.mark.skipif(mosquitto_missing() is not None,
                                  reason=mosquitto_missing() or "")

pytestmark = pytest.mark.timeout(120)


@needs_broker
def test_local_broker_config_and_stop_by_pid(tmp_path):
    broker = LocalBroker(max_inflight_messages=3, max_queued_messages=7, max_packet_size=65536,
                         directory=tmp_path)
    text = broker.config()
    for line in ("allow_anonymous true", "persistence false", "max_inflight_messages 3",
                 "max_queued_messages 7", "max_packet_size 65536"):
        assert line in text
    with broker:
        pid = broker.pid
        assert psutil.pid_exists(pid)
        assert f"listener {broker.port} 127.0.0.1" in broker.config_path.read_text()
    assert broker.pid is None
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 5)


@needs_broker
def test_broker_uses_the_environment_broker_unless_limits_are_asked_for(mqtt_broker, monkeypatch):
    monkeypatch.setenv("NETQ_MQTT_BROKER", f"{mqtt_broker.host}:{mqtt_broker.port}")
    with broker() as shared:
        assert (shared.host, shared.port) == (mqtt_broker.host, mqtt_broker.port)
    assert mqtt_broker.process.poll() is None  # a shared broker is left running
    with broker(max_queued_messages=10) as private:
        assert private.port != mqtt_broker.port  # special limits: a private broker
        with socket.create_connection((private.host, private.port), timeout=5):
            pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((private.host, private.port), timeout=5).close()
    for malformed in ("localhost", "127.0.0.1:http", "127.0.0.1:70000", ":1883"):
        monkeypatch.setenv("NETQ_MQTT_BROKER", malformed)
        with pytest.raises(ValueError, match="NETQ_MQTT_BROKER"):
            with broker():
                pass
    monkeypatch.setenv("NETQ_MQTT_BROKER", "[::1]:1883")
    assert environment_broker() == nq.NetworkLocation("::1", 1883)


@pytest.fixture
def no_mosquitto(monkeypatch):
    """This process finds no mosquitto, as on a machine without the package."""
    monkeypatch.setattr(brokers, "_SEARCH", ())
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("NETQ_MOSQUITTO", raising=False)
    monkeypatch.delenv("NETQ_MQTT_BROKER", raising=False)


def test_missing_mosquitto_says_how_to_install(no_mosquitto):
    with pytest.raises(nq.BrokerUnavailable, match="apt-get install -y mosquitto"):
        local_broker()


def test_without_mosquitto_broker_runs_amqtt_and_says_so(no_mosquitto, amqtt_binary, caplog):
    """broker() falls back to a private amqtt (the venv ensure_amqtt made), names it, and a
    netq server and client exchange a message through it; it is stopped on exit."""
    said: list[str] = []
    with caplog.at_level("WARNING", logger="netq.lab"), broker(report=said.append) as where:
        assert len(said) == 1 and "amqtt" in said[0] and "apt-get install -y mosquitto" in said[0]
        assert said[0] in caplog.text
        options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(where.host, where.port,
                                                                   path="fallback"))
        with nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options) as server, \
                nq.new(nq.Protocol.MQTT, nq.Purpose.CLIENT,
                       nq.CommunicatorOptions(netloc=options.netloc)) as client:
            client.put("through amqtt").result(timeout=60)
            assert server.get(timeout=60).data == "through amqtt"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((where.host, where.port), timeout=5).close()


def test_without_mosquitto_its_own_settings_say_mosquitto_is_needed(no_mosquitto):
    with pytest.raises(nq.BrokerUnavailable, match="max_inflight_messages are mosquitto's"):
        with broker(max_inflight_messages=2):
            pass


def test_with_no_broker_at_all_the_error_names_both(no_mosquitto, monkeypatch, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(brokers.AMQTT_VENV_VARIABLE, str(blocked / "amqtt"))  # cannot be made
    with pytest.raises(nq.BrokerUnavailable) as raised:
        with broker():
            pass
    assert "apt-get install -y mosquitto" in str(raised.value)
    assert "amqtt" in str(raised.value)


@needs_broker
def test_a_brokers_port_is_drawn_below_the_ephemeral_range(tmp_path):
    """A broker's port is never one the kernel could hand to an outgoing connection while the
    broker starts (where the kernel says where that range begins)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except OSError:
        pytest.skip("the kernel does not say where its ephemeral port range starts")
    with local_broker(directory=tmp_path) as broker:
        assert broker.netloc.port < low


def test_terminate_says_whether_the_process_exited_within_its_bound():
    """``terminate`` ends a process that honours SIGTERM, answers True for one that had
    already exited, and False (leaving it running) for one that ignores SIGTERM."""
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert brokers.terminate(polite, 30.0)
        assert polite.returncode is not None
        assert brokers.terminate(polite, 30.0)  # already gone
    finally:
        polite.kill()
        polite.wait()
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('ready', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        assert not brokers.terminate(stubborn, 0.2)
        assert stubborn.poll() is None
    finally:
        stubborn.kill()
        stubborn.wait()
        stubborn.stdout.close()  # type: ignore[union-attr]
