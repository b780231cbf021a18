"""Two mosquitto brokers bridged both ways on loopback, for netq across a broker network.

Broker A (the "cloud") is a plain private broker; broker B (the "edge") carries one bridge
connection to A that shares ``<prefix>/#`` in both directions. A netq server connects to A,
its clients to B, so every link packet, retained status and Last Will crosses the bridge.

One bridge connection with ``both`` rather than a bridge on each side: two bridges over the
same topics would forward every message back and forth for ever (mosquitto has no loop
detection across two separate connections). ``try_private true`` tells A that B is a bridge,
which makes A keep the RETAIN flag of what it forwards (retained statuses stay retained on B)
and not echo B's own publishes back to it.

The bridge can run through a :class:`fault_proxy.FaultProxy` (``via_proxy=True``), so a test
can break the bridge link alone (``proxy.reset()``) while both brokers and every netq
communicator keep their own broker connections.

Brokers are started with :class:`netq.lab.brokers.LocalBroker` (free port,
``mosquitto -c <conf>`` in the foreground, killed by pid); the bridge lines go in through its
``extra`` settings.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import netq as nq
from netq.lab.brokers import LocalBroker

PREFIX = "netq"  # netq's default MQTTOptions.prefix: everything netq publishes is under it
BRIDGE_QOS = 1  # netq publishes at QoS 1; the bridge must not downgrade it to 0
# Seconds between bridge reconnect attempts, as "base cap" of mosquitto's jittered backoff
# (default 5 30); base = cap gives a constant delay. mosquitto 2.0.11 waited its default 5 s
# with the one-value (constant) form.
RESTART_TIMEOUT = "1 1"
KEEPALIVE = 5  # seconds; mosquitto's smallest bridge keepalive (default 60)


def bridge_lines(remote_host: str, remote_port: int, *, name: str, prefix: str = PREFIX,
                 qos: int = BRIDGE_QOS, overrides: dict | None = None) -> list[str]:
    """The bridge section of the edge broker's mosquitto.conf (the one docs/transports.md
    shows): share ``<prefix>/#`` both ways at ``qos`` with the broker at remote_host:port.
    ``overrides`` replaces options by name (``{"cleansession": "true"}``) to try a bridge that
    preserves less."""
    lines = [
        f"connection {name}",
        f"address {remote_host}:{remote_port}",
        f"topic {prefix}/# both {qos}",
        # MQTT 3.1.1 with the bridge flag: A keeps the RETAIN flag on what it forwards
        # (retain-as-published) and does not echo B's publishes back (no loop).
        "bridge_protocol_version mqttv311",
        "try_private true",
        # A keeps the bridge's subscription and its queued QoS 1 messages while the bridge
        # link is down, and B resends its unacknowledged ones when it comes back.
        "cleansession false",
        # No $SYS/broker/connection/<id>/state retained messages on either side.
        "notifications false",
        f"restart_timeout {RESTART_TIMEOUT}",
        f"keepalive_interval {KEEPALIVE}",
        f"remote_clientid {name}",
        f"local_clientid {name}-local",
    ]
    overrides = dict(overrides or {})
    replaced = [f"{line.split()[0]} {overrides.pop(line.split()[0])}"
                if line.split()[0] in overrides else line for line in lines]
    if overrides:
        raise ValueError(f"not bridge options of this configuration: {sorted(overrides)}")
    return replaced


class BridgedBrokers:
    """Broker A (server side) and broker B (client side) with B bridged to A.

    ``a`` and ``b`` are :class:`netq.lab.brokers.LocalBroker`; ``server_netloc(service)`` and
    ``client_netloc(service)`` are where netq connects. ``overrides`` go to
    :func:`bridge_lines`; ``limits`` (``max_queued_messages`` etc.) apply to both brokers,
    ``a_limits`` to broker A only (over ``limits``).
    Use as a context manager; :meth:`close` stops everything.
    """

    def __init__(self, directory: str | os.PathLike, *, via_proxy: bool = False,
                 prefix: str = PREFIX, qos: int = BRIDGE_QOS, overrides: dict | None = None,
                 a_limits: dict | None = None, **limits) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        self.qos = qos
        self.overrides = overrides
        self.via_proxy = via_proxy
        self.limits = limits
        self.a_limits = {**limits, **(a_limits or {})}
        self.name = f"netq-bridge-{uuid.uuid4().hex[:8]}"
        self.a: LocalBroker | None = None
        self.b: LocalBroker | None = None
        self.proxy = None

    # ------------------------------------------------------------------ life cycle

    def start(self, timeout: float = 20.0) -> BridgedBrokers:
        try:
            self.a = LocalBroker(directory=self.directory / "a", **self.a_limits).start()
            remote = (self.a.host, self.a.port)
            if self.via_proxy:
                from fault_proxy import FaultProxy

                self.proxy = FaultProxy(remote)
                remote = self.proxy.address
            extra = bridge_lines(remote[0], remote[1], name=self.name, prefix=self.prefix,
                                 qos=self.qos, overrides=self.overrides)
            self.b = LocalBroker(directory=self.directory / "b", extra=extra,
                                 **self.limits).start()
            self.wait_linked(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for broker in (self.b, self.a):
            if broker is not None:
                broker.close()
        if self.proxy is not None:
            self.proxy.close()

    def __enter__(self) -> BridgedBrokers:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------ addresses

    def server_netloc(self, service: str) -> nq.NetworkLocation:
        return nq.NetworkLocation(self.a.host, self.a.port, path=service)

    def client_netloc(self, service: str) -> nq.NetworkLocation:
        return nq.NetworkLocation(self.b.host, self.b.port, path=service)

    # ------------------------------------------------------------------ readiness

    def wait_linked(self, timeout: float = 20.0) -> float:
        """Block until a QoS 1 publish crosses the bridge both ways (B -> A, then A -> B);
        the seconds it took. Raises TimeoutError with both brokers' logs otherwise."""
        started = time.monotonic()
        deadline = started + timeout
        topic = f"{self.prefix}/.bridge-probe/{uuid.uuid4().hex[:12]}"
        for source, target in ((self.b, self.a), (self.a, self.b)):
            if not _crosses(source, target, topic, deadline):
                raise TimeoutError(
                    f"the bridge {self.name} did not carry a message {source.port} -> "
                    f"{target.port} within {timeout} s; broker A log:\n{_tail(self.a)}\n"
                    f"broker B log:\n{_tail(self.b)}")
        return time.monotonic() - started

    def bridge_log_lines(self, text: str) -> int:
        """How many lines of broker A's log contain ``text`` (e.g. "New bridge connected")."""
        try:
            log = self.a.log_path.read_text(errors="replace")
        except OSError:
            return 0
        return sum(text in line for line in log.splitlines())


def _tail(broker: LocalBroker | None) -> str:
    if broker is None:
        return "(not started)"
    try:
        return broker.log_path.read_text(errors="replace")[-1500:]
    except OSError:
        return "(no log)"


def _paho(broker: LocalBroker):
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(CallbackAPIVersion.VERSION2,
                         client_id=f"bridge-probe-{uuid.uuid4().hex[:8]}")
    client.connect(broker.host, broker.port, keepalive=10)
    return client


def _close_paho(client) -> None:
    client.disconnect()
    client.loop_stop()
    client._reset_sockets()  # paho keeps its wake-up socketpair open after loop_stop


def _crosses(source: LocalBroker, target: LocalBroker, topic: str, deadline: float) -> bool:
    """Publish on ``source`` until a subscriber on ``target`` sees it (or the deadline)."""
    arrived = threading.Event()
    subscribed = threading.Event()
    receiver = _paho(target)
    receiver.on_message = lambda client, userdata, message: arrived.set()
    receiver.on_subscribe = lambda *args: subscribed.set()
    sender = _paho(source)
    try:
        receiver.loop_start()
        sender.loop_start()
        receiver.subscribe(topic, qos=1)
        if not subscribed.wait(max(0.0, deadline - time.monotonic())):
            return False
        # The bridge may not be up yet (its subscription on A, its connection): publish again
        # every 100 ms until one copy gets through.
        while time.monotonic() < deadline:
            sender.publish(topic, b"probe", qos=1)
            if arrived.wait(0.1):
                return True
        return False
    finally:
        _close_paho(sender)
        _close_paho(receiver)


class Watcher:
    """A plain MQTT subscriber on ``broker`` to ``topic`` (wildcards allowed): ``messages``
    lists ``(topic, payload, retain)`` as they arrive. Subscribed when the constructor
    returns; use as a context manager."""

    def __init__(self, broker: LocalBroker, topic: str, timeout: float = 10.0) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.arrived = threading.Event()
        subscribed = threading.Event()
        self._client = client = _paho(broker)
        client.on_message = self._on_message
        client.on_subscribe = lambda *args: subscribed.set()
        client.loop_start()
        client.subscribe(topic, qos=1)
        if not subscribed.wait(timeout):
            self.close()
            raise TimeoutError(f"no SUBACK from {broker!r} within {timeout} s")

    def _on_message(self, client, userdata, message) -> None:
        self.messages.append((message.topic, bytes(message.payload), bool(message.retain)))
        self.arrived.set()

    def close(self) -> None:
        _close_paho(self._client)

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
