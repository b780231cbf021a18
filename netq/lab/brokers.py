"""MQTT brokers for tests, demos and notebooks: a private mosquitto, or the one named by
``$NETQ_MQTT_BROKER``. (The MQTT *transport* is :mod:`netq.transports.mqtt`.)

    from netq.lab.brokers import local_broker

    with local_broker() as broker:                  # mosquitto on a free loopback port
        options = nq.CommunicatorOptions(netloc=broker.netloc)
        with nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options) as server:
            ...

:func:`local_broker` writes a mosquitto configuration into a private directory, starts
``mosquitto -c <conf>`` in the foreground on ``127.0.0.1:<free port>``, waits until it accepts
connections and stops it by its pid (SIGTERM, then SIGKILL). When the binary is missing it
raises :class:`netq.BrokerUnavailable` saying how to install it. The broker keeps nothing on
disk (``persistence false``) and its log goes to ``<directory>/mosquitto.log``.

Broker limits worth knowing (mosquitto 2.0): ``max_inflight_messages`` (20) and
``max_queued_messages`` (1000) per subscriber; past them the broker *drops* QoS 1 messages
while the publisher still gets its PUBACK. netq's MQTT transport numbers its packets and
bounds what it has in the broker, so a drop costs a reconnect and a resend, never a message
(see :mod:`netq.transports.mqtt.link`).
"""

from __future__ import annotations

import logging
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from ..exceptions import BrokerUnavailable
from ..options import NetworkLocation

__all__ = ("LocalBroker", "local_broker", "AmqttBroker", "RabbitMQCluster", "RabbitMQNode",
           "find_rabbitmq", "broker", "environment_broker", "find_mosquitto", "free_port",
           "BROKER_VARIABLE", "INSTALL_HINT", "RABBITMQ_START_TIMEOUT")

_logger = logging.getLogger(__name__)

BROKER_VARIABLE = "NETQ_MQTT_BROKER"  # "host:port" of a running broker (binder/start sets it)

INSTALL_HINT = ("install mosquitto: `sudo apt-get install -y mosquitto` (Debian/Ubuntu), "
                "`brew install mosquitto` (macOS), or pass binary=/path/to/mosquitto")
_SEARCH = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto",
           "/usr/local/opt/mosquitto/sbin/mosquitto")
_START_TIMEOUT = 10.0  # seconds mosquitto gets to start listening
_STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL


def find_mosquitto(binary: str | os.PathLike | None = None) -> str:
    """The mosquitto executable: ``binary``, ``$NETQ_MOSQUITTO``, ``PATH``, or the usual places."""
    candidates = [binary, os.environ.get("NETQ_MOSQUITTO"), shutil.which("mosquitto"), *_SEARCH]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.fspath(candidate)
    raise BrokerUnavailable(f"the mosquitto broker was not found; {INSTALL_HINT}")


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10000  # brokers' ports are drawn at random from here up to the ephemeral range
_PORT_DRAWS = 50
_port_draw = random.Random().randrange  # its own generator: the program's random.seed() stays


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing is bound to now, for a program that binds it later.

    A broker takes seconds to bind the port it is given (RabbitMQ about 12 s), and a port from
    the kernel's ephemeral range (what ``bind(0)`` gives) can meanwhile become the local end of
    any outgoing connection on the machine. So, where the kernel says where that range starts
    (Linux), the port is drawn below it; elsewhere, or when no draw is free, ``bind(0)``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        ephemeral_low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 0
    candidates = ([_port_draw(_LOWEST_PORT, ephemeral_low) for _ in range(_PORT_DRAWS)]
                  if ephemeral_low > _LOWEST_PORT + _PORT_DRAWS else [])
    for port in [*candidates, 0]:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise BrokerUnavailable(f"no free TCP port on {host}")


class _BrokerProcesses:
    """What every broker here shares: a private directory (removed by :meth:`close` when it
    made one) and ``with`` = start, then close. Subclasses give ``start()`` and ``stop()``."""

    directory: Path
    _own_directory: bool

    def _use_directory(self, directory: str | os.PathLike | None, prefix: str) -> None:
        """Keep the broker's files in ``directory``, or in a new private one removed by
        :meth:`close`."""
        self._own_directory = directory is None
        self.directory = Path(directory if directory is not None
                              else tempfile.mkdtemp(prefix=prefix))
        self.directory.mkdir(parents=True, exist_ok=True)

    def start(self) -> Self:
        raise NotImplementedError  # each broker starts its own processes

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the broker and remove its private directory."""
        self.stop()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()


class LocalBroker(_BrokerProcesses):
    """A private mosquitto process. Start with :meth:`start` (or ``with``); stop with :meth:`stop`.

    Limits (``None``: mosquitto's default): ``max_inflight_messages`` and
    ``max_queued_messages`` per client, ``max_queued_bytes`` per client, ``max_packet_size``
    in bytes (mosquitto refuses 0; below netq's chunk size netq adapts when it speaks MQTT 5).
    TLS: ``certfile``/``keyfile`` (and ``cafile`` + ``require_certificate`` for client
    certificates) make the listener TLS-only. ``extra`` lines go into the configuration
    verbatim. ``port=0`` picks a free port; :meth:`restart` keeps the same one.
    """

    kind = "mosquitto"
    config_name = "mosquitto.conf"  # in :attr:`directory`
    log_name = "mosquitto.log"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 max_inflight_messages: int | None = None,
                 max_queued_messages: int | None = None,
                 max_queued_bytes: int | None = None,
                 max_packet_size: int | None = None,
                 certfile: str | os.PathLike | None = None,
                 keyfile: str | os.PathLike | None = None,
                 cafile: str | os.PathLike | None = None,
                 require_certificate: bool = False,
                 extra: list[str] | tuple[str, ...] = (),
                 binary: str | os.PathLike | None = None,
                 directory: str | os.PathLike | None = None) -> None:
        self.binary = find_mosquitto(binary)
        self.host = host
        self.port = port
        self.limits = {"max_inflight_messages": max_inflight_messages,
                       "max_queued_messages": max_queued_messages,
                       "max_queued_bytes": max_queued_bytes,
                       "max_packet_size": max_packet_size}
        self.tls = {"certfile": certfile, "keyfile": keyfile, "cafile": cafile}
        if (certfile is None) != (keyfile is None):
            raise ValueError("TLS needs both certfile and keyfile")
        self.require_certificate = require_certificate
        self.extra = list(extra)
        self._use_directory(directory, prefix=f"netq-{self.kind}-")
        self.process: subprocess.Popen | None = None


    # ------------------------------------------------------------------ properties

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def netloc(self) -> NetworkLocation:
        """The broker's address (``path`` unset: the default service)."""
        return NetworkLocation(self.host, self.port)

    @property
    def config_path(self) -> Path:
        return self.directory / self.config_name

    @property
    def log_path(self) -> Path:
        return self.directory / self.log_name

    def command(self) -> list[str]:
        """The broker's command line."""
        return [self.binary, "-c", str(self.config_path)]

    def config(self) -> str:
        """The configuration file's text."""
        # Run as whoever we are: started as root, mosquitto would switch to the "mosquitto"
        # user and could no longer read certificates in our private directories.
        lines = [f"user {pwd.getpwuid(os.getuid()).pw_name}",
                 f"listener {self.port} {self.host}", "allow_anonymous true",
                 # Without it mosquitto writes to subscribers with Nagle on: a small packet
                 # behind another waits for a delayed ACK (40 ms round trips here).
                 "set_tcp_nodelay true",
                 "persistence false", "log_dest stderr",
                 "log_type error", "log_type warning", "log_type notice"]
        for name, value in self.limits.items():
            if value is not None:
                lines.append(f"{name} {int(value)}")
        certfile, keyfile = self.tls["certfile"], self.tls["keyfile"]
        if certfile is not None:
            assert keyfile is not None  # __init__ takes both or neither
            lines.append(f"certfile {os.fspath(certfile)}")
            lines.append(f"keyfile {os.fspath(keyfile)}")
            if self.tls["cafile"] is not None:
                lines.append(f"cafile {os.fspath(self.tls['cafile'])}")
            if self.require_certificate:
                lines.append("require_certificate true")
        lines.extend(self.extra)
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ life cycle

    def start(self) -> LocalBroker:
        if self.process is not None and self.process.poll() is None:
            return self
        fixed_port = self.port != 0
        for _attempt in range(5):
            if not fixed_port:
                self.port = free_port(self.host)
            self.config_path.write_text(self.config())
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True)
            if self._wait_listening():
                return self
            self._reap()
            if fixed_port:
                break  # the port is taken (or the config is wrong): trying again won't help
        raise BrokerUnavailable(
            f"{self.kind} did not start listening on {self.host}:{self.port}; "
            f"log {self.log_path}:\n{self._log_tail()}")

    def _wait_listening(self) -> bool:
        process = self.process
        assert process is not None  # start() has just launched it
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _reap(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGTERM)
                process.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
            except ProcessLookupError:
                process.wait()
        self.process = None

    def stop(self) -> None:
        """Stop the broker by its pid (SIGTERM, SIGKILL after 5 s). Idempotent."""
        self._reap()

    def kill(self) -> None:
        """SIGKILL the broker (a crash): clients see their connection reset."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def restart(self, pause: float = 0.0) -> None:
        """Stop, wait ``pause`` seconds, start again on the same port."""
        self.stop()
        time.sleep(pause)
        self.start()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.pid is not None else "stopped"
        return f"<{type(self).__name__} {self.kind} {self.host}:{self.port} {state}>"


def local_broker(**settings) -> LocalBroker:
    """A started :class:`LocalBroker` (use it with ``with``, or call ``close()``)."""
    return LocalBroker(**settings).start()


def environment_broker() -> NetworkLocation | None:
    """The broker named by ``$NETQ_MQTT_BROKER`` (``host:port``, ``[::1]:port``), or None.

    A malformed value raises ValueError rather than silently starting another broker.
    """
    value = os.environ.get(BROKER_VARIABLE, "").strip()
    if not value:
        return None
    host, separator, port = value.rpartition(":")
    host = host.strip("[]")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"${BROKER_VARIABLE} must be host:port, got {value!r}")
    return NetworkLocation(host, int(port))


@contextmanager
def broker(**settings) -> Iterator[NetworkLocation]:
    """A broker to talk to, as a context manager yielding its :class:`NetworkLocation`.

    Without ``settings`` and with ``$NETQ_MQTT_BROKER`` set (``binder/start`` runs a loopback
    mosquitto and sets it), that broker is used and left running. Otherwise a private
    :func:`local_broker` with these settings (limits, TLS) is started and stopped on exit:
    experiments that need special broker limits always get their own.
    """
    shared = None if settings else environment_broker()
    if shared is not None:
        yield shared
        return
    with local_broker(**settings) as private:
        yield private.netloc


# ====================================================================== RabbitMQ

RABBITMQ_HINT = ("install RabbitMQ: `sudo apt-get install -y rabbitmq-server` (Debian/Ubuntu; "
                 "the rabbitmq_mqtt plugin ships with it)")
_RABBITMQ_SEARCH = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/sbin/rabbitmq-server",
                    "/usr/local/sbin/rabbitmq-server", "/opt/homebrew/sbin/rabbitmq-server")
# What rabbitmq-server prints once every boot step has run ("... completed with N plugins.").
_BOOT_COMPLETED = b"Starting broker... completed"
_BOOT_NOTICE = 15.0  # seconds of waiting for a node after which the wait is logged (INFO)
_PORT_ATTEMPTS = 3  # starts a node gets when another program takes one of its ports
RABBITMQ_START_TIMEOUT = 90.0  # seconds a node gets to open its MQTT listener (~12 s idle)


def find_rabbitmq() -> tuple[str, str, str]:
    """``(rabbitmq-server, rabbitmqctl, epmd)`` executables, or :class:`BrokerUnavailable`.

    The script under ``/usr/lib/rabbitmq/bin`` comes first: ``/usr/sbin/rabbitmq-server`` is a
    wrapper that switches to the ``rabbitmq`` user, which could not read our private
    directories."""
    for candidate in _RABBITMQ_SEARCH:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            server = candidate
            break
    else:
        raise BrokerUnavailable(f"rabbitmq-server was not found; {RABBITMQ_HINT}")
    ctl = os.path.join(os.path.dirname(server), "rabbitmqctl")
    epmd = shutil.which("epmd") or "/usr/bin/epmd"
    if not (os.access(ctl, os.X_OK) and os.access(epmd, os.X_OK)):
        raise BrokerUnavailable(f"rabbitmqctl or Erlang's epmd is missing; {RABBITMQ_HINT}")
    return server, ctl, epmd


class RabbitMQNode:
    """One RabbitMQ node of a :class:`RabbitMQCluster`: its name, ports and data directory."""

    def __init__(self, cluster: RabbitMQCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"netq{cluster.tag}n{index}@localhost"
        self.choose_ports()
        self.directory = cluster.directory / f"node{index}"
        self.process: subprocess.Popen | None = None
        self._log_start = 0  # where this start's output begins in stdout.log

    def choose_ports(self) -> None:
        """Free MQTT, AMQP and distribution ports on the cluster's host (applied at the next
        :meth:`start_process`)."""
        host = self.cluster.host
        self.mqtt_port = free_port(host)
        self.amqp_port = free_port(host)
        self.dist_port = free_port(host)

    @property
    def netloc(self) -> NetworkLocation:
        """The node's MQTT listener (``path`` unset: the default service)."""
        return NetworkLocation(self.cluster.host, self.mqtt_port)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.directory / "stdout.log"

    def config(self) -> str:
        host = self.cluster.host
        lines = [f"listeners.tcp.default = {host}:{self.amqp_port}",
                 f"mqtt.listeners.tcp.default = {host}:{self.mqtt_port}",
                 "mqtt.allow_anonymous = true",
                 # Our messages are small and many: no disk alarm on a nearly full CI disk.
                 "disk_free_limit.absolute = 50MB",
                 "vm_memory_high_watermark.relative = 0.2",
                 "log.console = false", "log.file.level = warning"]
        if self.index:
            lines += ["cluster_formation.peer_discovery_backend = classic_config",
                      f"cluster_formation.classic_config.nodes.1 = {self.cluster.nodes[0].name}"]
        return "\n".join(lines) + "\n"

    def environment(self) -> dict[str, str]:
        cluster = self.cluster
        environment = dict(os.environ)
        environment.update({
            "HOME": str(cluster.home), "ERL_EPMD_PORT": str(cluster.epmd_port),
            "ERL_EPMD_ADDRESS": cluster.host,
            "RABBITMQ_NODENAME": self.name, "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_NODE_IP_ADDRESS": cluster.host,
            "RABBITMQ_NODE_PORT": str(self.amqp_port), "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.directory / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.directory / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.directory / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.directory / "rabbitmq.pid"),
            # epmd is ours (RabbitMQCluster), stopped by its pid: the node must not start one.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-start_epmd false",
            "RABBITMQ_CTL_ERL_ARGS": "-start_epmd false",
        })
        return environment

    def start_process(self) -> None:
        """Launch the node (returns at once; :meth:`wait_ready` waits for MQTT)."""
        if self.process is not None and self.process.poll() is None:
            return
        for sub in ("mnesia", "log"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        (self.directory / "rabbitmq.conf").write_text(self.config())
        (self.directory / "advanced.config").write_text("[].\n")
        (self.directory / "rabbitmq-env.conf").write_text("")
        (self.directory / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self.process = subprocess.Popen(
                [self.cluster.binaries[0]], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=self.environment(), start_new_session=True)

    def wait_ready(self, timeout: float = RABBITMQ_START_TIMEOUT) -> None:
        """Wait until the node says it has booted and its MQTT listener accepts connections,
        or raise BrokerUnavailable.

        Both: the MQTT listener opens before the node's last boot steps (its AMQP listener
        among them), so a node can accept MQTT connections for a moment and then exit with
        ``BOOT FAILED``."""
        process = self.process
        assert process is not None  # start_process() has launched it
        started = time.monotonic()
        deadline = started + timeout
        said = False
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            if not said and time.monotonic() - started >= _BOOT_NOTICE:
                said = True
                _logger.info("waiting for RabbitMQ node %s to boot (up to %g s; its log: %s)",
                             self.name, timeout, self.log_path)
            if _BOOT_COMPLETED in self._this_start_output():
                try:
                    with socket.create_connection((self.cluster.host, self.mqtt_port),
                                                  timeout=0.5):
                        return
                except OSError:
                    pass
            time.sleep(0.1)
        raise BrokerUnavailable(
            f"RabbitMQ node {self.name} did not boot with MQTT open on {self.cluster.host}:"
            f"{self.mqtt_port} within {timeout:g} s; log {self.log_path}:\n{self._log_tail()}")

    def wait_started(self, timeout: float = RABBITMQ_START_TIMEOUT) -> None:
        """:meth:`wait_ready` after a first start. A node that exited because one of its ports
        was taken while it booted (another program bound it first) gets new ports and starts
        again (three starts in all), with a warning on the ``netq.lab.brokers`` logger."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                self.wait_ready(timeout)
                return
            except BrokerUnavailable:
                if attempt == _PORT_ATTEMPTS or not self._lost_a_port():
                    raise
            taken = (self.mqtt_port, self.amqp_port, self.dist_port)
            self.stop()
            self.choose_ports()
            _logger.warning("RabbitMQ node %s exited: one of its ports %s was taken while it "
                            "started; starting it again on MQTT port %d", self.name, taken,
                            self.mqtt_port)
            self.start_process()

    def _lost_a_port(self) -> bool:
        """Whether this start ended with a listener that could not bind (``eaddrinuse``)."""
        if self.process is None or self.process.poll() is None:
            return False
        return b"eaddrinuse" in self._this_start_output()

    def _this_start_output(self) -> bytes:
        """What the node has printed since its last :meth:`start_process`."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return log.read()
        except OSError:
            return b""

    def _log_tail(self) -> str:
        texts = []
        for path in (self.log_path, *sorted((self.directory / "log").glob("*.log"))):
            try:
                texts.append(path.read_text(errors="replace")[-1500:])
            except OSError:
                pass
        return "\n".join(texts)

    def stop(self) -> None:
        """Stop the node by its pid (SIGTERM: a clean shutdown; SIGKILL after 30 s) and every
        process it started (its process group: erl_child_setup, inet_gethost)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGTERM)
                process.wait(30.0)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        _kill_group(process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL the node and its helpers (a crash)."""
        if self.process is not None:
            _kill_group(self.process)
        self.process = None

    def restart(self) -> None:
        """Stop the node, start it again with the same name, ports and data; wait for MQTT."""
        self.stop()
        self.start_process()
        self.wait_ready()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.pid is not None else "stopped"
        return f"<RabbitMQNode {self.name} mqtt {self.cluster.host}:{self.mqtt_port} {state}>"


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group a broker was started in (start_new_session), reap its leader
    and wait until the rest of the group is gone too (RabbitMQ's Erlang VM is a child of the
    leader script: until it is gone it holds the node's name and ports)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    deadline = time.monotonic() + _STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


class RabbitMQCluster(_BrokerProcesses):
    """Private RabbitMQ nodes with the MQTT plugin, on loopback; the nodes after the first
    start together once it has booted, and join it (``classic_config`` peer discovery). One
    node is a cluster of one: ``RabbitMQCluster(1).start().nodes[0].netloc``.

    Everything is private: an ``epmd`` on a free port (started and stopped by its pid), a HOME
    with its own ``.erlang.cookie``, per node a name, AMQP/MQTT/distribution ports on
    ``host`` only, and its data and logs under ``directory`` (removed by :meth:`close`).
    Starting takes about 12 s on an idle machine for a cluster of one, twice that for more.

    RabbitMQ 3.10 caveat: the first node of a cluster, killed with SIGKILL, does not come back
    (its MQTT plugin fails to restart its Raft member: ``badrpc, nodedown``); the other nodes,
    and a node of a cluster of one, do.
    """

    def __init__(self, size: int = 1, *, host: str = "127.0.0.1",
                 directory: str | os.PathLike | None = None) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one node")
        self.binaries = find_rabbitmq()
        self.host = host
        self.tag = os.urandom(3).hex()
        self._use_directory(directory, prefix="netq-rabbitmq-")
        self.home = self.directory / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex().upper())
        cookie.chmod(0o400)
        self.epmd_port = free_port(host)
        self.epmd: subprocess.Popen | None = None
        self.nodes = [RabbitMQNode(self, index) for index in range(size)]

    def start(self) -> RabbitMQCluster:
        """Start epmd and every node at once; wait until each one's MQTT listener is up."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> RabbitMQCluster:
        """Start epmd and the first node's process, without waiting for it (see
        :meth:`wait_ready`, which starts the others): clusters launched one after the other
        boot in parallel."""
        try:
            if self.epmd is None:
                environment = dict(os.environ, ERL_EPMD_ADDRESS=self.host, HOME=str(self.home))
                self.epmd = subprocess.Popen(
                    [self.binaries[2], "-port", str(self.epmd_port)], env=environment,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True)
                self._wait_epmd()
            self.nodes[0].start_process()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> RabbitMQCluster:
        """Wait until the first node has booted, then start the others and wait until each
        one has booted with its MQTT listener up (BrokerUnavailable, all stopped, if one does
        not come up).

        The others join the first one only once it has booted: a node that joins a first
        node still booting can make it fail (``incompatible_feature_flags``) or wait for
        the joiner's tables until the start timeout."""
        try:
            first, *others = self.nodes
            first.wait_started()
            for node in others:
                node.start_process()
            for node in others:
                node.wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_epmd(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.epmd_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise BrokerUnavailable(f"epmd did not listen on {self.host}:{self.epmd_port}")

    def ctl(self, node: RabbitMQNode, *arguments: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <node> ...`` against one of our nodes; its output."""
        result = subprocess.run([self.binaries[1], "-n", node.name, *arguments],
                                env=node.environment(), capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        if result.returncode:
            raise BrokerUnavailable(f"rabbitmqctl {' '.join(arguments)} on {node.name} "
                                    f"failed: {result.stderr or result.stdout}")
        return result.stdout

    def running_nodes(self) -> list[str]:
        """The names of the cluster's running nodes, as the first node sees them."""
        text = self.ctl(self.nodes[0], "eval", "rabbit_nodes:all_running().")
        return sorted(name.strip(" '\n") for name in text.strip().strip("[]").split(","))

    def stop(self) -> None:
        """Stop every node, then epmd, by their pids (idempotent)."""
        for node in self.nodes:
            node.stop()
        if self.epmd is not None:
            _kill_group(self.epmd)
            self.epmd = None



# ====================================================================== amqtt

AMQTT_VERSION = "0.12.1"  # the amqtt release netq is tested with (MQTT 3.1.1 only)


class AmqttBroker(LocalBroker):
    """A private amqtt broker (pure Python, MQTT 3.1.1 only) on a free loopback port.

    ``binary`` is the ``amqtt`` script of an environment that has ``amqtt`` installed: keep it
    in a virtual environment of its own (its dependency pins are not netq's), e.g.
    ``python -m venv /tmp/amqtt && /tmp/amqtt/bin/pip install amqtt==0.12.1`` and
    ``AmqttBroker(binary="/tmp/amqtt/bin/amqtt")``. Started, stopped, killed and restarted as
    :class:`LocalBroker`; its log goes to ``<directory>/amqtt.log``.
    """

    kind = "amqtt"
    config_name = "amqtt.yaml"
    log_name = "amqtt.log"

    def __init__(self, *, binary: str | os.PathLike, host: str = "127.0.0.1", port: int = 0,
                 directory: str | os.PathLike | None = None) -> None:
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise BrokerUnavailable(f"no amqtt executable at {os.fspath(binary)}; install it "
                                    f"with `pip install amqtt=={AMQTT_VERSION}` in a venv of "
                                    f"its own")
        self.binary = os.fspath(binary)
        self.host = host
        self.port = port
        self._use_directory(directory, prefix=f"netq-{self.kind}-")
        self.process = None

    def config(self) -> str:
        return (f"listeners:\n  default:\n    type: tcp\n    bind: {self.host}:{self.port}\n"
                "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
                "    allow_anonymous: true\n")
